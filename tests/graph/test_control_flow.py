"""wb.cond and wb.scan: values and gradients against unrolled graphs, only the chosen branch
running, errors that name the op and the user's line, files, compiled bodies, nesting."""

from __future__ import annotations

import dataclasses
import json
import linecache

import numpy as np
import pytest

import workbench as wb
from workbench.ops.registry import REGISTRY

STEPS = 8


def rnn_cell(w, u, b):
    """An Elman cell with a second carry (a running sum) and two outputs per step."""

    def cell(carry, x):
        h, total = carry
        h = wb.tanh(wb.matmul(h, w) + wb.matmul(x, u) + b)
        return (h, total + wb.sum(h * h, axis=1)), (h, wb.mean(h, axis=1))

    return cell


def rnn_graph(unrolled: bool):
    rng = np.random.default_rng(0)
    g = wb.Graph(name="rnn")
    with g.as_default():
        xs = wb.placeholder("xs", shape=(STEPS, 4, 3), dtype="float64")
        h0 = wb.placeholder("h0", shape=(4, 5), dtype="float64")
        w = wb.variable("w", init=rng.standard_normal((5, 5)) * 0.5, dtype="float64")
        u = wb.variable("u", init=rng.standard_normal((3, 5)), dtype="float64")
        b = wb.variable("b", init=rng.standard_normal(5) * 0.1, dtype="float64")
        cell = rnn_cell(w, u, b)
        init = (h0, wb.zeros_like(h0[:, 0]))
        if unrolled:
            carry, hs, ms = init, [], []
            for t in range(STEPS):
                carry, (h, m) = cell(carry, xs[t])
                hs.append(h)
                ms.append(m)
            (h_last, total), ys = carry, (wb.stack(hs), wb.stack(ms))
        else:
            (h_last, total), ys = wb.scan(cell, xs, init)
        weights = rng.standard_normal((STEPS, 4, 5))
        loss = wb.sum(ys[0] * weights) + wb.sum(ys[1]) + wb.sum(h_last * h_last) + wb.sum(total)
        grads = wb.gradients(loss, [w, u, b, xs, h0])
    feeds = {"xs": rng.standard_normal((STEPS, 4, 3)), "h0": rng.standard_normal((4, 5))}
    return g, [loss, h_last, total, *ys, *grads], feeds


def test_scan_over_8_steps_equals_the_unrolled_graph_in_values_and_gradients():
    values = []
    for unrolled in (False, True):
        g, fetches, feeds = rnn_graph(unrolled)
        values.append(wb.Session(g, seed=0).run(fetches, feeds))
    for got, expected in zip(*values, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    g, fetches, _ = rnn_graph(False)
    assert [op.type for op in g.operations].count("scan") == 2  # the loop and its gradient loop


def test_scan_is_one_op_and_returns_the_structure_of_its_arguments(graph):
    xs = wb.constant(np.arange(6.0).reshape(3, 2))
    (a, (b,)), [y, z] = wb.scan(
        lambda c, x: ((c[0] + x, (c[1][0] * 2.0,)), [c[0], wb.sum(x)]), xs, (wb.zeros_like(xs[0]), (1.0,))
    )
    assert {t.op.name for t in (a, b, y, z)} == {"scan"} and y.shape == (3, 2) and z.shape == (3,)
    a_v, b_v, y_v, z_v = wb.Session(graph).run([a, b, y, z])
    np.testing.assert_array_equal(a_v, [6.0, 9.0])
    assert float(b_v) == 8.0 and z_v.tolist() == [1.0, 5.0, 9.0]
    np.testing.assert_array_equal(y_v, [[0.0, 0.0], [0.0, 1.0], [2.0, 4.0]])


def test_scan_reverse_and_length(graph):
    xs = wb.constant([1.0, 2.0, 3.0])
    total, partial = wb.scan(lambda c, x: (c + x, c + x), xs, wb.constant(0.0), reverse=True)
    count, ys = wb.scan(lambda c, _: (c + 1, c * 10), None, wb.constant(0), length=4)
    got = wb.Session(graph).run([total, partial, count, ys])
    assert float(got[0]) == 6.0 and got[1].tolist() == [6.0, 5.0, 3.0]
    assert int(got[2]) == 4 and got[3].tolist() == [0, 10, 20, 30] and got[3].dtype == np.int64


def test_scan_body_is_compiled_once_and_reused_by_every_step_and_run(graph):
    xs = wb.placeholder("xs", shape=(None, 3))
    final, _ = wb.scan(lambda c, x: (c * 0.5 + x, None), xs, wb.zeros_like(xs[0]))
    body = final.op.attrs["body"]
    sess = wb.Session(graph)
    for n in (4, 9, 2):
        sess.run(final, {xs: np.ones((n, 3), np.float32)})
    assert body.compiled == 1


def test_scan_inside_scan_and_cond_inside_scan(graph):
    m = wb.constant(np.arange(12.0).reshape(3, 4))

    def outer(c, row):
        inner, _ = wb.scan(lambda s, v: (s + v * c, None), row, wb.constant(0.0, dtype="float64"))
        return wb.cond(inner > 20.0, lambda: inner, lambda: c + 1.0), inner

    final, inners = wb.scan(outer, m, wb.constant(1.0, dtype="float64"))
    (d,) = wb.gradients(final, [m])
    got = wb.Session(graph).run([final, inners, d])
    # row 0: sum 6 * 1 = 6 -> c = 2; row 1: sum 22 * 2 = 44 -> c = 44; row 2: 38 * 44
    assert got[1].tolist() == [6.0, 44.0, 38.0 * 44.0] and float(got[0]) == 38.0 * 44.0
    expected = np.array([[0.0] * 4, [2.0 * 38.0] * 4, [44.0] * 4])  # d final / d m through the taken branches
    np.testing.assert_allclose(got[2], expected)


def test_variables_made_in_a_body_belong_to_the_graph(graph):
    def cell(h, x):
        with wb.name_scope("cell"):
            w = wb.variable("w", shape=(2, 2), init="ones")
        return wb.matmul(h, w) + x, None

    final, _ = wb.scan(
        cell, wb.constant(np.ones((3, 1, 2)), dtype="float32"), wb.constant(np.zeros((1, 2)), dtype="float32")
    )
    assert [v.name for v in graph.variables] == ["cell/w"]
    (dw,) = wb.gradients(wb.sum(final), graph.variables)
    value, grad = wb.Session(graph).run([final, dw])
    np.testing.assert_array_equal(value, [[7.0, 7.0]])
    assert grad.shape == (2, 2)


def counting(monkeypatch, op_type):
    """Count the calls of ``op_type``'s kernel."""
    calls = []
    opdef = REGISTRY[op_type]

    def kernel(xp, *args, **kwargs):
        calls.append(1)
        return opdef.kernel(xp, *args, **kwargs)

    monkeypatch.setitem(REGISTRY, op_type, dataclasses.replace(opdef, kernel=kernel))
    return calls


def test_cond_runs_only_the_chosen_branch(graph, monkeypatch):
    erf_calls, tanh_calls = counting(monkeypatch, "erf"), counting(monkeypatch, "tanh")
    p = wb.placeholder("p", shape=(), dtype="bool")
    x = wb.placeholder("x", shape=(1000,))
    heavy = lambda: wb.erf(wb.matmul(wb.reshape(x, (1, 1000)), wb.reshape(x, (1000, 1)) * x)[0])  # noqa: E731
    y = wb.cond(p, heavy, lambda: wb.tanh(x))
    sess = wb.Session(graph)
    value = np.linspace(-1, 1, 1000).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(sess.run(y, {p: False, x: value}), np.tanh(value), rtol=1e-6)
    assert (len(erf_calls), len(tanh_calls)) == (0, 3)
    sess.run(y, {p: True, x: value})
    assert (len(erf_calls), len(tanh_calls)) == (1, 3)


def test_cond_gradients_flow_through_the_branch_that_ran(graph):
    p = wb.placeholder("p", shape=(), dtype="bool")
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    w = wb.variable("w", init=np.array([1.0, 2.0, 3.0]), dtype="float64")
    y = wb.cond(p, lambda: wb.sum(x * w * w), lambda: wb.sum(wb.exp(x)))
    dx, dw = wb.gradients(y, [x, w])
    sess = wb.Session(graph)
    xv = np.array([0.5, -1.0, 2.0])
    got = sess.run([y, dx, dw], {p: True, x: xv})
    np.testing.assert_allclose(got[1:], [[1.0, 4.0, 9.0], 2 * xv * [1.0, 2.0, 3.0]])
    got = sess.run([y, dx, dw], {p: False, x: xv})
    np.testing.assert_allclose(got[1:], [np.exp(xv), [0.0, 0.0, 0.0]])


def test_cond_with_a_python_bool_builds_one_branch(graph):
    x = wb.constant(2.0)
    assert wb.cond(True, lambda: x * 3.0, lambda: 1 / 0).op.type == "multiply"


def line_of(pattern: str) -> str:
    """``File "...", line N: code`` of the line of this file that contains ``pattern``."""
    lines = linecache.getlines(__file__)
    n = next(i for i, line in enumerate(lines, 1) if pattern in line and "line_of" not in line)
    return f'File "{__file__}", line {n}: {lines[n - 1].strip()}'


def test_cond_branch_mismatches_name_the_op_and_the_line(graph):
    p = wb.placeholder("p", shape=(), dtype="bool")
    x = wb.placeholder("x", shape=(3,))
    with pytest.raises(wb.ShapeError) as caught:
        wb.cond(p, lambda: x, lambda: wb.concat([x, x]), name="pick")  # shapes differ
    message = str(caught.value)
    assert message.startswith("cond 'pick': output 0 is (3,) float32 in true_fn but (6,) float32 in false_fn")
    assert message.endswith(line_of("# shapes differ"))
    with pytest.raises(wb.ShapeError, match=r"^cond 'cond': output 0 is \(3,\) float32 in true_fn but \(3,\) int64"):
        wb.cond(p, lambda: x, lambda: wb.cast(x, "int64"))  # dtypes differ
    with pytest.raises(wb.ShapeError) as caught:
        wb.cond(p, lambda: (x, x), lambda: x)  # structures differ
    assert str(caught.value).startswith("cond 'cond': true_fn returns (tensor, tensor) but false_fn returns tensor")
    assert str(caught.value).endswith(line_of("# structures differ"))
    with pytest.raises(wb.DTypeError, match=r"^cond 'cond': pred must be a bool scalar, got \(3,\) float32"):
        wb.cond(x, lambda: x, lambda: x)


def test_scan_carry_changes_name_the_op_and_the_line(graph):
    xs = wb.placeholder("xs", shape=(5, 3))
    with pytest.raises(wb.ShapeError) as caught:
        wb.scan(lambda c, x: (wb.concat([c, x]), None), xs, wb.zeros_like(xs[0]), name="grow")  # carry grows
    message = str(caught.value)
    assert message.startswith("scan 'grow': carry 0 is (3,) float32 at the start of a step but (6,) float32 at its end")
    assert message.endswith(line_of("# carry grows"))
    with pytest.raises(wb.ShapeError, match=r"^scan 'scan': carry 0 is \(3,\) float32 .* but \(3,\) float64"):
        wb.scan(lambda c, x: (wb.cast(c, "float64"), None), xs, wb.zeros_like(xs[0]))
    with pytest.raises(wb.ShapeError) as caught:
        wb.scan(lambda c, x: ((c, c), None), xs, wb.zeros_like(xs[0]))  # carry structure
    assert str(caught.value).startswith(
        "scan 'scan': fn returns a carry structured as (tensor, tensor), but init is tensor"
    )
    assert str(caught.value).endswith(line_of("# carry structure"))
    with pytest.raises(wb.ShapeError, match="^scan 'scan': fn must return \\(carry, y\\), got Tensor"):
        wb.scan(lambda c, x: c + x, xs, wb.zeros_like(xs[0]))
    with pytest.raises(wb.ShapeError, match=r"sequence 1 has 4 steps, but sequence 0 says 5"):
        wb.scan(lambda c, x: (c, None), (xs, wb.placeholder("ys", shape=(4,))), wb.constant(0.0))


def test_a_carry_whose_open_dimension_changes_when_run_names_the_op_and_the_line(graph):
    xs = wb.placeholder("xs", shape=(4, None, 3))  # the batch of each step is open: the build cannot tell
    init = wb.constant(np.zeros((1, 3), "float32"))
    carry, _ = wb.scan(lambda c, x: (c + x, None), xs, init, name="broadcast")  # carry broadcasts
    sess = wb.Session(graph)
    with pytest.raises(wb.ExecutionError) as caught:
        sess.run(carry, {"xs": np.ones((4, 2, 3), "float32")})
    message = str(caught.value)
    assert message.startswith(
        "scan 'broadcast' failed: ValueError: carry 0 has shape (1, 3) at the start of step 0 but (2, 3) at its end"
    )
    assert message.endswith(line_of("# carry broadcasts"))
    np.testing.assert_array_equal(sess.run(carry, {"xs": np.ones((4, 1, 3), "float32")}), np.full((1, 3), 4.0))


def test_a_body_may_not_update_variables(graph):
    v = wb.variable("v", shape=(3,), init="zeros")
    with pytest.raises(wb.GraphError, match="scan body 'scan/body': assign_add .* updates a variable"):
        wb.scan(lambda c, x: (c, wb.assign_add(v, x)), wb.constant(np.ones((2, 3), np.float32)), wb.constant(0.0))


def test_dropout_in_a_branch_draws_per_run_and_its_gradient_uses_the_same_mask(graph):
    training = wb.placeholder("training", shape=(), dtype="bool")
    x = wb.placeholder("x", shape=(None, 50), dtype="float64")
    y = wb.cond(training, lambda: wb.dropout(x, 0.5), lambda: x)
    (dx,) = wb.gradients(wb.sum(y * 3.0), [x])
    sess = wb.Session(graph, seed=1)
    value = np.random.default_rng(0).uniform(1, 2, (4, 50))
    runs = [sess.run([y, dx], {training: True, x: value}) for _ in range(2)]
    for y_v, d_v in runs:
        mask = y_v / value
        assert set(np.round(np.unique(mask), 12)) == {0.0, 2.0}
        np.testing.assert_allclose(d_v, 3.0 * mask)
    assert not np.array_equal(runs[0][0], runs[1][0])  # a new mask each run
    again = wb.Session(graph, seed=1).run([y, dx], {training: True, x: value})
    np.testing.assert_array_equal(again[0], runs[0][0])  # the same seed, the same first mask
    np.testing.assert_array_equal(sess.run(y, {training: False, x: value}), value)


def test_graphs_with_control_flow_round_trip_through_json_as_data(tmp_path):
    g, fetches, feeds = rnn_graph(False)
    with g.as_default():
        p = wb.placeholder("p", shape=(), dtype="bool")
        picked = wb.cond(p, lambda: fetches[0] * 2.0, lambda: fetches[1][0, 0])
    text = g.to_json()
    doc = json.loads(text)
    scan_record = next(r for r in doc["operations"] if r["type"] == "scan")
    assert (
        set(scan_record["attrs"]["body"]) == {"body"} and "operations" in scan_record["attrs"]["body"]["body"]["graph"]
    )
    loaded = wb.Graph.from_json(text)
    names = [t.name for t in fetches] + [picked.name]
    sess_a, sess_b = wb.Session(g, seed=0), wb.Session(loaded, seed=0)
    for flag in (True, False):
        a = sess_a.run(names, {**feeds, "p": flag})
        b = sess_b.run(names, {**feeds, "p": flag})
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
    assert loaded.to_json() == text


def test_a_tampered_body_is_a_format_error():
    g, _, _ = rnn_graph(False)
    doc = json.loads(g.to_json())
    record = next(r for r in doc["operations"] if r["type"] == "scan")
    record["attrs"]["body"]["body"]["inputs"][0] = "nowhere"
    with pytest.raises(wb.FormatError, match="body input 'nowhere' is not a placeholder of the body"):
        wb.Graph.from_json(json.dumps(doc))


@pytest.fixture
def graph():
    g = wb.Graph()
    with g.as_default():
        yield g


def test_a_scan_under_mixed_precision_casts_inside_its_body(graph):
    w = wb.variable("w", shape=(3, 3))
    with wb.mixed_precision("float16"):
        xs = wb.cast(wb.placeholder("xs", shape=(4, 2, 3)), "float16")
        h, _ = wb.scan(lambda h, x: (wb.tanh(wb.matmul(h, w) + x), None), xs, wb.zeros_like(xs[0]))
        loss = wb.mean(h)
    (dw,) = wb.gradients(loss, [w])
    assert h.dtype == "float16" and loss.dtype == "float32" and dw.dtype == "float32"
    value = wb.Session(graph).run(dw, {"xs": np.ones((4, 2, 3), np.float32)})
    assert value.dtype == np.float32 and np.isfinite(value).all()


def test_each_plan_compiles_its_bodies_once_when_it_is_built(graph):
    x = wb.placeholder("x", shape=(4,))
    p = wb.placeholder("p", shape=(), dtype="bool")
    y = wb.cond(p, lambda: x * 2.0, lambda: x - 1.0)
    true_body, false_body = y.op.attrs["true_body"], y.op.attrs["false_body"]
    sess = wb.Session(graph)
    for flag in (True, False, True, False):
        sess.run(y, {x: np.ones(4, np.float32), p: flag})
    assert (true_body.compiled, false_body.compiled) == (1, 1)
    sess.run([y, x * 3.0], {x: np.ones(4, np.float32), p: True})  # other fetches: another plan, its own sub-plans
    assert (true_body.compiled, false_body.compiled) == (2, 2)


def test_dropouts_in_two_branches_draw_different_masks(graph):
    training = wb.placeholder("training", shape=(), dtype="bool")
    x = wb.constant(np.ones((8, 64)))
    a = wb.cond(training, lambda: wb.dropout(x, 0.5), lambda: x)
    b = wb.cond(training, lambda: wb.dropout(x, 0.5), lambda: x)
    got_a, got_b = wb.Session(graph).run([a, b], {training: True})
    assert not np.array_equal(got_a, got_b)


def test_dropout_in_a_scan_body_keeps_one_mask_across_steps_and_in_the_gradient(graph):
    x = wb.placeholder("x", shape=(5, 40), dtype="float64")

    def step(c, xt):
        d = wb.dropout(xt, 0.5)
        return c + d, d

    h, ys = wb.scan(step, x, wb.zeros_like(x[0]))
    (dx,) = wb.gradients(wb.sum(h) + wb.sum(ys), [x])
    h_v, ys_v, dx_v = wb.Session(graph, seed=2).run([h, ys, dx], {x: np.ones((5, 40))})
    mask = ys_v[0]
    assert all(np.array_equal(row, mask) for row in ys_v)  # the same draw at every step of a run
    np.testing.assert_allclose(dx_v, 2 * np.broadcast_to(mask, (5, 40)))


def test_how_a_loss_through_scan_and_cond_reduces_over_the_batch(graph):
    from workbench.graph.batch_reduction import fetch_reduction, loss_reduction

    x = wb.placeholder("x", shape=(None, 5, 3))
    w = wb.variable("w", shape=(3, 3))
    h, hs = wb.scan(
        lambda h, xt: (wb.tanh(wb.matmul(h, w) + xt), h), wb.transpose(x, (1, 0, 2)), wb.zeros_like(x[:, 0])
    )
    training = wb.placeholder("training", shape=(), dtype="bool")
    y = wb.cond(training, lambda: h * 2.0, lambda: h)
    assert loss_reduction(graph, wb.mean(y)) == "mean" and loss_reduction(graph, wb.sum(hs)) == "sum"
    assert fetch_reduction(graph, hs).axis == 1  # (steps, batch, features): the rows along axis 1
    over_rows, _ = wb.scan(lambda c, row: (c + wb.sum(row), None), x, wb.constant(0.0))
    with pytest.raises(wb.ClusterError, match="of type 'scan'.*it scans over the rows of the batch"):
        loss_reduction(graph, over_rows)
    picked = wb.cond(wb.sum(x) > 0.0, lambda: wb.mean(x), lambda: wb.mean(x * 2.0))
    with pytest.raises(wb.ClusterError, match="cannot be split across replicas exactly: it applies 'greater'"):
        loss_reduction(graph, picked)
