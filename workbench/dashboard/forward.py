"""The client's side of the training monitor: fits on a cluster, summarized for its scheduler.

:func:`training_update` is the one place that reads training progress from the
event stream. A :class:`Forwarder` turns the updates of each cluster fit into
summaries (steps/s, samples/s, the loss and its new points) and sends them to
that fit's scheduler with ``Client.log_event``, at most ``1 / interval`` times a
second and once more when the fit ends; the scheduler's
:class:`~workbench.dashboard.monitor.TrainingMonitor` keeps them for the
dashboard page and ``/metrics``. Local fits are not forwarded (no scheduler).

>>> sent = []
>>> now = [0.0]
>>> forwarder = Forwarder(send=lambda client, msg: sent.append(msg), find_client=lambda address: "client",
...                       clock=lambda: now[0])
>>> from workbench.events import FitFinished, FitStarted, Step
>>> forwarder(FitStarted(session="s1", graph_name="mlp", scheduler="tcp://s:8786", steps=3, batch_size=64,
...                      fetches=("loss",)))
>>> for step in (1, 2, 3):
...     now[0] += 0.1
...     forwarder(Step(session="s1", step=step, time=0.1, samples_per_s=640.0, fetches={"loss": 1.0 / step}))
>>> forwarder(FitFinished(session="s1", steps=3))
>>> [(m["status"], m.get("step")) for m in sent]
[('started', 0), ('running', 3), ('done', 3)]
>>> sent[1]["points"], round(sent[1]["steps_per_s"], 3)
([[1, 1.0], [2, 0.5], [3, 0.3333333333333333]], 10.0)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from workbench.dashboard.lanes import compact, keep

from workbench.events import ROOT, EventStream, FitFailed, FitFinished, FitInterrupted, FitStarted, Step, Validated

TOPIC = "workbench-training"  # the scheduler event topic of the summaries
SPAN_STEPS = 8  # steps of spans sent at most with one summary (the page shows the last ones)
SEND_TIMEOUT = 5.0  # seconds one summary may take to reach the scheduler before it is dropped


def training_update(event) -> dict[str, Any] | None:
    """What a training event says, for the monitor: None for other events.

    ``status`` is ``"started"`` (with ``graph``, ``scheduler``, ``steps``, ``batch_size``
    and the fetch ``labels``), ``"running"`` (a step: ``step`` and each fetched ``values``)
    or ``"done"``; every update has the ``session`` it comes from.
    """
    if isinstance(event, FitStarted):
        return {
            "status": "started",
            "session": event.session,
            "graph": event.graph_name,
            "scheduler": event.scheduler,
            "steps": int(event.steps or 0),
            "batch_size": int(event.batch_size or 0),
            "labels": list(event.fetches or []),
        }
    if isinstance(event, Step):
        numbers = {"time": event.time, "samples_per_s": event.samples_per_s, **event.fetches}
        values = {k: float(v) for k, v in numbers.items() if _is_number(v)}
        spans = event.metrics.get("spans") if isinstance(event.metrics, dict) else None
        update = {"status": "running", "session": event.session, "step": int(event.step), "values": values}
        return {**update, "spans": compact(spans)} if spans else update
    if isinstance(event, Validated):
        values = {k: float(v) for k, v in event.fetches.items() if _is_number(v)}
        return {"status": "validated", "session": event.session, "step": int(event.step), "values": values}
    if isinstance(event, (FitFinished, FitInterrupted, FitFailed)):
        return {"status": "done", "session": event.session}
    return None


def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return isinstance(value, (int, float)) or getattr(value, "ndim", None) == 0 and float(value) is not None
    except (TypeError, ValueError):
        return False


class _Fit:
    """One forwarded fit: where it goes and what has not been sent yet."""

    def __init__(self, client, started: dict, now: float):
        self.client, self.graph, self.session = client, started["graph"], started["session"]
        self.steps, self.batch_size = started["steps"], started["batch_size"]
        labels = started["labels"]
        self.loss_name = "loss" if "loss" in labels else (labels[0] if labels else None)
        self.step = self.sent_step = 0
        self.sent_time = now
        self.loss: float | None = None
        self.points: list[list[float]] = []
        self.val_points: list[list[float]] = []  # the loss on held-out data (fit(validation=...)), not yet sent
        self.spans: deque = deque()  # the timeline's spans of the last steps not yet sent (dashboard/lanes.py)

    def add(self, update: dict) -> None:
        self.step = update["step"]
        loss = update["values"].get(self.loss_name) if self.loss_name else None
        if loss is not None and math.isfinite(loss):
            self.loss = loss
            self.points.append([self.step, loss])
        keep(self.spans, update.get("spans"), SPAN_STEPS)

    def add_validation(self, update: dict) -> None:
        loss = update["values"].get(self.loss_name) if self.loss_name else None
        if loss is not None and math.isfinite(loss):
            self.val_points.append([update["step"], loss])

    def summary(self, status: str, now: float) -> dict[str, Any]:
        elapsed = now - self.sent_time
        steps_per_s = (self.step - self.sent_step) / elapsed if elapsed > 0 else 0.0
        msg = {
            "graph": self.graph,
            "session": self.session,
            "status": status,
            "step": self.step,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "loss_name": self.loss_name,
            "loss": self.loss,
            "points": self.points,
            "val_points": self.val_points,
            "spans": list(self.spans),
        }
        if self.step > self.sent_step:
            msg.update(steps_per_s=steps_per_s, samples_per_s=steps_per_s * self.batch_size)
        self.points, self.val_points, self.sent_step, self.sent_time = [], [], self.step, now
        self.spans = deque()
        return msg


class Forwarder:
    """An event listener sending each cluster fit's summaries to its scheduler.

    ``send(client, msg)`` and ``find_client(address)`` default to :func:`post` (the
    scheduler's ``log_event``, sent from the client's event loop without waiting) and the
    running client of this process connected to that scheduler; a failed send stops
    forwarding that fit. Monitoring never stops or holds training: a stopped scheduler
    delays nothing but the summaries.
    """

    def __init__(
        self, interval: float = 0.25, clock: Callable[[], float] = time.monotonic, send=None, find_client=None
    ):
        self.interval, self.clock = interval, clock
        self.send = send or post
        self.find_client = find_client or client_for
        self.fits: dict[Any, _Fit] = {}

    def __call__(self, event: dict) -> None:
        update = training_update(event)
        if update is None:
            return
        now = self.clock()
        if update["status"] == "started":
            self.fits.pop(update["session"], None)
            client = self.find_client(update["scheduler"]) if update["scheduler"] and update["graph"] else None
            if client is not None:
                fit = self.fits[update["session"]] = _Fit(client, update, now)
                self._send(fit, "started", now)
            return
        fit = self.fits.get(update["session"])
        if fit is None:
            return
        if update["status"] == "done":
            self.fits.pop(update["session"], None)
            self._send(fit, "done", now)
            return
        if update["status"] == "validated":
            fit.add_validation(update)  # rare (every k steps): sent at once
            self._send(fit, "running", now)
            return
        fit.add(update)
        if now - fit.sent_time >= self.interval:
            self._send(fit, "running", now)

    def _send(self, fit: _Fit, status: str, now: float) -> None:
        try:
            self.send(fit.client, fit.summary(status, now))
        except Exception:  # noqa: BLE001 - a closed client or a lost scheduler: stop forwarding this fit
            self.fits.pop(fit.session, None)


_in_order: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> the lock its summaries queue on


def post(client, msg: dict) -> None:
    """``client.log_event(TOPIC, msg)`` without waiting for the scheduler: the summary is sent from
    the client's event loop, after the ones posted before it, and dropped if it has not arrived
    within ``SEND_TIMEOUT`` (a stopped or lost scheduler must not hold the fit that emits it)."""
    if client.status != "running":
        raise RuntimeError(f"the client is {client.status}")
    client.loop.add_callback(_deliver, client, msg)


async def _deliver(client, msg: dict) -> None:
    lock = _in_order.get(client)
    if lock is None:
        lock = _in_order[client] = asyncio.Lock()
    async with lock:
        with contextlib.suppress(Exception):  # monitoring only: a summary that cannot go is dropped
            await asyncio.wait_for(client.scheduler.log_event(topic=TOPIC, msg=msg), SEND_TIMEOUT)


def client_for(address: str):
    """The running client of this process connected to the scheduler at ``address``, or None."""
    from distributed import Client

    for client in list(Client._instances):  # distributed keeps every client of the process here
        scheduler = getattr(client, "scheduler", None)
        if client.status == "running" and scheduler is not None and scheduler.address == address:
            return client
    return None


_installed: dict[str, Any] = {"unsubscribe": None}


def forward(stream: EventStream = ROOT) -> Callable[[], None]:
    """Send the progress of every fit on a cluster to its scheduler's dashboard page and ``/metrics``.

    In a notebook this is on already (``import workbench`` in a kernel, ``%flow_cluster``);
    scripts call it once. Idempotent; returns a function that stops forwarding.
    """
    if _installed["unsubscribe"] is None:
        _installed["unsubscribe"] = stream.subscribe(Forwarder())
    return stop


def stop() -> None:
    """Stop forwarding fits started from now on."""
    if _installed["unsubscribe"] is not None:
        _installed["unsubscribe"]()
        _installed["unsubscribe"] = None
