"""The one-process simulation of R replicas: the exact reference a strategy is checked against.

``Session.fit(train, data, batch_size, steps, replicas=R, strategy=...)`` without a cluster
trains with :class:`SimulatedReplicas`, a step engine the one :class:`~workbench.fitloop.FitLoop`
drives. Each replica has its own copy of every variable (the optimizer's slots and the
strategy's included) and runs the strategy's program (:mod:`workbench.strategies.program`) on
its shard of each global batch, in a thread of its own; collectives meet in an
:class:`InProcessGroup`. Shards and row offsets are the cluster's (``np.array_split`` of the
batch, :func:`workbench.training.batch_indices`), sums are taken in the cluster's fixed pairwise
order, so the simulation, local training (for ``"allreduce"``) and the cluster agree.

The lab of "Revisiting Distributed Synchronous SGD" (Chen et al., 2016) runs on the same replicas:

- ``stragglers=``: replica r waits its injected delay (the draw for (step, r)) before its step, so
  it reaches the step's first collective that much later;
- ``backup_replicas=b`` (strategy ``"allreduce"``): R + b replicas run, each on a shard of its own
  (a step draws ``batch_size + b * (batch_size // R)`` rows, as on the cluster), and the step's
  all-reduces combine the gradients of the first R to arrive (ties by replica id) as their mean
  over the rows used; the b latest take the result too, so every replica holds the same bits;
- ``clock="virtual"`` (:mod:`workbench.clock`): nothing sleeps; each replica keeps its own virtual
  time (``compute_seconds`` or the compute measured, plus its delay, a step); a step whose
  replicas meet in a collective ends, for all of them, at the arrival that completes it, a step
  without one (local SGD's local steps) lets each replica go on by itself.

Step metrics per replica: ``bytes_sent`` (what the cluster's collective would send,
:func:`workbench.ops.collective.bytes_sent`) and ``collectives`` (how many ran); with stragglers,
backups or the virtual clock also ``"delays"``, ``"arrivals"`` (seconds from the step's start
until each replica reached the step's first collective, delay included) and, with backups,
``"dropped"`` (the replica ids not used). The asynchronous baseline (:mod:`workbench.lab_async`)
compiles and runs its replicas' plans through the same :class:`ReplicaRunner`.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from workbench.clock import WALL, Clock
from workbench.errors import ArgumentError, CollectiveError
from workbench.fitloop import FitRequest, StepOutcome, interrupts_at_step_boundaries
from workbench.graph.compile import compile_plan
from workbench.graph.passes import optimize
from workbench.graph.batch_reduction import combine as combine_fetch
from workbench.graph.batch_reduction import fetch_reduction
from workbench.ops.collective import bytes_sent, combine
from workbench.strategies.program import UPDATE, ReplicaProgram
from workbench.spans import Lanes, new_marks, span, tracing
from workbench.strategies.weights import weight
from workbench.stragglers import coerce
from workbench.training import batch_indices

#: Checkpoint members of a replica's own state: ``replicas/<rank>/<variable>``.
PREFIX = "replicas/"


class _Pending:
    """One rank's collective in flight in an :class:`InProcessGroup`."""

    __slots__ = ("group", "key", "rank")

    def __init__(self, group: InProcessGroup, key, rank: int):
        self.group, self.key, self.rank = group, key, rank

    def done(self) -> bool:
        return self.key in self.group._results

    def wait(self, timeout: float | None = None):
        began = time.time()
        result = self.group._wait(self.key, self.rank, timeout)
        self.group.members[self.rank].waited(self.key, began)
        return result


class Member:
    """Rank ``rank`` of an :class:`InProcessGroup`: the communicator one replica's plan runs with."""

    def __init__(self, group: InProcessGroup, rank: int):
        self.group, self.rank, self.size = group, rank, group.size
        self.step, self.calls = 0, 0
        self.bytes_sent = self.collectives = 0
        self.marks, self.cursor = new_marks(), 0.0
        self.weight = 1.0  # this replica's share of the loss (r.weight), set every step
        self.clock, self.delay = WALL, 0.0
        self.began = self.woke = self.arrived = (
            0.0  # perf_counter: the step's start, the end of its delay, its first collective
        )
        self.arrival = 0.0  # seconds from the step's start to its first collective (virtual on that clock)

    def begin(self, step: int, delay: float = 0.0) -> None:
        """A new run (step): collectives are matched across ranks by their order within it; ``delay``:
        the seconds this replica's step is late by (slept before it on the wall clock)."""
        self.step, self.calls, self.delay = step, 0, float(delay)
        self.marks = new_marks()  # the step's spans (workbench.spans)
        self.cursor = getattr(self.marks, "begin", 0.0)
        self.began = self.woke = time.perf_counter()

    def computed(self) -> None:
        """This replica's step reached its first collective (or its end, without one): its arrival."""
        self.arrived = time.perf_counter()
        if self.clock.virtual:
            self.arrival = self.clock.compute(self.arrived - self.began) + self.delay
        else:  # a backup cut short is due when it would have arrived
            self.arrival = max(self.arrived - self.began, self.delay + self.arrived - self.woke)

    def waited(self, key, began: float) -> None:
        """A wait for collective ``key`` from ``began`` until now: compute until then, then the collective."""
        now = time.time()
        self.marks.phase("compute", self.cursor, began)
        self.marks.phase("collective", began, now, key)
        self.cursor = now

    def start(self, kind: str, xp, value, **attrs) -> _Pending:
        if self.calls == 0:
            self.computed()
        key = (self.step, self.calls)
        self.calls += 1
        self.collectives += attrs.get("members", 1)  # a plan's bucket carries several collective ops
        self.bytes_sent += bytes_sent(kind, value.nbytes, value.dtype.itemsize, self.size, self.rank, attrs)
        self.marks.arrived(key)
        return self.group._start(key, self.rank, kind, xp, value, attrs)


class InProcessGroup:
    """R ranks in one process: each collective's parts meet here and are combined once, in rank order.

    Parameters
    ----------
    size : int
    timeout : float
        Seconds a rank waits for its peers before :class:`~workbench.errors.CollectiveError`.
    needed : int, optional
        With backup replicas, the parts each collective combines (R of the ``size``): the first to
        arrive at the step's first collective (on the virtual clock the earliest virtual arrivals,
        ties by rank), every later collective of the step among the same ranks.
    """

    def __init__(self, size: int, timeout: float = 60.0, needed: int | None = None):
        self.size, self.timeout = int(size), float(timeout)
        self.needed = self.size if needed is None else int(needed)
        self.members = [Member(self, r) for r in range(self.size)]
        self._lock = threading.Condition()
        self._parts: dict = {}
        self._results: dict = {}
        self._taken: dict = {}
        self._failed: str | None = None
        self.used: list[int] | None = None  # the ranks this step's collectives combine (decided at its first)
        self.went_on = threading.Event()  # set once they are known: a backup left out stops its delay
        self.scale: float | None = None  # with backups and a mean loss: 1 / the rows used
        self.mean_over_rows = False
        self.rows: list[int] = []
        self._order: list[int] = []  # ranks in the order they reached the step's first collective

    def _start(self, key, rank: int, kind: str, xp, value, attrs: dict) -> _Pending:
        with self._lock:
            if key in self._results or key in self._taken:  # a backup's late part: the result is out
                return _Pending(self, key, rank)
            parts = self._parts.setdefault(key, [None] * self.size)
            parts[rank] = (kind, value)
            if self.needed < self.size and self.used is None and rank not in self._order:
                self._order.append(rank)
            used = self._ready(parts)
            if used is not None:
                chosen = [parts[r] for r in used]
                kinds = {(k, v.shape, v.dtype.str) for k, v in chosen}
                if len(kinds) > 1:
                    self._failed = f"replicas started different collectives at the same point: {sorted(kinds)}"
                else:
                    result = combine(kind, xp, [v for _, v in chosen], attrs)
                    if self.scale is not None:  # the backups' mean over the rows used (their parts hold rows * g)
                        xp.multiply(result, result.dtype.type(self.scale), out=result)
                    self._results[key] = result
                del self._parts[key]
                self._lock.notify_all()
        return _Pending(self, key, rank)

    def _ready(self, parts: list) -> list[int] | None:
        """The ranks whose parts make the collective's result, once they are in (else None)."""
        if self.needed == self.size:
            return list(range(self.size)) if all(p is not None for p in parts) else None
        if self.used is None:
            if self.members[0].clock.virtual:
                if not all(p is not None for p in parts):
                    return None
                order = sorted(range(self.size), key=lambda r: (self.members[r].arrival, r))
            elif len(self._order) < self.needed:
                return None
            else:
                order = self._order
            self.used = sorted(order[: self.needed])
            if self.mean_over_rows:
                self.scale = 1.0 / sum(self.rows[r] for r in self.used)
            self.went_on.set()
        return self.used if all(parts[r] is not None for r in self.used) else None

    def _wait(self, key, rank: int, timeout: float | None):
        with self._lock:
            ready = self._lock.wait_for(
                lambda: key in self._results or self._failed is not None, self.timeout if timeout is None else timeout
            )
            if self._failed is not None:
                raise CollectiveError(f"collective of replica {rank} abandoned: {self._failed}")
            if not ready:
                raise CollectiveError(f"replica {rank} waited {self.timeout:g} s for its peers' collective {key}")
            result = self._results[key]
            taken = self._taken[key] = self._taken.get(key, 0) + 1
            if taken < self.size:  # a copy, made before the last rank takes the array itself (and may write into it)
                return result.copy()
            del self._results[key]
            return result

    def abort(self, why: str) -> None:
        """Wake every waiting rank with a CollectiveError (a replica failed)."""
        with self._lock:
            self._failed = self._failed or why
            self._lock.notify_all()
        self.went_on.set()

    def reset(self, rows: list[int] | None = None, scale: bool = False) -> None:
        """A new step: nothing in flight; ``rows`` per rank, and ``scale`` to take the mean over the rows
        the backups' collectives use."""
        with self._lock:
            self._parts.clear()
            self._results.clear()
            self._taken.clear()
            self._failed = None
            self.used, self._order = None, []
            self.rows = list(rows or [])
            self.mean_over_rows, self.scale = bool(scale), None
            self.went_on.clear()


class ReplicaRunner:
    """Every simulated replica's state and compiled plans: the one place a replica's plan is compiled and run.

    Parameters
    ----------
    request : FitRequest
    program : ReplicaProgram
        What each replica runs (a strategy's program; the asynchronous baseline's own).
    ranks : int
        The states held: one per replica (and one more for a parameter server's).
    """

    def __init__(self, request: FitRequest, program: ReplicaProgram, ranks: int):
        self.request, self.program, self.device = request, program, request.device
        self.states: list[dict] = [{} for _ in range(ranks)]
        self.plans: list[dict] = [{} for _ in range(ranks)]
        self.optimized: dict = {}  # (due, fetches, fed) -> the pruned, optimized graph every rank's plan runs
        self._optimizing = threading.Lock()  # replicas' threads compile their own plans at once

    def start(self, variables: dict[str, np.ndarray]) -> None:
        """Every rank's state from ``variables``: its own saved copy (``replicas/<rank>/<name>``) where
        there is one, else the fit's value, else the strategy slot's initial value."""
        names = self.program.state_variables()
        slots = self.program.initial_slots(variables, self.request.seed)
        put = self.device.put
        for rank, state in enumerate(self.states):
            state.clear()
            for name in names:
                saved = variables.get(f"{PREFIX}{rank}/{name}")
                value = saved if saved is not None else variables[name] if name in variables else slots[name]
                state[name] = put(np.array(value, copy=True))  # in the same dicts: the plans compiled stay valid

    def plan(self, rank: int, fetches: list[str], fed: list[str], due: frozenset = frozenset()):
        """Rank ``rank``'s plan of ``fetches`` from ``fed`` on the program's variant for ``due``, compiled once."""
        key = (due, tuple(fetches), tuple(fed))
        found = self.plans[rank].get(key)
        if found is None:
            with self._optimizing:  # the graph passes once for every rank: they run the same program
                graph = self.optimized.get(key)
                if graph is None:
                    graph = self.optimized[key] = optimize(self.program.variant(due), list(fetches), fed=list(fed))
            found = self.plans[rank][key] = compile_plan(
                graph,
                fetches,
                fed,
                self.device,
                state=self.states[rank],
                seed=self.request.seed,
                own_state=True,
                optimized=True,
            )
        return found

    def feeds(self, rank: int, rows: np.ndarray, step: int, share: float) -> dict:
        """A replica's feeds for ``step`` (1-based): its shard's rows, its id, the step and its weight."""
        inputs, put = self.program.inputs, self.device.put
        feeds = {name: put(a[rows]) for name, a in self.request.data.items()}
        if inputs:
            dtype = self.program.record.graph.get(inputs["weight"]).dtype
            feeds[inputs["id"]] = put(np.array(rank, dtype=np.int64))
            feeds[inputs["step"]] = put(np.array(step, dtype=np.int64))
            feeds[inputs["weight"]] = put(np.array(share, dtype=dtype))
        return feeds

    def run(self, plan, feeds: dict, step: int | None = None, offset: int = 0, comm=None) -> list:
        """``plan`` on ``feeds`` (by name) at ``step`` (1-based; None: no step), with ``comm``'s collectives."""
        options = {} if step is None else {"step": step - 1, "row_offset": offset}
        return plan.run(
            [feeds[name] for name in plan.feed_names], check_numerics=self.request.check_numerics, comm=comm, **options
        )

    def variables(self, rank: int) -> dict[str, np.ndarray]:
        """The graph's variables of rank ``rank``, as host copies."""
        to_host = self.device.to_host
        graph = {v.name for v in self.request.graph.variables}
        return {n: np.array(to_host(v)) for n, v in self.states[rank].items() if n in graph}


class SimulatedReplicas:
    """The step engine of a fit with ``replicas`` replicas of ``strategy`` in this process.

    ``variables()`` are replica 0's; :meth:`checkpoint_state` adds every replica's own state
    (``replicas/<rank>/<name>``: its variables, optimizer slots and strategy slots), so a
    resumed fit continues exactly, replicas that drifted apart (local SGD) included. ``backups``,
    ``stragglers`` and ``clock``: the lab's (see the module docstring).
    """

    workers = None
    restarts = 0

    def __init__(
        self, request: FitRequest, strategy, replicas: int, backups: int = 0, stragglers=None, clock: Clock = WALL
    ):
        self.request, self.replicas, self.backups = request, int(replicas), int(backups)
        self.total = self.replicas + self.backups
        if request.batch_size < self.replicas:
            raise ArgumentError(
                f"a batch of {request.batch_size} examples cannot be split across {self.replicas} replicas"
            )
        self.program = ReplicaProgram.build(
            request.graph, request.train, strategy, self.total, tuple(request.fetches.values()), request.feeds
        )
        self.strategy = self.program.name
        if self.backups and self.strategy != "allreduce":
            raise ArgumentError(
                f"backup_replicas={self.backups} is trained by strategy 'allreduce' (the default), "
                f"not {self.strategy!r}: the first R gradients to arrive are all-reduced"
            )
        self.size = request.batch_size + self.backups * (request.batch_size // self.replicas)
        self.stragglers = coerce(stragglers, self.total)
        self.clock = clock
        self.lab = self.stragglers is not None or self.backups > 0 or clock.virtual  # delays, arrivals recorded
        self.group = InProcessGroup(self.total, needed=self.replicas if self.backups else None)
        for member in self.group.members:
            member.clock = clock
        self.device = request.device
        self.runner = ReplicaRunner(request, self.program, self.total)
        self.step, self.now = 0, 0.0
        self.ahead = [0.0] * self.total  # each replica's virtual time less self.now (<= 0: behind, after local steps)
        self.labels = list(request.fetches)
        # how each fetch's shard values make the global batch's (a mean by shares, a sum added ...)
        self.reductions = [fetch_reduction(request.graph, name) for name in request.fetches.values()]
        self._pool = concurrent.futures.ThreadPoolExecutor(self.total) if self.total > 1 else None

    # -- state ------------------------------------------------------------------------------
    def state_specs(self) -> dict[str, tuple]:
        """Checkpoint members beyond the graph's variables: every replica's own state."""
        graph = self.program.record.graph
        specs = {}
        for rank in range(self.total):
            for name in self.program.state_variables():
                v = graph.get(name)
                specs[f"{PREFIX}{rank}/{name}"] = (v.shape, v.dtype)
        return specs

    def start(self, variables: dict[str, np.ndarray], step: int) -> None:
        self.runner.start(variables)
        self.step, self.now = step, 0.0
        self.ahead = [0.0] * self.total
        self.lanes = Lanes(time.time())  # each step's spans (one lane per replica)

    def variables(self) -> tuple[dict[str, np.ndarray], int]:
        """Replica 0's values of the graph's variables, and their step."""
        return self.runner.variables(0), self.step

    def checkpoint_state(self) -> dict[str, np.ndarray]:
        """Every replica's own state, for a checkpoint (see the class docstring)."""
        to_host = self.device.to_host
        return {
            f"{PREFIX}{rank}/{n}": np.array(to_host(v))
            for rank, state in enumerate(self.runner.states)
            for n, v in state.items()
        }

    def settle(self, step: int) -> tuple[dict[str, np.ndarray], int]:
        return self.variables()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- steps ------------------------------------------------------------------------------
    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        req = self.request
        n = len(next(iter(req.data.values())))
        indices = batch_indices(n, self.size, last, seed=req.batch_seed, start=first - 1)
        kind = self.program.reduction() if self.program.uses_weight() else "mean"
        with interrupts_at_step_boundaries() as pending:
            for step, index in enumerate(indices, start=first):
                if pending():
                    raise KeyboardInterrupt
                started = time.perf_counter()
                results = self._step(step, index, kind)
                self.step = step
                yield self._outcome(step, results, time.perf_counter() - started)
            if pending():
                raise KeyboardInterrupt

    def _step(self, step: int, index: np.ndarray, kind: str) -> list:
        """Every replica's step ``step`` on its shard of ``index``; their results in rank order."""
        parts, offsets = shards(index, self.total)
        due = self.program.due(step)
        delays = self.stragglers.delays(step, self.total) if self.stragglers else [0.0] * self.total
        rows = [len(p) for p in parts]
        self.group.reset(rows, scale=self.backups > 0 and kind == "mean")
        self.group.timeout = 60.0 + max(delays)
        calls = [(r, parts[r], offsets[r], due, step, kind, len(index), delays[r]) for r in range(self.total)]
        if self._pool is None:
            return [self._replica_step(*call) for call in calls]
        futures = [self._pool.submit(self._replica_step, *call) for call in calls]
        results, error = [], None
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as e:  # noqa: BLE001 - the first failure is raised, once every replica stopped
                error = error or e
        if error is not None:
            raise error
        return results

    def _share(self, kind: str, rows: int, total: int) -> float:
        """A replica's ``r.weight``: its share of the loss; with backups its rows (for a mean loss), the
        collective taking the mean over the rows used."""
        if self.backups and kind == "mean":
            return float(rows)
        return weight(kind, rows, total)

    def _replica_step(self, rank, rows, offset, due, step, kind, total, delay) -> dict:
        req, member, runner = self.request, self.group.members[rank], self.runner
        try:
            plan = runner.plan(rank, [UPDATE, *req.fetches.values()], [*req.data, *self.program.inputs.values()], due)
            share = self._share(kind, len(rows), total)
            feeds = runner.feeds(rank, rows, step, share)
            member.weight = float(share)  # what weighted collectives scale by (cross_replica_sum's gradient)
            sent, count = member.bytes_sent, member.collectives
            member.begin(step, delay)
            if delay > 0 and not self.clock.virtual:
                self.group.went_on.wait(delay)  # a straggler; a backup left out stops waiting
                member.woke = time.perf_counter()
            started = time.perf_counter()
            values = runner.run(plan, feeds, step, offset, comm=member)
        except BaseException as e:
            self.group.abort(f"replica {rank} failed at step {step}: {type(e).__name__}: {e}")
            raise
        if member.calls == 0:
            member.computed()
        member.marks.phase("compute", member.cursor, time.time())
        member.marks.backward_began(plan.backward_began)
        return {
            "worker": f"replica {rank}",
            "rank": rank,
            "marks": member.marks.as_dict(),
            "fetches": [np.asarray(self.device.to_host(v)) for v in values[1:]],
            "rows": len(rows),
            "seconds": time.perf_counter() - started,
            "compute": member.arrived - started if member.calls else time.perf_counter() - started,
            "arrival": member.arrival,
            "delay": member.delay,
            "synced": member.calls > 0,
            "bytes_sent": member.bytes_sent - sent,
            "collectives": member.collectives - count,
        }

    def _outcome(self, step: int, results: list, seconds: float) -> StepOutcome:
        used = self.group.used if self.backups and self.group.used is not None else list(range(self.total))
        chosen = [results[r] for r in used]
        rows = sum(r["rows"] for r in chosen)
        fetches = {}
        shares = [r["rows"] / rows for r in chosen]
        for k, (label, reduction) in enumerate(zip(self.labels, self.reductions, strict=True)):
            value = combine_fetch(reduction, [r["fetches"][k] for r in chosen], shares)
            fetches[label] = float(value) if np.ndim(value) == 0 else value
        metrics = {
            "replicas": self.replicas,
            "compute_seconds": max(r["seconds"] for r in chosen),
            "bytes_sent": max(r["bytes_sent"] for r in results),
            "collectives": max(r["collectives"] for r in results),
        }
        if not self.lab:
            metrics["spans"] = self.lanes.record(step, results)  # laid out when read
            return StepOutcome(step, fetches, metrics, seconds=seconds)
        arrivals = [float(r["arrival"]) for r in results]
        metrics["delays"] = [float(r["delay"]) for r in results]
        metrics["arrivals"] = arrivals
        if self.backups:
            metrics["dropped"] = [r for r in range(self.total) if r not in used]
        if not self.clock.virtual:
            metrics["spans"] = self.lanes.record(step, results)  # laid out when read
            return StepOutcome(step, fetches, metrics, seconds=seconds)
        metrics["compute_seconds"] = max(self.clock.compute(r["compute"]) for r in chosen)
        ahead, met = self.ahead, any(r["synced"] for r in results)
        if met:  # the replicas met: the step ends at the arrival completing it
            seconds = max(ahead[r] + arrivals[r] for r in used)
            self.ahead = [0.0] * self.total
        else:  # each replica went on by itself
            ends = [a + arrived for a, arrived in zip(ahead, arrivals, strict=True)]
            seconds = max(ends)
            self.ahead = [end - seconds for end in ends]
        self.now += seconds
        if tracing():
            metrics["spans"] = step_spans(step, self.now - seconds, ahead, arrivals, used, seconds, met)
        return StepOutcome(step, fetches, metrics, seconds=seconds, elapsed=self.now)


def step_spans(
    step: int, begin: float, ahead: list[float], arrivals: list[float], used: list[int], seconds: float, met: bool
) -> list[dict]:
    """One virtual step's spans (:mod:`workbench.timeline`), one lane per replica, in virtual seconds since
    the fit started: ``compute`` from where the replica's lane stood (``ahead`` of ``begin``) until it
    reached the step's collective (a straggler's delay included, as on the cluster), then, where the
    replicas ``met`` in it, ``wait`` for the last of the replicas used to arrive; a dropped replica's
    lane ends where the step went on without it."""
    last = max(used, key=lambda r: (ahead[r] + arrivals[r], r))
    out = []
    for r, arrived in enumerate(arrivals):
        worker, start = f"replica {r}", ahead[r]
        done = min(start + arrived, seconds) if met else start + arrived
        if done > start:
            out.append(span(worker, r, step, "compute", begin + start, begin + done))
        if met and r in used and r != last and done < seconds:
            out.append(span(worker, r, step, "wait", begin + done, begin + seconds, waiting_for=f"replica {last}"))
    return out


def shards(index: np.ndarray, count: int) -> tuple[list[np.ndarray], list[int]]:
    """The cluster's split of a batch's rows into ``count`` shards (cluster/lower.shards), and each shard's row offset."""
    parts = np.array_split(index, count)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])[:-1]]).astype(int).tolist()
    return parts, offsets
