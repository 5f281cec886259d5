"""Fused parameter-group updates and cross-entropy with its gradient: same results, fewer ops."""

import collections

import numpy as np
import pytest

import workbench as wb
from workbench.graph.passes import optimize, validate
from workbench.graph.step_fusion import fuse_cross_entropy, fuse_step, fuse_updates
from workbench.testing import assert_close

OPTIMIZERS = {
    "adam": lambda: wb.optimizers.Adam(0.05),
    "adamw_clipped": lambda: wb.optimizers.Adam(0.05, weight_decay=0.01, clip_norm=0.5),
    "momentum": lambda: wb.optimizers.Momentum(0.1),
    "nesterov_decay": lambda: wb.optimizers.Momentum(0.1, nesterov=True, weight_decay=0.1),
    "sgd_clipped": lambda: wb.optimizers.SGD(0.1, clip_norm=0.1),
    "sgd_decay": lambda: wb.optimizers.SGD(0.1, weight_decay=0.05),
}


def _mlp(optimizer, mixed=False, dropout=False):
    g = wb.Graph(name="mlp")
    with g.as_default(), wb.mixed_precision("float16" if mixed else "float32"):
        x = wb.placeholder("x", shape=(None, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.matmul(x, wb.variable("w1", shape=(6, 8))) + wb.variable("b1", shape=(8,), init=0.1))
        if dropout:
            h = wb.dropout(h, 0.25)
        logits = wb.matmul(h, wb.variable("w2", shape=(8, 3))) + wb.variable("b2", shape=(3,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        train = optimizer.minimize(loss, loss_scale="dynamic" if mixed else None)
    return g, train, loss


def _batches(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(16, 6)).astype(np.float32), "y": rng.integers(0, 3, 16)} for _ in range(n)]


def _step_ops(sess) -> collections.Counter:
    plan, *_ = sess.plans.values()
    return collections.Counter(op.type for op in plan.step_ops)


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "float16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_steps_give_the_unfused_losses_and_weights(name, mixed):
    g, train, loss = _mlp(OPTIMIZERS[name](), mixed)
    cpu = wb.Session(g, seed=1)
    gpu = wb.Session(g, seed=1, device="gpu", emulate=True)  # the GPU's graph rewrite, on NumPy
    for batch in _batches():
        np.testing.assert_array_equal(gpu.run([train, loss], batch)[1], cpu.run([train, loss], batch)[1])
    for k, v in cpu.variables.items():
        np.testing.assert_array_equal(gpu.variables[k], v, err_msg=k)
    ops_ = _step_ops(gpu)
    assert ops_["softmax_cross_entropy_with_grad"] == 1 and "softmax_cross_entropy_grad" not in ops_
    assert ops_["fused_update"] >= 1 and ops_["assign"] + ops_["assign_sub"] <= (3 if mixed else 0)


def test_one_adam_kernel_updates_every_parameter():
    g, train, loss = _mlp(wb.optimizers.Adam(0.01))
    sess = wb.Session(g, device="gpu", emulate=True)
    sess.run(train, _batches(1)[0])
    (plan,) = sess.plans.values()
    (update,) = [op for op in plan.step_ops if op.type == "fused_update"]
    assert update.attrs["lanes"] == 4 and update.attrs["width"] == 4 and len(update.outputs) == 12
    assert [t.op.name for t in update.inputs[:4]] == ["Adam/w1/m", "Adam/w1/v", "w1", "gradients/matmul_3"]
    assert update.inputs[-1].shape == ()  # the bias-corrected learning rate, shared by the lanes
    # what is left of the optimizer: the step count and its learning rate
    assert [op.type for op in plan.step_ops[-3:]] == ["assign_add", "fused_elementwise", "fused_update"]


def test_updates_write_into_the_variables_arrays():
    g, train, loss = _mlp(wb.optimizers.Momentum(0.1))
    sess = wb.Session(g, device="gpu", emulate=True)
    batch = _batches(1)[0]
    sess.run(train, batch)
    state = sess.plan_for(train, batch).state  # the variables' arrays, shared by the session's plans
    arrays = {k: id(v) for k, v in state.items()}
    for _ in range(3):
        sess.run(train, batch)
    assert {k: id(v) for k, v in state.items()} == arrays
    before = np.array(sess.variables["w1"])
    w1 = sess.run([train, g.get("w1")], batch)[1]  # the read is fetched: the update makes a new array
    np.testing.assert_array_equal(w1, before)
    assert id(state["w1"]) != arrays["w1"]


def test_fetched_updates_and_twice_updated_variables_stay_as_they_are():
    g, train, loss = _mlp(wb.optimizers.SGD(0.1))
    with g.as_default():
        again = wb.assign_add(g.get("w2"), wb.constant(np.ones((8, 3), np.float32)) * 0.5, name="again")
    graph = optimize(g, [train.name, again.name, "SGD/assign_sub"])
    fused = fuse_updates(graph, keep=[train.name, again.name, "SGD/assign_sub"])
    validate(fused)
    (update,) = [op for op in fused.operations if op.type == "fused_update"]
    assert update.attrs["lanes"] == 2  # b1 and b2: w1's update is fetched, w2 is updated twice
    assert {t.op.name for t in update.inputs[::2][:2]} == {"b1", "b2"}


def test_cross_entropy_stays_when_its_softmax_is_needed_elsewhere_or_the_loss_is_weighted():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(4, 3))
        rows = wb.softmax_cross_entropy(wb.matmul(x, w), y)
        weighted = wb.sum(rows * wb.placeholder("weights", shape=(None,)), name="loss")
        train = wb.optimizers.SGD(0.1).minimize(weighted)
    graph = optimize(g, [train.name])
    assert fuse_cross_entropy(graph, keep=[train.name]) is graph


def test_summed_loss_and_hoisted_upstream():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(4, 3))
        loss = wb.sum(wb.softmax_cross_entropy(wb.matmul(x, w), y)) * 0.5 + wb.sum(w * w)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    graph = optimize(g, [train.name, loss.name])
    fused = fuse_step(graph, keep=[train.name, loss.name])
    validate(fused)
    assert [op.type for op in fused.operations].count("softmax_cross_entropy_with_grad") == 1
    feed = {"x": np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32), "y": np.array([0, 2, 1, 1, 0])}
    cpu, gpu = wb.Session(g, seed=4), wb.Session(g, seed=4, device="gpu", emulate=True)
    for _ in range(3):
        assert_close(gpu.run([train, loss], feed)[1], cpu.run([train, loss], feed)[1], rtol=1e-6)
    assert_close(gpu.variables["w"], cpu.variables["w"], rtol=1e-6)


def test_random_ops_keep_their_draws_in_fused_steps():
    g, train, loss = _mlp(wb.optimizers.Adam(0.05), dropout=True)
    cpu, gpu = wb.Session(g, seed=2), wb.Session(g, seed=2, device="gpu", emulate=True)
    for batch in _batches(3):
        np.testing.assert_array_equal(gpu.run([train, loss], batch)[1], cpu.run([train, loss], batch)[1])
    assert _step_ops(gpu)["fused_update"] == 1
