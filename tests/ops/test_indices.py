"""Indices and labels are checked at run time: never wrapped into another class, on any device."""

import numpy as np
import pytest

import workbench as wb


def _graph():
    g = wb.Graph(name="idx")
    with g.as_default():
        logits = wb.placeholder("logits", shape=(None, 4))
        labels = wb.placeholder("labels", shape=(None,), dtype="int64")
        params = wb.placeholder("params", shape=(None, 2))
        index = wb.placeholder("index", shape=(None,), dtype="int32")
        loss = wb.softmax_cross_entropy(logits, labels)  # the line the error names
        picked = wb.gather(params, index)  # the gather line
        hot = wb.one_hot(labels, 4)  # the one_hot line
    return g, dict(loss=loss, picked=picked, hot=hot)


FEEDS = {"logits": np.zeros((3, 4), np.float32), "params": np.arange(10.0).reshape(5, 2)}


@pytest.mark.parametrize("session", [dict(), dict(device="gpu", emulate=True)], ids=["cpu", "gpu-emulated"])
@pytest.mark.parametrize("check_numerics", [False, True])
@pytest.mark.parametrize(
    "fetch, feed, message",
    [
        (
            "loss",
            {"labels": [0, -1, 2]},
            r"softmax_cross_entropy 'softmax_cross_entropy' failed: IndexError: label -1 at position 1 is out of range \[0, 4\)\n.*loss = wb.softmax_cross_entropy",
        ),
        ("loss", {"labels": [4, 9, 0]}, r"label 4 at position 0 is out of range \[0, 4\) \(and 1 more\)"),
        (
            "picked",
            {"index": [0, -2]},
            r"gather 'gather' failed: IndexError: index -2 at position 1 is out of range \[0, 5\)\n.*the gather line",
        ),
        ("picked", {"index": [5]}, r"index 5 at position 0 is out of range \[0, 5\)"),
        (
            "hot",
            {"labels": [1, -1, 0]},
            r"one_hot 'one_hot' failed: IndexError: index -1 at position 1 is out of range \[0, 4\)\n.*the one_hot line",
        ),
        ("hot", {"labels": [1, 2, 4]}, r"index 4 at position 2 is out of range \[0, 4\)"),
    ],
)
def test_out_of_range_indices_are_execution_errors(session, check_numerics, fetch, feed, message):
    """Fixes: negative labels and indices silently used the last class; under check_numerics
    an index out of range escaped as a bare IndexError."""
    g, t = _graph()
    sess = wb.Session(g, **session)
    with pytest.raises(wb.ExecutionError, match=message) as info:
        sess.run(t[fetch], {**FEEDS, **feed}, check_numerics=check_numerics)
    assert info.value.op == t[fetch].op.name


@pytest.mark.parametrize("session", [dict(), dict(device="gpu", emulate=True)], ids=["cpu", "gpu-emulated"])
def test_indices_in_range_still_work(session):
    g, t = _graph()
    sess = wb.Session(g, **session)
    loss, picked, hot = sess.run([t["loss"], t["picked"], t["hot"]], {**FEEDS, "labels": [0, 3, 2], "index": [4, 0]})
    np.testing.assert_allclose(loss, np.log(4.0) * np.ones(3), rtol=1e-6)
    np.testing.assert_array_equal(picked, [[8.0, 9.0], [0.0, 1.0]])
    np.testing.assert_array_equal(hot, np.eye(4)[[0, 3, 2]])
    empty = sess.run(t["picked"], {**FEEDS, "index": np.zeros(0, np.int32)})
    assert empty.shape == (0, 2)


def test_training_with_a_negative_label_stops_at_that_step():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        loss = wb.mean(wb.softmax_cross_entropy(x @ wb.variable("w", shape=(3, 4)), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    Y = np.arange(16) % 4
    Y[9] = -1
    with pytest.raises(wb.ExecutionError, match="label -1"):
        wb.Session(g).fit(train, {"x": np.ones((16, 3), np.float32), "y": Y}, batch_size=16, steps=1)
