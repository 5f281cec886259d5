"""The GraphView coloured by each op's time (fit(profile=k), History.profile(), Session.last_profile)."""

import numpy as np
import pytest

import workbench as wb
from workbench.widgets import GraphView, TrainingView


def deep():
    g = wb.Graph(name="deep")
    with g.as_default():
        h = wb.placeholder("x", shape=(None, 16))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        for i in (1, 2):
            with wb.name_scope(f"layer{i}"):
                h = wb.tanh(wb.matmul(h, wb.variable("w", shape=(16, 16), init="glorot_uniform")))
        loss = wb.mean(wb.softmax_cross_entropy(h, y), name="loss")
        train = wb.optimizers.SGD(0.2).minimize(loss)
    rng = np.random.default_rng(0)
    return g, train, loss, {"x": rng.normal(size=(64, 16)).astype("float32"), "y": rng.integers(0, 16, 64)}


def test_graph_view_colours_nodes_by_time_during_a_profiled_fit():
    g, train, loss, data = deep()
    sess = wb.Session(g, seed=0)
    training = TrainingView().follow(sess.events)
    view = GraphView(g).follow(training)
    hist = sess.fit(train, data, batch_size=16, steps=6, fetches={"loss": loss}, profile=2)
    view.throttle.flush()
    assert view.stat_kinds == ["time"] and view.stat == "time" and view.stat_steps == [2, 4, 6]
    assert view.stat_scale["title"] == "seconds per step"
    assert view.node_stats["layer1/matmul"] == pytest.approx(hist.records[-1]["profile"]["layer1/matmul"])
    # the gradients scope is folded: it shows the sum of its ops' seconds
    assert "gradients" in view.collapsed
    members = {k: v for k, v in hist.records[-1]["profile"].items() if k.startswith("gradients/")}
    assert members and view.node_stats["gradients"] == pytest.approx(sum(members.values()))
    view.toggle("layer1")
    layer = [v for k, v in hist.records[-1]["profile"].items() if k.startswith("layer1/")]
    assert view.node_stats["layer1"] == pytest.approx(sum(layer))
    assert "hsl(" in view.snapshot()  # the static picture is coloured too


def test_show_profile_colours_by_a_historys_medians_or_a_runs_times():
    g, train, loss, data = deep()
    sess = wb.Session(g, seed=0)
    hist = sess.fit(train, data, batch_size=16, steps=4, profile=1)
    view = GraphView(g)
    view.show_profile(hist)
    assert view.stat == "time" and view.node_stats["layer2/matmul"] == pytest.approx(hist.profile()["layer2/matmul"])
    sess.run(loss, {"x": data["x"], "y": data["y"]}, profile=True)
    view.show_profile(sess.last_profile, step=1)
    assert view.stat_scale["step"] == 1 and view.node_stats["loss"] == pytest.approx(sess.last_profile["loss"])
