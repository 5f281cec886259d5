"""Validation curves in the TrainingView; the GraphView coloured by the model's statistics, linked to it."""

import math

import numpy as np
import pytest

import workbench as wb
from workbench import notebook
from workbench.events import FitFinished, FitStarted, Step, Validated
from workbench.widgets import GraphView, TrainingView, snapshots
from workbench.widgets.statistics import StepStats


def deep(scopes=3):
    g = wb.Graph(name="deep")
    with g.as_default():
        h = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        for i in range(1, scopes + 1):
            with wb.name_scope(f"layer{i}"):
                h = wb.tanh(wb.matmul(h, wb.variable("w", shape=(h.shape[1], 4), init="glorot_uniform")))
        loss = wb.mean(wb.softmax_cross_entropy(h, y), name="loss")
        train = wb.optimizers.SGD(0.2).minimize(loss)
    rng = np.random.default_rng(0)
    return g, train, loss, {"x": rng.normal(size=(64, 4)).astype("float32"), "y": rng.integers(0, 4, 64)}


def test_training_view_draws_validation_over_its_metric(clock):
    view = TrainingView(clock=clock)
    view.feed([FitStarted(steps=4, batch_size=8, fetches=("loss",)),
               *[Step(step=k, time=0.1, samples_per_s=80.0, fetches={"loss": 2.0 / k}) for k in (1, 2)],
               Validated(step=2, fetches={"loss": 1.5}, examples=10),
               *[Step(step=k, time=0.1, samples_per_s=80.0, fetches={"loss": 2.0 / k}) for k in (3, 4)],
               Validated(step=4, fetches={"loss": float("nan")}, examples=10),
               FitFinished(steps=4)])  # fmt: skip
    assert view.state["curves"]["val_loss"] == [[2, 1.5]]  # NaN is not drawn
    assert view.state["curves"]["loss"][-1] == [4, 0.5]
    svg = view.snapshot()
    assert "loss (dashed: validation)" in svg and "val_loss" not in svg  # one chart for both curves


def test_step_stats_keep_the_newest_and_every_other_step():
    stats = StepStats(max_steps=4)
    for step in range(1, 8):
        stats.add(step * 10, {"a/w/grad_norm": float(step), "a/relu/mean": -float(step), "b/mean": 1.0})
    assert (
        stats.steps == [10, 50, 70] and stats.nearest(44) == 50 and stats.nearest(30) == 50 and stats.nearest(29) == 10
    )
    assert stats.kinds() == ["grad_norm", "mean"]
    assert stats.node_values("mean", 70, collapsed={"a"}) == {"a": -7.0, "b": 1.0}
    assert stats.scale("mean") == {"stat": "mean", "lo": 1.0, "hi": 7.0, "log": False, "signed": True}
    stats.add(80, {"a/w/grad_norm": float("inf")})
    assert stats.node_values("grad_norm", 80) == {"a/w": float("inf")} and stats.scale("grad_norm")["hi"] == 7.0
    layer = StepStats()
    layer.add(90, {"a/w/grad_norm": 3.0, "a/b/grad_norm": 4.0, "a/relu/std": 0.5, "a/out/std": 2.0})
    layer.add(100, {"a/w/grad_norm": 3.0, "a/b/grad_norm": float("nan")})
    assert layer.node_values("grad_norm", 90, collapsed={"a"}) == {"a": 7.0}  # a folded layer: the sum of its norms
    assert layer.node_values("std", 90, collapsed={"a"}) == {"a": 2.0}  # its largest std
    assert math.isnan(layer.node_values("grad_norm", 100, collapsed={"a"})["a"])  # a NaN member shows
    assert layer.scale("grad_norm", collapsed={"a"})["hi"] == 7.0 and layer.scale("grad_norm")["hi"] == 4.0


def test_graph_view_colours_nodes_by_statistics_and_follows_the_training_views_clicks():
    g, train, loss, data = deep()
    sess = wb.Session(g, seed=0)
    training = TrainingView().follow(sess.events)
    view = GraphView(g).follow(training)
    assert view.following and view._session is None and view.stat == ""
    sess.fit(train, data, batch_size=16, steps=12, fetches={"loss": loss}, stats=3)
    view.throttle.flush()
    assert view.stat == "grad_norm" and view.stat_steps == [3, 6, 9, 12]
    assert view.stat_kinds == ["grad_norm", "mean", "std"]
    # layer scopes of 3 ops are open: each variable shows its own gradient norm at the latest step
    assert set(view.node_stats) == {"layer1/w", "layer2/w", "layer3/w"}
    assert view.stat_scale["step"] == 12 and view.stat_scale["title"] == "gradient norm"
    assert view.node_stats["layer2/w"] == pytest.approx(sess_history_value(sess, train, data, 12, "layer2/w/grad_norm"))
    # a click on the loss curve at step 7 shows step 6 here; the scrubber marks its step there
    training.selected_step = 7
    assert view.step == 6 and view.stat_scale["step"] == 6 and training.selected_step == 6
    view.step = 9
    assert training.selected_step == 9
    view.stat = "mean"
    assert "layer1/tanh" in view.node_stats and "layer1/w" not in view.node_stats
    view.toggle("layer1")  # folded: the scope shows its member of largest magnitude
    members = {k: v for k, v in view.stats.values[9].items() if k.startswith("layer1/") and k.endswith("/mean")}
    assert view.node_stats["layer1"] == max(members.values(), key=abs)
    view.stat = "grad_norm"  # a folded scope's gradient norms add up; the scale covers that sum
    norms = {k: v for k, v in view.stats.values[9].items() if k.startswith("layer1/") and k.endswith("/grad_norm")}
    assert norms and view.node_stats["layer1"] == pytest.approx(sum(norms.values()))
    assert view.stat_scale["hi"] >= view.node_stats["layer1"]
    view.stat = ""
    assert view.node_stats == {} and view.stat_scale == {}


def sess_history_value(sess, train, data, step, label):
    """The statistic as a fresh session computes it: the same seed, fit again (the batches are the same)."""
    again = wb.Session(sess.graph, seed=0)
    return again.fit(train, data, batch_size=16, steps=step, stats=step).stats[step][label]


def test_the_notebook_links_graph_views_of_the_model_to_each_new_fit():
    g, train, loss, data = deep()
    other, _, _, _ = deep()
    shown = []
    notebook.install(display=shown.append)
    try:
        view, unrelated = GraphView(g).follow(), GraphView(other).follow()
        sess = wb.Session(g, seed=0)
        sess.fit(train, data, batch_size=16, steps=4, fetches={"loss": loss}, stats=2)
        (training,) = shown
        view.throttle.flush()
        assert view._session == sess.token and view.stat_steps == [2, 4]
        assert unrelated._session is None and unrelated.stat_steps == []
        training.selected_step = 1
        assert view.step == 2
        sess.fit(train, data, batch_size=16, steps=2, fetches={"loss": loss}, stats=1)  # a new run: its own stats
        view.throttle.flush()
        assert view.stat_steps == [1, 2] and shown[1].selected_step == 0
        shown[1].selected_step = 2
        assert view.step == 2 and training.selected_step == 2  # unlinked from the old view
    finally:
        notebook.uninstall()


def test_statistics_scope_folds_like_the_gradients():
    g, train, _, _ = deep()
    wb.watch(train)
    assert "stats" in GraphView(g).collapsed
    assert "stats" in snapshots.graph_svg(GraphView(g).layout, {})


def test_statistics_added_after_the_view_was_made_stay_folded():
    g, train, loss, data = deep()
    view = GraphView(g, fold_over=10)  # the layers stay open
    wb.Session(g).fit(train, data, batch_size=16, steps=2, stats=1)  # adds the stats ops to the graph
    view.toggle("layer1")
    assert "stats" in view.collapsed and "layer1" in view.collapsed
    assert not any(n["id"].startswith("stats/") for n in view.layout["nodes"])
