"""Synchronous SGD with stragglers and backup replicas in one process (Chen et al., 2016).

``Session(g).fit(..., replicas=R, backup_replicas=b, stragglers=..., clock=...)`` without a cluster
trains with :class:`SyncReplicas`. Each step draws ``batch_size + b * (batch_size // R)`` rows (the
backups get shards of their own, as on the cluster) and splits them into R + b shards; replica r
computes its shard's gradient, then waits its injected delay (the draw for (step, r)) before
handing it in. The gradients of the first R to arrive (ties by replica id) are weighted so their
sum is the mean over the rows used (the sum, for a sum loss), summed in the fixed pairwise order of
the replicas used, and applied once with the fit's optimizer: every replica holds the same
variables, so one copy stands for all of them. The b latest are dropped.

Every record holds ``"delays"`` (per replica), ``"arrivals"`` (seconds from the step's start until
each replica's gradient was ready, delay included) and, with backups, ``"dropped"`` (the replica
ids not used). On the virtual clock (:mod:`workbench.clock`) replicas run one after another and
nothing sleeps: a step lasts until the arrival that completes it. On the wall clock they run in
threads and the delays are slept.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from workbench.clock import WALL, Clock
from workbench.errors import ArgumentError
from workbench.fitloop import FitRequest, StepOutcome, interrupts_at_step_boundaries
from workbench.graph.batch_reduction import combine as combine_fetch
from workbench.lab_programs import LabPrograms, shards
from workbench.ops.collective import pairwise_sum
from workbench.spans import span, tracing
from workbench.strategies.weights import weight
from workbench.stragglers import coerce
from workbench.training import batch_indices


def first_to_arrive(arrivals: list[float], needed: int) -> tuple[list[int], list[int]]:
    """(used, dropped): the ``needed`` earliest arrivals (ties by replica id) and the rest, each in id order."""
    order = sorted(range(len(arrivals)), key=lambda r: (arrivals[r], r))
    return sorted(order[:needed]), sorted(order[needed:])


def combine_gradients(gradients: list[list], rows: list[int], kind: str, backups: bool = False) -> list:
    """The sum over replicas of ``weight * g``, pairwise in replica order: the mean over ``rows`` for a mean loss.

    Without backups each weight is the replica's share of the rows (the all-reduce's ``r.weight``); with
    them, as the cluster's backup arbiter does, each gradient is multiplied by its rows and the sum by
    ``1 / rows used``, so the simulation and the cluster agree.
    """
    total = sum(rows)
    combined = []
    for k in range(len(gradients[0])):
        dtype = gradients[0][k].dtype
        if backups and kind == "mean":
            summed = pairwise_sum([g[k] * np.asarray(float(n), dtype=dtype) for g, n in zip(gradients, rows)])
            combined.append(np.multiply(summed, 1.0 / total, out=summed, casting="unsafe"))
        else:
            parts = [g[k] * np.asarray(weight(kind, n, total), dtype=dtype) for g, n in zip(gradients, rows)]
            combined.append(pairwise_sum(parts))
    return combined


class SyncReplicas:
    """The step engine of a synchronous fit of R replicas (plus b backups) with stragglers, in this process."""

    strategy = "allreduce"
    workers = None
    restarts = 0

    def __init__(self, request: FitRequest, replicas: int, backups: int = 0, stragglers=None, clock: Clock = WALL):
        self.request, self.replicas, self.backups = request, int(replicas), int(backups)
        self.total = self.replicas + self.backups
        if request.batch_size < self.replicas:
            raise ArgumentError(
                f"a batch of {request.batch_size} examples cannot be split across {self.replicas} replicas"
            )
        self.size = request.batch_size + self.backups * (request.batch_size // self.replicas)
        self.stragglers = coerce(stragglers, self.total)
        self.clock = clock
        self.programs = LabPrograms(request)
        self.state: dict = {}
        self.plans: dict[int, object] = {}
        self.step, self.now = 0, 0.0
        self._pool = None
        if not clock.virtual and self.total > 1:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.total, thread_name_prefix="replica")

    # -- state ------------------------------------------------------------------------------
    def start(self, variables: dict[str, np.ndarray], step: int) -> None:
        self.state = self.programs.initial_state(variables)
        self.plans.clear()
        self.apply_plan = self.programs.apply_plan(self.state)
        self.step, self.now = step, 0.0

    def variables(self) -> tuple[dict[str, np.ndarray], int]:
        return self.programs.host_variables(self.state), self.step

    def settle(self, step: int) -> tuple[dict[str, np.ndarray], int]:
        return self.variables()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _plan(self, rank: int):
        rank = 0 if self.clock.virtual else rank  # one after another: one plan serves every replica
        found = self.plans.get(rank)
        if found is None:
            found = self.plans[rank] = self.programs.gradient_plan(self.state)
        return found

    # -- steps ------------------------------------------------------------------------------
    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        req = self.request
        n = len(next(iter(req.data.values())))
        indices = batch_indices(n, self.size, last, seed=req.batch_seed, start=first - 1)
        with interrupts_at_step_boundaries() as pending:
            for step, index in enumerate(indices, start=first):
                if pending():
                    raise KeyboardInterrupt
                started = time.perf_counter()
                parts, offsets = shards(index, self.total)
                delays = self.stragglers.delays(step, self.total) if self.stragglers else [0.0] * self.total
                if self.clock.virtual:
                    replies = [self._compute(r, parts[r], offsets[r], step) for r in range(self.total)]
                    arrivals = [self.clock.compute(x["compute"]) + d for x, d in zip(replies, delays)]
                    used, dropped = first_to_arrive(arrivals, self.replicas)
                else:
                    replies, arrivals, used, dropped = self._race(step, parts, offsets, delays, started)
                rows = [len(parts[r]) for r in used]
                used_gradients = [replies[r]["gradients"] for r in used]
                gradients = combine_gradients(used_gradients, rows, self.programs.kind, self.backups > 0)
                self.programs.apply(self.apply_plan, gradients)
                self.step = step
                if self.clock.virtual:
                    seconds = max(arrivals[r] for r in used)
                else:
                    seconds = time.perf_counter() - started
                self.now += seconds
                yield self._outcome(step, replies, used, dropped, rows, delays, arrivals, seconds)
            if pending():
                raise KeyboardInterrupt

    def _compute(self, rank: int, rows, offset: int, step: int) -> dict:
        started = time.perf_counter()
        gradients, fetched = self.programs.compute(self._plan(rank), rows, offset, step)
        return {"gradients": gradients, "fetches": fetched, "compute": time.perf_counter() - started}

    def _race(self, step, parts, offsets, delays, started):
        """The wall clock: every replica in a thread of its own, its delay slept; the first R to finish are used."""
        done = threading.Event()  # set once R gradients are in: the late ones stop waiting

        def replica(rank: int) -> dict:
            reply = self._compute(rank, parts[rank], offsets[rank], step)
            ready = time.perf_counter() - started
            if delays[rank] > 0:
                done.wait(delays[rank])
            # a dropped replica stops waiting early: its arrival is when it would have handed in
            reply["arrival"] = max(time.perf_counter() - started, ready + delays[rank])
            return reply

        if self._pool is None:
            reply = replica(0)
            return [reply], [reply["arrival"]], [0], []
        futures = {self._pool.submit(replica, r): r for r in range(self.total)}
        order, error = [], None
        for future in concurrent.futures.as_completed(futures):
            if future.exception() is not None:
                error = error or future.exception()
                done.set()
            order.append(futures[future])
            if len(order) == self.replicas:
                done.set()
        if error is not None:
            raise error
        replies = [None] * self.total
        for future, rank in futures.items():
            replies[rank] = future.result()
        return replies, [x["arrival"] for x in replies], sorted(order[: self.replicas]), sorted(order[self.replicas :])

    def _outcome(self, step, replies, used, dropped, rows, delays, arrivals, seconds) -> StepOutcome:
        programs, total = self.programs, sum(rows)
        fetches = {}
        for k, (label, reduction) in enumerate(zip(programs.labels, programs.reductions, strict=True)):
            value = combine_fetch(reduction, [replies[r]["fetches"][k] for r in used], [n / total for n in rows])
            fetches[label] = float(value) if np.ndim(value) == 0 else value
        metrics = {
            "replicas": self.replicas,
            "compute_seconds": max(self.clock.compute(replies[r]["compute"]) for r in used),
            "delays": [float(d) for d in delays],
            "arrivals": [float(a) for a in arrivals],
        }
        if self.backups:
            metrics["dropped"] = dropped
        if tracing():
            metrics["spans"] = step_spans(step, self.now - seconds, arrivals, used, seconds)
        return StepOutcome(step, fetches, metrics, seconds=seconds, elapsed=self.now if self.clock.virtual else None)


def step_spans(step: int, begin: float, arrivals: list[float], used: list[int], seconds: float) -> list[dict]:
    """One step's spans (:mod:`workbench.timeline`), one lane per replica, in the engine's seconds since the
    fit started (virtual ones under ``clock="virtual"``): ``compute`` until the replica handed its gradient
    in (a straggler's delay included, as on the cluster), then ``wait`` for the last of the replicas used
    to arrive; a dropped replica's lane ends where the step went on without it."""
    last = max(used, key=lambda r: (arrivals[r], r))
    out = []
    for r, arrived in enumerate(arrivals):
        worker = f"replica {r}"
        done = min(arrived, seconds)
        if done > 0:
            out.append(span(worker, r, step, "compute", begin, begin + done))
        if r in used and r != last and arrived < seconds:
            out.append(span(worker, r, step, "wait", begin + arrived, begin + seconds, waiting_for=f"replica {last}"))
    return out
