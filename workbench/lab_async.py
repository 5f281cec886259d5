"""Asynchronous SGD in one process: the baseline of "Revisiting Distributed Synchronous SGD".

``Session(g).fit(..., strategy="async", replicas=R)`` without a cluster trains with
:class:`AsyncReplicas`. Each replica reads the current variables, computes the gradient of its
own rows (its j-th gradient: shard r of R of global batch j, split as a synchronous fit splits
it), waits its injected delay (the draw for (j, r)) and hands the gradient in; a parameter
server applies each gradient with the fit's optimizer the moment it arrives, in arrival order
(ties by replica id), and the replica reads the variables again right after its gradient was
applied. ``steps`` counts applied gradients: one record per applied gradient, holding
``"replica"``, ``"staleness"`` (the updates applied between that gradient's read and its apply:
about R - 1 with equal replicas), ``"delay"`` and ``"arrival"`` (seconds from its read until it
was ready, delay included).

On the virtual clock (:mod:`workbench.clock`) the replicas' reads and arrivals are events on one
timeline and nothing sleeps; on the wall clock each replica is a thread.

The replicas' plans are compiled and run by the simulation's :class:`~workbench.simulation.ReplicaRunner`,
from one replica program (:mod:`workbench.strategies.program`) whose strategy applies gradients
handed in: one plan gives a replica's gradients and the fit's fetches on its shard, the other is the
fit's optimizer (slots and all) applied by the server to each gradient as it arrives. The exchange
cannot sit inside a replica's plan as an ``all_reduce``: the server decides when each gradient is
applied, from the arrivals.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from workbench import ops
from workbench.clock import WALL, Clock
from workbench.errors import ArgumentError, ClusterError
from workbench.fitloop import FitRequest, StepOutcome, interrupts_at_step_boundaries
from workbench.simulation import ReplicaRunner, shards
from workbench.spans import span, tracing
from workbench.strategies.program import UPDATE, ReplicaProgram
from workbench.strategies.registry import Strategy
from workbench.stragglers import coerce
from workbench.training import batch_indices


class HandedIn:
    """The replica program of asynchronous SGD, its two plans' fetches and feeds, and how to run them.

    Attributes
    ----------
    gradients : list of str
        The gradient tensors, in the optimizer's order.
    fed : list of str
        The placeholders the apply plan takes the gradients through, in the same order.
    """

    def __init__(self, request: FitRequest, ranks: int):
        if request.stats_every:
            raise ArgumentError("fit(stats=...) is not computed by the simulation's asynchronous runs")
        self.request = request
        fed: list[str] = []

        def apply_fed_gradients(r):
            handed = {}
            for i, v in enumerate(r.variables):
                handed[v] = ops.placeholder(f"gradient_{i}", shape=v.shape, dtype=v.dtype)
                fed.append(handed[v].name)
            r.apply(handed)

        strategy = Strategy("handed_in", apply_fed_gradients)
        fetches = tuple(request.fetches.values())
        program = ReplicaProgram.build(request.graph, request.train, strategy, 1, fetches, request.feeds)
        self.runner = ReplicaRunner(request, program, ranks)
        self.gradients = [g for g, _ in program.record.record.gradients]
        self.fed = fed
        self.labels = list(request.fetches)

    def compute(self, rank: int, rows: np.ndarray, offset: int, step: int) -> tuple[list, list]:
        """Rank ``rank``'s gradients (host copies) and fetches on ``rows`` of the data at ``step`` (1-based),
        on the variables its state holds now."""
        req, runner = self.request, self.runner
        plan = runner.plan(rank, [*self.gradients, *req.fetches.values()], list(req.data))
        values = runner.run(plan, runner.feeds(rank, rows, step, 1.0), step, offset)
        host = [np.array(req.device.to_host(v)) for v in values]
        return host[: len(self.gradients)], host[len(self.gradients) :]

    def apply(self, rank: int, gradients: list) -> None:
        """Run the optimizer's update on rank ``rank``'s state with ``gradients`` (host arrays, in order)."""
        put, runner = self.request.device.put, self.runner
        plan = runner.plan(rank, [UPDATE], self.fed)
        runner.run(plan, {name: put(g) for name, g in zip(self.fed, gradients, strict=True)})


class _Batches:
    """Shard ``r`` of global batch ``j`` (1-based), for replicas that are at different batches."""

    def __init__(self, request: FitRequest, replicas: int):
        self.request, self.replicas = request, replicas
        self.n = len(next(iter(request.data.values())))
        self.cache: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def shard(self, j: int, r: int) -> tuple[np.ndarray, int]:
        with self.lock:
            return self._shard(j, r)

    def _shard(self, j: int, r: int) -> tuple[np.ndarray, int]:
        found = self.cache.get(j)
        if found is None:
            req = self.request
            index = next(batch_indices(self.n, req.batch_size, j, seed=req.batch_seed, start=j - 1))
            found = self.cache[j] = shards(index, self.replicas)
            for old in [k for k in self.cache if k < j - 4 * self.replicas]:
                del self.cache[old]  # every replica is long past it
        parts, offsets = found
        return parts[r], offsets[r]


class AsyncReplicas:
    """The step engine of ``strategy="async"`` with R replicas in this process (one step: one applied gradient)."""

    strategy = "async"
    workers = None
    restarts = 0

    def __init__(self, request: FitRequest, replicas: int, stragglers=None, clock: Clock = WALL):
        self.request, self.replicas = request, int(replicas)
        if request.batch_size < self.replicas:
            raise ArgumentError(
                f"a batch of {request.batch_size} examples cannot be split across {self.replicas} replicas"
            )
        self.stragglers = coerce(stragglers, self.replicas)
        self.clock = clock
        self.programs = HandedIn(request, self.replicas + 1)  # the replicas' states, then the server's
        self.server = self.replicas
        self.state = self.programs.runner.states[self.server]
        self.batches = _Batches(request, self.replicas)
        self.lock = threading.Lock()
        self.step, self.now = 0, 0.0
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    # -- state ------------------------------------------------------------------------------
    def start(self, variables: dict[str, np.ndarray], step: int) -> None:
        self.programs.runner.start(variables)
        self.step, self.now = step, 0.0
        # a resumed fit starts every replica afresh, at the global batch the steps done have reached
        self.batch = [step // self.replicas] * self.replicas

    def variables(self) -> tuple[dict[str, np.ndarray], int]:
        with self.lock:
            return self.programs.runner.variables(self.server), self.step

    def settle(self, step: int) -> tuple[dict[str, np.ndarray], int]:
        return self.variables()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _delay(self, j: int, r: int) -> float:
        return self.stragglers.delay(j, r) if self.stragglers else 0.0

    def _gradient(self, rank: int, r: int) -> dict:
        """Replica r's next gradient, on the variables rank ``rank``'s state holds now (the server's, on the
        virtual clock: the replicas read one after another)."""
        self.batch[r] += 1
        j = self.batch[r]
        rows, offset = self.batches.shard(j, r)
        started = time.perf_counter()
        gradients, fetched = self.programs.compute(rank, rows, offset, j)
        return {"gradients": gradients, "fetches": fetched, "compute": time.perf_counter() - started, "batch": j}

    # -- steps ------------------------------------------------------------------------------
    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        arrivals = self._virtual() if self.clock.virtual else self._wall()
        with interrupts_at_step_boundaries() as pending:
            try:
                for step in range(first, last + 1):
                    if pending():
                        raise KeyboardInterrupt
                    started = time.perf_counter()
                    reply = next(arrivals)
                    with self.lock:
                        self.programs.apply(self.server, reply["gradients"])
                        staleness = self.step - reply["version"]
                        self.step = step
                    if "applied" in reply:  # the wall clock's replica thread reads again now
                        reply["applied"].set()
                    seconds = reply["at"] - self.now if self.clock.virtual else time.perf_counter() - started
                    self.now = reply["at"] if self.clock.virtual else self.now + seconds
                    yield self._outcome(step, reply, staleness, seconds)
                if pending():
                    raise KeyboardInterrupt
            finally:
                arrivals.close()

    def _virtual(self) -> Iterator[dict]:
        """Arrivals in virtual time: every replica reads at 0, then right after its gradient is applied."""
        heap: list = []

        def read(r: int, at: float) -> None:
            reply = self._gradient(self.server, r)
            reply.update(replica=r, version=self.step, delay=self._delay(reply["batch"], r))
            reply["arrival"] = self.clock.compute(reply["compute"]) + reply["delay"]
            reply["at"] = at + reply["arrival"]
            heapq.heappush(heap, (reply["at"], r, reply))

        for r in range(self.replicas):
            read(r, self.now)
        while True:
            at, r, reply = heapq.heappop(heap)
            yield reply  # applied by the caller before it asks for the next one
            read(r, at)

    def _wall(self) -> Iterator[dict]:
        """Arrivals as they come: each replica a thread that reads, computes, sleeps its delay and hands in."""
        handed: queue.Queue = queue.Queue()
        self._stop.clear()
        for r in range(self.replicas):
            thread = threading.Thread(target=self._replica, args=(r, handed), name=f"async-replica-{r}", daemon=True)
            self._threads.append(thread)
            thread.start()
        try:
            while True:
                try:
                    reply = handed.get(timeout=300)
                except queue.Empty:
                    raise ClusterError("no asynchronous replica handed a gradient in for 300 s") from None
                if isinstance(reply, BaseException):
                    raise reply
                reply["at"] = time.perf_counter()
                yield reply
        finally:
            self.close()

    def _replica(self, r: int, handed: queue.Queue) -> None:
        own = self.programs.runner.states[r]
        try:
            while not self._stop.is_set():
                with self.lock:  # the read: a copy of the server's variables
                    own.update({n: v.copy() for n, v in self.state.items()})
                    version = self.step
                read = time.perf_counter()
                reply = self._gradient(r, r)
                delay = self._delay(reply["batch"], r)
                if delay > 0 and self._stop.wait(delay):
                    return
                applied = threading.Event()
                reply.update(
                    replica=r, version=version, delay=delay, arrival=time.perf_counter() - read, applied=applied
                )
                handed.put(reply)
                while not applied.wait(0.1):
                    if self._stop.is_set():
                        return
        except BaseException as e:  # noqa: BLE001 - handed to the fit, which raises it
            handed.put(e)

    def _outcome(self, step: int, reply: dict, staleness: int, seconds: float) -> StepOutcome:
        programs = self.programs
        fetches = {}
        for label, value in zip(programs.labels, reply["fetches"], strict=True):
            fetches[label] = float(value) if np.ndim(value) == 0 else value
        metrics = {
            "replicas": self.replicas,
            "replica": int(reply["replica"]),
            "staleness": int(staleness),
            "delay": float(reply["delay"]),
            "arrival": float(reply["arrival"]),
            "compute_seconds": self.clock.compute(reply["compute"]),
        }
        if tracing():  # the replica's stretch from its read to its gradient's arrival (never a wait: async)
            r, arrived = int(reply["replica"]), float(reply["arrival"])
            metrics["spans"] = [span(f"replica {r}", r, step, "compute", max(self.now - arrived, 0.0), self.now)]
        return StepOutcome(step, fetches, metrics, seconds=seconds, elapsed=self.now if self.clock.virtual else None)
