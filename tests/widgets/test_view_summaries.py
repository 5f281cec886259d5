"""Each view's text/plain is a one-line summary; a ClusterView says when its cluster closed; Graph.summary()."""

import pytest

import workbench as wb
from workbench.events import (
    ROOT,
    ClusterClosed,
    FitFinished,
    FitInterrupted,
    FitStarted,
    ScalingPoint,
    ScalingStarted,
    Step,
)
from workbench.widgets import ClusterView, GraphView, ScalingView, TrainingView


def _text(view) -> str:
    data, _ = view._repr_mimebundle_()
    return data["text/plain"]


def test_training_view_text_is_one_line():
    view = TrainingView()
    view.feed([FitStarted(steps=300, batch_size=8, fetches=("loss",)),
               *[Step(step=i, time=0.1, samples_per_s=80.0, fetches={"loss": 1.0 / i}) for i in range(1, 301)],
               FitFinished(steps=300)])  # fmt: skip
    assert _text(view) == "training · 300 steps · done · loss 0.00333"
    titled = TrainingView(title="training · 300 steps")  # as the notebook names it
    titled.feed([FitStarted(steps=300, batch_size=8, fetches=("loss",)), Step(step=1, time=0.1, samples_per_s=8.0,
                 fetches={"loss": 0.054}), FitInterrupted(step=1, steps=300, reason="stopped")])  # fmt: skip
    assert _text(titled) == "training · 300 steps · stopped at step 1 · loss 0.054"


def test_graph_and_scaling_views_text(tmp_path):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        with wb.name_scope("dense"):
            w = wb.variable("w", shape=(4, 3))
            b = wb.variable("b", shape=(3,), init="zeros")
        loss = wb.mean(wb.matmul(x, w) + b)
        wb.optimizers.Momentum(0.1).minimize(loss)
    assert _text(GraphView(g)) == f"graph mlp · {len(g.operations)} ops · 15 parameters · 2 scopes folded"
    table = g.summary(print_fn=None)
    assert table.splitlines()[2].split() == ["dense", "2", "15", "0"]
    assert table.splitlines()[3].split() == ["Momentum", "2", "0", "15"]
    assert table.splitlines()[-1].split() == ["total", "4", "15", "15"]
    scaling = ScalingView()
    scaling.feed([ScalingStarted(workers=(1, 2)), ScalingPoint(workers=1, samples_per_s=10.0)])
    assert _text(scaling) == "scaling study · 1 of 2 points · running"


def test_cluster_view_turns_closed_when_its_cluster_closes():
    info = {"scheduler": "tcp://127.0.0.1:9", "dashboard": "http://127.0.0.1:8787/status",
            "workers": [{"address": "tcp://127.0.0.1:1", "name": "0", "threads": 1, "memory": 2**30, "gpus": 0}]}  # fmt: skip
    view = ClusterView(info)
    other = ClusterView(dict(info, scheduler="tcp://127.0.0.1:10"))
    assert _text(view) == "cluster tcp://127.0.0.1:9 · 1 workers"
    ROOT.emit(ClusterClosed, scheduler="tcp://127.0.0.1:9")
    assert view.closed and not other.closed
    assert view.info == {"scheduler": "tcp://127.0.0.1:9", "workers": [], "closed": "closed"}
    assert _text(view) == "cluster tcp://127.0.0.1:9 · closed"
    svg = view.snapshot()
    assert "closed" in svg and "dashboard" not in svg and "tcp://127.0.0.1:1" not in svg
    ROOT.emit(ClusterClosed, scheduler="tcp://127.0.0.1:10", shut_down=False)  # a cluster reached by address
    assert _text(other) == "cluster tcp://127.0.0.1:10 · disconnected" and "keeps running" in other.snapshot()


@pytest.mark.slow
def test_closing_a_local_cluster_closes_its_view():
    from workbench.magics import _cluster_view

    client = wb.cluster.connect("local", n_workers=1)
    try:
        view = _cluster_view(client)
        assert not view.closed and len(view.info["workers"]) == 1
    finally:
        wb.cluster.close(client)
    assert view.closed and "closed" in _text(view)
