"""Asynchronous SGD on a cluster: ``fit(..., strategy="async", replicas=R)``, the baseline of Chen et al. (2016).

Each of ``R`` replicas (one per worker) repeatedly reads the current variables, computes the gradient
of its own ``batch_size // R`` rows and sends it; a parameter-server role applies each gradient with
the fit's optimizer the moment it arrives, in arrival order, and the replica then reads the variables
again. The pieces are the ``parameter_server`` engine's (:mod:`workbench.cluster.program`): a
``replica_gradients`` task pinned to the replica's worker, an ``apply_update`` task on the server's
worker chained on the previous one, and a small ``step_metrics`` task; keys read like the model
(``mlp-grad``, ``mlp-update``, ``mlp-metrics``), so the dashboard shows the phases as for the other
strategies, and Dask places and restarts them.

The semantics, the same in the one-process simulation:

- ``steps`` counts applied gradients (TF1's ``global_step``): one record per applied gradient, with
  ``"replica"`` (whose gradient it was), ``"staleness"`` (updates applied between the read of the
  variables that gradient used and its apply; about ``R - 1`` with equal replicas) and ``"delay"``
  (its injected delay: ``stragglers.delay(j, replica)`` for the replica's j-th gradient);
- replica ``r``'s j-th gradient (j from 1) uses shard ``r`` of ``R`` (split as synchronous training
  splits a batch) of global batch ``j``, and is the mean gradient over those rows;
- the fetches of a record are that gradient's shard's values.

Host copies of the variables come home every ``sync_every`` applies (and where the loop asks, and at
the last); a lost worker restarts the run from the last one, without reporting a step twice.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from workbench.cluster.failures import drop, restartable
from workbench.cluster.health import StepDeadline, scheduler_workers
from workbench.cluster.lower import shards, task_key
from workbench.cluster.options import ClusterOptions
from workbench.cluster.program import (
    TrainingProgram,
    apply_update,
    host_state,
    initial_state,
    replica_gradients,
    step_metrics,
)
from workbench.errors import ClusterError, FeedError, WorkbenchError
from workbench.events import EventStream, Restarted, Synced
from workbench.fitloop import FitRequest, StepOutcome
from workbench.stragglers import coerce as coerce_stragglers
from workbench.training import batch_indices, is_dask_array


def gradient_rows(num_examples: int, batch_size: int, batch_seed, replicas: int, replica: int, j: int) -> np.ndarray:
    """The rows of replica ``replica``'s j-th gradient: its shard of global batch ``j`` (split as sync)."""
    index = next(batch_indices(num_examples, batch_size, j, batch_seed, start=j - 1))
    return shards(index, replicas)[replica]


class AsyncEngine:
    """The ``async`` step engine: one outcome per applied gradient (see the module's docstring)."""

    strategy = "async"

    def __init__(self, request: FitRequest, client, options: ClusterOptions, events: EventStream):
        self.client, self.request, self.events = client, request, events
        self.scheduler = client.scheduler.address  # where the dashboard's monitor hears of this fit
        self.name, self.batch_size = request.graph.name, request.batch_size
        self.addresses = options.workers
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
        self.deadline = StepDeadline(options.step_timeout)
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

    # -- the step-engine seam ---------------------------------------------------------------------
    def start(self, variables: dict, step: int) -> None:
        state = {n: np.asarray(variables[n]) for n in self.program.state_variables}
        self.host = ({**variables, **state}, int(step))
        self._scatter()

    def variables(self) -> tuple[dict, int]:
        return self.host

    def close(self) -> None:
        self.in_flight = {}
        self.state = self.program_ref = None
        self.sources = []

    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        """Apply gradients ``first..last`` as they arrive; one outcome per applied gradient, in order."""
        reported = first - 1
        every = self.sync_every
        synced = lambda s: s == last or bool(sync_at(s)) or bool(every and s % every == 0)  # noqa: E731
        while reported < last:
            try:
                for outcome in self._applies(last, synced):
                    if outcome.step > reported:
                        reported = outcome.step
                        yield outcome
            except self._transient as e:
                self._restart(e)

    # -- placing the run --------------------------------------------------------------------------
    def _scatter(self) -> None:
        client, timeout = self.client, self.deadline.seconds
        known = sorted(scheduler_workers(client, timeout))
        members = [w for w in (self.addresses or known) if w in known][: self.replicas]
        if not members:
            raise ClusterError("strategy='async' has no workers left to train on")
        self.members, self.server = members, members[0]
        self.token = uuid.uuid4().hex[:8]
        variables, step = self.host
        state = initial_state({n: variables[n] for n in self.program.state_variables}, step)
        self.program_ref = client.scatter(self.program, broadcast=True, hash=False, workers=members, timeout=timeout)
        self.state = client.scatter([state], hash=False, workers=[self.server], timeout=timeout)[0]
        self.sources = [
            client.scatter(self.data[n], broadcast=True, hash=False, workers=members, timeout=timeout)
            for n in self.program.feeds
        ]
        self.in_flight: dict = {}

    def _read(self, replica: int, j: int, version: int):
        """Replica ``replica``'s j-th gradient, of the variables after ``version`` applies."""
        rows = gradient_rows(self.num_examples, self.batch_size, self.request.batch_seed, len(self.members), replica, j)
        offset = sum(len(p) for p in shards(np.arange(self.batch_size), len(self.members))[:replica])
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
            workers=[self.members[replica]],
            allow_other_workers=False,
            pure=False,
        )
        self.in_flight[future.key] = (future, replica, j, version, delay)
        return future

    # -- the applies ------------------------------------------------------------------------------
    def _applies(self, last: int, synced: Callable[[int], bool]) -> Iterator[StepOutcome]:
        from distributed import as_completed

        applied = self.host[1]
        count = len(self.members)
        first_j = applied // count + 1  # a resumed run reads the batches after those it applied
        reads = [self._read(r, first_j, applied) for r in range(min(count, last - applied))]
        arriving = as_completed(reads, loop=self.client.loop)
        metrics: deque = deque()
        for future in arriving:
            _, replica, j, version, delay = self.in_flight.pop(future.key)
            if future.status != "finished":
                self._raise(future, applied + 1)
            applied += 1
            key = task_key(self.name, "update", applied, token=self.token)
            self.state = self.client.submit(
                apply_update, self.program_ref, self.state, future, key=key, workers=[self.server], pure=False
            )
            key = task_key(self.name, "metrics", applied, token=self.token)
            measured = self.client.submit(step_metrics, future, self.state, key=key, workers=[self.server], pure=False)
            metrics.append((applied, replica, applied - 1 - version, delay, measured))
            if applied + len(self.in_flight) < last:  # every gradient in flight will be applied
                arriving.add(self._read(replica, j + 1, applied))
            if synced(applied):  # its outcome, and those before it, once the variables are home
                self._sync(applied)
                while metrics:
                    yield self._outcome(*metrics.popleft())
            while metrics and (metrics[0][-1].done() or len(metrics) > count):
                yield self._outcome(*metrics.popleft())
        while metrics:
            yield self._outcome(*metrics.popleft())

    def _raise(self, future, step: int):
        error = future.exception()
        if isinstance(error, (*self._transient, WorkbenchError)):
            raise error
        raise ClusterError(f"gradient {step} failed on the cluster: {type(error).__name__}: {error}") from error

    def _sync(self, step: int) -> None:
        state = self.state.result(timeout=self.deadline.seconds)
        state = state if self.request.device.host_arrays else host_state(state)
        self.host = ({**self.host[0], **{n: np.asarray(v) for n, v in state["variables"].items()}}, step)
        if self.events is not None:
            self.events.emit(Synced, step=step)

    def _outcome(self, step: int, replica: int, staleness: int, delay: float, measured) -> StepOutcome:
        started = time.perf_counter()
        result = measured.result(timeout=self.deadline.seconds)
        self.deadline.progressed(time.perf_counter() - started)
        compute = result["compute"]
        metrics = {
            "replicas": len(self.members),
            "replica": replica,
            "staleness": staleness,
            "delay": delay,
            "compute_seconds": max(compute.values()),
            "update_seconds": result["update_seconds"],
            "workers": compute,
            "restarts": self.restarts,
        }
        return StepOutcome(step, dict(zip(self.labels, result["fetches"])), metrics)

    def _restart(self, error: BaseException) -> None:
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise ClusterError(f"asynchronous training failed {self.restarts} times: {type(error).__name__}: {error}")
        if self.client.status != "running":
            raise error
        self.deadline.restarted()
        drop(self.client, [f for f, *_ in self.in_flight.values()])
        time.sleep(min(5.0, self.deadline.seconds) / 5)  # the scheduler notices a dead worker meanwhile
        if self.events is not None:
            self.events.emit(Restarted, step=self.host[1], attempt=self.restarts)
        self._scatter()


def make(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> AsyncEngine:
    """The ``async`` strategy's factory (see :mod:`workbench.cluster.engines`)."""
    return AsyncEngine(request, client, options, events)
