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
