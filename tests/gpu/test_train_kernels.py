"""Generated kernels of the fused training-step ops, and float16/bfloat16 in the generator.

No GPU needed: the generated CUDA is compiled with the host C++ compiler behind a
few definitions (``blockIdx``, ``__half`` as ``_Float16``, ``__nv_bfloat16`` as
its bits) and every thread of a launch runs in turn. Whole training steps run
through the compiled kernels and are checked against CPU sessions.
"""

import ctypes
import shutil
import subprocess
import types

import numpy as np
import pytest

import workbench as wb
from workbench.gpu import codegen
from workbench.gpu.train_codegen import cross_entropy_kernel_source, update_kernel_source
from workbench.gpu.train_kernels import CrossEntropyKernels, UpdateKernels
from workbench.ops import fused_train
from workbench.testing import assert_close

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")

HOST = """\
#include <cmath>
#include <cstdint>
#include <cstring>
using namespace std;
#define __global__
#define __device__
#define __forceinline__ inline
struct Dim { unsigned int x; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
typedef _Float16 __half;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return (__half)f; }
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h) { uint32_t u = (uint32_t)h.bits << 16; float f; memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if (f != f) return {0x7fc0};
    u += 0x7fff + ((u >> 16) & 1);
    return {(uint16_t)(u >> 16)};
}
struct float16 { _Float16 v; float16() {} float16(float f) : v((_Float16)f) {} operator float() const { return (float)v; } };
"""

LIBRARIES: dict = {}


def build(source: str, tmp_root):
    """``source`` compiled into a shared library (once per source)."""
    if source not in LIBRARIES:
        folder = tmp_root.mktemp("kernel")
        (folder / "k.cpp").write_text(source)
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(folder / "k.so"), str(folder / "k.cpp")],
                       check=True, capture_output=True, text=True)  # fmt: skip
        LIBRARIES[source] = ctypes.CDLL(str(folder / "k.so"))
    return LIBRARIES[source]


class HostRawKernel:
    """``cupy.RawKernel`` stand-in: one host call per thread of the launch."""

    tmp = None  # set by the fixture below

    def __init__(self, source, name):
        head = source.split(f"void {name}(", 1)[1].split(") {", 1)[0]
        params = [p.strip() for p in head.split(",")]
        args = [
            f"({p.rsplit(' ', 1)[0]})a[{k}]" if "*" in p else f"*({p.rsplit(' ', 1)[0]}*)a[{k}]"
            for k, p in enumerate(params)
        ]
        body = "\n".join(line for line in source.splitlines() if not line.startswith("#include <cuda_"))
        launcher = (
            'extern "C" void launch(unsigned grid, unsigned block, void** a) {\n'
            "    blockDim.x = block; gridDim.x = grid;\n"
            "    for (unsigned b = 0; b < grid; ++b) for (unsigned t = 0; t < block; ++t) {\n"
            f"        blockIdx.x = b; threadIdx.x = t; {name}({', '.join(args)});\n"
            "    }\n}\n"
        )
        self.library = build(HOST + body + launcher, HostRawKernel.tmp)
        self.n_params = len(params)

    def __call__(self, grid, block, args):
        assert len(args) == self.n_params
        held = [np.array(a) if isinstance(a, np.generic) else a for a in args]  # NumPy gives scalars for 0-d results
        pointers = (ctypes.c_void_p * len(held))(*[a.ctypes.data for a in held])
        self.library.launch(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), pointers)


@pytest.fixture(autouse=True)
def _host_kernels(tmp_path_factory):
    HostRawKernel.tmp = tmp_path_factory


FAKE_CUPY = types.SimpleNamespace(ndarray=np.ndarray, RawKernel=HostRawKernel, empty=np.empty)


def _mlp(optimizer, classes=3):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.matmul(x, wb.variable("w1", shape=(6, 10))) + wb.variable("b1", shape=(10,), init=0.1))
        logits = wb.matmul(h, wb.variable("w2", shape=(10, classes))) + wb.variable(
            "b2", shape=(classes,), init="zeros"
        )
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        train = optimizer.minimize(loss)
    return g, train, loss


@pytest.mark.parametrize("make", [lambda: wb.optimizers.Adam(0.05, weight_decay=0.01, clip_norm=1.0),
                                  lambda: wb.optimizers.Momentum(0.1, nesterov=True),
                                  lambda: wb.optimizers.SGD(0.2, weight_decay=0.1)], ids=["adamw", "nesterov", "sgd"])  # fmt: skip
def test_training_steps_through_the_generated_kernels_match_cpu(make, monkeypatch):
    updates, cross_entropy = UpdateKernels(FAKE_CUPY, 2), CrossEntropyKernels(FAKE_CUPY, 2)
    monkeypatch.setitem(fused_train.DEVICE_KERNELS, fused_train.FUSED_UPDATE, [updates])
    monkeypatch.setitem(fused_train.DEVICE_KERNELS, fused_train.SCE_WITH_GRAD, [cross_entropy])
    g, train, loss = _mlp(make())
    cpu, gpu = wb.Session(g, seed=5), wb.Session(g, seed=5, device="gpu", emulate=True)
    rng = np.random.default_rng(0)
    for _ in range(4):
        feed = {"x": rng.normal(size=(37, 6)).astype(np.float32), "y": rng.integers(0, 3, 37)}
        np.testing.assert_allclose(gpu.run([train, loss], feed)[1], cpu.run([train, loss], feed)[1], rtol=2e-6)
    for k, v in cpu.variables.items():
        assert_close(gpu.variables[k], v, rtol=2e-5, err_msg=k)
    # one update launch and one cross-entropy launch per step, in place from the second step
    assert updates.calls == 4 and cross_entropy.calls == 4 and updates.compiled == 1


def _numpy_cross_entropy(logits, labels, upstream, mean):
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    loss = np.log(np.exp(z).sum(-1)) - np.take_along_axis(z, labels[:, None], -1)[:, 0]
    g = float(upstream) / (len(labels) if mean else 1)
    return loss, (p - np.eye(logits.shape[1])[labels]) * g


@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-5), ("float64", 1e-12), ("float16", 2e-3)])
@pytest.mark.parametrize("mean", [True, False])
def test_cross_entropy_kernel_matches_numpy(dtype, rtol, mean):
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(300, 7)) * 4).astype(dtype)
    labels = rng.integers(0, 7, 300).astype(np.int32)
    upstream = np.array(1.5, dtype)
    run = CrossEntropyKernels(FAKE_CUPY, 1)(
        np, (logits, labels, upstream), {"axis": None, "keepdims": False, "mean": mean}
    )
    loss, dlogits = run(logits, labels, upstream)
    want_loss, want_d = _numpy_cross_entropy(logits, labels, upstream, mean)
    np.testing.assert_allclose(loss, want_loss, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(dlogits, want_d, rtol=rtol, atol=rtol * np.abs(want_d).max())
    labels[3] = 7  # out of range: that row is NaN, the others are not
    loss, dlogits = run(logits, labels, upstream)
    assert np.isnan(loss[3]) and np.isnan(dlogits[3]).all() and not np.isnan(np.delete(loss, 3)).any()


def test_cross_entropy_kernel_declines_what_it_cannot_do():
    kernels = CrossEntropyKernels(FAKE_CUPY, 1)
    logits, labels = np.zeros((4, 3, 5), np.float32), np.zeros((4, 3), np.int64)
    attrs = {"axis": (0,), "keepdims": False, "mean": True}
    assert kernels(np, (logits, labels, np.ones(3, np.float32)), attrs) is None  # a per-column gradient
    assert kernels(np, (logits.transpose(1, 0, 2), labels.T, np.ones((), np.float32)), {**attrs, "axis": None}) is None
    assert cross_entropy_kernel_source("float32", "float32", True) is None  # labels must be integers


def test_update_kernel_of_three_lanes_in_place_and_not():
    program = (  # m' = 0.9 m + g; w' = w - lr m'  (lane inputs m, w, g; shared lr)
        ("constant", (), (("value", 0.9),), "float32"),
        ("multiply", (4, 0), (), "float32"),
        ("add", (5, 2), (), "float32"),
        ("multiply", (3, 6), (), "float32"),
        ("subtract", (1, 7), (), "float32"),
    )
    attrs = {"program": program, "stores": (6, 8), "lanes": 3, "width": 3}
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=s).astype(np.float32) for s in [(5, 7)] * 3 + [(1,)] * 3 + [(300,)] * 3] + [
        np.array(0.1, np.float32)
    ]
    expected = fused_train._update_kernel(np, *arrays, **attrs)
    run = UpdateKernels(FAKE_CUPY, 2)(np, arrays, attrs)
    outs = [np.empty_like(arrays[w]) for w in fused_train.update_writes(attrs, len(arrays))]
    run(arrays, outs)
    for got, want in zip(outs, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    variables = [arrays[w] for w in fused_train.update_writes(attrs, len(arrays))]
    run(arrays, variables)  # in place: the outputs are the variables' arrays
    for got, want in zip(variables, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    strided = [*arrays[:2], rng.normal(size=(7, 5)).astype(np.float32).T, *arrays[3:]]
    assert UpdateKernels(FAKE_CUPY, 2)(np, strided, attrs) is None


def _bfloat16_bits(values) -> np.ndarray:
    return np.array(
        [int(np.array(codegen.rounded(v, "bfloat16"), np.float32).view(np.uint32)) >> 16 for v in values], np.uint16
    )


def _bfloat16_values(bits) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.slow
def test_bfloat16_and_float16_updates_round_once_when_stored():
    program = (("multiply", (2, 1), (), "bfloat16"), ("subtract", (0, 3), (), "bfloat16"))  # w - lr g
    name, source = update_kernel_source(program, ("bfloat16", "bfloat16", "bfloat16"), (4,), 1, 2)
    assert "#include <cuda_bf16.h>" in source and "__nv_bfloat16* o0_0" in source
    rng = np.random.default_rng(3)
    w, g = _bfloat16_bits(rng.normal(size=1000)), _bfloat16_bits(rng.normal(size=1000))
    lr = _bfloat16_bits([0.01])
    out = np.empty_like(w)
    HostRawKernel(source, name)((4,), (256,), (w, g, out, np.int64(1000), lr))
    want = _bfloat16_bits(_bfloat16_values(w) - _bfloat16_values(lr)[0] * _bfloat16_values(g))
    np.testing.assert_array_equal(out, want)
    half = tuple((kind, refs, attrs, "float16") for kind, refs, attrs, _ in program)
    name, source = update_kernel_source(half, ("float16",) * 3, (4,), 1, 2)
    w16, g16, lr16 = (
        rng.normal(size=999).astype(np.float16),
        rng.normal(size=999).astype(np.float16),
        np.array(0.01, np.float16),
    )
    out16 = np.empty_like(w16)
    HostRawKernel(source, name)((2,), (256,), (w16, g16, out16, np.int64(999), lr16))
    np.testing.assert_array_equal(
        out16, (w16.astype(np.float32) - np.float32(lr16) * g16.astype(np.float32)).astype(np.float16)
    )


def test_float16_elementwise_kernels_compute_in_float():
    program = (
        ("multiply", (0, 1), (), "float16"),
        ("constant", (), (("value", 0.5),), "float16"),
        ("add", (2, 3), (), "float16"),
        ("tanh", (4,), (), "float16"),
    )
    params, out, body = codegen.kernel_source(program, ("float16", "float16"))
    loop = (
        'extern "C" void run(const float16* a, const float16* b, float16* c, long long n) {\n'
        "    for (long long i = 0; i < n; ++i) { const float16 in0 = a[i]; const float16 in1 = b[i]; float16 out0;\n"
        f"        {body}\n        c[i] = out0; }}\n}}\n"
    )
    library = build(HOST + loop, HostRawKernel.tmp)
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=500).astype(np.float16), rng.normal(size=500).astype(np.float16)
    c = np.empty_like(a)
    library.run(*(ctypes.c_void_p(x.ctypes.data) for x in (a, b, c)), ctypes.c_longlong(500))
    want = np.tanh(a.astype(np.float32) * b.astype(np.float32) + np.float32(0.5)).astype(np.float16)
    np.testing.assert_allclose(c.astype(np.float32), want.astype(np.float32), atol=1e-3)  # host tanh vs NumPy's: 1 ulp


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_training_kernels_compile_with_nvcc(tmp_path):
    sources = [cross_entropy_kernel_source(d, "int64", True)[1] for d in ("float16", "bfloat16", "float32", "float64")]
    program = (("multiply", (2, 1), (), "float16"), ("subtract", (0, 3), (), "float16"))
    sources.append(update_kernel_source(program, ("float16",) * 3, (4,), 4, 2)[1])
    from workbench.gpu.conv_kernels import col2im_source, im2col_source

    sources += [make(d)[1] for make in (im2col_source, col2im_source) for d in ("float16", "float32", "float64")]
    for i, source in enumerate(sources):
        path = tmp_path / f"k{i}.cu"
        path.write_text(source)
        # device code only, as NVRTC compiles a RawKernel's source (no host compiler pass: 0.6 s, not 3)
        subprocess.run(
            ["nvcc", "-arch=sm_90", "-cubin", str(path), "-o", str(tmp_path / "k.cubin")],
            check=True,
            capture_output=True,
        )


# -- convolutions ---------------------------------------------------------------------------------


def _conv_kernels():
    from workbench.gpu.conv_kernels import ConvKernels

    fake = types.SimpleNamespace(ndarray=np.ndarray, RawKernel=HostRawKernel, empty=np.empty,
                                 ascontiguousarray=np.ascontiguousarray)  # fmt: skip
    return ConvKernels(fake, 2)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("shape,kernel,stride,padding", [
    ((2, 3, 9, 7), (3, 3), (1, 1), "same"),
    ((3, 2, 8, 8), (3, 2), (2, 2), "same"),
    ((2, 4, 7, 9), (2, 3), (2, 1), "valid"),
    ((1, 1, 5, 5), (5, 5), (1, 1), "valid"),
])  # fmt: skip
def test_generated_convolutions_match_the_namespace_kernels(shape, kernel, stride, padding, dtype):
    from workbench.ops.registry import REGISTRY

    rng = np.random.default_rng(6)
    x = rng.normal(size=shape).astype(dtype)
    w = rng.normal(size=(5, shape[1], *kernel)).astype(dtype)
    attrs = {"stride": stride, "padding": padding}
    kernels = _conv_kernels()
    out = kernels.forward(np, (x, w), attrs)(x, w)
    want = REGISTRY["conv2d"].kernel(np, x, w, **attrs)
    rtol = 1e-2 if dtype == "float16" else 1e-6
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=rtol * 10)
    g = rng.normal(size=want.shape).astype(dtype)
    dx = kernels.input_grad(np, (g, x, w), attrs)(g, x, w)
    np.testing.assert_allclose(
        dx, REGISTRY["conv2d_input_grad"].kernel(np, g, x, w, **attrs), rtol=rtol, atol=rtol * 10
    )
    dw = kernels.filter_grad(np, (x, g, w), attrs)(x, g, w)
    np.testing.assert_allclose(
        dw, REGISTRY["conv2d_filter_grad"].kernel(np, x, g, w, **attrs), rtol=rtol, atol=rtol * 30
    )
    assert out.flags.c_contiguous and dx.shape == x.shape and dw.shape == w.shape and kernels.calls == 3


def test_a_cnn_trains_through_the_generated_convolutions(monkeypatch):
    kernels = _conv_kernels()
    patched = (("conv2d", kernels.forward), ("conv2d_input_grad", kernels.input_grad),
               ("conv2d_filter_grad", kernels.filter_grad))  # fmt: skip

    def on_device(session, fetches, feed):  # the stand-in takes NumPy arrays: only this session may use it
        with monkeypatch.context() as m:
            for op, fn in patched:
                m.setitem(fused_train.DEVICE_KERNELS, op, [fn])
            return session.run(fetches, feed)

    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2, 8, 8))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.conv2d(x, wb.variable("c1", shape=(4, 2, 3, 3), init="he_uniform"), padding="same"))
        h = wb.relu(wb.conv2d(h, wb.variable("c2", shape=(6, 4, 3, 3), init="he_uniform"), stride=2, padding="same"))
        logits = wb.matmul(wb.reshape(h, (-1, 6 * 16)), wb.variable("w", shape=(6 * 16, 3)))
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    cpu, gpu = wb.Session(g, seed=1), wb.Session(g, seed=1, device="gpu", emulate=True)
    rng = np.random.default_rng(7)
    for _ in range(3):
        feed = {"x": rng.normal(size=(5, 2, 8, 8)).astype(np.float32), "y": rng.integers(0, 3, 5)}
        np.testing.assert_allclose(on_device(gpu, [train, loss], feed)[1], cpu.run([train, loss], feed)[1], rtol=1e-5)
    for k, v in cpu.variables.items():
        assert_close(gpu.variables[k], v, rtol=1e-4, err_msg=k)
    assert kernels.calls == 3 * (
        2 * 2 + 1
    )  # per step: im2col for both forwards and filter grads, col2im for c2's input grad
