"""Timelines of the lab's simulated fits, in virtual seconds: waits blamed on the straggler, none with
backups that drop it, async lanes without waits."""

import numpy as np
import pytest

import workbench as wb


@pytest.fixture(scope="module")
def problem():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2), dtype="float64")
        y = wb.placeholder("y", shape=(None, 1), dtype="float64")
        w = wb.variable("w", shape=(2, 1), init="zeros", dtype="float64")
        train = wb.optimizers.SGD(0.1).minimize(wb.mean((x @ w - y) ** 2))
    xs = np.random.default_rng(0).normal(size=(64, 2))
    return g, train, {"x": xs, "y": xs @ np.array([[1.0], [2.0]])}


def fit(problem, **kw):
    g, train, data = problem
    return wb.Session(g, seed=0).fit(train, data, batch_size=12, steps=6, clock="virtual", compute_seconds=0.1, **kw)


def test_a_virtual_sync_fit_blames_its_straggler_in_virtual_seconds(problem):
    hist = fit(problem, replicas=3, stragglers=wb.stragglers.Fixed(1, 0.2))
    tl = hist.timeline()
    assert tl.workers == ["replica 0", "replica 1", "replica 2"]
    worker, seconds = tl.stragglers()[0]
    assert worker == "replica 1" and seconds == pytest.approx(0.2)
    waits = [s for s in tl.spans if s["phase"] == "wait"]
    assert len(waits) == 12 and {s["waiting_for"] for s in waits} == {"replica 1"}
    assert all(s["end"] - s["start"] == pytest.approx(0.2) for s in waits)
    for step, elapsed in zip(hist["step"], hist["elapsed"], strict=True):  # spans lie inside their step
        inside = [s for s in tl.spans if s["step"] == step]
        assert max(s["end"] for s in inside) == pytest.approx(elapsed)
        assert min(s["start"] for s in inside) == pytest.approx(elapsed - 0.3)
    assert fit(problem, replicas=3, stragglers=wb.stragglers.Fixed(1, 0.2)).timeline().spans == tl.spans


def test_backups_that_drop_the_straggler_leave_no_waits(problem):
    hist = fit(problem, replicas=3, backup_replicas=1, stragglers=wb.stragglers.Fixed(1, 0.2))
    tl = hist.timeline()
    assert not [s for s in tl.spans if s["phase"] == "wait"]
    assert all(s["end"] - s["start"] == pytest.approx(0.1) for s in tl.spans)  # cut where the step went on


def test_async_lanes_run_from_each_read_to_its_arrival(problem):
    tl = fit(problem, replicas=3, strategy="async").timeline()
    assert {s["phase"] for s in tl.spans} == {"compute"}
    assert len(tl.spans) == 6 and all(s["end"] - s["start"] == pytest.approx(0.1) for s in tl.spans)
