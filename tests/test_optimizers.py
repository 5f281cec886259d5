"""Optimizers against straightforward NumPy references, step by step, in float64."""

import numpy as np
import pytest

import workbench as wb

RNG = np.random.default_rng(0)
X = RNG.normal(size=(16, 3))
Y = X @ np.array([1.5, -2.0, 0.5]) + 0.25 + 0.1 * RNG.normal(size=16)
W0 = RNG.normal(size=(3,))
B0 = np.array([0.3])


def build(optimizer, var_list=None):
    g = wb.Graph(name="linear")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="float64")
        w = wb.variable("w", init=W0, dtype="float64")
        b = wb.variable("b", init=B0, dtype="float64")
        loss = wb.mean((wb.sum(x * w, axis=1) + b - y) ** 2)
        names = None if var_list is None else [{"w": w, "b": b}[n] for n in var_list]
        train = optimizer.minimize(loss, var_list=names)
    return g, train


def grads(w, b):
    r = X @ w + b - Y
    return {"w": 2 * X.T @ r / len(Y), "b": np.array([2 * r.mean()])}


def clipped(gs, clip_norm):
    if clip_norm is None:
        return gs
    norm = np.sqrt(sum(np.sum(g * g) for g in gs.values()))
    return {k: g * (clip_norm / max(norm, clip_norm)) for k, g in gs.items()}


def sgd_reference(lr, steps, weight_decay=0.0, clip_norm=None):
    p = {"w": W0.copy(), "b": B0.copy()}
    for _ in range(steps):
        gs = clipped(grads(p["w"], p["b"]), clip_norm)
        p = {k: p[k] - lr * (gs[k] + weight_decay * p[k]) for k in p}
        yield p


def momentum_reference(lr, mu, steps, nesterov=False, weight_decay=0.0, clip_norm=None):
    p = {"w": W0.copy(), "b": B0.copy()}
    acc = {k: np.zeros_like(v) for k, v in p.items()}
    for _ in range(steps):
        gs = clipped(grads(p["w"], p["b"]), clip_norm)
        new = {}
        for k in p:
            g = gs[k] + weight_decay * p[k]
            acc[k] = mu * acc[k] + g
            step = g + mu * acc[k] if nesterov else acc[k]
            new[k] = p[k] - lr * step
        p = new
        yield p


def adam_reference(lr, steps, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=None):
    """Kingma & Ba, Algorithm 1 with the reordering of their section 2 (as TensorFlow 1.x):
    lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); p -= lr_t * m / (sqrt(v) + eps); decoupled decay."""
    p = {"w": W0.copy(), "b": B0.copy()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(val) for k, val in p.items()}
    for t in range(1, steps + 1):
        gs = clipped(grads(p["w"], p["b"]), clip_norm)
        lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        new = {}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * gs[k]
            v[k] = b2 * v[k] + (1 - b2) * gs[k] * gs[k]
            new[k] = p[k] - lr_t * m[k] / (np.sqrt(v[k]) + eps) - lr * weight_decay * p[k]
        p = new
        yield p


CASES = {
    "sgd": (lambda: wb.optimizers.SGD(0.05), lambda n: sgd_reference(0.05, n)),
    "sgd_decay": (
        lambda: wb.optimizers.SGD(0.05, weight_decay=0.1),
        lambda n: sgd_reference(0.05, n, weight_decay=0.1),
    ),
    "sgd_clip": (lambda: wb.optimizers.SGD(0.05, clip_norm=0.5), lambda n: sgd_reference(0.05, n, clip_norm=0.5)),
    "momentum": (lambda: wb.optimizers.Momentum(0.02, momentum=0.8), lambda n: momentum_reference(0.02, 0.8, n)),
    "nesterov": (
        lambda: wb.optimizers.Momentum(0.02, momentum=0.9, nesterov=True),
        lambda n: momentum_reference(0.02, 0.9, n, nesterov=True),
    ),
    "momentum_decay_clip": (
        lambda: wb.optimizers.Momentum(0.02, momentum=0.9, weight_decay=0.05, clip_norm=1.0),
        lambda n: momentum_reference(0.02, 0.9, n, weight_decay=0.05, clip_norm=1.0),
    ),
    "adam": (lambda: wb.optimizers.Adam(0.05), lambda n: adam_reference(0.05, n)),
    "adam_betas": (
        lambda: wb.optimizers.Adam(0.01, beta1=0.5, beta2=0.9, epsilon=1e-3),
        lambda n: adam_reference(0.01, n, b1=0.5, b2=0.9, eps=1e-3),
    ),
    "adamw_clip": (
        lambda: wb.optimizers.Adam(0.05, weight_decay=0.1, clip_norm=0.3),
        lambda n: adam_reference(0.05, n, weight_decay=0.1, clip_norm=0.3),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy_reference_step_by_step(case):
    make, reference = CASES[case]
    g, train = build(make())
    sess = wb.Session(g)
    feed = {"x": X, "y": Y}
    steps = 25
    for step, expected in enumerate(reference(steps), start=1):
        sess.run(train, feed)
        for name in ("w", "b"):
            np.testing.assert_allclose(
                sess.variables[name], expected[name], rtol=1e-10, atol=1e-14, err_msg=f"{name} at step {step}"
            )
    # and they optimize
    first = next(iter(reference(1)))
    assert not np.allclose(sess.variables["w"], first["w"])


def test_clipping_is_by_global_norm():
    # with a large norm every gradient is scaled by the same factor
    g, train = build(wb.optimizers.SGD(1.0, clip_norm=1e-3))
    sess = wb.Session(g)
    sess.run(train, {"x": X, "y": Y})
    delta = np.concatenate([W0 - sess.variables["w"], B0 - sess.variables["b"]])
    np.testing.assert_allclose(np.linalg.norm(delta), 1e-3, rtol=1e-10)
    gs = grads(W0, B0)
    full = np.concatenate([gs["w"], gs["b"]])
    np.testing.assert_allclose(delta / np.linalg.norm(delta), full / np.linalg.norm(full), rtol=1e-10)


@pytest.mark.parametrize(
    "make, slots",
    [
        (lambda: wb.optimizers.SGD(0.1), []),
        (lambda: wb.optimizers.Momentum(0.1), ["Momentum/w/momentum", "Momentum/b/momentum"]),
        (lambda: wb.optimizers.Adam(0.1), ["Adam/w/m", "Adam/w/v", "Adam/b/m", "Adam/b/v"]),
    ],
)
def test_slot_variables(make, slots):
    g, train = build(make())
    found = [v for v in g.variables if v.name not in ("w", "b")]
    assert set(slots) <= {v.name for v in found}
    assert all(not v.trainable for v in found)
    assert {v.name for v in g.trainable_variables} == {"w", "b"}
    for name in slots:
        assert g.get(name).shape == g.get(name.split("/")[1]).shape
    sess = wb.Session(g)
    sess.run(train, {"x": X, "y": Y})
    assert set(sess.variables) == {v.name for v in g.variables}
    for name in slots:
        assert np.any(sess.variables[name] != 0)


def test_adam_counts_steps():
    g, train = build(wb.optimizers.Adam(0.1))
    (step,) = [v for v in g.variables if v.name.endswith("step")]
    assert not step.trainable
    sess = wb.Session(g)
    for _ in range(3):
        sess.run(train, {"x": X, "y": Y})
    assert sess.variables[step.name] == 3


@pytest.mark.parametrize(
    "make", [lambda: wb.optimizers.SGD(0.1), lambda: wb.optimizers.Momentum(0.1), lambda: wb.optimizers.Adam(0.1)]
)
def test_var_list_limits_the_updates(make):
    g, train = build(make(), var_list=["b"])
    sess = wb.Session(g)
    for _ in range(3):
        sess.run(train, {"x": X, "y": Y})
    np.testing.assert_array_equal(sess.variables["w"], W0)
    assert not np.array_equal(sess.variables["b"], B0)
    assert not any(v.name.startswith(("Momentum/w/", "Adam/w/")) for v in g.variables)


def test_two_optimizers_in_one_graph():
    g = wb.Graph()
    with g.as_default():
        w = wb.variable("w", init=np.array([1.0, -1.0]), dtype="float64")
        loss = wb.sum(w * w)
        a = wb.optimizers.Adam(0.1).minimize(loss)
        b = wb.optimizers.Adam(0.1).minimize(loss)
        with wb.name_scope("finetune"):
            c = wb.optimizers.Momentum(0.1).minimize(loss)
            d = wb.optimizers.Momentum(0.1).minimize(loss)
    names = [op.name for op in g.operations]
    assert len(names) == len(set(names))
    assert (a.name, b.name) == ("Adam/update", "Adam_1/update")
    assert (c.name, d.name) == ("finetune/Momentum/update", "finetune/Momentum_1/update")
    assert "finetune/Momentum_1/w/momentum" in g
    sess = wb.Session(g)
    sess.run(a)
    sess.run(b)
    assert sess.variables["Adam/step"] == 1 and sess.variables["Adam_1/step"] == 1


def test_learning_rate_as_a_tensor():
    g = wb.Graph()
    with g.as_default():
        lr = wb.placeholder("lr", shape=(), dtype="float64")
        w = wb.variable("w", init=np.array([1.0, -2.0]), dtype="float64")
        train = wb.optimizers.SGD(lr).minimize(wb.sum(w * w))
    sess = wb.Session(g)
    sess.run(train, {lr: 0.25})
    np.testing.assert_allclose(sess.variables["w"], [0.5, -1.0])
    sess.run(train, {lr: 0.0})
    np.testing.assert_allclose(sess.variables["w"], [0.5, -1.0])


def test_bad_arguments():
    with pytest.raises(wb.GraphError, match="learning_rate must be positive"):
        wb.optimizers.SGD(0.0)
    with pytest.raises(wb.GraphError, match="clip_norm must be positive"):
        wb.optimizers.Adam(0.1, clip_norm=-1)
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(2,), dtype="float64")
        w = wb.variable("w", shape=(2,), init=1.0, dtype="float64")
        frozen = wb.variable("f", shape=(2,), init=1.0, dtype="float64", trainable=False)
        with pytest.raises(wb.GradientError, match="does not depend on any of the variables w"):
            wb.optimizers.SGD(0.1).minimize(wb.sum(x * frozen))
        with pytest.raises(wb.GraphError, match="no trainable variables"):
            wb.optimizers.SGD(0.1).minimize(wb.sum(x), var_list=[])
        assert w.trainable
