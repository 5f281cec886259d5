"""The Workbench page of the Dask dashboard: each fit's progress, loss curve and phase timeline.

A Bokeh application served by the scheduler's dashboard at ``/individual-workbench``
(so it is listed in the dashboard's "More..." menu, in ``individual-plots.json`` and
in dask-labextension's panel). It reads the scheduler's
:class:`~workbench.dashboard.monitor.TrainingMonitor` twice a second: one panel per
fit, newest first, with steps/s, samples/s and the loss in its title, the loss
curve, when each phase (grad, reduce, update, metrics; allreduce) of the last steps ran
on each worker, and the timeline's lanes of those steps (:mod:`workbench.dashboard.lanes`).
"""

from __future__ import annotations

import html

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, Div, FactorRange, HoverTool, Legend, LegendItem
from bokeh.plotting import figure

from workbench.dashboard.lanes import LanesFigure
from workbench.dashboard.monitor import NAME

PAGE = "/individual-workbench"
PHASE_COLORS = {
    "grad": "#1f77b4",
    "reduce": "#ff7f0e",
    "update": "#2ca02c",
    "metrics": "#9467bd",
    "host": "#8c564b",
    "allreduce": "#17becf",
}
NOT_LOADED = (
    "No training monitor on this scheduler: start it with <code>--preload workbench.dashboard.preload</code> "
    "(a local cluster from workbench has it)."
)
NO_FITS = "No fit has reported to this scheduler yet. Fits on this cluster appear here while they train."


def headline(fit: dict) -> str:
    """A fit's title line (HTML): graph, status, step, steps/s, samples/s and the loss."""
    parts = [f"<b>{html.escape(fit['graph'])}</b>", html.escape(str(fit.get("status", "")))]
    parts.append(f"step {fit.get('step', 0):,} / {fit.get('steps') or '?'}")
    if isinstance(fit.get("steps_per_s"), (int, float)):
        parts.append(f"{fit['steps_per_s']:.1f} steps/s")
    if isinstance(fit.get("samples_per_s"), (int, float)):
        parts.append(f"{fit['samples_per_s']:,.0f} samples/s")
    if isinstance(fit.get("loss"), (int, float)):
        parts.append(f"{html.escape(str(fit.get('loss_name') or 'loss'))} {fit['loss']:.4g}")
    return '<div class="wb-fit-title" style="font-size:15px">' + " · ".join(parts) + "</div>"


class FitPanel:
    """One fit: its title, the loss curve, and the timeline of its last steps' tasks per worker."""

    def __init__(self, graph: str):
        self.graph = graph
        self.title = Div(text="", sizing_mode="stretch_width")
        self.loss_source = ColumnDataSource({"step": [], "loss": []})
        self.loss = figure(title="loss", height=260, width=420, x_axis_label="step", tools="pan,wheel_zoom,reset")
        self.loss.line("step", "loss", source=self.loss_source, line_width=2, color="#1f77b4", legend_label="train")
        self.val_source = ColumnDataSource({"step": [], "loss": []})  # fit(validation=...): held-out data
        self.loss.line("step", "loss", source=self.val_source, line_width=2, color="#ff7f0e", line_dash="dashed",
                       legend_label="validation")  # fmt: skip
        self.loss.scatter("step", "loss", source=self.val_source, size=5, color="#ff7f0e")
        self.loss.legend.location = "top_right"
        self.tasks = ColumnDataSource({k: [] for k in ("worker", "left", "right", "phase", "step", "color", "ms")})
        self.timeline = figure(
            title="phases of the last steps, per worker",
            height=290,
            width=620,
            y_range=FactorRange(),
            x_axis_label="seconds",
            tools="pan,wheel_zoom,reset",
        )
        bars = self.timeline.hbar(y="worker", left="left", right="right", height=0.7, color="color", source=self.tasks)
        legend = Legend(items=[LegendItem(label={"field": "phase"}, renderers=[bars])], orientation="horizontal")
        self.timeline.add_layout(legend, "below")
        self.timeline.add_tools(
            HoverTool(tooltips=[("", "@phase, step @step"), ("time", "@ms{0.0} ms"), ("worker", "@worker")])
        )
        self.lanes = LanesFigure()  # the spans the fit reports: compute, communicate, wait (with whom), update
        self.root = column(self.title, row(self.loss, self.timeline), self.lanes.figure, sizing_mode="stretch_width")

    def update(self, fit: dict) -> None:
        self.title.text = headline(fit)
        points = fit.get("points") or []
        self.loss.title.text = str(fit.get("loss_name") or "loss")
        self.loss_source.data = {"step": [p[0] for p in points], "loss": [p[1] for p in points]}
        val = fit.get("val_points") or []
        self.val_source.data = {"step": [p[0] for p in val], "loss": [p[1] for p in val]}
        self.lanes.update(fit.get("spans") or [])
        tasks = fit.get("tasks") or []
        origin = min((t["start"] for t in tasks), default=0.0)
        workers = sorted({t["worker"] for t in tasks})
        if list(self.timeline.y_range.factors) != workers:
            self.timeline.y_range.factors = workers
        self.tasks.data = {
            "worker": [t["worker"] for t in tasks],
            "left": [t["start"] - origin for t in tasks],
            "right": [t["stop"] - origin for t in tasks],
            "phase": [t["phase"] for t in tasks],
            "step": [t["step"] for t in tasks],
            "color": [PHASE_COLORS.get(t["phase"], "#7f7f7f") for t in tasks],
            "ms": [1000 * (t["stop"] - t["start"]) for t in tasks],
        }


class TrainingPage:
    """Every fit the scheduler's monitor knows, newest first."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.note = Div(text="", sizing_mode="stretch_width")
        self.root = column(Div(text="<h2>Workbench training</h2>"), self.note, sizing_mode="stretch_width")
        self.panels: dict[str, FitPanel] = {}
        self.order: list[str] = []

    def update(self) -> None:
        monitor = self.scheduler.plugins.get(NAME)
        fits = monitor.fits() if monitor is not None else []
        self.note.text = NOT_LOADED if monitor is None else ("" if fits else NO_FITS)
        order = [fit["graph"] for fit in fits]
        for graph in order:
            if graph not in self.panels:
                self.panels[graph] = FitPanel(graph)
        if order != self.order:
            self.order = order
            self.root.children = [*self.root.children[:2], *(self.panels[g].root for g in order)]
        for fit in fits:
            self.panels[fit["graph"]].update(fit)


def workbench_doc(scheduler, extra, doc) -> None:
    """The Bokeh document of the page (the signature of distributed's dashboard applications)."""
    page = TrainingPage(scheduler)
    page.update()
    doc.title = "Dask: Workbench"
    doc.add_root(page.root)
    doc.add_periodic_callback(page.update, 500)


def register_page() -> bool:
    """Add the page to the applications of every scheduler dashboard started in this process from now on.

    Returns False when Dask's dashboard cannot run here (bokeh missing or too old).
    """
    try:
        from distributed.dashboard import scheduler as dashboard
    except ImportError:
        return False
    dashboard.applications.setdefault(PAGE, workbench_doc)
    return True
