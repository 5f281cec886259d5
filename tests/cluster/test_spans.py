"""Spans laid out from replicas' marks, without a cluster: clock offsets, waits blamed, lanes in order."""

import copy
import pickle

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


def split_marks(begin, backward, computed, end):
    """One replica's marks whose compute's backward pass began at ``backward`` (as Plan.backward_began)."""
    m = marks(0.0, begin, computed, computed, computed, end)
    m["backward"] = backward
    return m


def test_compute_is_split_where_the_backward_pass_began():
    spans = Lanes(origin=0.0).step(1, [{"worker": "a", "rank": 0, "marks": split_marks(0.0, 0.15, 0.4, 0.5)}])
    compute = [(s["part"], s["start"], s["end"]) for s in spans if s["phase"] == "compute"]
    assert compute == [("forward", 0.0, 0.15), ("backward", 0.15, 0.4)]
    assert Timeline(spans).summary()["a"]["compute"]["total"] == 0.4  # the parts add up to the phase
    assert Timeline(spans).chrome_trace()["traceEvents"][2]["name"] == "forward"


def test_compute_stretches_between_collectives_take_the_part_they_lie_in():
    # compute, a wait at a collective (the forward's, as a synchronized batch norm's), compute across the
    # start of the backward pass, a wait, compute
    m = {
        "offset": 0.0,
        "begin": 0.0,
        "phases": [
            ["compute", 0.0, 0.1],
            ["collective", 0.1, 0.2, "bn"],
            ["compute", 0.2, 0.4],
            ["collective", 0.4, 0.5, "grad"],
            ["compute", 0.5, 0.6],
        ],
        "arrivals": {"bn": 0.1, "grad": 0.4},
        "backward": 0.3,
    }
    spans = Lanes(origin=0.0).step(1, [{"worker": "a", "rank": 0, "marks": m}])
    compute = [(s["part"], s["start"], s["end"]) for s in spans if s["phase"] == "compute"]
    assert compute == [("forward", 0.0, 0.1), ("forward", 0.2, 0.3), ("backward", 0.3, 0.4), ("backward", 0.5, 0.6)]
    assert all(a["end"] <= b["start"] for a, b in zip(spans, spans[1:], strict=False))


def test_marks_without_a_backward_pass_lay_out_plain_compute():
    spans = Lanes(origin=0.0).step(1, [{"worker": "a", "rank": 0, "marks": split_marks(0.0, None, 0.4, 0.5)}])
    assert [s for s in spans if s["phase"] == "compute"] == [
        {"worker": "a", "replica": 0, "step": 1, "phase": "compute", "start": 0.0, "end": 0.4}
    ]


def test_recorded_steps_are_laid_out_when_read_in_the_order_they_were_recorded():
    steps = [marks(0.0, 0.0, 0.2, 0.2, 0.25, 0.3), marks(0.0, 0.5, 0.6, 0.6, 0.65, 0.7)]
    eager = Lanes(origin=0.0)
    expected = [eager.step(k, [{"worker": "a", "rank": 0, "marks": m}]) for k, m in enumerate(steps, 1)]
    lazy = Lanes(origin=0.0)
    recorded = [lazy.record(k, [{"worker": "a", "rank": 0, "marks": m}]) for k, m in enumerate(steps, 1)]
    assert recorded[1][0]["phase"] == "idle"  # read first, yet step 1 was laid out before it: its idle is there
    assert recorded == expected and list(recorded[0]) == expected[0] and len(recorded[1]) == len(expected[1])
    assert pickle.loads(pickle.dumps(recorded[1])) == expected[1]
    assert type(copy.deepcopy(recorded[0])) is list and recorded[0] + recorded[1] == expected[0] + expected[1]
    later = lazy.step(3, [{"worker": "a", "rank": 0, "marks": marks(0.0, 0.8, 0.9, 0.9, 0.95, 1.0)}])
    assert later[0]["phase"] == "idle" and later[0]["start"] == 0.7  # after the recorded steps
