"""Donated intermediates: a step writes into an input only when nothing else holds that array or a
view of it. The usual case is told by the array's reference count (``buffers.SOLE_DONOR``); any
other count falls back to scanning the slots that must survive the step. The first test fails if
that count is measured too low (every step scans), the second if it is too high (a step writes into
an array a view still reads)."""

import numpy as np

import workbench as wb
import workbench.graph.plan as plan_module


def _scans(monkeypatch) -> list:
    """Record each scan of the guarded slots that a donating or updating step makes."""
    calls = []
    scan = plan_module._shared

    def counted(a, slots, guard):
        calls.append(a.shape)
        return scan(a, slots, guard)

    monkeypatch.setattr(plan_module, "_shared", counted)
    return calls


def test_a_chain_of_intermediates_is_donated_without_a_scan(monkeypatch):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        y = wb.relu(wb.tanh(x * 2.0) + 1.0) * 3.0
    X = np.array([[0.5, -1.0, 2.0]], np.float32)
    sess = wb.Session(g)
    expected = np.maximum(np.tanh(X * 2.0) + 1.0, 0.0) * 3.0
    np.testing.assert_array_equal(sess.run(y, {x: X}), expected)
    scans = _scans(monkeypatch)
    np.testing.assert_array_equal(sess.run(y, {x: X}), expected)
    assert scans == []  # every donor was held by its slot alone
    np.testing.assert_array_equal(X, [[0.5, -1.0, 2.0]])


def test_a_donor_that_a_later_view_still_reads_is_not_written(monkeypatch):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(2, 3))
        h = wb.tanh(x)  # an intermediate
        flat = wb.reshape(h, (6,))  # a view of it, read by the last op
        bumped = h + 1.0  # h's last use: it could be written in place, but the view needs its values
        y = wb.reshape(bumped, (6,)) * flat
    X = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    scans = _scans(monkeypatch)
    out = wb.Session(g).run(y, {x: X})
    h_value = np.tanh(X).reshape(6)
    np.testing.assert_array_equal(out, (h_value + 1.0) * h_value)
    assert scans  # the view made the count larger, so the step looked at the slots
