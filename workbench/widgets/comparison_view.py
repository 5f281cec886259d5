"""ComparisonView: the runs of :func:`workbench.compare_strategies`, live.

Left: the comparison's metric (validation accuracy when recorded) against time, one curve per run.
Right: the distribution of gradient arrivals of the synchronous runs, the "k-th gradient arrival"
plot of Chen et al. (2016): at each k = 1 .. R + b, the median over steps of the k-th earliest
arrival (seconds from the step's start), with a dot where a run's step completes (the R-th).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import traitlets

from workbench.widgets import svg
from workbench.widgets._base import View, front_end


def _metric(record: dict) -> tuple[str, float] | None:
    keys = [k for k in record if k.startswith("val_")]
    for key in ("val_accuracy", *keys):
        if key in record and np.ndim(record[key]) == 0:
            return key, float(record[key])
    return None


class ComparisonView(View):
    """Validation metric against time per run, and the arrival distribution of the synchronous runs.

    >>> view = ComparisonView(["sync", "async"])
    >>> view.add("sync", {"step": 1, "elapsed": 0.5, "val_accuracy": 0.4, "arrivals": [0.1, 0.3], "replicas": 2})
    >>> view.state["runs"][0]["points"], view.state["runs"][0]["kth"]
    ([[0.5, 0.4]], [[1, 0.1], [2, 0.3]])
    """

    _esm = front_end("comparison_view.js")
    state = traitlets.Dict().tag(sync=True)

    def __init__(self, labels=(), clock: str = "virtual", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock_kind = clock
        self.metric = "val_accuracy"
        self.runs = {label: self._empty() for label in labels}
        self.status = "running"
        self._sync()

    @staticmethod
    def _empty() -> dict:
        return {"points": [], "arrivals": [], "needed": None, "steps": 0, "elapsed": 0.0, "status": "waiting"}

    @classmethod
    def of(cls, comparison) -> ComparisonView:
        """The view of a finished comparison (its histories)."""
        view = cls(list(comparison.histories), clock=comparison.clock)
        for label, history in comparison.histories.items():
            for record in history.records:
                view.add(label, record, push=False)
            view.finish_run(label, push=False)
        view.done()
        return view

    def add(self, label: str, record: dict, push: bool = True) -> None:
        """One step's record of run ``label``."""
        run = self.runs.setdefault(label, self._empty())
        run["status"] = "running"
        run["steps"] = int(record.get("step", run["steps"] + 1))
        run["elapsed"] = float(record.get("elapsed", run["elapsed"]))
        found = _metric(record)
        if found is not None:
            self.metric = found[0]
            run["points"].append([run["elapsed"], found[1]])
        arrivals = record.get("arrivals")
        if arrivals is not None and len(arrivals) > 0:
            run["arrivals"].append(sorted(float(a) for a in arrivals))
            run["needed"] = int(record.get("replicas", len(arrivals)))
        if push:
            self.throttle.request()

    def finish_run(self, label: str, push: bool = True) -> None:
        self.runs.setdefault(label, self._empty())["status"] = "done"
        if push:
            self.throttle.pending = True
            self.throttle.flush()

    def done(self) -> None:
        self.status = "done"
        self.throttle.pending = True
        self.throttle.flush()
        self.refresh_snapshot()

    def handle(self, event) -> bool:
        return False  # fed by compare_strategies' callbacks, not by events

    @property
    def ended(self) -> bool:
        return self.status == "done"

    def _sync(self) -> None:
        runs = []
        for label, run in self.runs.items():
            kth = []
            if run["arrivals"] and len({len(a) for a in run["arrivals"]}) == 1:
                median = np.median(np.asarray(run["arrivals"]), axis=0)
                kth = [[k + 1, float(v)] for k, v in enumerate(median)]
            runs.append(
                {
                    "label": label,
                    "points": [list(p) for p in run["points"]],
                    "kth": kth,
                    "needed": run["needed"],
                    "steps": run["steps"],
                    "elapsed": run["elapsed"],
                    "status": run["status"],
                }
            )
        self.state = {"metric": self.metric, "clock": self.clock_kind, "status": self.status, "runs": runs}

    def snapshot_state(self):
        return self.state

    def __repr__(self) -> str:
        done = sum(r["status"] == "done" for r in self.runs.values())
        return f"strategy comparison · {done} of {len(self.runs)} runs · {self.status}"

    def render_snapshot(self, state) -> str:
        return comparison_svg(state)


def comparison_svg(state: dict) -> str:
    """The picture of a comparison: the metric against time per run, and the k-th arrival medians."""
    runs = state.get("runs", [])
    colors = {r["label"]: svg.COLORS[i % len(svg.COLORS)] for i, r in enumerate(runs)}
    unit = "virtual s" if state.get("clock") == "virtual" else "s"
    left = svg.line_chart(
        0, 24, state.get("metric", "val_accuracy"),
        [(r["points"], colors[r["label"]], False) for r in runs], x_label=unit, width=340, height=200,
    )  # fmt: skip
    synced = [r for r in runs if r["kth"]]
    right = svg.line_chart(
        350, 24, "k-th gradient arrival (median)",
        [(r["kth"], colors[r["label"]], False) for r in synced], x_label="k", width=300, height=200, zero=True,
    )  # fmt: skip
    legend = []
    for i, r in enumerate(runs):
        x = 8 + 150 * i
        legend.append(svg.element("rect", x=x, y=232, width=12, height=4, fill=colors[r["label"]]))
        legend.append(svg.element("text", f"{r['label']} ({r['steps']} steps)", x=x + 16, y=238, fill=svg.INK))
    title = svg.element("text", f"strategy comparison · {state.get('clock', '')} clock · {state.get('status', '')}",
                        x=8, y=14, fill=svg.MUTED)  # fmt: skip
    width = max(660, 8 + 150 * len(runs))
    return svg.document(width, 248, [title, left, right, *legend], "strategy comparison")
