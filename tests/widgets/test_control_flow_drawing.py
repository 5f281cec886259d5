"""GraphView draws a scan or a cond as one node that unfolds into its body."""

from __future__ import annotations

import numpy as np

import workbench as wb
from workbench.widgets import GraphView
from workbench.widgets.layout import all_scopes, graph_layout


def rnn():
    g = wb.Graph(name="rnn")
    with g.as_default():
        xs = wb.placeholder("xs", shape=(6, 2, 3))
        w = wb.variable("w", shape=(3, 3))
        h, hs = wb.scan(lambda h, x: (wb.tanh(wb.matmul(h, w) + x), h), xs, wb.zeros_like(xs[0]), name="loop")
        p = wb.placeholder("p", shape=(), dtype="bool")
        y = wb.cond(p, lambda: wb.sum(h), lambda: wb.sum(hs), name="pick")
    return g, y


def ids(layout):
    return {n["id"]: n for n in layout["nodes"]}


def test_a_loop_and_a_branch_start_folded_as_one_node_each():
    g, _ = rnn()
    view = GraphView(g)
    assert {"loop", "pick"} <= set(view.collapsed)
    nodes = ids(view.layout)
    assert nodes["loop"]["control"] == "scan" and nodes["loop"]["kind"] == "scope" and nodes["loop"]["members"] >= 4
    assert nodes["pick"]["control"] == "cond" and nodes["pick"]["shape"] == "()"
    assert not any(n.startswith("loop/") for n in nodes)
    edges = {(e["source"], e["target"]) for e in view.layout["edges"]}
    assert {("xs", "loop"), ("w", "loop"), ("loop", "pick")} <= edges


def test_unfolding_a_loop_shows_its_body_fed_by_the_outer_tensors():
    g, _ = rnn()
    layout = graph_layout(g, collapsed={"pick"})
    nodes = ids(layout)
    assert nodes["loop/scan"]["type"] == "scan"
    body = {n for n in nodes if n.startswith("loop/body/")}
    assert {"loop/body/carry_0", "loop/body/x_0", "loop/body/captured_0", "loop/body/tanh"} <= body
    assert nodes["loop/body/captured_0"]["inputs"] == ["w"] and nodes["loop/body/x_0"]["inputs"] == ["xs"]
    edges = {(e["source"], e["target"]) for e in layout["edges"]}
    assert ("w", "loop/body/captured_0") in edges and ("loop/scan", "pick") in edges
    assert any(b["scope"] == "loop/body" for b in layout["boxes"])
    assert {"loop", "loop/body", "pick", "pick/true", "pick/false"} <= set(all_scopes(g))


def test_search_finds_ops_inside_a_body_and_opens_it():
    g, _ = rnn()
    view = GraphView(g)
    assert view.reveal("body/tanh") == "loop/body/tanh"
    assert "loop" not in view.collapsed and "loop/body/tanh" in ids(view.layout)


def test_the_gradient_loop_is_drawn_folded_too():
    g, y = rnn()
    with g.as_default():
        wb.gradients(y, [g.variables[0]])
    view = GraphView(g, collapsed=[])
    names = set(ids(view.layout))
    assert any(n.startswith("gradients/") and n.endswith("/scan") for n in names)
    np.testing.assert_equal(len(view.layout["nodes"]) > 20, True)
