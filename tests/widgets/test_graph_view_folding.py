"""GraphView on a real model: fold all after fit(stats=k) folds the statistics too; unfold a level at a time."""

import numpy as np

import workbench as wb
from workbench.widgets import GraphView
from workbench.widgets.graph_view import unfold_one_level


def _model():
    g = wb.Graph(name="deep")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        for i in range(3):
            with wb.name_scope(f"layer{i}"):
                with wb.name_scope("dense"):
                    h = wb.relu(
                        wb.matmul(h, wb.variable("w", shape=(4, 4))) + wb.variable("b", shape=(4,), init="zeros")
                    )
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    return g, train, loss


def test_fold_all_after_stats_folds_the_statistics_scope_too():
    g, train, loss = _model()
    view = GraphView(g)
    sess = wb.Session(g)
    sess.fit(train, {"x": np.ones((8, 4), "float32"), "y": np.zeros(8, "int64")}, batch_size=4, steps=2, stats=1)
    view._draw_new_ops()
    assert "stats" in view.collapsed and any(
        n.startswith("stats/") for n in view.names
    )  # the front end's fold all reads names
    view.unfold_all()
    view.fold_all()
    assert "stats" in view.collapsed
    assert {n["id"] for n in view.layout["nodes"] if n["kind"] == "scope"} >= {"stats", "layer0", "gradients"}


def test_unfold_one_level_opens_the_outermost_folded_scopes_only():
    g, _, _ = _model()
    view = GraphView(g)
    view.fold_all()
    view.unfold_one_level()
    assert "layer0" not in view.collapsed and "layer0/dense" in view.collapsed
    view.unfold_one_level()
    assert "layer0/dense" not in view.collapsed
    assert unfold_one_level(["a"], ["a", "a/b", "a/b/c", "d"]) == ["a/b"]  # its sub-scopes start folded
    assert unfold_one_level(["a", "a/b", "d"], ["a", "a/b", "d"]) == ["a/b"]


def test_constants_show_their_value():
    g = wb.Graph(name="c")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        y = x * 0.5 + wb.constant([1.0, 2.0, 3.0]) + wb.constant(np.arange(12.0, dtype="float32").reshape(3, 4))[0, :3]
    values = {n["type"] + ":" + n.get("value", ""): n for n in GraphView(g).layout["nodes"] if n["type"] == "constant"}
    assert set(values) == {"constant:0.5", "constant:[1, 2, 3]", "constant:0 … 11"}
    assert "0.5 · ()" in GraphView(g).snapshot()
    assert y.shape == (None, 3)


def test_the_header_and_folded_scopes_count_parameters():
    g, _, _ = _model()
    view = GraphView(g)
    view.fold_all()
    assert view.layout["parameters"] == 3 * (16 + 4) and view.layout["operations"] == len(g.operations)
    scopes = {n["id"]: n for n in view.layout["nodes"] if n["kind"] == "scope"}
    assert scopes["layer0"]["parameters"] == 20 and scopes["Adam"]["parameters"] == 0  # slots are not trained
    assert "20 params" in view.snapshot() and "60 parameters" in view.snapshot()
