"""Fused training steps, float16 chains and captured matmuls on a real CUDA device (skipped without one)."""

import time

import numpy as np
import pytest

import workbench as wb
from workbench.ops import fused_train
from workbench.testing import assert_close

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")
try:
    _DEVICES = cp.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    _DEVICES = 0
if _DEVICES == 0:
    pytest.skip("no CUDA device", allow_module_level=True)


def _mlp(optimizer, mixed=False):
    g = wb.Graph(name="mlp")
    with g.as_default(), wb.mixed_precision("float16" if mixed else "float32"):
        x = wb.placeholder("x", shape=(None, 24))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.matmul(x, wb.variable("w1", shape=(24, 64))) + wb.variable("b1", shape=(64,), init=0.1))
        logits = wb.matmul(h, wb.variable("w2", shape=(64, 7))) + wb.variable("b2", shape=(7,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        train = optimizer.minimize(loss, loss_scale="dynamic" if mixed else None)
    return g, train, loss


def _feed(n=96, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 24)).astype(np.float32), "y": rng.integers(0, 7, n)}


@pytest.mark.parametrize("make", [lambda: wb.optimizers.Adam(0.01, weight_decay=0.01, clip_norm=1.0),
                                  lambda: wb.optimizers.Momentum(0.05, nesterov=True, weight_decay=0.1),
                                  lambda: wb.optimizers.SGD(0.1)], ids=["adamw", "nesterov", "sgd"])  # fmt: skip
def test_fused_updates_and_cross_entropy_run_as_generated_kernels(make):
    g, train, loss = _mlp(make())
    cpu, gpu = wb.Session(g, seed=3), wb.Session(g, seed=3, device="gpu")
    updates, cross_entropy = (
        fused_train.DEVICE_KERNELS[k][0] for k in (fused_train.FUSED_UPDATE, fused_train.SCE_WITH_GRAD)
    )
    calls = updates.calls, cross_entropy.calls
    for i in range(5):
        feed = _feed(seed=i)
        np.testing.assert_allclose(gpu.run([train, loss], feed)[1], cpu.run([train, loss], feed)[1], rtol=1e-4)
    for name, value in cpu.variables.items():
        assert_close(gpu.variables[name], value, rtol=1e-3, err_msg=name)
    assert updates.calls - calls[0] == 5 and cross_entropy.calls - calls[1] == 5


def test_mixed_precision_steps_fuse_float16_chains():
    g, train, loss = _mlp(wb.optimizers.Adam(0.01), mixed=True)
    cpu, gpu = wb.Session(g, seed=3), wb.Session(g, seed=3, device="gpu")
    for i in range(5):
        feed = _feed(seed=i)
        np.testing.assert_allclose(gpu.run([train, loss], feed)[1], cpu.run([train, loss], feed)[1], rtol=2e-2)
    (plan,) = gpu.plans.values()
    half = [op for op in plan.step_ops if op.type == "fused_elementwise" and op.outputs[0].dtype == "float16"]
    assert half, [op.type for op in plan.step_ops]


@pytest.mark.parametrize("dtype,rtol", [("float16", 2e-2), ("float32", 1e-5), ("float64", 1e-12)])
def test_capturable_matmul_matches_cupy(dtype, rtol):
    from workbench.gpu.blas import CapturableMatmul

    matmul = CapturableMatmul(cp, cp.matmul)
    matmul.bind(cp.cuda.get_current_stream().ptr)
    rng = np.random.default_rng(1)
    for ta, tb in [(False, False), (True, False), (False, True), (True, True)]:
        a = cp.asarray(rng.normal(size=(48, 80) if ta else (80, 48)).astype(dtype))
        b = cp.asarray(rng.normal(size=(33, 48) if tb else (48, 33)).astype(dtype))
        a, b = (a.T if ta else a), (b.T if tb else b)
        np.testing.assert_allclose(cp.asnumpy(matmul(a, b)), cp.asnumpy(cp.matmul(a, b)), rtol=rtol, atol=rtol)
    assert matmul.calls == 4 and matmul.fallbacks == 0
    matmul.close()


def test_a_whole_step_is_captured_and_replayed():
    g, train, loss = _mlp(wb.optimizers.Adam(0.01))
    plain = wb.Session(g, seed=3, device="gpu")
    graphs = wb.Session(g, seed=3, device="gpu", cuda_graphs=True)
    seen = []
    graphs.events.subscribe(lambda e: seen.append(e) if e["kind"] == "graph_capture" else None)
    feed = {k: cp.asarray(v) for k, v in _feed().items()}
    for _ in range(6):
        np.testing.assert_allclose(graphs.run([train, loss], feed)[1], plain.run([train, loss], feed)[1], rtol=1e-5)
    assert [e["status"] for e in seen] == ["captured"], seen
    assert graphs.device.graph_replays == 3
    cp.cuda.Device().synchronize()
    started = time.perf_counter()
    for _ in range(50):
        graphs.run(train, feed)
    host = (time.perf_counter() - started) / 50
    cp.cuda.Device().synchronize()
    print(f"host time per captured step: {host * 1e6:.1f} us")


def test_convolutions_run_as_generated_kernels_and_one_product_each():
    from workbench.ops.fused import DEVICE_KERNELS

    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 16, 16))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.max_pool2d(
            wb.relu(wb.conv2d(x, wb.variable("c1", shape=(8, 3, 3, 3), init="he_uniform"), padding="same")), 2
        )
        h = wb.relu(wb.conv2d(h, wb.variable("c2", shape=(16, 8, 3, 3), init="he_uniform"), stride=2, padding="same"))
        logits = wb.matmul(wb.reshape(h, (-1, 16 * 16)), wb.variable("w", shape=(16 * 16, 5)))
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    cpu, gpu = wb.Session(g, seed=1), wb.Session(g, seed=1, device="gpu")
    conv = DEVICE_KERNELS["conv2d"][0].__self__
    before = conv.calls
    rng = np.random.default_rng(7)
    for _ in range(3):
        feed = {"x": rng.normal(size=(12, 3, 16, 16)).astype(np.float32), "y": rng.integers(0, 5, 12)}
        np.testing.assert_allclose(gpu.run([train, loss], feed)[1], cpu.run([train, loss], feed)[1], rtol=1e-4)
    for k, v in cpu.variables.items():
        assert_close(gpu.variables[k], v, rtol=1e-3, err_msg=k)
    assert conv.calls - before == 3 * 5
