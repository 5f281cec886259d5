"""The synchronous-SGD coordinator: what to submit, record, bring home, leave out or redo.

Plain code driven by events, tested without a cluster (as Dask's own worker
state machine is). A shell (:mod:`workbench.cluster.parameter_server.synchronous` for the parameter server,
:mod:`workbench.cluster.collective.strategy_engine` for strategy functions) feeds it what
happened (``step_done``, ``synced``, ``failed``) and carries out the
instructions it returns:

- ``Submit(step, sync)``: lower and submit that step's tasks (``sync``: its
  variables come home with its results, for shells whose steps bring them);
- ``Record(step, metrics)``: the step is done; report it (each step once);
- ``Sync(step)``: bring that step's variables to the host (a recovery point,
  and a checkpoint file when asked);
- ``LeaveOut(workers)``: these workers stopped answering; leave them out of the
  rest of the fit (a failure whose shell found silent members);
- ``Restart(step, attempt)``: drop everything in flight and continue from the
  host copy of ``step``, with fresh task keys;
- ``Finish()``: every step is done and the last one is synced.

Steps finish in order (each depends on the one before), at most ``window`` of
them are in flight, and a failure costs at most ``sync_every`` steps of work.
For the parameter server a sync also cuts the task lineage: steps after it
start from the copy the host sends back, so the scheduler never holds more
than ``sync_every`` steps of history, however long the run, and nothing past a
sync point is submitted before the sync is done (``hold_at_sync``). Engines
whose replicas live on the workers (the all-reduce family) keep submitting
across a sync: the step's own results bring its variables home.

Steps may also finish in arrival order: asynchronous SGD
(:mod:`workbench.cluster.parameter_server.asynchronous`) submits one gradient per
``Submit``, to whichever replica is free, and reports ``step_done`` for the next step
whenever any gradient in flight has been applied (``window``: the replicas); its records
wait for their metrics, and those a failure lost are redone (``forget_records``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from workbench.errors import ClusterError


@dataclass(frozen=True)
class Submit:
    step: int
    sync: bool = field(default=False, compare=False)  # its variables come home (a sync point)


@dataclass(frozen=True)
class Record:
    step: int
    metrics: Any


@dataclass(frozen=True)
class Sync:
    step: int


@dataclass(frozen=True)
class Restart:
    step: int
    attempt: int


@dataclass(frozen=True)
class LeaveOut:
    workers: tuple


@dataclass(frozen=True)
class Finish:
    pass


class Coordinator:
    """State of one training run on a cluster.

    Parameters
    ----------
    start : the step whose variables the host holds (0, or a checkpoint's step).
    steps : the last step to run.
    window : steps in flight at most.
    sync_every : bring variables home every this many steps (None: only at ``sync_at`` and the end).
    max_restarts : failures tolerated before giving up with ClusterError.
    sync_at : callable, optional
        Further steps to bring home (``sync_at(step)`` true): where the training loop
        writes checkpoints.
    hold_at_sync : bool
        Submit nothing past a sync point until it is synced (the parameter server's lineage
        cut); False: keep the window full across syncs.
    """

    def __init__(
        self,
        start: int,
        steps: int,
        window: int = 4,
        sync_every: int | None = 10,
        max_restarts: int = 5,
        sync_at: Callable[[int], bool] | None = None,
        hold_at_sync: bool = True,
    ):
        if window < 1 or (sync_every is not None and sync_every < 1):
            raise ValueError("window and sync_every must be positive")
        self.steps, self.window, self.sync_every, self.max_restarts = steps, window, sync_every, max_restarts
        self.sync_at, self.hold_at_sync = sync_at, hold_at_sync
        self.host_step = start  # the last step whose variables are on the host
        self.done = start  # the last step finished (in this attempt)
        self.recorded = start  # the last step reported
        self.submitted = start  # the last step submitted
        self.attempt = 0
        self.restarts = 0

    @property
    def in_flight(self) -> range:
        return range(self.done + 1, self.submitted + 1)

    def start(self) -> list:
        if self.done >= self.steps:
            return [Finish()]
        return self._fill()

    def is_sync_point(self, step: int) -> bool:
        """Whether ``step``'s variables come home."""
        every = self.sync_every is not None and step % self.sync_every == 0
        return every or step == self.steps or (self.sync_at is not None and bool(self.sync_at(step)))

    def _fill(self) -> list:
        out = []
        boundary = self.host_step + 1 if self.hold_at_sync else self.steps  # the next sync point
        while boundary < self.steps and not self.is_sync_point(boundary):
            boundary += 1
        while self.submitted < min(self.steps, boundary) and self.submitted - self.done < self.window:
            self.submitted += 1
            out.append(Submit(self.submitted, self.is_sync_point(self.submitted)))
        return out

    def step_done(self, step: int, metrics: Any) -> list:
        if step != self.done + 1:
            raise ValueError(f"step {step} finished, but step {self.done + 1} was expected")
        self.done = step
        out: list = []
        if step > self.recorded:  # a redone step is reported once
            self.recorded = step
            out.append(Record(step, metrics))
        if self.is_sync_point(step):
            out.append(Sync(step))
        else:
            out.extend(self._fill())
        return out

    def synced(self, step: int) -> list:
        self.host_step = max(self.host_step, step)
        return [Finish()] if step == self.steps else self._fill()

    def forget_records(self, after: int) -> None:
        """The records of the steps after ``after`` never reached the user: a shell whose records wait
        for more than the step (the asynchronous engine's, for their metrics) lost them with a failure.
        Those steps are recorded when they are redone (each still once). Only records past the host
        copy can be forgotten: the steps up to it are never redone."""
        if after < self.host_step:
            raise ValueError(f"the records up to step {self.host_step} (the host copy) cannot be redone; got {after}")
        self.recorded = min(self.recorded, after)

    def failed(self, step: int, error: BaseException, silent=()) -> list:
        """Step ``step`` (or what was in flight with it) was lost with ``error``; ``silent``: the
        members the shell found the scheduler no longer hears from (left out from here on)."""
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise ClusterError(
                f"training failed {self.restarts} times; last at step {step}: {type(error).__name__}: {error}"
            ) from error
        self.attempt += 1
        self.done = self.submitted = self.host_step
        leave = [LeaveOut(tuple(sorted(silent)))] if silent else []
        return [*leave, Restart(self.host_step, self.attempt), *self._fill()]
