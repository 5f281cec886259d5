import dataclasses

import numpy as np
import pytest

import workbench as wb
from workbench.events import (
    EventStream,
    FitFailed,
    FitFinished,
    FitInterrupted,
    FitStarted,
    NodeState,
    Restarted,
    RunFailed,
    RunFinished,
    RunStarted,
    ScalingFinished,
    ScalingPoint,
    ScalingStarted,
    Step,
)
from workbench.widgets import ClusterView, ComparisonView, GraphView, ScalingView, Throttle, TrainingView
from workbench.widgets.training_view import Series, TrainingModel


def steps(n, labels=("loss",), session="", **metrics):
    for i in range(1, n + 1):
        fetches = {k: 1.0 / i for k in labels}
        yield Step(session=session, step=i, time=0.01, samples_per_s=100.0 * i, fetches=fetches, metrics=metrics)


# -- throttling ---------------------------------------------------------------------------


def test_throttle_pushes_at_most_ten_times_a_second_and_always_the_last_state(clock):
    pushed = []
    throttle = Throttle(lambda: pushed.append(clock()), max_rate=10, clock=clock)
    for _ in range(10_000):  # 10,000 events over 2 s
        clock.advance(0.0002)
        throttle.request()
    assert 19 <= len(pushed) <= 21
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(pushed, pushed[1:]))
    throttle.flush()
    assert pushed[-1] == clock()
    throttle.flush()  # nothing new: no push
    assert len(pushed) == throttle.pushes


def test_training_view_updates_at_most_ten_times_a_second_whatever_the_step_rate(clock):
    stream = EventStream()
    view = TrainingView(clock=clock).follow(stream, session="s1")
    syncs = []
    view.observe(lambda change: syncs.append(clock()), names="state")
    stream.emit(FitStarted(session="s1", steps=5000, batch_size=32, fetches=("loss",)))
    for event in steps(5000, session="s1"):
        clock.advance(0.0004)  # 2,500 steps/s for 2 s
        stream.emit(event)
    assert len(syncs) <= 2 * 10 + 1
    stream.emit(FitFinished(session="s1", steps=5000))
    assert view.state["step"] == 5000 and view.state["status"] == "done"
    assert view.state["curves"]["loss"][-1] == [5000, 1.0 / 5000]
    assert not view.following  # the run is over


def test_training_view_ignores_other_sessions(clock):
    stream = EventStream()
    view = TrainingView(clock=clock).follow(stream, session="s1")
    stream.emit(FitStarted(session="s2", steps=10, batch_size=4))
    assert view.model.status == "waiting"


def test_fetches_may_be_called_anything(clock):
    """A fetch named like a field of the step (time, workers, step) is still a curve of its own."""
    model = TrainingModel()
    labels = ("time", "workers", "step", "replicas", "samples/s")
    model.handle(FitStarted(steps=3, batch_size=4, fetches=labels), clock())
    for event in steps(3, labels=labels, replicas=2, workers={"tcp://a": 0.005}):
        model.handle(event, clock())
    snap = model.snapshot()
    assert sorted(snap["curves"]) == sorted(labels)
    assert snap["curves"]["workers"][-1] == [3, 1.0 / 3] and snap["step"] == 3
    assert snap["replicas"] == 2 and snap["throughput"][-1] == [3, 300.0]
    assert snap["workers"] == {"tcp://a": pytest.approx(0.5)}


# -- training model -----------------------------------------------------------------------


def test_training_model_progress_eta_and_curves(clock):
    model = TrainingModel()
    model.handle(FitStarted(steps=100, batch_size=32, fetches=("loss", "acc")), clock())
    for event in steps(25, labels=("loss", "acc")):
        clock.advance(0.1)
        model.handle(event, clock())
    snap = model.snapshot()
    assert snap["step"] == 25 and snap["steps"] == 100 and snap["status"] == "running"
    assert snap["elapsed"] == pytest.approx(2.5)
    assert snap["eta"] == pytest.approx(7.5)  # 75 steps at 0.1 s each
    assert snap["samples_per_s"] == 2500.0
    assert snap["median_samples_per_s"] == 1300.0  # of 100, 200, ..., 2500
    assert sorted(snap["curves"]) == ["acc", "loss"]
    assert snap["throughput"][-1] == [25, 2500.0]
    assert snap["workers"] == {}
    assert model.handle(FitFinished(steps=100), clock()) is True
    assert model.snapshot()["eta"] is None


def test_training_model_worker_utilization_replicas_and_dropped(clock):
    model = TrainingModel()
    model.handle(FitStarted(steps=4, batch_size=8, fetches=("loss",)), clock())
    workers = {"tcp://a": 0.05, "tcp://b": 0.1}
    for event in steps(4, replicas=2, workers=workers, dropped=0):
        model.handle(dataclasses.replace(event, time=0.1), clock())
    model.handle(Step(step=5, time=0.1, samples_per_s=1.0, fetches={"loss": 0.1},
                      metrics={"workers": {"tcp://a": 0.1}, "dropped": 1}), clock())  # fmt: skip
    snap = model.snapshot()
    assert snap["workers"] == {"tcp://a": pytest.approx(0.3 / 0.5), "tcp://b": pytest.approx(0.4 / 0.5)}
    assert snap["replicas"] == 2 and snap["dropped"] == 1


def test_a_resumed_cluster_fit_plots_only_its_metrics(clock):
    model = TrainingModel()
    model.handle(FitStarted(steps=100, batch_size=8, fetches=("loss",), start=60, replicas=2, workers=2), clock())
    clock.advance(4.0)
    metrics = {"replicas": 2, "compute_seconds": 0.1, "reduce_seconds": 0.01, "update_seconds": 0.01,
               "bytes_moved": 1024, "workers": {"tcp://a": 0.1, "tcp://b": 0.1}, "dropped": 0}  # fmt: skip
    model.handle(Step(step=80, time=0.2, samples_per_s=40.0, fetches={"loss": 0.5}, metrics=metrics), clock())
    model.handle(Restarted(step=80, attempt=1), clock())
    snap = model.snapshot()
    assert list(snap["curves"]) == ["loss"]
    assert snap["eta"] == pytest.approx(4.0)  # 20 steps in 4 s since step 60; 20 to go
    assert snap["start"] == 60 and snap["restarts"] == 1 and snap["workers"] == {"tcp://a": 0.5, "tcp://b": 0.5}


def test_non_scalar_fetches_are_not_plotted(clock):
    model = TrainingModel()
    model.handle(FitStarted(steps=1, batch_size=1, fetches=("loss", "logits", "nan")), clock())
    fetches = {"loss": 1.0, "logits": np.zeros(3), "nan": float("nan")}
    model.handle(Step(step=1, time=0.1, samples_per_s=10.0, fetches=fetches), clock())
    assert list(model.snapshot()["curves"]) == ["loss"]


def test_a_failed_run_shows_where(clock):
    model = TrainingModel()
    model.handle(FitStarted(steps=10, batch_size=1), clock())
    assert model.handle(RunFailed(op="log", error="NaN"), clock()) is True
    assert model.snapshot()["status"] == "failed" and model.snapshot()["error"] == "log: NaN"


def test_series_keeps_a_bounded_number_of_points_and_the_last_one():
    series = Series(max_points=100)
    for i in range(1, 100_001):
        series.append(i, float(i))
    points = series.view()
    assert len(points) <= 101
    assert points[0] == [1, 1.0] and points[-1] == [100_000, 100_000.0]
    xs = [p[0] for p in points]
    assert xs == sorted(xs)


def test_training_view_from_a_real_fit(clock, linear):
    g, train, loss = linear
    sess = wb.Session(g)
    view = TrainingView(clock=clock).follow(sess.events)
    sess.fit(train, {"x": np.ones((16, 2), "float32")}, batch_size=4, steps=12, fetches={"loss": loss})
    assert view.state["step"] == 12 and view.state["status"] == "done"
    assert len(view.state["curves"]["loss"]) == 12
    assert view.state["curves"]["loss"][-1][1] < view.state["curves"]["loss"][0][1]


def test_the_stop_button_ends_a_real_fit_after_the_current_step_and_the_view_says_so(clock, linear):
    g, train, loss = linear
    sess = wb.Session(g)
    view = TrainingView(clock=clock).follow(sess.events, session=sess.token)

    def click(record):  # what the front end's Stop button sends
        if record["step"] == 4:
            view._on_front_end_message(view, {"event": "stop"}, [])
            assert view.model.outcome == "stopping after this step"

    history = sess.fit(train, {"x": np.ones((16, 2), "float32")}, batch_size=4, steps=50, fetches={"loss": loss},
                       callback=click)  # fmt: skip
    assert len(history.records) == 4
    assert view.state["status"] == "stopped" and view.state["outcome"] == "stopped at step 4"
    assert view.state[
        "step"
    ] == 4 and view.__repr__() == "training · 4 / 50 steps · stopped at step 4 · loss " + format(
        history.records[-1]["loss"], ".3g"
    )
    assert "stopped at step 4" in view.snapshot() and not view.following
    assert not view.request_stop()  # the run is over: a late click stops nothing


def test_the_final_state_says_done_interrupted_or_failed(clock):
    outcomes = []
    for end in (FitFinished(steps=9), FitInterrupted(step=6, steps=9, reason="interrupted"),
                FitInterrupted(step=5, steps=9, reason="stopped"),
                FitFailed(step=3, error="ClusterError: lost the Dask scheduler")):  # fmt: skip
        view = TrainingView(clock=clock)
        view.feed([FitStarted(steps=9, batch_size=2), *steps(3), end])
        outcomes.append(view.state["outcome"])
        assert view.ended
    assert outcomes == [
        "done", "interrupted at step 6", "stopped at step 5", "failed: ClusterError: lost the Dask scheduler"
    ]  # fmt: skip


# -- graph view ---------------------------------------------------------------------------


def test_graph_view_folds_and_unfolds(mlp):
    view = GraphView(mlp)
    assert view.collapsed == ["SGD", "gradients"] and len(view.layout["nodes"]) == 10
    view.toggle("gradients")
    assert view.collapsed == ["SGD"] and len(view.layout["nodes"]) == 15
    view.collapsed = []  # what the front end does on a click
    assert len(view.layout["nodes"]) == 21
    with pytest.raises(KeyError, match="no name scope 'nope'"):
        view.toggle("nope")


def scoped_mlp():
    g = wb.Graph(name="scoped")
    with g.as_default():
        h = wb.placeholder("x", shape=(None, 8))
        for i in (1, 2, 3):
            with wb.name_scope(f"layer{i}"):
                h = wb.relu(wb.matmul(h, wb.variable("w", shape=(8, 8))) + wb.variable("b", shape=(8,)))
        wb.optimizers.SGD(0.1).minimize(wb.mean(h))
    return g


def test_graph_view_folds_big_user_scopes_and_folds_or_unfolds_everything():
    view = GraphView(scoped_mlp())
    assert view.collapsed == ["SGD", "gradients", "layer1", "layer2", "layer3"]
    assert GraphView(scoped_mlp(), fold_over=10).collapsed == ["SGD", "gradients"]
    assert "layer2/w" in view.names and len(view.names) == len(view.graph.operations)
    view.unfold_all()
    assert view.collapsed == [] and len(view.layout["nodes"]) == len(view.graph.operations)
    view.fold_all()
    assert {n["id"] for n in view.layout["nodes"]} >= {"layer1", "layer2", "layer3", "gradients", "SGD"}
    assert not any("/" in n["id"] for n in view.layout["nodes"])


def test_graph_view_search_reveals_and_highlights_a_hidden_op():
    view = GraphView(scoped_mlp())
    assert view.search("W")[:1] == ["layer1/w"] and view.search("layer2/w") == ["layer2/w"]
    assert view.search("") == [] and view.search("nothing") == []
    assert view.reveal("layer2/matmul") == "layer2/matmul"
    assert "layer2" not in view.collapsed and "layer1" in view.collapsed
    assert view.highlight == "layer2/matmul" and "layer2/matmul" in {n["id"] for n in view.layout["nodes"]}
    with pytest.raises(KeyError, match="graph 'scoped' has no operation matching 'conv'"):
        view.reveal("conv")


def test_graph_view_node_states_from_run_events(mlp, clock):
    stream = EventStream()
    view = GraphView(mlp, clock=clock).follow(stream)
    ops = ("x", "y", "w", "b", "matmul", "add", "softmax_cross_entropy", "mean")
    mine = {"session": "s7", "graph": mlp.token}
    stream.emit(RunStarted(**mine, ops=ops))
    assert view.states["matmul"] == "running"
    stream.emit(RunFinished(**mine))
    assert set(view.states.values()) == {"done"}
    clock.advance(1)
    stream.emit(RunStarted(**mine, ops=ops + ("gradients/ones_like", "SGD/update")))
    stream.emit(RunFailed(**mine, op="add", error="boom"))
    assert view.states["matmul"] == "done" and view.states["add"] == "error"
    assert view.states["mean"] == "waiting" and view.states["gradients"] == "waiting"
    other = wb.Graph(name=mlp.name)  # same names, another graph: its runs are not this view's
    stream.emit(RunStarted(session="s8", graph=other.token, ops=ops))
    stream.emit(RunFinished(session="s8", graph=other.token))
    assert view.states["add"] == "error"
    assert view.following  # a graph view follows every run


def test_graph_view_state_updates_are_throttled(mlp, clock):
    stream = EventStream()
    view = GraphView(mlp, clock=clock).follow(stream)
    pushes = []
    view.observe(lambda change: pushes.append(clock()), names="states")
    for i in range(1000):  # a node_state storm: 1,000 events in 1 s
        clock.advance(0.001)
        stream.emit(NodeState(session="s1", graph=mlp.token, op="matmul", state="running" if i % 2 else "done"))
    assert len(pushes) <= 11


def test_graph_view_from_a_real_session(mlp):
    view = GraphView(mlp).follow(wb.events.ROOT)
    try:
        sess = wb.Session(mlp)
        sess.run(mlp.loss, {"x": np.zeros((2, 64)), "y": np.zeros(2, "int64")})
    finally:
        view.stop()
    assert view.states["mean"] == "done"


def test_graph_views_of_two_graphs_with_the_same_names_stay_apart():
    def build():
        g = wb.Graph(name="twin")
        with g.as_default():
            x = wb.placeholder("x", shape=(None, 2))
            w = wb.variable("w", shape=(2,), init=1.0)
            y = wb.sum(x * w, axis=1)
        return g, y

    (first, y1), (second, _) = build(), build()
    views = [GraphView(g).follow(wb.events.ROOT) for g in (first, second)]
    try:
        wb.Session(first).run(y1, {"x": np.ones((1, 2))})
    finally:
        for view in views:
            view.stop()
    assert views[0].states["sum"] == "done" and views[1].states == {}


# -- scaling and cluster views ------------------------------------------------------------


def test_scaling_view_rows_arrive_one_by_one():
    stream = EventStream()
    view = ScalingView().follow(stream)
    stream.emit(ScalingStarted(workers=(1, 2, 4)))
    assert view.state == {"planned": [1, 2, 4], "rows": [], "status": "running"}
    stream.emit(ScalingPoint(workers=2, samples_per_s=180.0, speedup=1.8, efficiency=0.9))
    stream.emit(ScalingPoint(workers=1, samples_per_s=100.0, speedup=1.0, efficiency=1.0))
    assert [r["workers"] for r in view.state["rows"]] == [1, 2]  # pushed at once, sorted
    rows = [{"workers": n, "samples_per_s": 100.0 * n * 0.9, "speedup": 0.9 * n, "efficiency": 0.9} for n in (1, 2, 4)]
    stream.emit(ScalingFinished(rows=tuple(rows)))
    assert view.state["status"] == "done" and len(view.state["rows"]) == 3
    assert not view.following


def test_cluster_view_holds_the_info():
    info = {"scheduler": "tcp://127.0.0.1:8786", "dashboard": "http://127.0.0.1:8787/status",
            "workers": [{"address": "tcp://127.0.0.1:1", "name": "0", "threads": 1, "memory": 2**30, "gpus": 1}]}  # fmt: skip
    view = ClusterView(info)
    assert view.info["dashboard"].endswith("/status")
    assert ClusterView(None, message="none").info is None


def test_views_render_offline():
    """The front ends are shipped as text (no URL to fetch) and never import from the network."""
    for cls in (GraphView, TrainingView, ScalingView, ClusterView, ComparisonView):
        esm = cls._esm.default_value if hasattr(cls._esm, "default_value") else cls._esm
        esm = str(esm)
        assert "export default" in esm
        assert "http://" not in esm.replace("http://www.w3.org/2000/svg", "") and "https://" not in esm
        assert "import " not in esm
