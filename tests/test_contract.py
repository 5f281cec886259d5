"""The user-facing contract of issue 2, run exactly as written."""

import numpy as np
import pytest
from sklearn.datasets import load_digits

import workbench as wb

X, Y = load_digits(return_X_y=True)  # X float64 (1797, 64), Y int64


def build_and_train():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))  # dtype defaults to "float32"
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w1 = wb.variable("w1", shape=(64, 32), init="glorot_uniform")  # init: a name, a scalar or an ndarray
        b1 = wb.variable("b1", shape=(32,), init="zeros")
        w2 = wb.variable("w2", shape=(32, 10), init="glorot_uniform")
        b2 = wb.variable("b2", shape=(10,), init="zeros")
        h = wb.relu(wb.matmul(x, w1) + b1)
        logits = wb.matmul(h, w2) + b2
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        gw1, gb1 = wb.gradients(loss, [w1, b1])
        train = wb.optimizers.SGD(0.1).minimize(loss)

    sess = wb.Session(g, seed=0)
    sess.run(train, feed_dict={x: X, y: Y})  # keys: tensors or placeholder names
    value = sess.run(loss, feed_dict={"x": X, "y": Y})
    hist = sess.fit(train, data={"x": X, "y": Y}, batch_size=64, steps=300, fetches=[loss])
    # batches are drawn in a deterministic order from the session's seed;
    # hist.records: one dict per step with "step", "samples_per_s" and each fetch by its name
    sess.variables["w1"]  # numpy.ndarray
    g2 = wb.Graph.from_json(g.to_json())  # same structure, same initial values
    return locals()


@pytest.fixture(scope="module")
def run():
    return build_and_train()


def test_data_types():
    assert X.dtype == np.float64 and Y.dtype == np.int64


def test_variables_are_numpy_arrays(run):
    w1 = run["sess"].variables["w1"]
    assert type(w1) is np.ndarray
    assert w1.shape == (64, 32) and w1.dtype == np.float32
    assert np.any(run["sess"].variables["b1"] != 0)  # trained away from its zero init


def test_loss_value_and_gradients(run):
    value = run["value"]
    assert np.shape(value) == () and np.asarray(value).dtype == np.float32 and np.isfinite(value)
    gw1, gb1 = run["gw1"], run["gb1"]
    assert gw1.shape == (64, 32) and gb1.shape == (32,)


def test_history_records(run):
    hist, loss = run["hist"], run["loss"]
    assert len(hist.records) == 300
    assert [r["step"] for r in hist.records] == list(range(1, 301))
    for r in hist.records:
        assert {"step", "samples_per_s", loss.name} <= set(r)
        assert r["samples_per_s"] > 0
        assert np.isfinite(r[loss.name])
    losses = hist[loss.name]
    assert losses[-20:].mean() < losses[:20].mean() / 2


def test_feed_keys_as_tensors_or_names_agree(run):
    sess, x, y, loss = run["sess"], run["x"], run["y"], run["loss"]
    by_tensor = sess.run(loss, feed_dict={x: X, y: Y})
    by_name = sess.run(loss, feed_dict={"x": X, "y": Y})
    mixed = sess.run(loss, feed_dict={x: X, "y": Y})
    assert by_tensor == by_name == mixed


def test_json_round_trip_same_structure_and_initial_values(run):
    g, g2 = run["g"], run["g2"]
    assert g2.name == "mlp"
    assert [(op.name, op.type) for op in g.operations] == [(op.name, op.type) for op in g2.operations]
    assert [[t.name for t in op.inputs] for op in g.operations] == [[t.name for t in op.inputs] for op in g2.operations]
    assert [[(t.shape, t.dtype) for t in op.outputs] for op in g.operations] == [
        [(t.shape, t.dtype) for t in op.outputs] for op in g2.operations
    ]
    s1, s2 = wb.Session(g, seed=0), wb.Session(g2, seed=0)
    v1, v2 = s1.variables, s2.variables
    assert sorted(v1) == sorted(v2)
    for name in v1:
        np.testing.assert_array_equal(v1[name], v2[name])
    # and g2 computes what g computes
    feed = {"x": X[:50], "y": Y[:50]}
    assert s1.run("mean", feed) == s2.run("mean", feed)


def test_the_contract_is_deterministic(run):
    again = build_and_train()
    np.testing.assert_array_equal(again["hist"]["mean"], run["hist"]["mean"])
    np.testing.assert_array_equal(again["sess"].variables["w1"], run["sess"].variables["w1"])


def test_float64_graph_computes_in_float64():
    g = wb.Graph(name="mlp64")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(64, 10), init="glorot_uniform", dtype="float64")
        b = wb.variable("b", shape=(10,), init="zeros", dtype="float64")
        logits = wb.matmul(x, w) + b
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.SGD(0.01).minimize(loss)
    assert {op.outputs[0].dtype for op in g.operations if op.outputs and op.outputs[0].dtype.startswith("float")} == {
        "float64"
    }
    sess = wb.Session(g, seed=0)
    hist = sess.fit(train, data={x: X, y: Y}, batch_size=64, steps=5, fetches=[logits, loss])
    assert hist.records[-1][logits.name].dtype == np.float64
    assert sess.variables["w"].dtype == np.float64
    value = sess.run(loss, {x: X, y: Y})
    assert value.dtype == np.float64
    # the same sum in float64 by hand
    z = X @ sess.variables["w"] + sess.variables["b"]
    z = z - z.max(axis=1, keepdims=True)
    ref = np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(Y)), Y])
    np.testing.assert_allclose(value, ref, rtol=1e-12)
