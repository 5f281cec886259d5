"""TrainingView: progress, ETA, loss and metric curves, samples/s and worker utilization of a ``fit``."""

from __future__ import annotations

import math
import statistics
from typing import Any

import traitlets

from workbench.widgets import snapshots
from workbench.widgets._base import View, front_end

_RESERVED = {"kind", "session", "step", "time", "samples_per_s", "replicas", "workers", "dropped"}
# Step fields that are timings or sizes, not metrics (cluster fits report these).
_NOT_CURVES = _RESERVED | {"compute_seconds", "reduce_seconds", "update_seconds", "bytes_moved"}


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
    """The state of one training run, built from its events (``fit_started``, ``step``, ...).

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
        self.series: dict[str, Series] = {}
        self.busy: dict[str, float] = {}
        self.step_time = 0.0
        self.replicas = None
        self.dropped = 0
        self.restarts = 0
        self.start = 0
        self.error = ""

    def handle(self, event: dict[str, Any], now: float) -> bool:
        """Update from one event; True when the run has ended."""
        kind = event.get("kind")
        if kind == "fit_started":
            self.__init__(self.max_points)
            self.status, self.started = "running", now
            self.steps = int(event.get("steps") or 0)
            self.batch_size = int(event.get("batch_size") or 0)
            self.labels = list(event.get("fetches") or [])
            self.start = self.step = int(event.get("start") or 0)  # resumed from a checkpoint
        elif kind == "step":
            self._step(event, now)
        elif kind == "restarted":
            self.restarts += 1
        elif kind == "fit_finished":
            self.status = "done"
            self._tick(now)
            return True
        elif kind == "run_failed" and self.status == "running":
            self.status, self.error = "failed", f"{event.get('op', '')}: {event.get('error', '')}"
            self._tick(now)
            return True
        return False

    def _step(self, event: dict, now: float) -> None:
        if self.started is None:
            self.status, self.started = "running", now
        self.step = int(event.get("step", self.step + 1))
        self._tick(now)
        rate = event.get("samples_per_s")
        if _finite(rate):
            self.samples_per_s = float(rate)
            self._series("samples/s").append(self.step, float(rate))
        labels = self.labels or [k for k in event if k not in _NOT_CURVES]
        for label in labels:
            if _finite(event.get(label)):
                self._series(label).append(self.step, float(event[label]))
        if isinstance(event.get("workers"), dict):
            self.step_time += float(event.get("time") or 0.0)
            for worker, seconds in event["workers"].items():
                self.busy[worker] = self.busy.get(worker, 0.0) + float(seconds)
        self.replicas = event.get("replicas", self.replicas)
        self.dropped += int(event.get("dropped") or 0)

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

    def snapshot(self) -> dict[str, Any]:
        """Everything the front end draws, as JSON-able data."""
        curves = {k: s.view() for k, s in self.series.items() if k != "samples/s"}
        rates = [p[1] for p in self.series["samples/s"].view()] if "samples/s" in self.series else []
        return {
            "status": self.status, "steps": self.steps, "step": self.step, "batch_size": self.batch_size,
            "elapsed": self.elapsed, "eta": self.eta, "samples_per_s": self.samples_per_s,
            "median_samples_per_s": statistics.median(rates) if rates else 0.0,
            "curves": curves, "throughput": self.series["samples/s"].view() if "samples/s" in self.series else [],
            "workers": self.utilization(), "replicas": self.replicas, "dropped": self.dropped, "restarts": self.restarts, "start": self.start,
            "error": self.error,
        }  # fmt: skip


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TrainingView(View):
    """Live progress of a training run: a progress bar with ETA, curves of the loss and of
    each fetched metric, samples/s, and per-worker utilization on a cluster.

    Shown by ``Session.fit`` in a notebook; or by hand:

    >>> import workbench as wb
    >>> view = TrainingView()
    >>> view.feed([{"kind": "fit_started", "steps": 2, "batch_size": 8, "fetches": ["loss"]},
    ...            {"kind": "step", "step": 1, "time": 0.1, "samples_per_s": 80.0, "loss": 2.0},
    ...            {"kind": "step", "step": 2, "time": 0.1, "samples_per_s": 80.0, "loss": 1.5},
    ...            {"kind": "fit_finished", "steps": 2}])
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

    def __init__(self, title: str = "training", max_points: int = 400, **kwargs: Any) -> None:
        super().__init__(title=title, **kwargs)
        self.model = TrainingModel(max_points)
        self.state = self.model.snapshot()

    def handle(self, event: dict) -> bool:
        return self.model.handle(event, self.clock())

    @property
    def ended(self) -> bool:
        return self.model.status in ("done", "failed")

    def _sync(self) -> None:
        self.state = self.model.snapshot()

    def snapshot_state(self):
        return self.title, self.state

    def render_snapshot(self, state) -> str:
        return snapshots.training_svg(*state)
