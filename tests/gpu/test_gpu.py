"""GPU sessions on a real CUDA device (skipped without CuPy and a GPU)."""

import functools

import numpy as np
import pytest

import workbench as wb
from workbench.ops.fused import run_program
from workbench.ops.registry import REGISTRY
from workbench.testing import assert_close

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
try:
    _DEVICES = cp.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    _DEVICES = 0
if _DEVICES == 0:
    pytest.skip("no CUDA device", allow_module_level=True)


def _mlp(dtype="float32"):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 20), dtype=dtype)
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(
            wb.matmul(x, wb.variable("w1", shape=(20, 32), dtype=dtype))
            + wb.variable("b1", shape=(32,), init=0.1, dtype=dtype)
        )
        logits = wb.matmul(h, wb.variable("w2", shape=(32, 5), dtype=dtype)) + wb.variable(
            "b2", shape=(5,), init="zeros", dtype=dtype
        )
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        train = wb.optimizers.Adam(0.01).minimize(loss)
    return g, train, loss


def _data(n=64):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 20)), rng.integers(0, 5, n)


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-9), ("float32", 1e-4)])
def test_training_matches_numpy(dtype, rtol):
    g, train, loss = _mlp(dtype)
    X, Y = _data()
    cpu, gpu = wb.Session(g, seed=1), wb.Session(g, seed=1, device="gpu")
    for _ in range(5):
        a = cpu.run([train, loss], {"x": X, "y": Y})[1]
        b = gpu.run([train, loss], {"x": X, "y": Y})[1]
        assert isinstance(b, np.ndarray)
        np.testing.assert_allclose(b, a, rtol=rtol)
    state = gpu.plan_for([train, loss], {"x": X, "y": Y}).state
    for name, value in cpu.variables.items():
        assert isinstance(state[name], cp.ndarray)  # resident on the device
        np.testing.assert_allclose(gpu.variables[name], value, rtol=rtol * 10, atol=rtol)
    assert gpu.device.kernels.compiled > 0


def test_device_feeds_and_device_results():
    g, train, loss = _mlp()
    X, Y = _data()
    sess = wb.Session(g, device="gpu", results="device")
    value = sess.run(loss, {"x": cp.asarray(X, dtype=cp.float32), "y": cp.asarray(Y)})
    assert isinstance(value, cp.ndarray)
    host = wb.Session(g).run(loss, {"x": X, "y": Y})
    np.testing.assert_allclose(cp.asnumpy(value), host, rtol=1e-5)
    with pytest.raises(wb.FeedError, match="placeholder 'x' expects shape"):
        sess.run(loss, {"x": cp.zeros((4, 3), cp.float32), "y": cp.zeros(4, cp.int64)})


def test_pinned_staging_never_mixes_batches():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(256, 256))
        y = wb.sum(x * 2.0, axis=1)
    sess = wb.Session(g, device="gpu", results="device")
    batches = [np.full((256, 256), i, np.float32) for i in range(12)]
    outs = [sess.run(y, {x: b}) for b in batches]  # queued without waiting, buffers reused in turn
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(cp.asnumpy(out), np.full(256, 512.0 * i, np.float32))


def test_fused_kernels_match_sequential_programs():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(64, 33)).astype(np.float32), rng.normal(size=(33,)).astype(np.float32)
    program = (
        ("constant", (), (("value", 0.5),), "float32"),
        ("multiply", (0, 2), (), "float32"),
        ("sigmoid", (3,), (), "float32"),
        ("maximum", (4, 1), (), "float32"),
        ("greater", (5, 1), (), "bool"),
        ("where", (6, 5, 0), (), "float32"),
        ("cast", (7,), (("dtype", "float64"),), "float64"),
    )
    gpu = wb.Session(wb.Graph(), device="gpu").device
    got = REGISTRY["fused_elementwise"].kernel(gpu.xp, cp.asarray(a), cp.asarray(b), program=program,
                                               compilers=gpu.fused_compilers)  # fmt: skip
    assert isinstance(got, cp.ndarray) and got.dtype == np.float64
    np.testing.assert_allclose(cp.asnumpy(got), run_program(np, program, [a, b]), rtol=1e-6)


@pytest.mark.parametrize("pool", ["default", "managed", "none"])
def test_memory_pools(pool):
    g, train, loss = _mlp()
    X, Y = _data()
    try:
        sess = wb.Session(g, device="gpu", memory_pool=pool, memory_limit=None if pool == "none" else 1 << 30)
        assert np.isfinite(sess.run(loss, {"x": X, "y": Y}))
    finally:
        cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)


def test_missing_device_is_named():
    with pytest.raises(wb.DeviceError, match="does not exist"):
        wb.Session(wb.Graph(), device=f"gpu:{_DEVICES + 3}")
    with pytest.raises(wb.DeviceError, match="memory_pool must be one of"):
        wb.Session(wb.Graph(), device="gpu", memory_pool="huge")
    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)


def test_graph_replay_matches_plain_runs():
    g, train, loss = _mlp()
    X, Y = _data()
    plain = wb.Session(g, seed=1, device="gpu", cuda_graphs=False)
    graphs = wb.Session(g, seed=1, device="gpu", cuda_graphs=True)
    for i in range(8):
        feed = {"x": X[i % 2 :: 2], "y": Y[i % 2 :: 2]}
        a = plain.run([train, loss], feed)[1]
        b = graphs.run([train, loss], feed)[1]
        np.testing.assert_allclose(b, a, rtol=1e-5)  # cuBLAS may pick another algorithm under capture
    (plan_graphs,) = graphs.device.plan_graphs()
    if plan_graphs.obstacle is not None:  # CuPy 14 refuses cuBLAS calls during stream capture
        assert "cuBLAS" in plan_graphs.obstacle or "checks its indices" in plan_graphs.obstacle
        assert graphs.device.graph_replays == 0
    else:
        assert graphs.device.graph_replays == 5  # warm-up, warm-up, capture, then replays
    for name, value in plain.variables.items():
        assert_close(graphs.variables[name], value, rtol=1e-5)
    for name, array in plan_graphs.plan.state.items():
        assert isinstance(array, cp.ndarray), name
    graphs.initialize()  # new variable arrays: the graph is dropped and captured again
    plain.initialize()
    for _ in range(4):
        np.testing.assert_allclose(graphs.run([train, loss], {"x": X, "y": Y})[1],
                                   plain.run([train, loss], {"x": X, "y": Y})[1], rtol=1e-5)  # fmt: skip


def test_fused_kernels_on_flat_views_match_broadcasting():
    rng = np.random.default_rng(4)
    program = (("add", (0, 1), (), "float32"), ("relu", (2,), (), "float32"))
    gpu = wb.Session(wb.Graph(), device="gpu").device
    fused = functools.partial(REGISTRY["fused_elementwise"].kernel, compilers=gpu.fused_compilers)
    xp = gpu.xp
    a, b = (cp.asarray(rng.normal(size=(64, 8, 33)).astype(np.float32)) for _ in range(2))
    flat = fused(xp, a, b, program=program)  # same shapes: 1-D views
    strided = fused(xp, a, cp.ascontiguousarray(b.transpose(2, 1, 0)).transpose(2, 1, 0), program=program)
    assert flat.shape == strided.shape == (64, 8, 33)
    np.testing.assert_array_equal(cp.asnumpy(flat), cp.asnumpy(strided))
    np.testing.assert_array_equal(cp.asnumpy(flat), np.maximum(cp.asnumpy(a) + cp.asnumpy(b), 0))


@pytest.mark.parametrize("size", [4, 7, 1023, 1 << 20, (1 << 20) + 3])
def test_vectorized_kernels_match_elementwise_kernels(size):
    from workbench.gpu.kernels import vector_layout

    rng = np.random.default_rng(size)
    program = (  # an Adam step: lr_t * m / (sqrt(v) + eps), lr_t a 0-d array
        ("multiply", (0, 1), (), "float32"),
        ("sqrt", (2,), (), "float32"),
        ("constant", (), (("value", 1e-8),), "float32"),
        ("add", (4, 5), (), "float32"),
        ("divide", (3, 6), (), "float32"),
    )
    gpu = wb.Session(wb.Graph(), device="gpu").device
    kernels = gpu.kernels
    lr = cp.asarray(np.float32(1e-3))
    m, v = cp.asarray(rng.normal(size=size + 1).astype(np.float32)), cp.asarray(rng.random(size + 1).astype(np.float32))
    call = functools.partial(REGISTRY["fused_elementwise"].kernel, compilers=gpu.fused_compilers)
    before = kernels.vector_calls
    got = call(gpu.xp, lr, m[:size], v[:size], program=program)  # aligned views: vectorized
    assert kernels.vector_calls == before + 1
    elementwise = kernels(gpu.xp, program, [lr, m, v])
    reference = elementwise.elementwise(lr, m[:size], v[:size])  # the ElementwiseKernel alone
    np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(reference), rtol=1e-6)
    np.testing.assert_allclose(
        cp.asnumpy(got), run_program(np, program, [cp.asnumpy(a) for a in (lr, m[:size], v[:size])]), rtol=1e-5
    )
    shifted = call(gpu.xp, lr, m[1:], v[1:], program=program)  # 4 bytes past alignment: the elementwise kernel
    assert vector_layout((lr, m[1:], v[1:]), lambda a: a.data.ptr) is None and kernels.vector_calls == before + 1
    np.testing.assert_allclose(cp.asnumpy(shifted), cp.asnumpy(elementwise.elementwise(lr, m[1:], v[1:])), rtol=1e-6)


def test_vectorized_kernels_fall_back_for_broadcasting():
    rng = np.random.default_rng(5)
    program = (("add", (0, 1), (), "float32"), ("relu", (2,), (), "float32"))
    gpu = wb.Session(wb.Graph(), device="gpu").device
    xp = gpu.xp
    a = cp.asarray(rng.normal(size=(64, 33)).astype(np.float32))
    row = cp.asarray(rng.normal(size=(33,)).astype(np.float32))
    fused = functools.partial(REGISTRY["fused_elementwise"].kernel, compilers=gpu.fused_compilers)
    expected = np.maximum(cp.asnumpy(a) + cp.asnumpy(row), 0)
    np.testing.assert_array_equal(cp.asnumpy(fused(xp, a, row, program=program)), expected)  # broadcast: N-d kernel
    np.testing.assert_array_equal(
        cp.asnumpy(fused(xp, a, a.T.copy().T, program=program)), np.maximum(2 * cp.asnumpy(a), 0)
    )
    np.testing.assert_array_equal(
        cp.asnumpy(fused(xp, a, cp.broadcast_to(row, a.shape) + 0, program=program)), expected
    )


@pytest.mark.parametrize("bad", [-1, 5])
def test_labels_out_of_range_are_errors_on_the_device(bad):
    """CuPy wraps every out-of-range index silently; the kernels' check must catch it on the device."""
    g, train, loss = _mlp()
    X, Y = _data(8)
    Y[6] = bad
    sess = wb.Session(g, device="gpu")
    with pytest.raises(wb.ExecutionError, match=f"label {bad} at position 6 is out of range"):
        sess.run(loss, {"x": X, "y": Y})
    with g.as_default():
        hot = wb.one_hot(wb.placeholder("labels", shape=(None,), dtype="int64"), 5)
        picked = wb.gather(
            wb.placeholder("params", shape=(None, 2)), wb.placeholder("index", shape=(None,), dtype="int32")
        )
    with pytest.raises(wb.ExecutionError, match=f"one_hot .* index {bad} at position 6"):
        sess.run(hot, {"labels": Y})
    with pytest.raises(wb.ExecutionError, match=f"gather .* index {bad} at position 1"):
        sess.run(picked, {"params": np.zeros((5, 2), np.float32), "index": np.array([0, bad], np.int32)})
