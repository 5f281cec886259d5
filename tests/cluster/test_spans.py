"""Spans laid out from replicas' marks, without a cluster: clock offsets, waits blamed, lanes in order."""

from workbench.spans import Lanes, Marks
from workbench.timeline import Timeline


def marks(offset, begin, computed, arrived, reduced, end):
    """One all-reduce replica's marks, in its own clock (``offset``: its clock's lag behind the scheduler's)."""
    return {
        "offset": offset,
        "begin": begin,
        "phases": [
            ["compute", begin, computed],
            ["collective", computed, reduced, "gradients"],
            ["update", reduced, end],
        ],
        "arrivals": {"gradients": arrived},
    }


def test_clocks_are_aligned_through_each_workers_offset():
    # worker b's clock runs 100 s behind the scheduler's: in its own clock it computed "earlier" than a
    results = [
        {"worker": "a", "rank": 0, "marks": marks(0.0, 1000.0, 1000.1, 1000.1, 1000.5, 1000.6)},
        {"worker": "b", "rank": 1, "marks": marks(100.0, 900.0, 900.4, 900.4, 900.5, 900.6), "bytes_sent": 80},
    ]
    spans = Lanes(origin=1000.0).step(1, results)
    wait = [s for s in spans if s["phase"] == "wait"]
    assert len(wait) == 1 and wait[0]["worker"] == "a" and wait[0]["waiting_for"] == "b"
    assert abs(wait[0]["start"] - 0.1) < 1e-9 and abs(wait[0]["end"] - 0.4) < 1e-9
    b = {s["phase"]: s for s in spans if s["worker"] == "b"}
    assert set(b) == {"compute", "communicate", "update"}
    assert b["communicate"]["bytes"] == 80 and abs(b["communicate"]["start"] - 0.4) < 1e-9
    assert Timeline(spans).stragglers()[0][0] == "b"


def test_a_task_that_began_before_the_last_step_ended_starts_its_lane_after_it():
    lanes = Lanes(origin=0.0)
    first = lanes.step(1, [{"worker": "a", "rank": 0, "marks": marks(0.0, 0.0, 0.2, 0.2, 0.25, 0.3)}])
    second = lanes.step(2, [{"worker": "a", "rank": 0, "marks": marks(0.0, 0.1, 0.5, 0.5, 0.55, 0.6)}])
    lane = sorted(first + second, key=lambda s: s["start"])
    assert all(a["end"] <= b["start"] for a, b in zip(lane, lane[1:], strict=False))
    assert second[0]["start"] == 0.3  # waiting its turn, after step 1's update


def test_idle_between_a_workers_tasks():
    lanes = Lanes(origin=0.0)
    lanes.step(1, [{"worker": "a", "rank": 0, "marks": marks(0.0, 0.0, 0.2, 0.2, 0.25, 0.3)}])
    second = lanes.step(2, [{"worker": "a", "rank": 0, "marks": marks(0.0, 0.5, 0.6, 0.6, 0.65, 0.7)}])
    assert second[0]["phase"] == "idle" and (second[0]["start"], second[0]["end"]) == (0.3, 0.5)


def test_marks_record_in_order():
    m = Marks()
    m.phase("compute", m.begin, m.begin + 1)
    m.arrived("gradients", m.begin + 1)
    d = m.as_dict()
    assert d["phases"][0][0] == "compute" and d["arrivals"] == {"gradients": m.begin + 1} and d["offset"] == 0.0
