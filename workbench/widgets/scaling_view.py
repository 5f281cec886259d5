"""ScalingView: throughput and speedup against worker count, beside the ideal line."""

from __future__ import annotations

import functools
from typing import Any

import traitlets

from workbench.widgets import snapshots
from workbench.events import Event, ScalingFinished, ScalingPoint, ScalingStarted
from workbench.widgets._base import View, front_end

_COLUMNS = ("workers", "samples_per_s", "speedup", "efficiency")


def _by_workers(row: dict) -> int:
    return row["workers"]


class ScalingView(View):
    """The rows of a scaling study as they arrive: samples/s and speedup per worker count
    (ideal: proportional to the count), and the efficiency of each count; when the study
    predicted, each strategy's predictions as a dashed continuation, with the assumptions.

    >>> from workbench.events import ScalingPoint, ScalingStarted
    >>> view = ScalingView()
    >>> view.feed([ScalingStarted(workers=(1, 2)),
    ...            ScalingPoint(workers=1, samples_per_s=100.0, speedup=1.0, efficiency=1.0)])
    >>> view.state["planned"], len(view.state["rows"]), view.state["status"]
    ([1, 2], 1, 'running')
    """

    _esm = front_end("scaling_view.js")
    state = traitlets.Dict().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.planned: list[int] = []
        self.rows: list[dict] = []
        self.predicted: list[dict] = []
        self.assumptions: list[str] = []
        self.status = "waiting"
        self._sync()

    @functools.singledispatchmethod
    def handle(self, event: Event) -> bool:
        return False

    @handle.register
    def _started(self, event: ScalingStarted) -> bool:
        self.planned = [int(n) for n in event.workers]
        self.rows, self.predicted, self.assumptions, self.status = [], [], [], "running"
        return False

    @handle.register
    def _point(self, event: ScalingPoint) -> bool:
        row = {k: getattr(event, k) for k in _COLUMNS}
        self.rows = sorted([r for r in self.rows if r["workers"] != row["workers"]] + [row], key=_by_workers)
        self.status = "running"
        return True  # one point per measurement: always worth showing at once

    @handle.register
    def _finished(self, event: ScalingFinished) -> bool:
        if event.rows:
            self.rows = sorted(({k: r.get(k) for k in _COLUMNS} for r in event.rows), key=_by_workers)
        self.predicted = [{k: r.get(k) for k in (*_COLUMNS, "strategy")} for r in event.predictions]
        self.assumptions = [str(a) for a in event.assumptions]
        self.status = "done"
        return True

    @property
    def ended(self) -> bool:
        return self.status == "done"

    def _sync(self) -> None:
        state = {"planned": self.planned, "rows": self.rows, "status": self.status}
        if self.predicted:  # only a study that predicted has these
            state.update(predicted=self.predicted, assumptions=self.assumptions)
        self.state = state

    def snapshot_state(self):
        return self.state

    def __repr__(self) -> str:
        """One line: ``scaling study · 3 of 3 points · done``."""
        planned = len(self.planned) or len(self.rows)
        return f"scaling study · {len(self.rows)} of {planned} points · {self.status}"

    def render_snapshot(self, state) -> str:
        return snapshots.scaling_svg(state)
