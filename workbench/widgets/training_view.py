"""TrainingView: progress, ETA, loss and metric curves, samples/s and worker utilization of a ``fit``."""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any

import traitlets

from workbench.widgets import snapshots
from workbench.events import (
    Event,
    FitFailed,
    FitFinished,
    FitInterrupted,
    FitStarted,
    Restarted,
    RunFailed,
    Step,
    Validated,
)
from workbench.fitloop import request_stop
from workbench.widgets._base import View, front_end


class Series:
    """A curve kept to at most ``max_points`` points: when full, every other point is dropped
    and only every ``stride``-th later step is kept. The latest point is always shown."""

    def __init__(self, max_points: int = 400):
        self.max_points = max_points
        self.points: list[list[float]] = []
        self.stride = 1
        self.last: list[float] | None = None
        self._count = 0

    def append(self, step: float, value: float) -> None:
        self.last = [step, value]
        if self._count % self.stride == 0:
            self.points.append(self.last)
            if len(self.points) > self.max_points:
                self.points = self.points[::2]
                self.stride *= 2
        self._count += 1

    def view(self) -> list[list[float]]:
        if self.last is not None and (not self.points or self.points[-1] is not self.last):
            return [*self.points, self.last]
        return list(self.points)


class TrainingModel:
    """The state of one training run, built from its typed events (:class:`FitStarted`, :class:`Step`, ...).

    ``now`` is the time of the event being handled (from the view's clock), used
    for the elapsed time and the ETA.
    """

    def __init__(self, max_points: int = 400):
        self.max_points = max_points
        self.status = "waiting"
        self.steps = 0
        self.step = 0
        self.batch_size = 0
        self.labels: list[str] = []
        self.started: float | None = None
        self.elapsed = 0.0
        self.samples_per_s = 0.0
        self.series: dict[str, Series] = {}  # one curve per fetch label
        self.throughput = Series(max_points)
        self.busy: dict[str, float] = {}
        self.step_time = 0.0
        self.replicas = None
        self.dropped = 0
        self.restarts = 0
        self.start = 0
        self.error = ""
        self.stopped_at: int | None = None
        self.stopping = False  # a stop was asked for; the fit ends after its current step

    @functools.singledispatchmethod
    def handle(self, event: Event, now: float) -> bool:
        """Update from one event; True when the run has ended."""
        return False

    @handle.register
    def _started(self, event: FitStarted, now: float) -> bool:
        self.__init__(self.max_points)
        self.status, self.started = "running", now
        self.steps, self.batch_size = int(event.steps or 0), int(event.batch_size or 0)
        self.labels = list(event.fetches or ())
        self.start = self.step = int(event.start or 0)  # resumed from a checkpoint
        return False

    @handle.register
    def _step(self, event: Step, now: float) -> bool:
        if self.started is None:
            self.status, self.started = "running", now
        self.step = int(event.step)
        self._tick(now)
        if _finite(event.samples_per_s):
            self.samples_per_s = float(event.samples_per_s)
            self.throughput.append(self.step, self.samples_per_s)
        for label, value in event.fetches.items():
            if _finite(value):
                self._series(label).append(self.step, float(value))
        metrics = event.metrics
        if isinstance(metrics.get("workers"), dict):
            self.step_time += float(event.time or 0.0)
            for worker, seconds in metrics["workers"].items():
                self.busy[worker] = self.busy.get(worker, 0.0) + float(seconds)
        self.replicas = metrics.get("replicas", self.replicas)
        self.dropped += int(metrics.get("dropped") or 0)
        return False

    @handle.register
    def _validated(self, event: Validated, now: float) -> bool:
        for label, value in event.record().items():  # val_<label>: drawn over the <label> curve
            if _finite(value):
                self._series(label).append(int(event.step), float(value))
        return False

    @handle.register
    def _restarted(self, event: Restarted, now: float) -> bool:
        self.restarts += 1
        return False

    @handle.register
    def _finished(self, event: FitFinished, now: float) -> bool:
        self.status = "done"
        self._tick(now)
        return True

    @handle.register
    def _interrupted(self, event: FitInterrupted, now: float) -> bool:
        # a stop request (the Stop button, request_stop) or an interrupt (KeyboardInterrupt)
        self.status = "stopped" if event.reason == "stopped" else "interrupted"
        self.stopped_at = self.step = int(event.step)  # the bar ends where the fit did
        self._tick(now)
        return True

    @handle.register
    def _fit_failed(self, event: FitFailed, now: float) -> bool:
        if self.status not in ("running", "waiting"):
            return False
        self.status, self.error = "failed", event.error
        self._tick(now)
        return True

    @handle.register
    def _failed(self, event: RunFailed, now: float) -> bool:
        if self.status != "running":
            return False
        self.status, self.error = "failed", f"{event.op or ''}: {event.error}"
        self._tick(now)
        return True

    @property
    def outcome(self) -> str:
        """The run's state in words: "running", "done", "stopped at step N" (a stop request),
        "interrupted at step N" (an interrupt), "failed: ..."."""
        if self.status in ("stopped", "interrupted"):
            return f"{self.status} at step {self.stopped_at}"
        if self.status == "failed":
            return f"failed: {self.error}"
        if self.status == "running" and self.stopping:
            return "stopping after this step"
        return self.status

    def _tick(self, now: float) -> None:
        if self.started is not None:
            self.elapsed = max(now - self.started, 0.0)

    def _series(self, label: str) -> Series:
        if label not in self.series:
            self.series[label] = Series(self.max_points)
        return self.series[label]

    @property
    def eta(self) -> float | None:
        """Seconds left at the mean pace so far (None before the first step or after the end)."""
        done = self.step - self.start
        if self.status != "running" or done <= 0 or not self.steps:
            return None
        return self.elapsed / done * max(self.steps - self.step, 0)

    def utilization(self) -> dict[str, float]:
        """Each worker's busy time as a fraction of the training time so far."""
        total = self.step_time
        return {w: min(b / total, 1.0) if total > 0 else 0.0 for w, b in sorted(self.busy.items())}

    def charts(self) -> list[dict[str, Any]]:
        """The metric charts in the order their curves first came, each with its colour. The front
        ends draw these rather than the curves' key order: a saved notebook sorts its JSON keys."""
        return snapshots.training_charts(self.series)

    def snapshot(self) -> dict[str, Any]:
        """Everything the front end draws, as JSON-able data."""
        curves = {k: s.view() for k, s in self.series.items()}
        rates = [p[1] for p in self.throughput.view()]
        return {
            "charts": self.charts(),
            "status": self.status,
            "steps": self.steps,
            "step": self.step,
            "batch_size": self.batch_size,
            "elapsed": self.elapsed,
            "eta": self.eta,
            "samples_per_s": self.samples_per_s,
            "median_samples_per_s": statistics.median(rates) if rates else 0.0,
            "curves": curves,
            "throughput": self.throughput.view(),
            "workers": self.utilization(),
            "replicas": self.replicas,
            "dropped": self.dropped,
            "restarts": self.restarts,
            "start": self.start,
            "error": self.error,
            "outcome": self.outcome,
            "stopped_at": self.stopped_at,
            "stopping": self.stopping,
        }


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TrainingView(View):
    """Live progress of a training run: a progress bar with ETA, curves of the loss and of
    each fetched metric, samples/s, and per-worker utilization on a cluster.

    With ``fit(..., validation=...)`` each metric's chart also draws its validation
    curve (``val_<label>``, dashed, with a legend). Clicking a chart selects the step
    under the pointer (:attr:`selected_step`, marked in every chart); a
    :class:`~workbench.widgets.GraphView` linked with ``GraphView(g).follow(view)``
    shows the model's statistics at that step.

    Shown by ``Session.fit`` in a notebook; or by hand:

    >>> from workbench.events import FitFinished, FitStarted, Step
    >>> view = TrainingView()
    >>> view.feed([FitStarted(steps=2, batch_size=8, fetches=("loss",)),
    ...            Step(step=1, time=0.1, samples_per_s=80.0, fetches={"loss": 2.0}),
    ...            Step(step=2, time=0.1, samples_per_s=80.0, fetches={"loss": 1.5}),
    ...            FitFinished(steps=2)])
    >>> view.state["step"], view.state["status"], view.state["curves"]["loss"]
    (2, 'done', [[1, 2.0], [2, 1.5]])
    """

    _esm = front_end("training_view.js")
    state = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode("training").tag(sync=True)
    #: Metric curves on a logarithmic y axis (a checkbox in the view).
    log_scale = traitlets.Bool(False).tag(sync=True)
    #: Exponential moving average of the curves, 0 (raw) to 0.99 (a slider); the raw curve stays faint behind.
    smoothing = traitlets.Float(0.6, min=0.0, max=0.99).tag(sync=True)
    #: The step chosen by a click on a chart (or by a linked GraphView's scrubber); 0: none.
    selected_step = traitlets.Int(0).tag(sync=True)

    def __init__(self, title: str = "training", max_points: int = 400, **kwargs: Any) -> None:
        super().__init__(title=title, **kwargs)
        self.model = TrainingModel(max_points)
        self.state = self.model.snapshot()
        self.on_msg(self._on_front_end_message)
        self._hear_clicks_while_busy()

    def handle(self, event: Event) -> bool:
        return self.model.handle(event, self.clock())

    @property
    def ended(self) -> bool:
        return self.model.status in ("done", "failed", "stopped", "interrupted")

    def request_stop(self) -> bool:
        """What the Stop button does: end the followed fit after its current step (thread-safe).

        Returns whether a fit was asked to stop (False once the run has ended, or for a view
        that follows no session's fit)."""
        if self.ended or self._session is None or self.model.stopping:
            return False
        self.model.stopping = True
        return request_stop(self._session)

    def _on_front_end_message(self, widget, content, buffers) -> None:
        if isinstance(content, dict) and content.get("event") == "stop":
            self.request_stop()
            self.throttle.request()

    def _hear_clicks_while_busy(self) -> None:
        # A fit blocks the kernel's main thread, where widget messages are handled. ipykernel 7
        # reads them first on its shell-channel thread and asks each comm where to route them:
        # a Stop click is seen there, while the cell runs (only a flag is set from that thread).
        # On kernels without that thread the click takes effect once the cell is done.
        comm = getattr(self, "comm", None)
        route = getattr(comm, "_reply_subshell_for", None)
        if route is None:
            return

        def peek(data, default):
            content = data.get("content") if isinstance(data, dict) else None
            if isinstance(content, dict) and content.get("event") == "stop":
                self.request_stop()
            return route(data, default)

        comm._reply_subshell_for = peek

    def _sync(self) -> None:
        self.state = self.model.snapshot()

    def snapshot_state(self):
        return self.title, self.state

    def __repr__(self) -> str:
        """One line: ``training · 300 steps · done · loss 0.054`` (the notebook's text/plain)."""
        m = self.model
        steps = f"{m.steps} steps" if m.status == "done" or not m.steps else f"{m.step} / {m.steps} steps"
        shown = f"{m.steps} steps" in self.title  # the notebook's title says it already ("training · 300 steps")
        parts = [self.title, m.outcome] if shown else [self.title, steps, m.outcome]
        label = "loss" if "loss" in m.series else next(iter(m.series), None)
        if label is not None and m.series[label].last is not None:
            parts.append(f"{label} {m.series[label].last[1]:.3g}")
        return " · ".join(parts)

    def render_snapshot(self, state) -> str:
        return snapshots.training_svg(*state)
