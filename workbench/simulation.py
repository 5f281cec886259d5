"""The one-process simulation of R replicas: the exact reference a strategy is checked against.

``Session.fit(train, data, batch_size, steps, replicas=R, strategy=...)`` without a cluster
trains with :class:`SimulatedReplicas`, a step engine the one :class:`~workbench.fitloop.FitLoop`
drives. Each replica has its own copy of every variable (the optimizer's slots and the
strategy's included) and runs the strategy's program (:mod:`workbench.strategies.program`) on
its shard of each global batch, in a thread of its own; collectives meet in an
:class:`InProcessGroup`. Shards and row offsets are the cluster's (``np.array_split`` of the
batch, :func:`workbench.training.batch_indices`), sums are taken in the cluster's fixed pairwise
order, so the simulation, local training (for ``"allreduce"``) and the cluster agree.

Step metrics per replica: ``bytes_sent`` (what the cluster's collective would send,
:func:`workbench.ops.collective.bytes_sent`) and ``collectives`` (how many ran).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from workbench.errors import ArgumentError, CollectiveError
from workbench.fitloop import FitRequest, StepOutcome, interrupts_at_step_boundaries
from workbench.graph.compile import compile_plan
from workbench.graph.batch_reduction import combine as combine_fetch
from workbench.graph.batch_reduction import fetch_reduction
from workbench.ops.collective import bytes_sent, combine
from workbench.strategies.program import UPDATE, ReplicaProgram
from workbench.spans import Lanes, new_marks
from workbench.strategies.weights import weight
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

    def begin(self, step: int) -> None:
        """A new run (step): collectives are matched across ranks by their order within it."""
        self.step, self.calls = step, 0
        self.marks = new_marks()  # the step's spans (workbench.spans)
        self.cursor = getattr(self.marks, "begin", 0.0)

    def waited(self, key, began: float) -> None:
        """A wait for collective ``key`` from ``began`` until now: compute until then, then the collective."""
        now = time.time()
        self.marks.phase("compute", self.cursor, began)
        self.marks.phase("collective", began, now, key)
        self.cursor = now

    def start(self, kind: str, xp, value, **attrs) -> _Pending:
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
    """

    def __init__(self, size: int, timeout: float = 60.0):
        self.size, self.timeout = int(size), float(timeout)
        self.members = [Member(self, r) for r in range(self.size)]
        self._lock = threading.Condition()
        self._parts: dict = {}
        self._results: dict = {}
        self._taken: dict = {}
        self._failed: str | None = None

    def _start(self, key, rank: int, kind: str, xp, value, attrs: dict) -> _Pending:
        with self._lock:
            parts = self._parts.setdefault(key, [None] * self.size)
            parts[rank] = (kind, value)
            if all(p is not None for p in parts):
                kinds = {(k, v.shape, v.dtype.str) for k, v in parts}
                if len(kinds) > 1:
                    self._failed = f"replicas started different collectives at the same point: {sorted(kinds)}"
                else:
                    self._results[key] = combine(kind, xp, [v for _, v in parts], attrs)
                del self._parts[key]
                self._lock.notify_all()
        return _Pending(self, key, rank)

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
            del self._results[key], self._taken[key]
            return result

    def abort(self, why: str) -> None:
        """Wake every waiting rank with a CollectiveError (a replica failed)."""
        with self._lock:
            self._failed = self._failed or why
            self._lock.notify_all()

    def reset(self) -> None:
        with self._lock:
            self._parts.clear()
            self._results.clear()
            self._taken.clear()
            self._failed = None


class SimulatedReplicas:
    """The step engine of a fit with ``replicas`` replicas of ``strategy`` in this process.

    ``variables()`` are replica 0's; :meth:`checkpoint_state` adds every replica's own state
    (``replicas/<rank>/<name>``: its variables, optimizer slots and strategy slots), so a
    resumed fit continues exactly, replicas that drifted apart (local SGD) included.
    """

    workers = None
    restarts = 0

    def __init__(self, request: FitRequest, strategy, replicas: int):
        self.request, self.replicas = request, int(replicas)
        if request.batch_size < self.replicas:
            raise ArgumentError(
                f"a batch of {request.batch_size} examples cannot be split across {self.replicas} replicas"
            )
        self.program = ReplicaProgram.build(
            request.graph, request.train, strategy, self.replicas, tuple(request.fetches.values()), request.feeds
        )
        self.strategy = self.program.name
        self.group = InProcessGroup(self.replicas)
        self.device = request.device
        self.states: list[dict] = [{} for _ in range(self.replicas)]
        self.plans: list[dict] = [{} for _ in range(self.replicas)]
        self.step = 0
        self.labels = list(request.fetches)
        # how each fetch's shard values make the global batch's (a mean by shares, a sum added ...)
        self.reductions = [fetch_reduction(request.graph, name) for name in request.fetches.values()]
        self._pool = concurrent.futures.ThreadPoolExecutor(self.replicas) if self.replicas > 1 else None
        graph_names = {v.name for v in request.graph.variables}
        self.own = [n for n in self.program.state_variables() if n not in graph_names]  # the strategy's slots

    # -- state ------------------------------------------------------------------------------
    def state_specs(self) -> dict[str, tuple]:
        """Checkpoint members beyond the graph's variables: every replica's own state."""
        graph = self.program.record.graph
        specs = {}
        for rank in range(self.replicas):
            for name in self.program.state_variables():
                v = graph.get(name)
                specs[f"{PREFIX}{rank}/{name}"] = (v.shape, v.dtype)
        return specs

    def start(self, variables: dict[str, np.ndarray], step: int) -> None:
        names = self.program.state_variables()
        slots = self.program.initial_slots(variables, self.request.seed)
        put = self.device.put
        for rank, state in enumerate(self.states):
            state.clear()
            for name in names:
                saved = variables.get(f"{PREFIX}{rank}/{name}")
                value = saved if saved is not None else variables[name] if name in variables else slots[name]
                state[name] = put(np.array(value, copy=True))
        self.step = step
        self.lanes = Lanes(time.time())  # each step's spans (one lane per replica)

    def variables(self) -> tuple[dict[str, np.ndarray], int]:
        """Replica 0's values of the graph's variables, and their step."""
        to_host = self.device.to_host
        graph = {v.name for v in self.request.graph.variables}
        return {n: np.array(to_host(v)) for n, v in self.states[0].items() if n in graph}, self.step

    def checkpoint_state(self) -> dict[str, np.ndarray]:
        """Every replica's own state, for a checkpoint (see the class docstring)."""
        to_host = self.device.to_host
        return {
            f"{PREFIX}{rank}/{n}": np.array(to_host(v))
            for rank, state in enumerate(self.states)
            for n, v in state.items()
        }

    def settle(self, step: int) -> tuple[dict[str, np.ndarray], int]:
        return self.variables()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- steps ------------------------------------------------------------------------------
    def _plan(self, rank: int, due: frozenset):
        found = self.plans[rank].get(due)
        if found is None:
            graph = self.program.variant(due)
            fetches = [UPDATE, *self.request.fetches.values()]
            fed = [*self.request.data, *self.program.inputs.values()]
            found = self.plans[rank][due] = compile_plan(
                graph, fetches, fed, self.device, state=self.states[rank], seed=self.request.seed, own_state=True
            )
        return found

    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        req = self.request
        n = len(next(iter(req.data.values())))
        indices = batch_indices(n, req.batch_size, last, seed=req.batch_seed, start=first - 1)
        kind = self.program.reduction() if self.program.uses_weight() else "mean"
        with interrupts_at_step_boundaries() as pending:
            for step, index in enumerate(indices, start=first):
                if pending():
                    raise KeyboardInterrupt
                started = time.perf_counter()
                results = self._step(step, index, kind)
                self.step = step
                yield self._outcome(step, results, len(index), time.perf_counter() - started)
            if pending():
                raise KeyboardInterrupt

    def _step(self, step: int, index: np.ndarray, kind: str) -> list:
        """Every replica's step ``step`` on its shard of ``index``; their results in rank order."""
        parts = np.array_split(index, self.replicas)  # the cluster's shards (cluster/lower.shards)
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])[:-1]])
        due = self.program.due(step)
        calls = [(rank, parts[rank], int(offsets[rank]), due, step, kind, len(index)) for rank in range(self.replicas)]
        self.group.reset()
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

    def _replica_step(self, rank, rows, offset, due, step, kind, total) -> dict:
        req, inputs, member = self.request, self.program.inputs, self.group.members[rank]
        try:
            plan = self._plan(rank, due)
            feeds = {name: self.device.put(a[rows]) for name, a in req.data.items()}
            dtype = self.program.record.graph.get(inputs["weight"]).dtype
            feeds[inputs["id"]] = self.device.put(np.array(rank, dtype=np.int64))
            feeds[inputs["step"]] = self.device.put(np.array(step, dtype=np.int64))
            share = weight(kind, len(rows), total)
            feeds[inputs["weight"]] = self.device.put(np.array(share, dtype=dtype))
            member.weight = float(share)  # what weighted collectives scale by (cross_replica_sum's gradient)
            sent, count = member.bytes_sent, member.collectives
            member.begin(step)
            started = time.perf_counter()
            values = plan.run(
                [feeds[name] for name in plan.feed_names],
                check_numerics=req.check_numerics,
                step=step - 1,
                row_offset=offset,
                comm=member,
            )
        except BaseException as e:
            self.group.abort(f"replica {rank} failed at step {step}: {type(e).__name__}: {e}")
            raise
        member.marks.phase("compute", member.cursor, time.time())
        member.marks.backward_began(plan.backward_began)
        return {
            "worker": f"replica {rank}",
            "rank": rank,
            "marks": member.marks.as_dict(),
            "fetches": [np.asarray(self.device.to_host(v)) for v in values[1:]],
            "share": len(rows) / total,
            "seconds": time.perf_counter() - started,
            "bytes_sent": member.bytes_sent - sent,
            "collectives": member.collectives - count,
        }

    def _outcome(self, step: int, results: list, rows: int, seconds: float) -> StepOutcome:
        fetches = {}
        shares = [r["share"] for r in results]
        for k, (label, reduction) in enumerate(zip(self.labels, self.reductions, strict=True)):
            value = combine_fetch(reduction, [r["fetches"][k] for r in results], shares)
            fetches[label] = float(value) if np.ndim(value) == 0 else value
        metrics = {
            "replicas": self.replicas,
            "compute_seconds": max(r["seconds"] for r in results),
            "bytes_sent": max(r["bytes_sent"] for r in results),
            "collectives": max(r["collectives"] for r in results),
            "spans": self.lanes.record(step, results),  # laid out when read
        }
        return StepOutcome(step, fetches, metrics, seconds=seconds)
