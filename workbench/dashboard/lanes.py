"""The timeline's lanes on the dashboard's Workbench page: the spans of a fit's last steps, per worker.

Each :class:`~workbench.events.Step` of a cluster fit carries its spans (:mod:`workbench.timeline`);
the forwarder sends them, compacted (:func:`compact`), with the fit's summaries; the scheduler's
monitor keeps those of the last steps (:func:`keep`); :class:`LanesFigure` draws them as the
notebook's :class:`~workbench.widgets.TimelineView` does: a bar per span coloured by phase, a line
from each wait to the worker it waited for.

>>> compact([{"worker": "a", "step": 3, "phase": "wait", "start": 0.5, "end": 0.75, "waiting_for": "b"}])
[['a', 3, 'wait', 0.5, 0.75, 'b']]
"""

from __future__ import annotations

from collections import deque

PHASE_COLORS = {  # as the notebook's TimelineView
    "compute": "#0969da",
    "communicate": "#bf8700",
    "wait": "#cf222e",
    "update": "#1a7f37",
    "idle": "#d0d7de",
}


def compact(spans) -> list[list]:
    """Spans as short lists for the wire: ``[worker, step, phase, start, end, waiting_for or ""]``."""
    return [
        [
            str(s["worker"]),
            int(s["step"]),
            str(s["phase"]),
            float(s["start"]),
            float(s["end"]),
            s.get("waiting_for") or "",
        ]
        for s in spans
    ]


def keep(held: deque, spans, steps: int) -> None:
    """Add compact ``spans`` to ``held`` and drop those of steps older than the newest ``steps``."""
    for s in spans or ():
        if isinstance(s, list | tuple) and len(s) == 6:
            held.append(list(s))
    newest = max((s[1] for s in held), default=0)
    while held and held[0][1] <= newest - steps:
        held.popleft()


class LanesFigure:
    """A Bokeh figure of the spans of a fit's last steps, one lane per worker."""

    COLUMNS = ("worker", "left", "right", "phase", "step", "color", "ms", "waiting_for")

    def __init__(self) -> None:
        from bokeh.models import ColumnDataSource, FactorRange, HoverTool  # the scheduler's page only
        from bokeh.plotting import figure

        self.source = ColumnDataSource({k: [] for k in self.COLUMNS})
        self.arrows = ColumnDataSource({"x": [], "y0": [], "y1": []})
        self.figure = figure(
            title="where each worker's time went (last steps)",
            height=290,
            width=620,
            y_range=FactorRange(),
            x_axis_label="seconds since the fit started",
            tools="pan,wheel_zoom,reset",
        )
        self.figure.hbar(y="worker", left="left", right="right", height=0.7, color="color", source=self.source)
        self.figure.segment(x0="x", y0="y0", x1="x", y1="y1", color=PHASE_COLORS["wait"], source=self.arrows)
        tips = [
            ("", "@phase, step @step"),
            ("time", "@ms{0.00} ms"),
            ("worker", "@worker"),
            ("waiting for", "@waiting_for"),
        ]
        self.figure.add_tools(HoverTool(tooltips=tips))

    def update(self, spans: list) -> None:
        workers = sorted({s[0] for s in spans})
        if list(self.figure.y_range.factors) != workers:
            self.figure.y_range.factors = workers
        self.source.data = {
            "worker": [s[0] for s in spans],
            "left": [s[3] for s in spans],
            "right": [s[4] for s in spans],
            "phase": [s[2] for s in spans],
            "step": [s[1] for s in spans],
            "color": [PHASE_COLORS.get(s[2], "#8c959f") for s in spans],
            "ms": [1000 * (s[4] - s[3]) for s in spans],
            "waiting_for": [s[5] for s in spans],
        }
        waits = [s for s in spans if s[2] == "wait" and s[5] in workers]
        self.arrows.data = {"x": [s[4] for s in waits], "y0": [s[0] for s in waits], "y1": [s[5] for s in waits]}
