"""Asynchronous SGD on a cluster: ``fit(..., strategy="async", replicas=R)``, the baseline of Chen et al. (2016).

Each of ``R`` replicas (one per worker) repeatedly reads the current variables, computes the gradient
of its own ``batch_size // R`` rows and sends it; a parameter-server role applies each gradient with
the fit's optimizer the moment it arrives, in arrival order, and the replica then reads the variables
again. The pieces are the ``parameter_server`` engine's (:mod:`workbench.cluster.program`): a
``replica_gradients`` task pinned to the replica's worker, an ``apply_update`` task on the server's
worker chained on the previous one, and a small ``step_metrics`` task; keys read like the model
(``mlp-grad``, ``mlp-update``, ``mlp-metrics``), so the dashboard shows the phases as for the other
strategies, and Dask places them.

The semantics, the same in the one-process simulation:

- ``steps`` counts applied gradients (TF1's ``global_step``): one record per applied gradient, with
  ``"replica"`` (whose gradient it was), ``"staleness"`` (updates applied between the read of the
  variables that gradient used and its apply; about ``R - 1`` with equal replicas) and ``"delay"``
  (its injected delay: ``stragglers.delay(j, replica)`` for the replica's j-th gradient);
- replica ``r``'s j-th gradient (j from 1) uses shard ``r`` of ``R`` (split as synchronous training
  splits a batch) of global batch ``j``, and is the mean gradient over those rows;
- the fetches of a record are that gradient's shard's values.

The run loop is the coordinated one (:class:`~workbench.cluster.coordinated.Coordinated`, around the
:class:`~workbench.cluster.sync.Coordinator`), with steps in arrival order: each ``Submit`` is one
gradient, read by the next free replica; a step is done when the parameter server has applied a
gradient, whichever replica's it was (at most ``R`` in flight); its record waits for its metrics task
(``_complete``). Host copies of the variables come home every ``sync_every`` applies (and where the loop
asks, and at the last); a lost worker (:func:`~workbench.cluster.failures.restartable`), or one the
scheduler stopped hearing from (left out through the fit's
:class:`~workbench.cluster.membership.Membership`), restarts the run from the last copy on the members
left, without reporting a step twice.
"""

from __future__ import annotations

import concurrent.futures
import queue
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.cluster.coordinated import Coordinated
from workbench.cluster.failures import check_client, drop, restartable
from workbench.cluster.health import StepDeadline
from workbench.cluster.lower import shards, task_key
from workbench.cluster.membership import Membership
from workbench.cluster.options import ClusterOptions
from workbench.cluster.program import (
    TrainingProgram,
    apply_update,
    host_state,
    initial_state,
    replica_gradients,
    step_metrics,
)
from workbench.cluster.sync import Coordinator
from workbench.errors import ClusterError, FeedError, WorkbenchError
from workbench.events import EventStream, Synced
from workbench.fitloop import FitRequest, StepOutcome
from workbench.stragglers import coerce as coerce_stragglers
from workbench.training import batch_indices, is_dask_array


def gradient_rows(num_examples: int, batch_size: int, batch_seed, replicas: int, replica: int, j: int) -> np.ndarray:
    """The rows of replica ``replica``'s j-th gradient: its shard of global batch ``j`` (split as sync)."""
    index = next(batch_indices(num_examples, batch_size, j, batch_seed, start=j - 1))
    return shards(index, replicas)[replica]


@dataclass(frozen=True)
class Replicas:
    """The members of one attempt: replica ``i`` on ``addresses[i]``, the parameter server on the first."""

    addresses: tuple[str, ...]

    @property
    def server(self) -> str:
        return self.addresses[0]


@dataclass(frozen=True)
class Applied:
    """The gradient applied as step ``step``; its record once its metrics task (``measured``) is done."""

    step: int
    replica: int
    staleness: int
    delay: float
    measured: Any


class AsyncEngine(Coordinated):
    """The ``async`` step engine: one outcome per applied gradient (see the module's docstring).

    Its ``run`` is :class:`~workbench.cluster.coordinated.Coordinated`'s; this class says how to place
    an attempt (``_launch``), read a gradient (``_submit``), wait for the next one to arrive and apply it
    (``_next``), make records whole (``_complete``) and bring the variables home (``_bring_home``).
    """

    strategy = "async"

    def __init__(self, request: FitRequest, client, options: ClusterOptions, events: EventStream):
        self.client, self.request, self.events = client, request, events
        self.scheduler = client.scheduler.address  # where the dashboard's monitor hears of this fit
        self.name, self.batch_size = request.graph.name, request.batch_size
        self.replicas = options.replicas_for(client)
        self.workers = options.worker_count(client)
        if self.replicas > self.workers:
            raise ClusterError(
                f"strategy='async' runs one replica per worker; replicas={self.replicas} exceeds the {self.workers} workers"
            )
        if request.batch_size < self.replicas:
            raise ClusterError(
                f"a batch of {request.batch_size} examples cannot be split across {self.replicas} replicas"
            )
        self.sync_every, self.reason = options.sync_every, options.reason
        self.window = self.replicas  # one gradient in flight per replica
        self.deadline = StepDeadline(options.step_timeout)
        self.timeout = min(60.0, options.step_timeout or 60.0)  # bounds the questions about silent members
        self.membership = Membership(client, options.workers, self.deadline)
        self.program = TrainingProgram.for_fit(request)
        missing = set(self.program.feeds) - set(request.data)
        if missing:
            raise FeedError(f"data lacks the placeholders {sorted(missing)} that the gradients need")
        chunked = sorted(n for n in self.program.feeds if is_dask_array(request.data[n]))
        if chunked:
            raise ClusterError(f"strategy='async' takes NumPy data; {chunked} are dask arrays")
        self.data = {n: np.asarray(request.data[n]) for n in self.program.feeds}
        self.num_examples = len(next(iter(self.data.values())))
        self.labels = list(request.fetches)
        self.stragglers = coerce_stragglers(request.stragglers, self.replicas)
        self.restarts, self.max_restarts = 0, 5
        self._transient = restartable()
        self.host: tuple[dict, int] | None = None
        self.group: Replicas | None = None
        self.state = self.program_ref = None
        self.sources: list = []
        self.reading: dict = {}  # key -> (gradient future, replica, applies it read, delay, when read)
        self.free: deque = deque()  # replicas with no gradient in flight
        self.unassigned = 0  # gradients submitted while no replica was free (fewer members than R)

    # -- the step-engine seam ---------------------------------------------------------------------
    def start(self, variables: dict, step: int) -> None:
        state = {n: np.asarray(variables[n]) for n in self.program.state_variables}
        self.host = ({**variables, **state}, int(step))
        self._launch(self._choose_members())

    def variables(self) -> tuple[dict, int]:
        return self.host

    def close(self) -> None:
        self._drop()

    # -- placing an attempt -----------------------------------------------------------------------
    def _choose_members(self) -> list[str]:
        return self.membership.choose(self.replicas)

    def _launch(self, members: list[str]) -> None:
        """Program, data and the host copy's state on ``members``: an attempt from the host copy."""
        client, timeout = self.client, self.deadline.seconds
        variables, step = self.host
        self.token = uuid.uuid4().hex[:8]
        state = initial_state({n: variables[n] for n in self.program.state_variables}, step)
        self.program_ref = client.scatter(self.program, broadcast=True, hash=False, workers=members, timeout=timeout)
        self.state = client.scatter([state], hash=False, workers=[members[0]], timeout=timeout)[0]
        self.sources = [
            client.scatter(self.data[n], broadcast=True, hash=False, workers=members, timeout=timeout)
            for n in self.program.feeds
        ]
        self.group = Replicas(tuple(members))
        self.applied = step  # gradients applied so far
        self.arrivals: queue.Queue = queue.Queue()  # this attempt's gradients, as they arrive
        self.checked = time.monotonic()  # when the members were last seen in the scheduler's list
        self.free, self.unassigned, self.reading = deque(range(len(members))), 0, {}
        self.next_batch = [step // len(members) + 1] * len(members)  # a resumed run reads the batches after

    # -- gradients: read, arrive, applied ---------------------------------------------------------
    def _submit(self, step: int, sync: bool) -> None:
        """One more gradient in flight, read by the next free replica."""
        if self.free:
            self._read(self.free.popleft())
        else:
            self.unassigned += 1

    def _read(self, replica: int) -> None:
        """Replica ``replica``'s next gradient, of the variables after the applies so far."""
        j, members = self.next_batch[replica], self.group.addresses
        self.next_batch[replica] += 1
        rows = gradient_rows(self.num_examples, self.batch_size, self.request.batch_seed, len(members), replica, j)
        offset = sum(len(p) for p in shards(np.arange(self.batch_size), len(members))[:replica])
        delay = 0.0 if self.stragglers is None else float(self.stragglers.delay(j, replica))
        future = self.client.submit(
            replica_gradients,
            self.program_ref,
            self.state,
            rows,
            1.0,  # the mean gradient over its own rows
            offset,
            *self.sources,
            replica=replica,
            delay=delay,
            key=task_key(self.name, "grad", j, f"r{replica}", token=self.token),
            workers=[members[replica]],
            allow_other_workers=False,
            pure=False,
        )
        self.reading[future.key] = (future, replica, self.applied, delay, time.monotonic())
        future.add_done_callback(self.arrivals.put)

    def _next(self, coordinator: Coordinator) -> list:
        """Wait for the first gradient to arrive, from any replica, and apply it as the next step."""
        step = coordinator.in_flight[0]
        try:
            self._settle(self._outcomes, len(self.group.addresses))  # at most R records wait for metrics
            gradient = self._arrival(step)
        except self._transient as e:
            return self._lost(coordinator, step, e)
        _, replica, version, delay, read = self.reading.pop(gradient.key)
        # the deadline scales with a gradient's time, not the time between arrivals: the last ones wait
        # for the slowest replica alone
        self.deadline.progressed(time.monotonic() - read)
        self._results = (step, self._apply(step, gradient, replica, version, delay))
        if self.unassigned:  # a gradient waited for a free replica
            self.unassigned -= 1
            self._read(replica)
        else:
            self.free.append(replica)
        return coordinator.step_done(step, None)

    def _arrival(self, step: int):
        """The next gradient of this attempt to arrive; a failure once one failed, a member left the
        cluster (checked every second, also while the others' gradients come) or none came within the
        step deadline."""
        deadline = time.monotonic() + self.deadline.seconds
        future = None
        while future is None:
            try:
                future = self.arrivals.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.0)))
            except queue.Empty:
                pass
            if time.monotonic() - self.checked >= 1.0:
                self._check_members(step)
            if future is None and time.monotonic() >= deadline:
                raise TimeoutError(f"no gradient arrived for {self.deadline.seconds:g} s (gradient {step})")
        if future.status == "cancelled":
            raise concurrent.futures.CancelledError(f"gradient {step}: task {future.key} was cancelled")
        if future.status != "finished":
            error = future.exception()
            if isinstance(error, (*self._transient, WorkbenchError)):
                raise error
            raise ClusterError(f"gradient {step} failed on the cluster: {type(error).__name__}: {error}") from error
        return future

    def _check_members(self, step: int) -> None:
        """A member that left the cluster fails the attempt now (its pinned gradient would never come),
        a lost scheduler or a closed client ends the fit now, not at the deadline."""
        self.checked = time.monotonic()
        check_client(self.client)
        gone = self.membership.departed(self.group.addresses)
        if gone:
            raise ConnectionError(f"gradient {step}: worker {', '.join(sorted(gone))} left the cluster")

    def _apply(self, step: int, gradient, replica: int, version: int, delay: float) -> Applied:
        """The parameter server applies ``gradient`` as step ``step``; its metrics computed next to it."""
        server = self.group.server
        key = task_key(self.name, "update", step, token=self.token)
        self.state = self.client.submit(
            apply_update, self.program_ref, self.state, gradient, key=key, workers=[server], pure=False
        )
        key = task_key(self.name, "metrics", step, token=self.token)
        measured = self.client.submit(step_metrics, gradient, self.state, key=key, workers=[server], pure=False)
        self.applied = step
        return Applied(step, replica, step - 1 - version, delay, measured)

    # -- records, syncs and lost work -------------------------------------------------------------
    def _outcome(self, step: int, applied: Applied) -> Applied:
        return applied  # whole once its metrics are in (_complete)

    def _complete(self, outcomes: deque, final: bool) -> None:
        """The records whose metrics are in (all of them at the end), in order."""
        if final:
            self._settle(outcomes, 0)
            return
        try:
            self._settle(outcomes, len(outcomes))
        except self._transient:
            pass  # lost with its worker: the wait for the next gradient says so (_next)

    def _settle(self, outcomes: deque, pending: int) -> None:
        """Make the records in ``outcomes`` whole in order: those whose metrics are in, and the oldest ones
        (waiting for their metrics) until at most ``pending`` wait."""
        waiting = [i for i, entry in enumerate(outcomes) if isinstance(entry, Applied)]
        for k, i in enumerate(waiting):
            if outcomes[i].measured.status != "finished" and len(waiting) - k <= pending:
                return
            outcomes[i] = self._measured(outcomes[i])

    def _measured(self, applied: Applied) -> StepOutcome:
        result = applied.measured.result(timeout=self.deadline.seconds)
        compute = result["compute"]
        metrics = {
            "replicas": len(self.group.addresses),
            "replica": applied.replica,
            "staleness": applied.staleness,
            "delay": applied.delay,
            "compute_seconds": max(compute.values()),
            "update_seconds": result["update_seconds"],
            "workers": compute,
            "restarts": self.restarts,
        }
        return StepOutcome(applied.step, dict(zip(self.labels, result["fetches"])), metrics)

    def _bring_home(self, step: int, applied: Applied) -> None:
        """The variables after ``step`` applies: the new host copy, once every record up to it is whole
        (a failure past it redoes only steps after the copy)."""
        self._settle(self._outcomes, 0)
        state = self.state.result(timeout=self.deadline.seconds)
        state = state if self.request.device.host_arrays else host_state(state)
        self.host = ({**self.host[0], **{n: np.asarray(v) for n, v in state["variables"].items()}}, step)
        if self.events is not None:
            self.events.emit(Synced, step=step)

    def _lost(self, coordinator: Coordinator, step: int, error: BaseException) -> list:
        """Records still waiting for their metrics go with the attempt: their steps are reported when redone."""
        waiting = [entry for entry in self._outcomes if isinstance(entry, Applied)]
        for entry in waiting:
            self._outcomes.remove(entry)
        if waiting:
            coordinator.forget_records(waiting[0].step - 1)
        return super()._lost(coordinator, step, error)

    def _cancel(self) -> None:
        drop(self.client, [future for future, *_ in self.reading.values()])
        self.reading, self.free, self.unassigned = {}, deque(), 0

    def _drop(self) -> None:
        self._cancel()
        self.state = self.program_ref = self.group = None
        self.sources = []


def make(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> AsyncEngine:
    """The ``async`` strategy's factory (see :mod:`workbench.cluster.engines`)."""
    return AsyncEngine(request, client, options, events)
