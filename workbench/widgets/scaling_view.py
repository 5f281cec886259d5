"""ScalingView: throughput and speedup against worker count, beside the ideal line."""

from __future__ import annotations

from typing import Any

import traitlets

from workbench.widgets import snapshots
from workbench.widgets._base import View, front_end


class ScalingView(View):
    """The rows of a scaling study as they arrive: samples/s and speedup per worker count
    (ideal: proportional to the count), and the efficiency of each count.

    >>> view = ScalingView()
    >>> view.feed([{"kind": "scaling_started", "workers": [1, 2]},
    ...            {"kind": "scaling_point", "workers": 1, "samples_per_s": 100.0, "speedup": 1.0, "efficiency": 1.0}])
    >>> view.state["planned"], len(view.state["rows"]), view.state["status"]
    ([1, 2], 1, 'running')
    """

    _esm = front_end("scaling_view.js")
    state = traitlets.Dict().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.planned: list[int] = []
        self.rows: list[dict] = []
        self.status = "waiting"
        self._sync()

    def handle(self, event: dict) -> bool:
        kind = event.get("kind")
        if kind == "scaling_started":
            self.planned = [int(n) for n in event.get("workers", ())]
            self.rows, self.status = [], "running"
        elif kind == "scaling_point":
            row = {k: event.get(k) for k in ("workers", "samples_per_s", "speedup", "efficiency")}
            self.rows = [r for r in self.rows if r["workers"] != row["workers"]] + [row]
            self.rows.sort(key=lambda r: r["workers"])
            self.status = "running"
            return True  # one point per measurement: always worth showing at once
        elif kind == "scaling_finished":
            rows = event.get("rows")
            if rows:
                self.rows = sorted(({k: r.get(k) for k in ("workers", "samples_per_s", "speedup", "efficiency")}
                                    for r in rows), key=lambda r: r["workers"])  # fmt: skip
            self.status = "done"
            return True
        return False

    @property
    def ended(self) -> bool:
        return self.status == "done"

    def _sync(self) -> None:
        self.state = {"planned": self.planned, "rows": self.rows, "status": self.status}

    def snapshot_state(self):
        return self.state

    def render_snapshot(self, state) -> str:
        return snapshots.scaling_svg(state)
