"""Placeholders with a default, fit(feed_dict=...) and dropout that knows training from inference."""

import numpy as np
import pytest

import workbench as wb
from workbench.graph.passes import optimize, validate
from workbench.training import batch_indices


def model(rate=0.5):
    """A small classifier with dropout switched by a ``training`` placeholder that defaults to False."""
    g = wb.Graph(name="switch")
    with g.as_default():
        training = wb.placeholder("training", shape=(), dtype="bool", default=False)
        x = wb.placeholder("x", shape=(None, 6), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(6, 16), dtype="float64")
        v = wb.variable("v", shape=(16, 3), dtype="float64")
        h = wb.dropout(wb.tanh(x @ w), rate, training=training)
        logits = h @ v
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, x, y, h, loss, train


def data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 6)), "y": rng.integers(0, 3, n)}


def test_a_placeholder_with_a_default_need_not_be_fed():
    g = wb.Graph()
    with g.as_default():
        scale = wb.placeholder("scale", shape=(), default=2.0)
        x = wb.placeholder("x", shape=(None,))
        y = x * scale
    sess = wb.Session(g)
    assert sess.run(y, {x: [1.0, 3.0]}).tolist() == [2.0, 6.0]
    assert sess.run(y, {x: [1.0, 3.0], scale: 10.0}).tolist() == [10.0, 30.0]
    assert g.get("scale").op.attrs["default"].dtype == np.float32


def test_a_placeholder_without_a_default_must_still_be_fed():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None,))
        y = x * wb.placeholder("scale", shape=(), default=2.0)
    with pytest.raises(wb.FeedError, match="placeholder 'x' .* must be fed"):
        wb.Session(g).run(y)


def test_defaults_are_saved_with_the_graph():
    g, x, _, h, _, _ = model()
    copy = wb.Graph.from_json(g.to_json())
    default = copy.get("training").op.attrs["default"]
    assert default.dtype == np.bool_ and default.shape == () and not default
    feed = {"x": data()["x"]}
    np.testing.assert_array_equal(wb.Session(copy).run(h.name, feed), wb.Session(g).run(h, feed))


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: wb.placeholder("p", shape=(2,), default=[1.0, 2.0, 3.0]), wb.ShapeError,
         r"placeholder 'p': default of shape \(3,\) does not fit placeholder shape \(2,\)"),
        (lambda: wb.placeholder("p", shape=(None, 2), default=[1.0, 2.0]), wb.ShapeError,
         r"default of shape \(2,\) does not fit placeholder shape \(None, 2\)"),
        (lambda: wb.placeholder("p", shape=(), dtype="int32", default="yes"), wb.DTypeError,
         r"placeholder 'p': default 'yes' is not a int32 value"),
    ],
)  # fmt: skip
def test_a_default_that_does_not_fit_is_refused(make, error, message):
    with wb.Graph().as_default(), pytest.raises(error, match=message):
        make()


def test_a_file_with_a_default_of_the_wrong_dtype_is_a_format_error():
    g = wb.Graph()
    with g.as_default():
        wb.placeholder("training", shape=(), dtype="bool", default=False)
    text = g.to_json().replace('"dtype": "bool", "default"', '"dtype": "float32", "default"')
    with pytest.raises(wb.FormatError, match="placeholder default must be a float32 array, got bool"):
        wb.Graph.from_json(text)


def test_an_unfed_switch_prunes_the_dropout_away():
    g, x, _, h, _, _ = model()
    pruned = optimize(g, [h.name], fed=["x"])
    validate(pruned)
    types = {op.type for op in pruned.operations}
    assert "dropout" not in types and "where" not in types and "placeholder" in types
    fed = optimize(g, [h.name], fed=["x", "training"])
    assert {"dropout", "where"} <= {op.type for op in fed.operations}


def test_dropout_follows_the_switch():
    g, x, _, h, _, _ = model()
    sess = wb.Session(g, seed=1)
    feed = {"x": data()["x"]}
    plain = sess.run(h, feed)
    dropped = sess.run(h, {**feed, "training": True})
    zero = dropped == 0
    assert 0.3 < zero.mean() < 0.7
    np.testing.assert_allclose(dropped[~zero], 2 * plain[~zero], rtol=1e-12)
    np.testing.assert_array_equal(sess.run(h, {**feed, "training": False}), plain)


def test_dropout_with_python_bools_and_the_old_call():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        assert wb.dropout(x, 0.5, training=False) is x
        on = wb.dropout(x, 0.5, training=True, seed=3)
        old = wb.dropout(x, 0.5, seed=3)
    sess = wb.Session(g)
    ones = np.ones((8, 4), np.float32)
    a, b = sess.run([on, old], {x: ones}, step=0)
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) <= {0.0, 2.0}


def test_dropout_with_a_tensor_rate_keep_prob_style():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype="float64")
        rate = wb.placeholder("rate", shape=(), dtype="float64", default=0.0)
        y = wb.dropout(x, rate, seed=2)
        loss = wb.sum(y * y)
        (gx,) = wb.gradients(loss, [x])
    sess = wb.Session(g)
    x0 = np.random.default_rng(0).normal(size=(200, 4))
    np.testing.assert_array_equal(sess.run(y, {x: x0}), x0)
    quarter, grad = sess.run([y, gx], {x: x0, rate: 0.25}, step=0)
    kept = quarter != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(quarter[kept], x0[kept] / 0.75, rtol=1e-12)
    np.testing.assert_allclose(grad, 2 * quarter / 0.75 * kept, rtol=1e-12)
    assert not sess.run(y, {x: x0, rate: 1.0}).any()
    # the same draws as a float rate
    with g.as_default():
        fixed = wb.dropout(x, 0.25, seed=2)
    np.testing.assert_array_equal(sess.run(fixed, {x: x0}, step=0), quarter)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda x: wb.dropout(x, 0.5, 3), wb.ArgumentError, "training must be a bool or a bool tensor, got 3"),
        (lambda x: wb.dropout(x, 0.5, training=x), wb.DTypeError,
         r"training must be a bool, or a scalar bool tensor, got float32 tensor of shape \(None, 4\)"),
        (lambda x: wb.dropout(x, wb.placeholder("r", (), "int32")), wb.DTypeError,
         "a rate tensor must be a float scalar, got int32"),
    ],
)  # fmt: skip
def test_dropout_arguments_that_do_not_fit(make, error, message):
    with wb.Graph().as_default():
        x = wb.placeholder("x", shape=(None, 4))
        with pytest.raises(error, match=message):
            make(x)


def test_fit_feeds_the_fixed_values_at_every_step_and_validates_without_them():
    g, x, y, h, loss, train = model()
    d, held = data(), data(n=30, seed=1)
    sess = wb.Session(g, seed=3)
    hist = sess.fit(train, d, batch_size=16, steps=6, fetches={"loss": loss},
                    feed_dict={"training": True}, validation=(held, 3))  # fmt: skip
    # the training steps ran with dropout: the same as feeding the switch by hand
    by_hand = wb.Session(g, seed=3)
    for step, idx in enumerate(batch_indices(48, 16, 6, seed=(3, 1)), start=1):
        by_hand.run(train, {"x": d["x"][idx], "y": d["y"][idx], "training": True}, step=step - 1)
        if step % 3 == 0:  # validation: dropout off
            val = by_hand.run(loss, held)
            assert hist.records[step - 1]["val_loss"] == pytest.approx(float(val), rel=1e-12)
    for name, value in by_hand.variables.items():
        np.testing.assert_allclose(sess.variables[name], value, rtol=1e-12, err_msg=name)
    plain = wb.Session(g, seed=3)
    plain.fit(train, d, batch_size=16, steps=6)
    assert not np.allclose(plain.variables["w"], sess.variables["w"])  # without feed_dict: no dropout


def test_fit_feed_dict_errors():
    g, x, y, h, loss, train = model()
    sess = wb.Session(g)
    with pytest.raises(wb.FeedError, match="feeds placeholder 'x' both in data .* and in feed_dict"):
        sess.fit(train, data(), batch_size=8, steps=1, feed_dict={"x": np.zeros((8, 6))})
    with pytest.raises(wb.FeedError, match="placeholder 'training' expects bool values, got float64"):
        sess.fit(train, data(), batch_size=8, steps=1, feed_dict={"training": 1.5})
    with pytest.raises(wb.FeedError, match="graph 'switch' has no placeholder named 'nope'"):
        sess.fit(train, data(), batch_size=8, steps=1, feed_dict={"nope": True})
