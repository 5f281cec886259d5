"""The plan reuses buffers (donated intermediates, in-place variable updates) without
changing what any caller sees."""

import numpy as np

import workbench as wb
from workbench.testing import assert_close


def _model():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        w = wb.variable("w", init=np.arange(6, dtype=np.float32).reshape(3, 2) / 10)
        b = wb.variable("b", shape=(2,), init=0.5)
        h = wb.relu(wb.matmul(x, w) + b)
        loss = wb.mean(h * h)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, x, w, b, h, loss, train


def test_fetched_variables_are_not_changed_by_later_updates():
    g, x, w, b, h, loss, train = _model()
    sess = wb.Session(g)
    X = np.ones((4, 3), np.float32)
    before = sess.run(w)
    kept = before.copy()
    for _ in range(3):
        sess.run(train, {x: X})
    np.testing.assert_array_equal(before, kept)
    assert not np.array_equal(sess.run(w), kept)


def test_reads_in_the_same_run_see_the_values_from_its_start():
    g, x, w, b, h, loss, train = _model()
    sess = wb.Session(g)
    X = np.ones((4, 3), np.float32)
    sess.run(train, {x: X})  # the plan now owns the variables' arrays
    start = sess.variables["w"]
    _, seen = sess.run([train, w], {x: X})
    np.testing.assert_array_equal(seen, start)
    assert not np.array_equal(sess.variables["w"], start)


def test_in_place_training_matches_fresh_arrays():
    g, x, w, b, h, loss, train = _model()
    X = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    sess = wb.Session(g)
    losses = [float(sess.run([loss, train], {x: X})[0]) for _ in range(5)]
    wv, bv = np.arange(6, dtype=np.float32).reshape(3, 2) / 10, np.full(2, 0.5, np.float32)
    for i in range(5):
        pre = X @ wv + bv
        hv = np.maximum(pre, 0)
        assert abs(losses[i] - float(np.mean(hv * hv))) < 1e-6
        gh = 2 * hv / hv.size * (pre > 0)
        wv, bv = wv - 0.1 * (X.T @ gh), bv - 0.1 * gh.sum(0)
    assert_close(sess.variables["w"], wv, rtol=1e-5)
    assert sess.variables["w"].dtype == np.float32


def test_variables_that_share_an_array_stay_apart():
    g = wb.Graph()
    with g.as_default():
        a = wb.variable("a", shape=(3,), init=1.0)
        b = wb.variable("b", shape=(3,), init=2.0)
        copy = wb.assign(a, b)
        bump = wb.assign_add(b, wb.constant(np.ones(3, np.float32)))
    sess = wb.Session(g)
    sess.run(bump)
    sess.run(copy)
    sess.run(bump)
    sess.run(bump)
    np.testing.assert_array_equal(sess.variables["a"], [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(sess.variables["b"], [5.0, 5.0, 5.0])


def test_fed_arrays_are_never_written():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        y = wb.relu(wb.identity(x) * 2.0 + 1.0)
    X = np.array([[1.0, -3.0]], np.float32)
    out = wb.Session(g).run(y, {x: X})
    np.testing.assert_array_equal(X, [[1.0, -3.0]])
    np.testing.assert_array_equal(out, [[3.0, 0.0]])


def test_adam_updates_write_into_the_variables_own_arrays():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        w = wb.variable("w", shape=(3, 2))
        loss = wb.mean(wb.matmul(x, w) ** 2.0)
        train = wb.optimizers.Adam(0.1).minimize(loss)
    X = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    sess, fresh = wb.Session(g), wb.Session(g)
    sess.run(train, {x: X})  # the first run makes the arrays the plan then owns
    state = sess.plan_for(train, {x: X}).state  # the variables' arrays, as the plans hold them
    held = dict(state)
    for _ in range(3):
        sess.run(train, {x: X})
    assert all(state[name] is array for name, array in held.items())
    for _ in range(4):  # same values as a session whose plan is rebuilt every step
        fresh.plans.clear()
        fresh.run(train, {x: X})
    for name, value in fresh.variables.items():
        assert_close(sess.variables[name], value, rtol=1e-6)
