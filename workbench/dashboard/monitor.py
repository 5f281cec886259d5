"""The scheduler's side of the training monitor: a SchedulerPlugin that keeps what each fit reports.

Clients send throttled summaries of their fits with ``Client.log_event`` under
:data:`TOPIC` (see :mod:`workbench.dashboard.forward`); the plugin keeps the
latest of each (steps/s, samples/s, loss, and a bounded loss curve). From the
scheduler's own task transitions it keeps when and where each phase of the last
steps ran (the keys say graph, phase and step: :func:`workbench.cluster.lower.parse_key`).
The dashboard page (:mod:`workbench.dashboard.page`) and the Prometheus
collector (:func:`metric_families`) read :meth:`TrainingMonitor.fits`.

>>> monitor = TrainingMonitor()
>>> monitor.log_event(TOPIC, {"graph": "mlp", "status": "running", "step": 5, "steps": 100,
...                           "steps_per_s": 20.0, "samples_per_s": 1280.0, "loss": 0.5, "points": [[5, 0.5]]})
>>> monitor.transition(("mlp-grad-5-r0", "9f2c41d7"), "processing", "memory", stimulus_id="s", worker="tcp://w:1",
...                    startstops=[{"action": "compute", "start": 10.0, "stop": 10.25}])
>>> fit = monitor.fits()[0]
>>> fit["graph"], fit["step"], fit["loss"], fit["tasks"][0]["phase"]
('mlp', 5, 0.5, 'grad')
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from workbench.cluster.lower import parse_key
from workbench.dashboard.forward import TOPIC
from workbench.dashboard.lanes import keep

NAME = "workbench-training"  # the plugin's name on the scheduler
MAX_POINTS = 500  # loss points kept per fit (halved, every other one, when full)
TIMELINE_STEPS = 8  # steps of task timings kept per fit

_monitors: weakref.WeakSet = weakref.WeakSet()  # every monitor in this process, for the metrics collector


class TrainingMonitor(SchedulerPlugin):
    """Keeps, per graph name, the latest summary of its fit and the timings of its last steps' tasks."""

    name = NAME
    idempotent = True

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self._fits: dict[str, dict[str, Any]] = {}
        _monitors.add(self)

    # -- what clients report ------------------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or not isinstance(msg, dict) or not isinstance(msg.get("graph"), str):
            return
        fit = self._fit(msg["graph"])
        if msg.get("status") == "started":  # a new fit of that graph
            fit.update(
                points=[],
                stride=1,
                seen=0,
                tasks=deque(),
                started=self.clock(),
                step=0,
                loss=None,
                val_points=[],
                spans=deque(),
            )
        fit.update(
            {
                k: msg[k]
                for k in (
                    "session",
                    "status",
                    "step",
                    "steps",
                    "batch_size",
                    "steps_per_s",
                    "samples_per_s",
                    "loss",
                    "loss_name",
                )
                if k in msg
            }
        )
        fit["updated"] = self.clock()
        for point in msg.get("points") or []:
            self._add_point(fit, point)
        keep(fit.setdefault("spans", deque()), msg.get("spans"), TIMELINE_STEPS)  # the timeline's lanes
        for point in msg.get("val_points") or []:  # validation: every k steps, kept whole (bounded like points)
            fit.setdefault("val_points", []).append([float(point[0]), float(point[1])])
            if len(fit["val_points"]) > MAX_POINTS:
                fit["val_points"] = fit["val_points"][::2]

    @staticmethod
    def _add_point(fit: dict, point) -> None:
        fit["seen"] = fit.get("seen", 0) + 1
        if (fit["seen"] - 1) % fit["stride"]:
            return
        fit["points"].append([float(point[0]), float(point[1])])
        if len(fit["points"]) > MAX_POINTS:
            fit["points"] = fit["points"][::2]
            fit["stride"] *= 2

    # -- what the scheduler sees ----------------------------------------------------------------
    def transition(self, key, start, finish, *args, stimulus_id: str | None = None, **kwargs) -> None:
        if finish != "memory" or start != "processing":
            return
        name = parse_key(key)
        if name is None:
            return
        fit = self._fit(name.graph)
        tasks = fit["tasks"]
        for startstop in kwargs.get("startstops") or ():
            if startstop.get("action") == "compute":
                tasks.append(
                    {
                        "phase": name.phase,
                        "step": name.step,
                        "worker": str(kwargs.get("worker", "")),
                        "start": float(startstop["start"]),
                        "stop": float(startstop["stop"]),
                    }
                )
        newest = max((t["step"] for t in tasks), default=0)
        while tasks and tasks[0]["step"] <= newest - TIMELINE_STEPS:
            tasks.popleft()

    def _fit(self, graph: str) -> dict[str, Any]:
        if graph not in self._fits:
            self._fits[graph] = {
                "graph": graph,
                "status": "running",
                "step": 0,
                "steps": 0,
                "points": [],
                "stride": 1,
                "tasks": deque(),
                "started": self.clock(),
                "updated": self.clock(),
            }
        return self._fits[graph]

    def fits(self) -> list[dict[str, Any]]:
        """Each fit's latest summary (``graph``, ``status``, ``step``, ``steps``, ``steps_per_s``,
        ``samples_per_s``, ``loss``, ``points``, ``val_points``: the loss on held-out data) and
        ``tasks``: phase, step, worker, start, stop."""
        out = []
        for fit in sorted(self._fits.values(), key=lambda f: -f["updated"]):
            out.append(
                {
                    **fit,
                    "points": list(fit["points"]),
                    "val_points": list(fit.get("val_points") or []),
                    "tasks": sorted(fit["tasks"], key=lambda t: t["start"]),
                    "spans": list(fit.get("spans") or []),
                }
            )
        return out


def monitors() -> list[TrainingMonitor]:
    return list(_monitors)


def metric_families(fits: list[dict]):
    """Prometheus metric families of the fits: steps done, steps/s, samples/s and the loss, by graph."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    steps = CounterMetricFamily("workbench_training_steps", "Training steps done, by graph", labels=["graph"])
    families = [steps]
    for name, help_text in [
        ("steps_per_second", "Training steps per second, by graph"),
        ("samples_per_second", "Training samples per second, by graph"),
        ("loss", "Latest training loss, by graph"),
        ("running", "1 while the fit runs, 0 once it ended, by graph"),
    ]:
        families.append(GaugeMetricFamily(f"workbench_training_{name}", help_text, labels=["graph"]))
    for fit in fits:
        labels = [fit["graph"]]
        steps.add_metric(labels, float(fit.get("step") or 0))
        for family, key in zip(families[1:], ("steps_per_s", "samples_per_s", "loss")):
            if isinstance(fit.get(key), (int, float)):
                family.add_metric(labels, float(fit[key]))
        families[4].add_metric(labels, 1.0 if fit.get("status") in ("running", "started") else 0.0)
    return families


class Collector:
    """The Prometheus collector of every monitor in this process (the scheduler's ``/metrics``)."""

    def collect(self):
        return metric_families([fit for monitor in monitors() for fit in monitor.fits()])

    def describe(self):
        return []  # families depend on the fits running: no fixed description


_registered: list[Collector] = []


def register_metrics() -> None:
    """Add the collector to prometheus_client's default registry (what ``/metrics`` serves), once."""
    if _registered:
        return
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # no prometheus_client: the scheduler serves no /metrics either
        return
    collector = Collector()
    REGISTRY.register(collector)
    _registered.append(collector)
