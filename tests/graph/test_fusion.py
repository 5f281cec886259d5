"""The elementwise-fusion pass: fused graphs compute what the unfused ones do."""

import numpy as np
import pytest

import workbench as wb
from workbench.graph.fusion import fuse_elementwise
from workbench.graph.passes import optimize, validate
from workbench.graph.plan import Plan
from workbench.ops.fused import FUSED
from workbench.testing import assert_close

UNARY = ["negative", "tanh", "sigmoid", "relu", "abs", "exp_tanh", "sqrt_abs", "log_1p_abs", "sign"]
BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "where_greater", "divide_safe", "pow_abs"]


def _apply(kind, a, b=None):
    if kind == "exp_tanh":
        return wb.exp(wb.tanh(a))
    if kind == "sqrt_abs":
        return wb.sqrt(wb.abs(a))
    if kind == "log_1p_abs":
        return wb.log(wb.abs(a) + 1.0)
    if kind == "where_greater":
        return wb.where(a > b, a, b * 0.5)
    if kind == "divide_safe":
        return a / (wb.abs(b) + 1.0)
    if kind == "pow_abs":
        return wb.pow(wb.abs(a) + 0.5, wb.tanh(b))
    return getattr(wb, kind)(a) if b is None else getattr(wb, kind)(a, b)


def _random_graph(seed, dtype="float32"):
    """A random elementwise DAG over broadcastable placeholders, with fan-out and a few fetches."""
    rng = np.random.default_rng(seed)
    g = wb.Graph(name=f"random{seed}")
    shapes = [(4, 5), (5,), (4, 1), (), (1, 5)]
    with g.as_default():
        pool = [wb.placeholder(f"p{i}", shape=s, dtype=dtype) for i, s in enumerate(shapes)]
        pool.append(wb.constant(np.float32(0.75), dtype=dtype))
        for _ in range(int(rng.integers(6, 16))):
            if rng.random() < 0.4:
                t = _apply(UNARY[rng.integers(len(UNARY))], pool[rng.integers(len(pool))])
            else:
                a, b = (pool[i] for i in rng.integers(len(pool), size=2))
                t = _apply(BINARY[rng.integers(len(BINARY))], a, b)
            pool.append(t)
        outs = [pool[-1]] + [pool[i] for i in rng.integers(len(shapes), len(pool), size=2)]
    feeds = {f"p{i}": rng.normal(size=s).astype(dtype) for i, s in enumerate(shapes)}
    return g, outs, feeds


def _run(graph, fetches, feeds):
    order = [op.name for op in graph.operations if op.type == "placeholder"]
    plan = Plan(graph, fetches, order, np, {}, seed=0)
    with np.errstate(all="ignore"):
        return plan.run([feeds[n] for n in order]), plan


@pytest.mark.parametrize("seed", range(25))
def test_random_graphs_compute_the_same(seed):
    g, outs, feeds = _random_graph(seed)
    names = [t.name for t in outs]
    plain = optimize(g, names, fed=feeds)
    fused = fuse_elementwise(plain, keep=names)
    validate(fused)
    expected, plain_plan = _run(plain, names, feeds)
    got, fused_plan = _run(fused, names, feeds)
    assert len(fused_plan) <= len(plain_plan)
    for e, r in zip(expected, got):
        assert np.shape(e) == np.shape(r) and np.asarray(r).dtype == np.asarray(e).dtype
        np.testing.assert_allclose(r, e, rtol=1e-6, atol=1e-6)


def test_some_random_graph_is_actually_fused():
    counts = []
    for seed in range(25):
        g, outs, _ = _random_graph(seed)
        fused = fuse_elementwise(g, keep=[t.name for t in outs])
        counts.append(sum(op.type == FUSED for op in fused.operations))
    assert sum(counts) > 10


def test_bias_and_activation_become_one_op(graph):
    x = wb.placeholder("x", shape=(None, 3))
    w = wb.variable("w", shape=(3, 4))
    b = wb.variable("b", shape=(4,), init=0.1)
    y = wb.tanh(wb.matmul(x, w) + b, name="y")
    fused = fuse_elementwise(graph, keep=[y.name])
    validate(fused)
    assert [op.type for op in fused.operations] == ["placeholder", "variable", "variable", "matmul", FUSED]
    op = fused.operation("y")
    assert op.attrs["program"] == (("add", (0, 1), (), "float32"), ("tanh", (2,), (), "float32"))
    assert [t.name for t in op.inputs] == ["matmul", "b"]


def test_fetched_inner_results_stay_visible(graph):
    x = wb.placeholder("x", shape=(3,))
    h = wb.exp(x, name="h")
    wb.relu(h - 1.0, name="y")
    fused = fuse_elementwise(graph, keep=["h", "y"])
    assert fused.get("h").op.type == "exp"
    feeds = {"x": np.array([-1.0, 0.0, 2.0], np.float32)}
    (hv, yv), _ = _run(fused, ["h", "y"], feeds)
    assert_close(yv, np.maximum(np.exp(feeds["x"]) - 1.0, 0), rtol=1e-6)


def test_shared_results_are_not_hidden(graph):
    x = wb.placeholder("x", shape=(3,))
    h = wb.exp(x, name="h")
    wb.matmul(wb.reshape(h, (1, 3)), wb.reshape(h * 2.0, (3, 1)), name="out")
    fused = fuse_elementwise(graph, keep=["out"])
    validate(fused)
    assert fused.get("h").op.type == "exp"  # it has two consumers, so it stays


def _mlp(optimizer):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.matmul(x, wb.variable("w1", shape=(6, 8))) + wb.variable("b1", shape=(8,), init=0.1))
        logits = wb.matmul(h, wb.variable("w2", shape=(8, 3))) + wb.variable("b2", shape=(3,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        train = optimizer.minimize(loss)
    return g, train, loss


@pytest.mark.parametrize("optimizer", [wb.optimizers.Adam(0.01, weight_decay=0.01), wb.optimizers.Momentum(0.1, nesterov=True),
                                       wb.optimizers.SGD(0.1, clip_norm=0.5)], ids=["adam", "momentum", "sgd-clip"])  # fmt: skip
def test_training_steps_match_unfused(optimizer):
    g, train, loss = _mlp(optimizer)
    rng = np.random.default_rng(1)
    X, Y = rng.normal(size=(16, 6)).astype(np.float32), rng.integers(0, 3, 16)
    plain, fusing = wb.Session(g), wb.Session(g, device="gpu", emulate=True)
    for _ in range(4):
        a = plain.run([train, loss], {"x": X, "y": Y})[1]
        b = fusing.run([train, loss], {"x": X, "y": Y})[1]
        assert_close(b, a, rtol=1e-6)
    for name, value in plain.variables.items():
        assert_close(fusing.variables[name], value, rtol=1e-5)
    plan = fusing.plan_for([train, loss], {"x": X, "y": Y})
    plain_plan = plain.plan_for([train, loss], {"x": X, "y": Y})
    assert len(plan) < len(plain_plan)
    validate(plan.graph)


def test_adam_update_is_fused():
    g, train, loss = _mlp(wb.optimizers.Adam(0.01))
    graph = optimize(g, [train.name], fed=["x", "y"])
    fused = fuse_elementwise(graph, keep=[train.name])
    programs = [[s[0] for s in op.attrs["program"]] for op in fused.operations if op.type == FUSED]
    assert ["multiply", "sqrt", "constant", "add", "divide"] in programs  # lr_t * m / (sqrt(v) + eps)


def test_loss_tail_with_gradients_matches(graph):
    pred = wb.placeholder("pred", shape=(None, 4), dtype="float64")
    target = wb.placeholder("target", shape=(None, 4), dtype="float64")
    err = pred - target
    loss = wb.mean(wb.where(wb.abs(err) < 1.0, 0.5 * err * err, wb.abs(err) - 0.5), name="loss")  # Huber
    (grad,) = wb.gradients(loss, [pred])
    rng = np.random.default_rng(2)
    feeds = {"pred": rng.normal(size=(8, 4)) * 2, "target": rng.normal(size=(8, 4))}
    names = [loss.name, grad.name]
    plain = optimize(graph, names, fed=feeds)
    fused = fuse_elementwise(plain, keep=names)
    validate(fused)
    assert sum(op.type == FUSED for op in fused.operations) >= 1
    (expected, _), (got, _) = _run(plain, names, feeds), _run(fused, names, feeds)
    for e, r in zip(expected, got):
        np.testing.assert_allclose(r, e, rtol=1e-12)


def test_fused_graph_is_plain_data(graph):
    x = wb.placeholder("x", shape=(None, 2))
    y = wb.cast(wb.sigmoid(x * 3.0) > 0.5, "float32") + x
    fused = fuse_elementwise(graph, keep=[y.name])
    again = wb.Graph.from_json(fused.to_json())
    validate(again)
    assert again.operation(y.name).attrs["program"] == fused.operation(y.name).attrs["program"]
    feeds = {"x": np.array([[0.5, -2.0]], np.float32)}
    (a,), _ = _run(fused, [y.name], feeds)
    (b,), _ = _run(again, [y.name], feeds)
    np.testing.assert_array_equal(a, b)


def test_control_dependencies_survive(graph):
    x = wb.placeholder("x", shape=(2,))
    v = wb.variable("v", shape=(2,), init="zeros")
    step = wb.assign_add(v, 1.0)
    with graph.control_dependencies([step]):
        h = wb.exp(x)
    wb.relu(h - 1.0, name="y")
    fused = fuse_elementwise(graph, keep=["y"])
    validate(fused)
    assert [c.name for c in fused.operation("y").control_inputs] == [step.op.name]


def test_malformed_programs_are_shape_errors(graph):
    x = wb.placeholder("x", shape=(2,))
    with pytest.raises(wb.ShapeError, match="unknown op 'eval'"):
        wb.ops.apply(FUSED, x, program=(("eval", (0,), (), "float32"),))
    with pytest.raises(wb.ShapeError, match="refers to"):
        wb.ops.apply(FUSED, x, program=(("exp", (3,), (), "float32"),))


def test_unsupported_ops_stay_unfused(graph):
    x = wb.placeholder("x", shape=(3,))
    wb.relu(wb.exp(x) + 1.0, name="y")
    fused = fuse_elementwise(graph, keep=["y"], supported=lambda op: op.type != "exp")
    assert fused.get("exp").op.type == "exp"
    assert [s[0] for s in fused.operation("y").attrs["program"]] == ["constant", "add", "relu"]
