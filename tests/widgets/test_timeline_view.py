"""TimelineView: lanes of a fit's spans, a window that follows the fit, scroll back, the scrubber link."""

import numpy as np

import workbench as wb
from workbench.events import FitFinished, FitStarted, Step
from workbench.widgets import TimelineView, TrainingView


def step_spans(step, late="b"):
    t = step - 1.0
    return [
        {"worker": "a", "replica": 0, "step": step, "phase": "compute", "start": t, "end": t + 0.25},
        {"worker": "a", "replica": 0, "step": step, "phase": "wait", "start": t + 0.25, "end": t + 0.75, "waiting_for": late},
        {"worker": "a", "replica": 0, "step": step, "phase": "communicate", "start": t + 0.75, "end": t + 1.0, "bytes": 64},
        {"worker": late, "replica": 1, "step": step, "phase": "compute", "start": t, "end": t + 0.75},
        {"worker": late, "replica": 1, "step": step, "phase": "communicate", "start": t + 0.75, "end": t + 1.0, "bytes": 64},
    ]  # fmt: skip


def events(steps=20):
    yield FitStarted(steps=steps, strategy="allreduce", fetches=("loss",))
    for k in range(1, steps + 1):
        yield Step(step=k, time=1.0, fetches={"loss": 1.0 / k}, metrics={"spans": step_spans(k)})
    yield FitFinished(steps=steps)


def test_a_window_of_the_latest_steps_with_waits_pointing_at_the_late_worker():
    view = TimelineView(window=5)
    view.feed(events())
    assert view.status == "done" and view.workers == ["a", "b"]
    assert view.steps == [1, 20] and view.shown_steps == [16, 20]
    assert {s[1] for s in view.spans} == set(range(16, 21))
    waits = [s for s in view.spans if s[2] == "wait"]
    assert len(waits) == 5 and all(s[0] == 0 and s[5] == 1 for s in waits)
    assert view.stragglers[0] == ["b", 0.5]
    svg = view.snapshot()
    assert svg.startswith("<svg") and "waits for b" in svg and "marker-end" in svg and "steps 16..20" in svg
    assert "most waited for: b (0.5 s/step)" in repr(view)


def test_scrolling_back_and_the_training_views_scrubber():
    training = TrainingView()
    view = TimelineView(window=4)
    view.follow(training)
    training.feed(events())  # a TrainingView fed by hand: the linked timeline is fed the same
    view.feed(events())
    view.end_step = 6
    assert view.shown_steps == [3, 6] and {s[1] for s in view.spans} == {3, 4, 5, 6}
    view.live()
    assert view.shown_steps == [17, 20]
    training.selected_step = 9  # a click on the loss curve
    assert view.selected_step == 9 and view.shown_steps[0] <= 9 <= view.shown_steps[1]
    view.selected_step = 12  # a click on a span here selects its step there
    assert training.selected_step == 12


def test_show_a_finished_fits_timeline():
    timeline = wb.Timeline(s for k in (1, 2, 3) for s in step_spans(k, late="c"))
    view = TimelineView().show(timeline)
    assert view.workers == ["a", "c"] and view.shown_steps == [1, 3] and view.stragglers[0][0] == "c"
    assert len(view.timeline) == len(timeline)


def test_a_simulated_fit_feeds_the_view_live():
    g = wb.Graph(name="sim")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(4, 3))
        loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    sess = wb.Session(g, seed=0, cluster=False)
    view = TimelineView().follow(sess.events, session=sess.token)
    rng = np.random.default_rng(0)
    sess.fit(train, {"x": rng.normal(size=(48, 4)), "y": rng.integers(0, 3, 48)}, batch_size=12, steps=3, replicas=2)
    view.throttle.flush()
    assert view.status == "done" and view.workers == ["replica 0", "replica 1"] and view.steps == [1, 3]


def test_the_notebook_shows_a_timeline_beside_the_training_view_of_a_cluster_fit():
    from workbench import notebook
    from workbench.events import EventStream

    stream, shown = EventStream(), []
    notebook.install(stream, display=shown.append)
    try:
        stream.emit(FitStarted(session="s1", steps=2, strategy="allreduce", scheduler="tcp://127.0.0.1:1"))
        stream.emit(Step(session="s1", step=1, time=1.0, metrics={"spans": step_spans(1)}))
        stream.emit(FitFinished(session="s1", steps=2))
        training, timeline = shown
        assert isinstance(training, TrainingView) and isinstance(timeline, TimelineView)
        assert timeline.status == "done" and timeline.workers == ["a", "b"]
        stream.emit(FitStarted(session="s2", steps=2))  # a local fit: its training view only
        assert len(shown) == 3
    finally:
        notebook.uninstall()


def test_compute_parts_are_shown_and_named():
    spans = [
        {"worker": "a", "replica": 0, "step": 1, "phase": "compute", "start": 0.0, "end": 0.25, "part": "forward"},
        {"worker": "a", "replica": 0, "step": 1, "phase": "compute", "start": 0.25, "end": 0.5, "part": "backward"},
        {"worker": "a", "replica": 0, "step": 1, "phase": "update", "start": 0.5, "end": 0.6},
    ]
    view = TimelineView()
    view.feed([FitStarted(steps=1, strategy="allreduce"), Step(step=1, metrics={"spans": spans})])
    assert [(s[2], s[7]) for s in view.spans] == [("compute", "forward"), ("compute", "backward"), ("update", "")]
    svg = view.snapshot()
    assert "compute (backward) 250.00 ms" in svg and "#54aeff" in svg
