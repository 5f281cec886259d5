"""Timelines of the one-process simulation: one lane per replica, a wait per collective."""

import numpy as np

import workbench as wb


def model():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(4, 3), dtype="float64")
        loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, train


def data():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(96, 4)), "y": rng.integers(0, 3, 96)}


def test_a_simulated_fit_has_one_lane_per_replica_with_its_collectives():
    g, train = model()
    hist = wb.Session(g, seed=0, cluster=False).fit(train, data(), batch_size=24, steps=4, replicas=3)
    timeline = hist.timeline()
    assert timeline.workers == ["replica 0", "replica 1", "replica 2"] and timeline.steps == [1, 2, 3, 4]
    for step in timeline.steps:
        spans = timeline.step(step).spans
        assert {s["worker"] for s in spans if s["phase"] == "compute"} == set(timeline.workers)
        assert any(s["phase"] in ("communicate", "wait") for s in spans)
    for worker in timeline.workers:
        lane = [s for s in timeline.spans if s["worker"] == worker]
        assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(lane, lane[1:], strict=False))
    waits = [s for s in timeline.spans if s["phase"] == "wait"]
    assert all(s["waiting_for"] in timeline.workers and s["waiting_for"] != s["worker"] for s in waits)


def check_parts(timeline):
    """Each replica's step has a forward part that ends before its backward part begins, both inside the
    step, and no two spans of a lane overlap."""
    for worker in timeline.workers:
        lane = sorted((s for s in timeline.spans if s["worker"] == worker), key=lambda s: s["start"])
        assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(lane, lane[1:], strict=False))
        for step in timeline.steps:
            spans = [s for s in lane if s["step"] == step]
            working = [s for s in spans if s["phase"] != "idle"]
            first, last = min(s["start"] for s in working), max(s["end"] for s in working)
            forward = [s for s in spans if s.get("part") == "forward"]
            backward = [s for s in spans if s.get("part") == "backward"]
            assert forward and backward, spans
            assert all(s["phase"] == "compute" for s in forward + backward)
            assert max(s["end"] for s in forward) <= min(s["start"] for s in backward) + 1e-9
            assert first <= forward[0]["start"] and backward[-1]["end"] <= last


def test_a_simulated_step_splits_its_compute_into_forward_and_backward():
    g, train = model()
    hist = wb.Session(g, seed=0, cluster=False).fit(train, data(), batch_size=24, steps=4, replicas=3)
    timeline = hist.timeline()
    check_parts(timeline)
    names = {e["name"] for e in timeline.chrome_trace()["traceEvents"] if e.get("cat") == "compute"}
    assert names == {"forward", "backward"}


def test_the_live_view_of_a_simulated_fit_gets_each_step_as_it_ends():
    from workbench.widgets import TimelineView

    g, train = model()
    sess = wb.Session(g, seed=0, cluster=False)
    view = TimelineView().follow(sess.events, session=sess.token)
    seen = []

    def each_step(record):  # called after the step's event reached the view
        view.throttle.flush()
        seen.append((record["step"], view.steps, {s[7] for s in view.spans if s[2] == "compute"}))

    hist = sess.fit(train, data(), batch_size=24, steps=3, replicas=2, callback=each_step)
    assert [(k, steps) for k, steps, _ in seen] == [(1, [1, 1]), (2, [1, 2]), (3, [1, 3])]
    assert all(parts == {"forward", "backward"} for _, _, parts in seen)
    assert view.timeline.spans == hist.timeline().spans  # the spans the view read are the history's
