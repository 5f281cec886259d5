"""The worker side of a strategy function on a cluster: one replica's program, its collectives on the
worker-to-worker communicator.

The client ships a :class:`StrategyProgram`: each variant of the replica's program (one per set of
due ``every`` blocks, :mod:`workbench.strategies.program`) as graph JSON, never code. Each member
worker holds a :class:`StrategyReplica` (its own copy of every variable and slot), compiles each
variant once (:class:`~workbench.cluster.worker_plans.StrategyPlans`, kept warm between fits), and runs its shard of a step
with ``comm=`` a :class:`WorkerComm`: the collective ops' kernels call the worker's
:class:`~workbench.cluster.collective.communicator.Communicator`, whose sums are in the same fixed pairwise
order as the one-process simulation's, so the cluster and the simulation agree.

The communicator reduces sums of flat arrays. ``all_reduce`` sum and mean go to it as they are (a
mean scaled once by ``1 / R``, by the rank that sums each chunk, as the simulation does);
``all_gather``, ``broadcast`` and ``all_reduce`` max/min travel as a sum of ``(R, ...)`` arrays
that are zero but in the sender's row (adding zeros is exact), then max/min reduce the gathered
rows in rank order.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from workbench.cluster.collective.group import CollectiveGroup, communicator
from workbench.cluster.program import take_rows
from workbench.cluster.worker_plans import WARM
from workbench.cluster.collective.replica import _REPLICAS, hold, leave_thread_pool, retire
from workbench.cluster.spans import worker_marks
from workbench.errors import ClusterError, CollectiveError
from workbench.graph.batch_reduction import weighted
from workbench.graph.schedule import BUCKET_BYTES


@dataclass(frozen=True)
class StrategyProgram:
    """A fit's replica program as plain data for the workers.

    Attributes
    ----------
    strategy : str
    variants : tuple of (due periods, graph JSON)
        The program of the steps where exactly those ``every`` blocks run.
    periods : tuple of int
    feeds : tuple of str
        Placeholders fed with the shard's rows.
    inputs : tuple of (key, placeholder)
        ``id``, ``weight``, ``step``: what each replica is fed besides its rows.
    weight_dtype : str
    fetches : tuple of str
    fetch_reductions : tuple
        How each fetch combines across replicas (:mod:`workbench.graph.batch_reduction`).
    loss_reduction : {"mean", "sum"}
    seed : int
    device, device_options :
        As :class:`~workbench.cluster.program.TrainingProgram`'s (CPU workers).
    stats : tuple
        The model's statistic ops (``fit(stats=k)``): on the steps that report them, every rank also
        computes them on its shard, before the update, and the client joins them as the all-reduce
        engine's (:mod:`workbench.cluster.collective.stat_combine`).
    stat_norms : tuple of int
        For each of ``stats``: the index into ``stat_gradients`` of the gradient whose global-batch norm
        it reports (a ``grad_norm``), or -1.
    stat_gradients : tuple of str
        The shard's gradients of those norms: on the steps that report statistics the ranks all-reduce
        them, each times its weight, as the all-reduce engine's replicas do, and take the sum's norm.
    bucket_bytes : int or None
        The plans start their sum and mean all-reduces in flat buckets of about this many bytes, in the
        order the backward pass makes their inputs (:mod:`workbench.graph.schedule`; the all-reduce
        engine's buckets); None: one reduction per collective op.
    """

    strategy: str
    variants: tuple
    periods: tuple
    feeds: tuple
    inputs: tuple
    weight_dtype: str
    fetches: tuple
    fetch_reductions: tuple
    loss_reduction: str = "mean"
    seed: int = 0
    device: str = "cpu"
    device_options: tuple = ()
    stats: tuple = ()
    stat_norms: tuple = ()
    stat_gradients: tuple = ()
    bucket_bytes: int | None = BUCKET_BYTES

    def due(self, step: int) -> tuple:
        return tuple(k for k in self.periods if step % k == 0)


class _Waiting:
    """A collective in flight on the communicator; :meth:`wait` gives this rank's result as soon as
    it is summed (peers may still be reading what this rank sent: the replica waits for that before
    its next step, off this step's critical path, as the all-reduce engine does)."""

    __slots__ = ("handle", "finish", "comm", "bucket")

    def __init__(self, handle, finish, comm, bucket=""):
        self.handle, self.finish, self.comm, self.bucket = handle, finish, comm, bucket

    def done(self) -> bool:
        return self.handle.done()

    def wait(self, timeout: float | None = None):
        started, began = time.perf_counter(), time.time()
        flat = self.handle.summed(timeout)
        self.comm.wait_seconds += time.perf_counter() - started
        self.comm.waited(self.bucket, began)
        return self.finish(flat)


class WorkerComm:
    """What a replica's plan runs with on a worker: collective kernels on the worker's communicator."""

    def __init__(self, comm, step: int, delay: float = 0.0):
        self.comm, self.step = comm, step
        self.rank, self.size = comm.rank, comm.size
        self.calls = self.collectives = 0
        self.wait_seconds = 0.0
        self.handles: list = []  # every reduction of the run, settled before the next one
        self.delay, self.ready_wall = float(delay), None
        self.weight = 1.0  # this replica's share of the loss (r.weight): what weighted collectives scale by
        self.marks = worker_marks()  # the step's spans (workbench.cluster.spans)
        self.cursor = getattr(self.marks, "begin", 0.0)

    def waited(self, bucket: str, began: float) -> None:
        """A wait for collective ``bucket`` from ``began`` until now: compute until then, then the collective."""
        now = time.time()
        self.marks.phase("compute", self.cursor, began)
        self.marks.phase("collective", began, now, bucket)
        self.cursor = now

    def hand_in(self) -> None:
        """Once a step, before this rank's first collective (or at its end): a straggler's delay
        (``fit(stragglers=...)``), then the wall-clock time its contribution was ready."""
        if self.ready_wall is None:
            if self.delay > 0:
                time.sleep(self.delay)
            self.ready_wall = time.time()

    def start(self, kind: str, xp, value, **attrs) -> _Waiting:
        self.hand_in()
        value = np.asarray(value)
        bucket = f"{self.step}.s{self.calls}"  # every rank runs the same plan: the n-th collectives match
        self.calls += 1
        self.marks.arrived(bucket)
        self.collectives += attrs.get("members", 1)  # a bucket of the plan carries several collective ops
        shape, size, op = value.shape, self.size, attrs.get("op")
        if kind == "all_reduce" and op in ("sum", "mean"):
            # the communicator reduces into its own array: the plan's fresh bucket, or a copy
            flat = value.reshape(-1) if attrs.get("owned") else np.array(value, copy=True).reshape(-1)
            scale = 1.0 / size if op == "mean" and size > 1 else None
            return self._started(self.comm.start(bucket, flat, scale), lambda f: f.reshape(shape), bucket)
        if kind == "broadcast":  # the root's value plus everyone else's zeros
            flat = (np.array(value, copy=True) if self.rank == attrs["root"] else np.zeros_like(value)).reshape(-1)
        else:  # each rank's value in its own row, zeros elsewhere: the sum gathers them
            rows = np.zeros((size, *shape), dtype=value.dtype)
            rows[self.rank] = value
            flat = rows.reshape(-1)
        finish = {
            "all_gather": lambda f: f.reshape(size, *shape),
            "broadcast": lambda f: f.reshape(shape),
            "all_reduce": lambda f: _extreme(op, f.reshape(size, *shape)),
        }[kind]
        return self._started(self.comm.start(bucket, flat), finish, bucket)

    def _started(self, handle, finish, bucket: str) -> _Waiting:
        self.handles.append(handle)
        return _Waiting(handle, finish, self, bucket)


def _extreme(op: str, rows: np.ndarray) -> np.ndarray:
    reduce = np.maximum if op == "max" else np.minimum
    result = rows[0]
    for row in rows[1:]:
        result = reduce(result, row)
    return np.array(result, copy=True)


class StrategyReplica:
    """One worker's replica of a strategy fit: its variables and slots, and each variant's plan."""

    def __init__(self, program: StrategyProgram, variables: dict, step: int, group: CollectiveGroup, data=()):
        self.program, self.group, self.data = program, group, tuple(data)
        self.comm = communicator(group)
        self.step, self.failed, self.closed = step, None, False
        self.turn = threading.Condition()
        self.settling: list = []  # the last step's reductions, until the peers have read what this rank sent
        # the lease (see workbench.cluster.collective.replica.expired): held while the start task is wanted
        self.start_key, self.lease, self.used, self._running = None, 0.0, time.monotonic(), False
        # its variables and slots, and a plan per variant bound to them: warm from an earlier run of the program
        self.compiled = WARM.strategy(program, variables)
        self.compiled.owner = self
        self.variables, self.plans, self.stats_plans = (
            self.compiled.variables,
            self.compiled.plans,
            self.compiled.stats_plans,
        )

    def run(
        self,
        step: int,
        rows,
        offset: int,
        fetch_weight: float,
        sync: bool,
        stats: bool = False,
        delay: float = 0.0,
        reduce: tuple = (1.0, None),
    ) -> dict:
        """Step ``step`` on the shard ``rows``; ``reduce``: the all-reduce engine's ``(weight, scale)`` of
        this rank (:func:`~workbench.cluster.lower.allreduce_calls`), for the gradient norms of ``stats``."""
        with self.turn:  # under the lock close() reads it with: a closed replica's plans are never run
            self.used, self._running = time.monotonic(), True
        try:
            return self._run_in_turn(step, rows, offset, fetch_weight, sync, stats, delay, reduce)
        finally:
            self.used, self._running = time.monotonic(), False

    def turn_busy(self) -> bool:
        """Whether a step runs now (its lease does not end while it does)."""
        return self._running

    def _run_in_turn(self, step, rows, offset, fetch_weight, sync, stats, delay, reduce) -> dict:
        with self.turn:  # steps run in order (a later step that started early waits, bounded)
            ready = self.turn.wait_for(lambda: self.failed or self.step >= step - 1, timeout=self.group.timeout)
        if self.failed:
            raise CollectiveError(f"replica {self.comm.rank} of {self.group.token!r} is broken: {self.failed}")
        if not ready or self.step != step - 1:
            raise ClusterError(f"step {step} came to replica {self.comm.rank} at step {self.step}")
        try:
            return self._run(step, rows, offset, fetch_weight, sync, stats, delay, reduce)
        except BaseException as e:
            self.failed = f"step {step} failed here: {type(e).__name__}: {e}"
            raise
        finally:
            with self.turn:
                self.turn.notify_all()

    def _run(self, step, rows, offset, fetch_weight, sync, stats=False, delay=0.0, reduce=(1.0, None)) -> dict:
        program, inputs = self.program, dict(self.program.inputs)
        due = program.due(step)
        stats = stats and due in self.stats_plans
        plan = self.stats_plans[due] if stats else self.plans[due]
        if len(_REPLICAS) > 1 and self.comm.size > 1:
            leave_thread_pool()  # waits for peers while another run shares this worker
        for handle in self.settling:  # the last step's arrays are free once peers have read them
            handle.wait(self.group.timeout)
        started, start_wall = time.perf_counter(), time.time()
        sent, received = self.comm.bytes_sent, self.comm.bytes_received
        feeds = {name: take_rows(source, rows) for name, source in zip(program.feeds, self.data, strict=True)}
        feeds[inputs["id"]] = np.array(self.comm.rank, dtype=np.int64)
        feeds[inputs["step"]] = np.array(step, dtype=np.int64)
        weight = fetch_weight if program.loss_reduction == "mean" else 1.0
        feeds[inputs["weight"]] = np.array(weight, dtype=program.weight_dtype)
        comm = WorkerComm(self.comm, step, delay)
        comm.weight = float(weight)  # what weighted collectives scale by (cross_replica_sum's gradient)
        values = plan.run([feeds[n] for n in plan.feed_names], step=step - 1, row_offset=offset, comm=comm)
        comm.hand_in()  # a step without collectives: late at its end
        self.settling = comm.handles
        m = 1 + len(program.fetches)
        reported = self._stats(step, values[m:], reduce, comm) if stats else None
        self.step = step
        fetches = [
            weighted(r, np.array(v, copy=True), fetch_weight)
            for r, v in zip(program.fetch_reductions, values[1:m], strict=True)
        ]
        seconds = time.perf_counter() - started
        comm.marks.phase("compute", comm.cursor, time.time())
        comm.marks.backward_began(plan.backward_began)
        result = {
            "step": step,
            "rank": self.comm.rank,
            "worker": self.group.addresses[self.comm.rank],
            "fetches": fetches,
            "compute_seconds": seconds - comm.wait_seconds,
            "allreduce_wait_seconds": comm.wait_seconds,
            "update_seconds": 0.0,
            "bytes_sent": self.comm.bytes_sent - sent,
            "bytes_received": self.comm.bytes_received - received,
            "collectives": comm.collectives,
            "marks": comm.marks.as_dict(),
            "delay": comm.delay,
            "start_wall": start_wall,
            "ready_wall": comm.ready_wall,
        }
        if reported is not None:  # this shard's statistics and its share, as the all-reduce engine's replicas
            result["stats"], result["stats_share"] = reported, float(fetch_weight)
        if sync:  # every rank: replicas may differ between averaging steps (local SGD's optimizer slots)
            result["variables"] = {name: value.copy() for name, value in self.variables.items()}
        return result

    def _stats(self, step: int, values: list, reduce: tuple, comm: WorkerComm) -> list[float]:
        """The statistics of this shard, gradient norms of the global batch's gradient (``values``: the
        statistics, then :attr:`StrategyProgram.stat_gradients`)."""
        program = self.program
        reported = [float(np.asarray(v)) for v in values[: len(program.stats)]]
        if not program.stat_gradients:
            return reported
        started, began = time.perf_counter(), time.time()
        summed = self._summed(step, values[len(program.stats) :], *reduce)
        comm.wait_seconds += time.perf_counter() - started
        comm.waited(f"{step}.stats", began)
        norms = [float(np.linalg.norm(g)) for g in summed]
        return [norms[j] if j >= 0 else v for v, j in zip(reported, program.stat_norms, strict=True)]

    def _summed(self, step: int, gradients: list, weight: float, scale: float | None) -> list[np.ndarray]:
        """Each of ``gradients`` times ``weight``, summed over the ranks, times ``scale``: the all-reduce
        engine's arithmetic. One reduction per dtype, settled before the next step as the plan's are."""
        arrays = [np.asarray(g) for g in gradients]
        by_dtype: dict = {}
        for j, g in enumerate(arrays):
            by_dtype.setdefault(g.dtype.str, []).append(j)
        out: list = [None] * len(arrays)
        for dtype, members in by_dtype.items():
            flat = np.concatenate([arrays[j].reshape(-1) for j in members])  # a fresh array, reduced in place
            if weight != 1.0:
                np.multiply(flat, weight, out=flat, casting="unsafe")
            handle = self.comm.start(f"{step}.stats.{dtype}", flat, scale)
            self.settling.append(handle)
            handle.summed(self.group.timeout)
            start = 0
            for j in members:
                out[j] = flat[start : start + arrays[j].size]
                start += arrays[j].size
        return out

    def close(self) -> None:
        """End this replica: a step not yet begun fails at once; the plans go back to
        :data:`~workbench.cluster.worker_plans.WARM` unless a step is running or failed."""
        reusable = retire(self)
        if reusable is None:
            return
        self.comm.close()
        if reusable:
            WARM.give_back(self.compiled)


# -- the task functions ------------------------------------------------------------------------


def start_strategy_replica(
    program: StrategyProgram, variables: dict, step: int, group: CollectiveGroup, _bucket, *data, lease: float = 0.0
):
    """Make this worker's replica of ``group``'s run (dropping older generations of the same run); its
    lease is the all-reduce engine's (see :func:`workbench.cluster.collective.replica.start_replica`)."""
    return hold(StrategyReplica(program, variables, step, group, data), group, lease)


def run_strategy_step(
    token: str,
    step: int,
    rows,
    offset: int,
    weight,
    scale,
    fetch_weight,
    sync,
    _started,
    stats: bool = False,
    delay: float = 0.0,
):
    """One replica's step ``step`` (the arguments of :func:`workbench.cluster.lower.allreduce_calls`;
    ``weight`` and ``scale`` serve the gradient norms of ``stats``: also report the model's statistics;
    ``delay``: the seconds it is made late, see :meth:`WorkerComm.hand_in`)."""
    replica = _REPLICAS.get(token)
    if not isinstance(replica, StrategyReplica):
        raise CollectiveError(f"no strategy replica of run {token!r} on this worker (restarted?)")
    return replica.run(step, rows, offset, fetch_weight, sync, stats, delay, (weight, scale))
