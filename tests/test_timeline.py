"""Timeline: summaries, stragglers and the Chrome trace of a fixed set of spans."""

import json

import pytest

import workbench as wb
from workbench.timeline import Timeline, median_profile


def span(worker, replica, step, phase, start, end, **extra):
    return {"worker": worker, "replica": replica, "step": step, "phase": phase, "start": start, "end": end, **extra}


@pytest.fixture
def timeline():
    spans = []
    for step in (1, 2):
        t = (step - 1) * 1.0
        spans += [
            span("a", 0, step, "compute", t, t + 0.25),
            span("a", 0, step, "wait", t + 0.25, t + 0.75, waiting_for="c"),
            span("a", 0, step, "communicate", t + 0.75, t + 1.0, bytes=100),
            span("b", 1, step, "compute", t, t + 0.5),
            span("b", 1, step, "wait", t + 0.5, t + 0.75, waiting_for="c"),
            span("b", 1, step, "communicate", t + 0.75, t + 1.0, bytes=100),
            span("c", 2, step, "compute", t, t + 0.75),
            span("c", 2, step, "communicate", t + 0.75, t + 1.0, bytes=100),
        ]
    return Timeline(spans)


def test_stragglers_rank_who_held_the_steps_back(timeline):
    assert timeline.stragglers() == [("c", 0.5), ("a", 0.0), ("b", 0.0)]
    assert timeline.waits("a", on="c") == 0.5 and timeline.waits("c") == 0.0


def test_summary_gives_median_and_spread_per_phase_per_worker(timeline):
    summary = timeline.summary()
    assert list(summary) == ["a", "b", "c"]
    assert summary["a"]["wait"] == {"total": 1.0, "median": 0.5, "spread": 0.0}
    assert "wait" not in summary["c"] and summary["c"]["compute"]["median"] == 0.75


def test_steps_workers_and_windows(timeline):
    assert timeline.steps == [1, 2] and timeline.workers == ["a", "b", "c"]
    assert timeline.window(2, 2).steps == [2] and len(timeline.step(1)) == 8
    assert "3 workers" in repr(timeline) and repr(Timeline()) == "<Timeline: no spans>"


def test_chrome_trace_has_one_process_per_worker(timeline, tmp_path):
    path = timeline.to_chrome_trace(tmp_path / "trace.json")
    trace = json.loads(open(path).read())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 16 and {e["pid"] for e in spans} == {1, 2, 3}
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "a", 2: "b", 3: "c"}
    wait = next(e for e in spans if e["name"] == "wait")
    assert wait["args"]["waiting_for"] == "c" and wait["dur"] == 500000.0 and wait["ts"] == 250000.0


def test_history_gathers_the_spans_of_its_records(timeline):
    hist = wb.History()
    for step in (1, 2):
        hist.append({"step": step, "time": 1.0, "spans": timeline.step(step).spans, "profile": {"matmul": step}})
    assert hist.timeline().spans == timeline.spans
    assert hist.profile() == {"matmul": 1.5}
    assert "spans" not in hist.to_pandas().columns


def test_median_profile_counts_missing_ops_as_zero():
    assert median_profile([{"a": 1.0, "b": 2.0}, {"a": 3.0}, {"a": 2.0}]) == {"a": 2.0, "b": 0.0}
    assert median_profile([]) == {}
