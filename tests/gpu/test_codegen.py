"""The CUDA C generated for fused programs (no GPU needed) and the GPU device's errors."""

import numpy as np
import pytest

import workbench as wb
from workbench.gpu import codegen
from workbench.graph.fusion import fuse_elementwise


def test_bias_relu_kernel_source():
    program = (("add", (0, 1), (), "float32"), ("relu", (2,), (), "float32"))
    assert codegen.kernel_source(program, ("float32", "float32")) == (
        "float32 in0, float32 in1",
        "float32 out0",
        "const float v2 = in0 + in1;\nconst float v3 = (v2 > (float)0 || v2 != v2) ? v2 : (float)0;\nout0 = v3;",
    )


def test_constants_are_exact_literals():
    program = (("constant", (), (("value", 0.9),), "float64"), ("multiply", (1, 0), (), "float64"))
    _, out, body = codegen.kernel_source(program, ("float64",))
    assert out == "float64 out0"
    assert body == "const double v2 = (double)0.9 * in0;\nout0 = v2;"
    f32 = float(np.float32(0.9))
    assert codegen.literal(f32, "float32") == f"(float){f32!r}"
    assert np.float32(float(codegen.literal(f32, "float32")[len("(float)") :])) == np.float32(0.9)
    assert codegen.literal(True, "bool") == "true" and codegen.literal(3, "int64") == "(long long)3"


def test_where_compare_and_cast():
    program = (
        ("greater", (0, 1), (), "bool"),
        ("where", (2, 0, 1), (), "float32"),
        ("cast", (3,), (("dtype", "bool"),), "bool"),
        ("cast", (4,), (("dtype", "float64"),), "float64"),
    )
    params, out, body = codegen.kernel_source(program, ("float32", "float32"))
    assert params == "float32 in0, float32 in1" and out == "float64 out0"
    assert body.splitlines() == [
        "const bool v2 = in0 > in1;",
        "const float v3 = v2 ? in0 : in1;",
        "const bool v4 = (v3 != 0);",
        "const double v5 = (double)(v4);",
        "out0 = v5;",
    ]


def test_float16_is_computed_in_float_and_rounded_when_stored():
    program = (
        ("constant", (), (("value", 0.1),), "float16"),
        ("multiply", (0, 2), (), "float16"),
        ("cast", (3,), (("dtype", "float32"),), "float32"),
        ("cast", (4,), (("dtype", "float16"),), "float16"),
        ("add", (5, 1), (), "float16"),
    )
    params, out, body = codegen.kernel_source(program, ("float16", "float16"))
    assert params == "float16 in0, float16 in1" and out == "float16 out0"
    assert body.splitlines() == [
        "const float v3 = ((float)in0) * (float)0.0999755859375;",  # 0.1 as float16
        "const float v4 = (float)(v3);",
        "const float v5 = ((float)(float16)(v4));",  # a cast to float16 rounds
        "const float v6 = v5 + ((float)in1);",
        "out0 = (float16)(v6);",
    ]
    assert codegen.supported("exp", ["float16"], "float16") and codegen.supported("sqrt", ["bfloat16"], "bfloat16")


def test_raw_kernels_load_and_store_half_types():
    lines, result, dtype = codegen.body_lines(
        (("add", (0, 1), (), "bfloat16"),), ("bfloat16", "float16"), dialect="raw"
    )
    assert lines == ["const float v2 = __bfloat162float(in0) + __half2float(in1);"] and dtype == "bfloat16"
    assert codegen.store(result, dtype, "raw") == "__float2bfloat16(v2)"
    assert codegen.rounded(1 + 2**-8, "bfloat16") == 1.0 and codegen.rounded(1 + 3 * 2**-8, "bfloat16") == 1 + 2**-6
    assert codegen.literal(0.1, "bfloat16") == "(float)0.10009765625"


def test_sigmoid_matches_the_kernels_formula():
    assert codegen.expression("sigmoid", ["x"], "float64") == "(double)0.5 * tanh((double)0.5 * x) + (double)0.5"


def test_unsupported_dtypes_and_ops_give_none():
    assert codegen.kernel_source((("exp", (0,), (), "bfloat16"),), ("bfloat16",)) is None  # CuPy has no bfloat16
    assert codegen.kernel_source((("divide", (0, 0), (), "int64"),), ("int64",)) is None
    assert not codegen.supported("pow", ["int32", "int32"], "int32")
    assert not codegen.supported("matmul", ["float32", "float32"], "float32")
    assert codegen.supported("maximum", ["int64", "int64"], "int64")


def test_every_elementwise_op_of_the_registry_has_an_expression():
    from workbench.ops.registry import REGISTRY

    missing = [name for name, d in REGISTRY.items() if d.elementwise and name not in codegen.C_EXPRESSIONS]
    assert missing == []


def test_programs_from_the_pass_generate(graph):
    x = wb.placeholder("x", shape=(None, 3))
    m = wb.variable("m", shape=(3,), init="zeros")
    y = wb.sqrt(0.9 * m + 0.1 * (x * x)) + 1e-8
    fused = fuse_elementwise(graph, keep=[y.name], supported=codegen.supports_op)
    op = fused.operation(y.op.name)
    params, out, body = codegen.kernel_source(op.attrs["program"], [t.dtype for t in op.inputs])
    assert params == "float32 in0, float32 in1" and out == "float32 out0"
    assert "sqrt(" in body and body.count("const float") == len(op.attrs["program"]) - 3
    assert codegen.kernel_name(body).startswith("wb_fused_")


def test_gpu_device_errors_say_what_is_missing(graph, monkeypatch):
    import sys

    wb.placeholder("x", shape=(2,))
    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    with pytest.raises(wb.DeviceError, match="needs CuPy, which is not installed"):
        wb.Session(graph, device="gpu")
    with pytest.raises(wb.DeviceError, match="unknown device 'tpu'"):
        wb.Session(graph, device="tpu")
    with pytest.raises(wb.DeviceError, match="unknown device 'gpu:x'"):
        wb.Session(graph, device="gpu:x")
    with pytest.raises(wb.DeviceError, match="device 'cpu' takes no options, got fuse"):
        wb.Session(graph, fuse=True)


def test_no_cuda_device_is_a_clear_error(graph, monkeypatch):
    import sys
    import types

    class Runtime:
        @staticmethod
        def getDeviceCount():
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake = types.SimpleNamespace(__version__="14.0", cuda=types.SimpleNamespace(runtime=Runtime))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(wb.DeviceError, match="found no CUDA device.*no CUDA-capable device"):
        wb.Session(graph, device="gpu")


def test_emulated_gpu_session_feeds_fetches_and_fits(graph):
    x = wb.placeholder("x", shape=(None, 2))
    y = wb.placeholder("y", shape=(None,), dtype="int64")
    w = wb.variable("w", shape=(2, 2))
    loss = wb.mean(wb.softmax_cross_entropy(wb.relu(wb.matmul(x, w)) * 2.0 + 0.5, y), name="loss")
    train = wb.optimizers.SGD(0.1).minimize(loss)
    sess = wb.Session(graph, device="gpu", emulate=True)
    X, Y = np.random.default_rng(0).normal(size=(16, 2)), np.arange(16) % 2
    hist = sess.fit(train, data={"x": X, "y": Y}, batch_size=4, steps=3, fetches=[loss])
    assert len(hist.records) == 3 and isinstance(sess.variables["w"], np.ndarray)
    with pytest.raises(wb.FeedError, match="placeholder 'x' expects shape"):
        sess.run(loss, {"x": np.zeros((2, 3)), "y": [0, 1]})


def test_direct_calls_keep_the_namespace_but_skip_its_wrappers():
    import array_api_compat.numpy as compat

    from workbench.gpu.device import direct_calls

    xp = direct_calls(np, compat)
    a = np.arange(6.0).reshape(2, 3)
    assert xp.__name__ == compat.__name__ and xp.matmul is np.matmul and xp.sum is compat.sum
    np.testing.assert_array_equal(xp.matrix_transpose(a), a.T)
    np.testing.assert_array_equal(xp.reshape(a, (3, 2)), a.reshape(3, 2))
    assert not np.shares_memory(xp.reshape(a, (6,), copy=True), a)
    with pytest.raises(ValueError, match="at least 2-dimensional"):
        xp.matrix_transpose(np.ones(3))


def test_direct_copyto_copies_and_broadcasts():
    import array_api_compat.numpy as compat

    from workbench.gpu.device import direct_calls

    xp = direct_calls(np, compat)
    a, b = np.zeros((2, 3)), np.arange(6.0).reshape(2, 3)
    xp.copyto(a, b)
    np.testing.assert_array_equal(a, b)
    xp.copyto(a, np.arange(3.0))
    np.testing.assert_array_equal(a, [[0.0, 1.0, 2.0]] * 2)


def test_direct_copyto_is_one_memcpy_for_arrays_of_one_shape_and_dtype():
    import types

    import array_api_compat.numpy as compat

    from workbench.gpu.device import direct_calls

    copies, fallbacks = [], []

    class Pointer:
        def __init__(self, array):
            self.array = array

        def copy_from_device_async(self, src, size):
            copies.append(size)
            self.array.view[...] = src.array.view

    class Array:  # a device array as far as copyto looks: class, dtype, shape, flags, data, nbytes
        def __init__(self, view):
            self.view, self.dtype, self.shape, self.flags, self.nbytes = (
                view,
                view.dtype,
                view.shape,
                view.flags,
                view.nbytes,
            )
            self.data = Pointer(self)

    fake = types.SimpleNamespace(
        ndarray=Array, cuda=object(), matmul=None, copyto=lambda d, s, **kw: fallbacks.append((s, kw))
    )
    xp = direct_calls(fake, compat)
    dst, src = Array(np.zeros((2, 3), np.float32)), Array(np.ones((2, 3), np.float32))
    xp.copyto(dst, src)
    assert copies == [24] and dst.view.sum() == 6
    xp.copyto(dst, Array(np.ones(3, np.float32)))  # broadcasts: CuPy's copyto
    xp.copyto(dst, Array(np.ones((2, 3), np.float64)))  # casts: CuPy's copyto
    mask = np.array([[True, False, True]] * 2)
    xp.copyto(dst, src, where=mask)  # a masked copy (in-place where): CuPy's copyto, keywords kept
    assert copies == [24] and len(fallbacks) == 3
    assert fallbacks[-1][1]["where"] is mask


def test_the_new_elementwise_ops_generate_with_their_attributes():
    exact = codegen.expression("gelu", ["x"], "float32", {"approximate": "none"})
    tanh = codegen.expression("gelu", ["x"], "float32", {"approximate": "tanh"})
    assert "erf(x" in exact and "tanh(" not in exact and "tanh((float)0.7978845608028654" in tanh
    assert "erf(" not in codegen.expression("gelu_grad", ["g", "x", "y"], "float64", {"approximate": "tanh"})
    assert codegen.expression("clip", ["x", "lo", "hi"], "float32") == "(x < lo) ? lo : ((x > hi) ? hi : x)"
    assert codegen.expression("rsqrt", ["x"], "float64") == "(double)1 / sqrt(x)"
    assert not codegen.supported("rsqrt", ["int32"], "int32") and codegen.supported("square", ["int32"], "int32")
    program = (("square", (0,), (), "float32"), ("gelu", (1,), (("approximate", "tanh"),), "float32"))
    params, out, body = codegen.kernel_source(program, ("float32",))
    assert body.count("const float") == 2 and "tanh(" in body
