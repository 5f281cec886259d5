"""Donated intermediates: a step writes into an input only when nothing else holds that array or a
view of it. The usual case is told by the array's reference count (``buffers.SOLE_DONOR``); any
other count falls back to scanning the slots that must survive the step. The first test fails if
that count is measured too low (every step scans), the second if it is too high (a step writes into
an array a view still reads). Variable updates in place are told the same way
(``buffers.SOLE_UPDATE_READ`` and ``SOLE_UPDATE``), tested the same two ways."""

import sys
import weakref

import numpy as np

import workbench as wb
import workbench.graph.plan as plan_module


def _scans(monkeypatch, caller: str | None = None) -> list:
    """Record each scan of the guarded slots that a donating or updating step makes (only those
    of the step function named ``caller``, if given)."""
    calls = []
    scan = plan_module._shared

    def counted(a, slots, guard):
        if caller is None or sys._getframe(1).f_code.co_name == caller:
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


def test_adam_updates_run_in_place_without_a_scan(monkeypatch):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        w = wb.variable("w", shape=(3, 2))
        b = wb.variable("b", shape=(2,))
        loss = wb.mean((wb.matmul(x, w) + b) ** 2.0)
        train = wb.optimizers.Adam(0.1).minimize(loss)
    X = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    sess, fresh = wb.Session(g), wb.Session(g)
    sess.run(train, {x: X})  # the first run makes the arrays the plan then owns
    state = sess.plan_for(train, {x: X}).state
    held = {name: weakref.ref(array) for name, array in state.items()}  # a reference would be one more holder
    scans = _scans(monkeypatch, caller="inplace_update_step")
    for _ in range(3):
        sess.run(train, {x: X})
    assert scans == []  # each variable's array was held by the run alone
    assert all(state[name] is ref() for name, ref in held.items())  # written in place
    for _ in range(4):  # the values of fresh arrays every step
        fresh.plans.clear()
        fresh.run(train, {x: X})
    for name, value in fresh.variables.items():
        np.testing.assert_array_equal(sess.variables[name], value)


def test_an_update_leaves_the_array_that_a_later_read_of_its_variable_sees():
    """The first update's read is needed by a later step, the second's through a view: neither
    may write in place, though the variable's array has the count of one only the run holds."""
    g = wb.Graph()
    with g.as_default():
        v = wb.variable("v", init=np.arange(4, dtype=np.float32))
        bump = wb.assign_add(v, wb.constant(np.ones(4, np.float32)))
        later = v * 2.0  # made after the update, so run after it: reads the run's start value
        flat = wb.reshape(v, (2, 2))  # a view of the variable's array
        bump_again = wb.assign_add(v, wb.constant(np.ones(4, np.float32)))
        viewed = flat * 1.0  # the view read after the second update
    sess = wb.Session(g)
    for fetches, read in (
        ([bump, later], lambda start: start * 2.0),
        ([bump_again, viewed], lambda start: start.reshape(2, 2)),
    ):
        for _ in range(3):  # the same plan again: from its second run on it owns the array it made
            start = sess.variables["v"].copy()
            _, seen = sess.run(fetches)
            np.testing.assert_array_equal(seen, read(start))
            np.testing.assert_array_equal(sess.variables["v"], start + 1.0)
