"""Vectorized float4 kernels of fused programs: their source, when they run, and their results.

No GPU needed: the generated CUDA is compiled with the host C++ compiler behind a
few definitions (``float4``, ``blockIdx`` ...) and every block and thread of the
launch is run in turn, so the kernel's loops, tail and scalars are checked
against NumPy. The source is also compiled with ``nvcc`` when there is one.
"""

import ctypes
import shutil
import subprocess
import types

import numpy as np
import pytest

from workbench.gpu import codegen
from workbench.gpu.kernels import FusedKernels, vector_layout
from workbench.ops.fused import run_program

BIAS_RELU = (("add", (0, 1), (), "float32"), ("relu", (2,), (), "float32"))
ADAM_STEP = (  # lr_t * m / (sqrt(v) + eps), lr_t a 0-d array
    ("multiply", (0, 1), (), "float32"),
    ("sqrt", (2,), (), "float32"),
    ("constant", (), (("value", 1e-8),), "float32"),
    ("add", (4, 5), (), "float32"),
    ("divide", (3, 6), (), "float32"),
)

BIAS_RELU_SOURCE = """\
__device__ __forceinline__ float wb_op(const float in0, const float in1) {
    const float v2 = in0 + in1;
    const float v3 = (v2 > (float)0 || v2 != v2) ? v2 : (float)0;
    return v3;
}

extern "C" __global__ void NAME(const float* __restrict__ p0, const float* __restrict__ p1, float* out0, long long n) {
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long n4 = n / 4;
    float4* out4 = reinterpret_cast<float4*>(out0);
    for (long long i = start; i < n4; i += stride) {
        const float4 a0 = reinterpret_cast<const float4*>(p0)[i];
        const float4 a1 = reinterpret_cast<const float4*>(p1)[i];
        float4 r;
        r.x = wb_op(a0.x, a1.x);
        r.y = wb_op(a0.y, a1.y);
        r.z = wb_op(a0.z, a1.z);
        r.w = wb_op(a0.w, a1.w);
        out4[i] = r;
    }
    for (long long i = n4 * 4 + start; i < n; i += stride) {
        out0[i] = wb_op(p0[i], p1[i]);
    }
}
"""


def test_vector_source_of_bias_relu():
    name, source = codegen.vector_kernel_source(BIAS_RELU, 2)
    assert name.startswith("wb_vec4_")
    assert source == BIAS_RELU_SOURCE.replace("NAME", name)


def test_vector_source_reads_scalars_once():
    name, source = codegen.vector_kernel_source(ADAM_STEP, 3, scalars=(0,))
    assert "    const float s0 = p0[0];\n" in source
    assert "r.z = wb_op(s0, a1.z, a2.z);" in source and "out0[i] = wb_op(s0, p1[i], p2[i]);" in source
    assert "reinterpret_cast<const float4*>(p0)" not in source
    assert name != codegen.vector_kernel_source(ADAM_STEP, 3)[0]  # one kernel per scalar layout


def test_vector_source_shares_the_elementwise_expressions():
    _, _, body = codegen.kernel_source(BIAS_RELU, ("float32", "float32"))
    _, source = codegen.vector_kernel_source(BIAS_RELU, 2)
    for line in body.splitlines()[:-1]:
        assert f"    {line}\n" in source


def test_no_vector_source_for_other_dtypes_or_all_scalars():
    to_double = (("cast", (0,), (("dtype", "float64"),), "float64"),)
    assert codegen.vector_kernel_source(to_double, 1) is None
    assert codegen.vector_kernel_source((("exp", (0,), (), "float16"),), 1) is None
    assert codegen.vector_kernel_source(BIAS_RELU, 2, scalars=(0, 1)) is None


@pytest.mark.parametrize(
    "n,sms,blocks", [(1, 132, 1), (1024, 132, 1), (1025, 132, 2), (1 << 28, 132, 1056), (10**6, 2, 16)]
)
def test_vector_grid(n, sms, blocks):
    assert codegen.vector_grid(n, sms) == blocks


def _aligned(shape, offset=0):
    """A float32 array whose data starts ``offset`` floats past a 64-byte boundary."""
    size = int(np.prod(shape))
    raw = np.empty(size + 32, np.float32)
    start = (-raw.ctypes.data % 64) // 4 + offset
    return raw[start : start + size].reshape(shape)


def _layout(*arrays):
    return vector_layout(arrays, lambda a: a.ctypes.data)


def test_vector_layout_decisions():
    a, b = _aligned((64, 33)), _aligned((64, 33))
    assert _layout(a, b) == ((64, 33), 64 * 33, ())
    assert _layout(_aligned(()), a, b) == ((64, 33), 64 * 33, (0,))  # a 0-d array: a scalar
    assert _layout(a, _aligned((1, 1))) == ((64, 33), 64 * 33, (1,))
    assert _layout(a, _aligned((33,))) is None  # broadcasting a row: the elementwise kernel
    assert _layout(a, _aligned((64, 33), offset=1)) is None  # not 16-byte aligned
    assert _layout(a, _aligned((33, 64)).T) is None  # not C-contiguous
    assert _layout(_aligned((5,)), _aligned((1, 1))) is None  # the scalar would add a dimension
    assert _layout(_aligned(()), _aligned((1,))) is None  # nothing but scalars
    assert _layout(_aligned((0, 3)), _aligned((0, 3))) is None


# -- the generated kernel, run on the host ---------------------------------------------------

PRELUDE = """\
#include <cmath>
using namespace std;
#define __global__
#define __device__
#define __forceinline__ inline
struct alignas(16) float4 { float x, y, z, w; };
struct Dim { unsigned int x; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
"""


class HostRawKernel:
    """``cupy.RawKernel`` stand-in: the source compiled by g++, every thread of a launch run in turn."""

    launches: list = []

    def __init__(self, source, name):
        pointers = source.split(f"{name}(", 1)[1].split(")", 1)[0].count("float*")
        args = ", ".join([*(f"(const float*)p[{i}]" for i in range(pointers - 1)), f"(float*)p[{pointers - 1}]", "n"])
        launcher = (
            'extern "C" void launch(unsigned grid, unsigned block, void** p, long long n) {\n'
            "    blockDim.x = block; gridDim.x = grid;\n"
            "    for (unsigned b = 0; b < grid; ++b) for (unsigned t = 0; t < block; ++t) {\n"
            f"        blockIdx.x = b; threadIdx.x = t; {name}({args});\n"
            "    }\n}\n"
        )
        self.library = _compile(PRELUDE + source + launcher)
        self.pointers = pointers

    def __call__(self, grid, block, args):
        *arrays, n = args
        assert len(arrays) == self.pointers and isinstance(n, np.int64)
        HostRawKernel.launches.append((grid, block, int(n)))
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        self.library.launch(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), pointers, ctypes.c_longlong(int(n)))


_CACHE: dict = {}


def _compile(source, _cache=_CACHE):
    if source not in _cache:
        import tempfile

        folder = tempfile.mkdtemp()
        path = f"{folder}/kernel.cpp"
        with open(path, "w") as f:
            f.write(source)
        subprocess.run(
            ["g++", "-O1", "-shared", "-fPIC", "-o", f"{folder}/kernel.so", path], check=True, capture_output=True
        )
        _cache[source] = ctypes.CDLL(f"{folder}/kernel.so")
    return _cache[source]


class Elementwise:
    """``cupy.ElementwiseKernel`` stand-in that records its calls and runs the program on NumPy."""

    def __init__(self, params, out, body, name):
        self.name = name

    def __call__(self, *arrays):
        Elementwise.calls.append([a.shape for a in arrays])
        return run_program(np, Elementwise.program, arrays)


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")


def _host_kernels(program):
    Elementwise.calls, Elementwise.program, HostRawKernel.launches = [], program, []
    fake = types.SimpleNamespace(
        ndarray=np.ndarray, ElementwiseKernel=Elementwise, RawKernel=HostRawKernel, empty=np.empty
    )
    return FusedKernels(fake, pointer=lambda a: a.ctypes.data, multiprocessors=2)


@needs_gxx
@pytest.mark.parametrize("size", [4, 7, 4096, 20003, 8 * 4 * 256 * 2 + 5])  # the last needs the grid-stride loop
def test_host_run_of_the_vector_kernel_matches_numpy(size):
    rng = np.random.default_rng(size)
    kernels = _host_kernels(ADAM_STEP)
    lr = _aligned(())
    lr[...] = 1e-3
    m, v = _aligned((size,)), _aligned((size,))
    m[...], v[...] = rng.normal(size=size), rng.random(size)
    out = kernels(np, ADAM_STEP, [lr, m, v])(lr, m, v)
    assert Elementwise.calls == [] and len(HostRawKernel.launches) == 1 and kernels.vector_calls == 1
    np.testing.assert_allclose(out, run_program(np, ADAM_STEP, [lr, m, v]), rtol=1e-6)


@needs_gxx
def test_host_run_falls_back_for_misaligned_and_broadcast_inputs():
    rng = np.random.default_rng(1)
    kernels = _host_kernels(BIAS_RELU)
    a, b, row = _aligned((64, 33)), _aligned((64, 33), offset=1), _aligned((33,))
    for x in (a, b, row):
        x[...] = rng.normal(size=x.shape)
    call = kernels(np, BIAS_RELU, [a, a])
    np.testing.assert_array_equal(call(a, a), np.maximum(a + a, 0))  # vectorized
    np.testing.assert_array_equal(call(a, b), np.maximum(a + b, 0))  # misaligned: flat elementwise
    np.testing.assert_array_equal(call(a, row), np.maximum(a + row, 0))  # broadcast: N-d elementwise
    assert len(HostRawKernel.launches) == 1
    assert Elementwise.calls == [[(64 * 33,), (64 * 33,)], [(64, 33), (33,)]]


def test_other_dtypes_never_vectorize():
    kernels = _host_kernels(BIAS_RELU)
    program = (("add", (0, 1), (), "float64"), ("relu", (2,), (), "float64"))
    Elementwise.program = program
    a = np.ones((8, 8))
    np.testing.assert_array_equal(kernels(np, program, [a, a])(a, a), np.full((8, 8), 2.0))
    assert HostRawKernel.launches == [] and kernels.vector_calls == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_vector_sources_compile_with_nvcc(tmp_path):
    program = ADAM_STEP + (
        ("exp", (7,), (), "float32"),
        ("greater", (8, 1), (), "bool"),
        ("where", (9, 8, 2), (), "float32"),
    )
    for scalars in ((), (0,)):
        _, source = codegen.vector_kernel_source(program, 3, scalars)
        path = tmp_path / f"k{len(scalars)}.cu"
        path.write_text(source)
        # device code only, as NVRTC compiles a RawKernel's source
        subprocess.run(
            ["nvcc", "-arch=sm_90", "-cubin", str(path), "-o", str(tmp_path / "k.cubin")],
            check=True,
            capture_output=True,
        )
