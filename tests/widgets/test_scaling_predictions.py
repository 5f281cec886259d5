"""ScalingView with a study's predictions: state, and the dashed curves and assumptions in the snapshot."""

import re

import pytest

from workbench.cluster.predict import Assumptions, Profile, predict
from workbench.events import EventStream, ScalingFinished, ScalingPoint, ScalingStarted
from workbench.widgets import ScalingView
from workbench.widgets.snapshots import scaling_svg

PROFILE = Profile(model_bytes=4e6, batch_size=256, compute_per_sample=1e-4, latency=1e-3, bandwidth=1e9, hop=2e-3,
                  source="a test profile")  # fmt: skip
ROWS = (
    {"workers": 1, "samples_per_s": 9000.0, "speedup": 1.0, "efficiency": 1.0, "step_seconds": 0.028},
    {"workers": 2, "samples_per_s": 12000.0, "speedup": 1.33, "efficiency": 0.67, "step_seconds": 0.021},
)


def finished_view() -> ScalingView:
    stream = EventStream()
    view = ScalingView().follow(stream)
    stream.emit(ScalingStarted(workers=(1, 2)))
    for row in ROWS:
        stream.emit(ScalingPoint(**row))
    predicted = predict(PROFILE, [1, 2, 8, 100])
    stream.emit(
        ScalingFinished(rows=ROWS, predictions=tuple(predicted), assumptions=tuple(Assumptions().describe(PROFILE)))
    )
    return view


def test_the_view_keeps_predictions_and_assumptions():
    view = finished_view()
    state = view.state
    assert state["status"] == "done" and [r["workers"] for r in state["rows"]] == [1, 2]
    assert {(r["strategy"], r["workers"]) for r in state["predicted"]} == {
        (s, n) for s in ("allreduce", "parameter_server") for n in (1, 2, 8, 100)
    }
    assert any("a test profile" in a for a in state["assumptions"])


def test_without_predictions_the_state_is_as_before():
    stream = EventStream()
    view = ScalingView().follow(stream)
    stream.emit(ScalingStarted(workers=(1,)))
    stream.emit(ScalingFinished(rows=ROWS[:1]))
    assert set(view.state) == {"planned", "rows", "status"}


def test_the_snapshot_draws_predictions_dashed_on_a_log_axis_with_the_assumptions():
    svg = scaling_svg(finished_view().state)
    dashed = re.findall(
        r'<path d="([^"]+)" fill="none" stroke="(#1a7f37|#bc4c00)" stroke-width="1.5" stroke-dasharray="5 4"', svg
    )
    assert {color for _, color in dashed} == {"#1a7f37", "#bc4c00"}  # one curve per strategy, in both charts
    assert len(dashed) == 4
    # log2 axis: 1, 2, 8, 100 at evenly growing distances: 2 is 1/log2(100) of the way from 1 to 100
    xs = [float(x) for x in re.findall(r"M ([\d.]+) ", dashed[0][0]) + re.findall(r"L ([\d.]+) ", dashed[0][0])]
    assert (xs[1] - xs[0]) / (xs[3] - xs[0]) == pytest.approx(1 / 6.644, rel=0.02)
    assert "efficiency (dashed: ideal, predicted)" in svg
    assert "assumes link: the measured link: 1 GB/s per worker, 1,000 µs a message" in svg
    assert "100 allreduce" in svg and "100 parameter_server" in svg  # predicted rows in the table
