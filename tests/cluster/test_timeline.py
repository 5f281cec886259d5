"""Timelines of cluster fits on real worker processes: waits blamed on the late replica, trace export."""

import json

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.spans import delay_rank

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DELAY = 0.2


def check_lanes(timeline):
    """Within each worker's lane no two spans overlap, and each span lies inside its step's extent."""
    for worker in timeline.workers:
        lane = sorted((s for s in timeline.spans if s["worker"] == worker), key=lambda s: s["start"])
        for a, b in zip(lane, lane[1:], strict=False):
            assert a["end"] <= b["start"] + 1e-9, (a, b)
        for s in lane:
            assert 0 <= s["start"] < s["end"], s
    for step in timeline.steps:
        spans = timeline.step(step).spans
        first, last = min(s["start"] for s in spans), max(s["end"] for s in spans)
        assert all(first <= s["start"] and s["end"] <= last for s in spans)


@pytest.fixture
def late_replica(client3):
    """Replica 1 of every all-reduce fit on the cluster sleeps DELAY before each step's compute."""
    client3.run(delay_rank, 1, DELAY)
    yield 1
    client3.run(delay_rank, 1, 0)


def test_allreduce_waits_are_blamed_on_the_late_replica(client3, kit, late_replica, tmp_path):
    m = kit.mlp(hidden=16)
    sess = wb.Session(m["graph"], seed=0, cluster=client3)
    hist = sess.fit(m["train"], kit.blobs(), batch_size=24, steps=8, fetches={"loss": m["loss"]}, strategy="allreduce")
    check_blamed(hist, late_replica, tmp_path)


def test_waits_are_blamed_on_the_straggler_of_wb_stragglers(client3, kit, tmp_path):
    m = kit.mlp(hidden=16)
    sess = wb.Session(m["graph"], seed=0, cluster=client3)
    late = wb.stragglers.Fixed(1, DELAY)  # late after computing, before handing its gradient in
    hist = sess.fit(m["train"], kit.blobs(), batch_size=24, steps=8, fetches={"loss": m["loss"]}, strategy="allreduce",
                    stragglers=late)  # fmt: skip
    check_blamed(hist, 1, tmp_path)


def check_blamed(hist, late_replica, tmp_path):
    timeline = hist.timeline()
    assert len(timeline.workers) == 3 and timeline.steps == list(range(1, 9))
    late = next(s["worker"] for s in timeline.spans if s["replica"] == late_replica)
    worker, seconds = timeline.stragglers()[0]
    assert worker == late
    assert DELAY * 0.7 <= seconds <= DELAY * 1.5, timeline.stragglers()  # a loaded machine adds to the wait
    for other in timeline.workers:
        if other != late:  # the median step: a loaded machine may hold any process back now and then
            waited = [timeline.step(k).waits(other, on=late) for k in timeline.steps]
            assert np.median(waited) >= 0.15, waited
    assert timeline.waits(late) < 0.05
    summary = timeline.summary()
    assert summary[late]["compute"]["median"] >= DELAY
    assert {"compute", "communicate", "update"} <= set(summary[late])
    check_lanes(timeline)

    path = timeline.to_chrome_trace(tmp_path / "fit.json")
    trace = json.loads(open(path).read())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(timeline.spans)
    assert {e["pid"] for e in spans} == {1, 2, 3}
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(timeline.workers)
    waits = [e for e in spans if e["name"] == "wait"]
    assert waits and all(e["args"]["waiting_for"] == late for e in waits if e["dur"] > 1e5)
    np.testing.assert_allclose(hist["loss"][-1], hist.records[-1]["loss"])


def fit_timeline(client, kit, strategy, steps=6):
    m = kit.mlp(hidden=16)
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    hist = sess.fit(m["train"], kit.blobs(), batch_size=24, steps=steps, fetches={"loss": m["loss"]}, strategy=strategy)
    return hist.timeline()


def test_parameter_server_steps_have_a_timeline(client3, kit):
    timeline = fit_timeline(client3, kit, "parameter_server")
    assert timeline.steps == list(range(1, 7)) and len(timeline.workers) >= 2
    for step in timeline.steps:
        phases = [s["phase"] for s in timeline.step(step).spans]
        assert phases.count("compute") == 3 and phases.count("update") == 1
        assert "communicate" in phases  # the reduction tree's sums
    waits = [s for s in timeline.spans if s["phase"] == "wait"]
    assert all(s["waiting_for"] in timeline.workers and s["waiting_for"] != s["worker"] for s in waits)
    check_lanes(timeline)


def test_strategy_function_steps_have_a_timeline(client3, kit):
    timeline = fit_timeline(client3, kit, wb.strategies.local_sgd(every=2))
    assert timeline.steps == list(range(1, 7)) and len(timeline.workers) == 3
    for step in timeline.steps:
        collective = [s for s in timeline.step(step).spans if s["phase"] in ("communicate", "wait")]
        assert bool(collective) == (step % 2 == 0), step  # local SGD averages every 2nd step only
        assert {s["worker"] for s in timeline.step(step).spans if s["phase"] == "compute"} == set(timeline.workers)
    check_lanes(timeline)


@pytest.mark.parametrize("strategy", ["allreduce", "local_sgd"])
def test_a_cluster_step_splits_its_compute_into_forward_and_backward(client, kit, strategy):
    timeline = fit_timeline(client, kit, wb.strategies.local_sgd(every=2) if strategy == "local_sgd" else strategy)
    assert len(timeline.workers) == 2
    check_lanes(timeline)
    for step in timeline.steps:
        for worker in timeline.workers:
            spans = [s for s in timeline.step(step).spans if s["worker"] == worker]
            forward = [s for s in spans if s.get("part") == "forward"]
            backward = [s for s in spans if s.get("part") == "backward"]
            assert forward and backward and all(s["phase"] == "compute" for s in forward + backward), spans
            assert max(s["end"] for s in forward) <= min(s["start"] for s in backward) + 1e-9
    assert {"forward", "backward"} <= {e["name"] for e in timeline.chrome_trace()["traceEvents"]}
