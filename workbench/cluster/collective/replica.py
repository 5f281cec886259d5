"""The worker side of the all-reduce strategy: a replica of the variables that lives on its worker.

Each worker of a run holds a :class:`Replica` (keyed by the run's token, in the
worker process): the program's two plans, its own copy of every variable (updated
in place by the optimizer), the training data, and flat gradient buckets reused
from step to step. A
step task on that worker (:func:`run_step`):

1. runs the gradient plan on its shard. Each gradient is copied into its bucket as
   soon as the plan computes it; a bucket whose gradients are all there starts its
   all-reduce at once, on the worker's event loop, while this thread goes on with the
   rest of the backward pass (buckets follow the order the backward pass produces the
   gradients, last layer first);
2. waits for the sums to be in the buckets (bounded: a dead or hung peer raises
   ``CollectiveError``); each gradient came in weighted by its shard's share (a sum loss: as it is). The
   peers' replies to what this rank sent (they have read it) are waited for only when
   the next step is about to write into the buckets, off the step's critical path;
3. applies the optimizer in place with the reduced gradients, views into the buckets;
4. returns small numbers only (its weighted fetches, timings, bytes), plus a copy of the
   variables when the step is a sync point and this is rank 0.

All replicas start from the same values and apply the same bits, so they stay identical.
"""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np

from workbench.cluster.collective.group import CollectiveGroup, communicator
from workbench.cluster.malloc import reuse_freed_memory
from workbench.cluster.program import TrainingProgram, take_rows
from workbench.cluster.spans import injected_delay, worker_marks
from workbench.cluster.collective.stat_combine import gradient_norm_indices
from workbench.errors import ClusterError, CollectiveError
from workbench.graph.batch_reduction import Reduction, weighted
from workbench.cluster.worker_plans import WARM


class Replica:
    """One worker's replica of a run: plans, variables, buckets and its rank's communicator."""

    def __init__(
        self,
        program: TrainingProgram,
        variables: dict,
        step: int,
        group: CollectiveGroup,
        bucket_bytes: int = 4 << 20,
        data: tuple = (),
        needed: int | None = None,
    ):
        reuse_freed_memory()  # else every large temporary of a step is a fresh mmap in a Dask worker
        self.program, self.group = program, group
        # the sources of the feeds, held here: Dask may drop its extra replicas of scattered data
        # once no task waits for them, and a step must never fetch the data set or lose it
        self.data = tuple(data)
        self.comm = communicator(group)
        self.step = step
        # the lease: the run holds this replica while its start task is wanted (the client that made it is
        # connected and has not dropped it) and, with ``lease``, while a step comes within that many seconds
        self.start_key, self.lease, self.used, self._running = None, 0.0, time.monotonic(), False
        self.failed: str | None = None
        self.closed = False
        self.turn = threading.Condition()
        self._settling: list = []  # the last step's all-reduces, until peers have read what they sent
        # this replica's own arrays: its plans', warm from an earlier run of the same program if one ended here
        self.plans = plans = WARM.replica(program, variables, bucket_bytes)
        plans.owner = self
        self.variables, self.forward_state = plans.variables, plans.forward_state
        self.forward, self.forward_stats, self.update = plans.forward, plans.forward_stats, plans.update
        self.update_order, self.feed_order = plans.update_order, plans.feed_order
        self.buckets, self.flats, self.views, self.bucket_of = plans.buckets, plans.flats, plans.views, plans.bucket_of
        # backup replicas (fit(backup_replicas=b)): the first ``needed`` of the group's gradients are applied
        self.backup = None
        if needed is not None:
            from workbench.cluster.collective.backups import BackupRank

            self.backup = BackupRank(self.comm, needed, step, len(self.buckets), program.loss_reduction == "mean")
        self._deferred = False
        self.norm_of = gradient_norm_indices(program)  # grad_norm statistics: of the all-reduced gradients

    # -- one step ---------------------------------------------------------------------------------
    def _produced(self, i: int, value) -> None:
        """The plan just computed gradient ``i``: into its bucket; a full bucket starts reducing."""
        if self._packed[i]:
            return
        if self._weight == 1.0:
            np.copyto(self.views[i], value, casting="unsafe")
        else:
            np.multiply(value, self._weight, out=self.views[i], casting="unsafe")
        self._packed[i] = True
        b = self.bucket_of[i]
        self._missing[b] -= 1
        if self._missing[b] == 0 and not self._deferred:
            self._handles[b] = self.comm.start(f"{self._step}.{b}", self.flats[b], self._scale)

    def run(
        self,
        step: int,
        rows: np.ndarray,
        offset: int,
        weight: float,
        scale: float | None,
        fetch_weight: float,
        sync: bool,
        stats: bool = False,
        delay: float = 0.0,
    ) -> dict:
        """Step ``step`` on the examples ``rows`` (this replica's shard); see the module's docstring.

        ``offset``: where the shard starts in the global batch; ``weight``: what each gradient is
        multiplied by on its way into its bucket; ``scale``: what the sum is multiplied by;
        ``fetch_weight``: the shard's share of the batch (its fetches are weighted by it); ``stats``:
        also compute the program's statistic ops and return them (``"stats"``: this replica's values);
        ``delay``: seconds to wait after computing, before handing the gradient in (``fit(stragglers=...)``).
        """
        with self.turn:  # under the lock close() reads it with: a closed replica's plans are never run
            self.used, self._running = time.monotonic(), True
        self._marks = worker_marks()  # the step's spans (workbench.cluster.spans)
        try:
            self._wait_turn(step)
        except BaseException:
            self._running = False
            raise
        try:
            return self._run(step, rows, offset, weight, scale, fetch_weight, sync, stats, delay)
        except BaseException as e:
            self.failed = f"step {step} failed here: {type(e).__name__}: {e}"
            raise
        finally:
            self.used, self._running = time.monotonic(), False
            with self.turn:
                self.turn.notify_all()

    def _wait_turn(self, step: int) -> None:
        """Steps run in order: a later step that started early waits for this one (bounded)."""
        with self.turn:
            if not (self.failed or self.step >= step - 1):
                self._before_waiting()
            ready = self.turn.wait_for(lambda: self.failed or self.step >= step - 1, timeout=self.group.timeout)
        if self.failed:
            raise CollectiveError(f"replica {self.comm.rank} of {self.group.token!r} is broken: {self.failed}")
        if not ready or self.step != step - 1:
            raise ClusterError(f"step {step} came to replica {self.comm.rank} at step {self.step}")

    def _run(self, step, rows, offset, weight, scale, fetch_weight, sync, stats=False, delay=0.0, rejoin=0) -> dict:
        """``rejoin``: the attempt of a step this backup replica was out of, for which its gradient is
        wanted after all (a used replica left and too few others have one)."""
        start_wall = time.time()  # wall clock: the driver lines the replicas' steps up by it
        for handle in self._settling:  # the buckets are ours to write again once peers have read them
            handle.wait(self.group.timeout)
        if not rejoin and self.backup is not None and self.backup.decided(step):  # out of it before it began
            used = self._catch_up(step, rows, start_wall, fetch_weight, sync, delay)
            if used is not None:
                return used
            args = (step, rows, offset, weight, scale, fetch_weight, sync, stats)
            return self._run(*args, delay=0.0, rejoin=self.backup.rejoin)
        started, marks = time.perf_counter(), self._marks
        began = time.time()
        if injected_delay(self.comm.rank):  # tests: this rank made late
            time.sleep(injected_delay(self.comm.rank))
        program, n = self.program, len(self.program.gradients)
        self.forward_state.clear()
        self.forward_state.update(self.variables)
        if program.loss_scale:  # as the parameter-server path: the shard's loss scaled by its share
            self.forward_state[program.loss_scale] = self.variables[program.loss_scale] * program.gradient_weight(
                fetch_weight
            )
        self._step, self._weight, self._scale = step, weight, scale
        self._packed = [False] * n
        self._missing = [len(b.gradients) for b in self.buckets]
        self._handles: list = [None] * len(self.buckets)
        self._deferred = delay > 0 or self.backup is not None  # the gradient is handed in after the delay
        sent, received = self._bytes()
        feeds = [take_rows(self.data[k], rows) for k in self.feed_order]
        # random ops (dropout) draw per step, and per row of the global batch, however it is split
        checked = program.check_numerics
        stats = stats and self.forward_stats is not None
        plan = self.forward_stats if stats else self.forward
        values = plan.run(feeds, checked, step=step - 1, row_offset=offset)
        marks.backward_began(plan.backward_began)
        for i in range(n):  # gradients no plan step made (constants) go in now
            self._produced(i, values[i])
        # copies before the update changes variables; a mean weighted by the shard's share, the rest as they are
        m = n + len(program.fetches)
        reductions = program.fetch_reductions or (Reduction("mean"),) * (m - n)
        fetches = [weighted(r, np.array(v, copy=True), fetch_weight) for v, r in zip(values[n:m], reductions)]
        reported = [float(np.asarray(v)) for v in values[m:]] if stats else None
        computed, computed_at = time.perf_counter(), time.time()
        ready_wall = self._hand_in(delay)
        handed = time.perf_counter()  # the reduction's wait starts here, after the straggler's delay
        used = None
        if self.backup is not None:  # the first R gradients' mean, the same for every rank (this one's or not)
            self._before_waiting()
            used = self.backup.exchange(step, self.flats, start_wall, ready_wall, len(rows), attempt=rejoin)
            self._settling = []
        else:
            if not all(handle.done() for handle in self._handles):
                self._before_waiting()
            for handle in self._handles:  # the sums are in the buckets (read-only until the next step settles them)
                handle.summed(self.group.timeout)
            self._settling = self._handles
        reduced, reduced_at = time.perf_counter(), time.time()
        marks.arrived("gradients", ready_wall)  # handed in (after a straggler's delay)
        if reported is not None:  # the global batch's gradient norms (see workbench.cluster.collective.stat_combine)
            reported = [float(np.linalg.norm(self.views[i])) if i >= 0 else v for v, i in zip(reported, self.norm_of)]
        self.update.run([self.views[i] for i in self.update_order], checked)
        self.step = step
        marks.phase("compute", began, computed_at)
        marks.phase("collective", computed_at, reduced_at, "gradients")
        marks.phase("update", reduced_at, time.time())
        result = {
            "step": step,
            "rank": self.comm.rank,
            "worker": self.group.addresses[self.comm.rank],
            "fetches": fetches,
            "compute_seconds": computed - started,
            "allreduce_wait_seconds": reduced - handed,
            "update_seconds": time.perf_counter() - reduced,
            "bytes_sent": self._bytes()[0] - sent,
            "bytes_received": self._bytes()[1] - received,
            "marks": marks.as_dict(),
            "delay": float(delay),
            "share": fetch_weight,
            "start_wall": start_wall,
            "ready_wall": ready_wall,
        }
        if used is not None:
            result["used"], result["decided_wall"] = used, self.backup.decided_wall
        if sync and self.comm.rank == 0:
            result["variables"] = {name: value.copy() for name, value in self.variables.items()}
        if reported is not None:
            result["stats"], result["stats_share"] = reported, float(fetch_weight)
        return result

    def _hand_in(self, delay: float) -> float:
        """A straggler's wait (after computing, before its gradient goes anywhere; with backups cut
        short when the step goes on without it); the all-reduces held back meanwhile start now. The
        wall-clock time the gradient was ready."""
        if delay > 0:
            self._before_waiting()
            if self.backup is not None:
                self.backup.wait_decided(self._step, delay)
            else:
                time.sleep(delay)
        ready = time.time()
        if self.backup is None:
            for b, handle in enumerate(self._handles):
                if handle is None:
                    self._handles[b] = self.comm.start(f"{self._step}.{b}", self.flats[b], self._scale)
        return ready

    def _catch_up(self, step, rows, start_wall, fetch_weight, sync, delay) -> dict | None:
        """A backup replica whose step was decided without it: no gradient, the same update as the others
        (None where its gradient is wanted after all: the caller computes it)."""
        self._before_waiting()
        began, (sent, received) = time.perf_counter(), self._bytes()
        used = self.backup.exchange(step, self.flats, start_wall, time.time(), len(rows), out=True)
        if used is None:
            return None
        reduced = time.perf_counter()
        self.update.run([self.views[i] for i in self.update_order], self.program.check_numerics)
        self.step, self._settling = step, []
        result = {
            "step": step,
            "rank": self.comm.rank,
            "worker": self.group.addresses[self.comm.rank],
            "fetches": None,
            "compute_seconds": 0.0,
            "allreduce_wait_seconds": reduced - began,
            "update_seconds": time.perf_counter() - reduced,
            "bytes_sent": self._bytes()[0] - sent,
            "bytes_received": self._bytes()[1] - received,
            "delay": float(delay),
            "share": fetch_weight,
            "start_wall": start_wall,
            "ready_wall": time.time(),
            "used": used,
            "decided_wall": self.backup.decided_wall,
        }
        if sync and self.comm.rank == 0:
            result["variables"] = {name: value.copy() for name, value in self.variables.items()}
        return result

    def _bytes(self) -> tuple[int, int]:
        """Bytes this rank sent and received so far (with backups, the messages its backup side took too)."""
        received = self.comm.bytes_received + (self.backup.bytes_received if self.backup is not None else 0)
        return self.comm.bytes_sent, received

    def _before_waiting(self) -> None:
        """Waiting for peers while another run shares this worker: leave the thread pool (see
        :func:`leave_thread_pool`). Alone, the run keeps its thread: nothing else waits for peers."""
        if len(_REPLICAS) > 1 and self.comm.size > 1:
            leave_thread_pool()

    def turn_busy(self) -> bool:
        """Whether a step runs now (its lease does not end while it does)."""
        return self._running

    def close(self) -> None:
        """End this replica: a step not yet begun fails at once; the plans go back to :data:`WARM` unless a
        step is running or failed (its arrays are then left to it)."""
        reusable = retire(self)
        if reusable is None:
            return
        if self.backup is not None:
            self.backup.close()
        self.comm.close()
        if reusable:
            WARM.give_back(self.plans)


# -- the task functions (what the step graph calls) ----------------------------------------------

_seceded = threading.local()


def leave_thread_pool() -> None:
    """Give this task's slot in the worker's thread pool to the next task while it waits for peers.

    A step task that held its worker's only thread while waiting could deadlock with another run
    on the same workers (each holding one worker, waiting for the other). The task goes on in
    its own thread and ends there (``distributed.secede``); a no-op outside a worker, or if done.
    """
    if getattr(_seceded, "task", None) is not None and _seceded.task == _current_key():
        return
    try:
        from distributed import secede

        secede()
    except ValueError:  # not in a worker's task
        return
    _seceded.task = _current_key()


def _current_key():
    from distributed.worker import thread_state

    return getattr(thread_state, "key", None)


_REPLICAS: dict[str, Replica] = {}
_LOCK = threading.Lock()


def start_replica(
    program: TrainingProgram,
    variables: dict,
    step: int,
    group: CollectiveGroup,
    bucket_bytes: int,
    *data,
    lease: float = 0.0,
    needed: int | None = None,
) -> str:
    """Make this worker's replica of ``group``'s run (dropping older generations of the same run).

    ``data``: one source per feed of the program (see :func:`take_rows`). The worker drops the replica
    when the scheduler releases this task (its client left, or dropped the run) and, with ``lease``,
    when no step came for that many seconds (see :func:`expired`).
    """
    return hold(Replica(program, variables, step, group, bucket_bytes, data, needed), group, lease)


def hold(replica, group: CollectiveGroup, lease: float) -> str:
    """Keep ``replica`` (a :class:`Replica` or a strategy replica) as this worker's replica of ``group``'s
    run, under this start task's key and ``lease``, closing older generations of the same run; its address."""
    run = group.token.rsplit(".", 1)[0]
    replica.start_key, replica.lease = _current_key(), float(lease or 0.0)
    _watch_leases()
    with _LOCK:  # one table for both kinds: stop_replicas, the leases and the thread-pool rule cover them all
        for token in [t for t in _REPLICAS if t.rsplit(".", 1)[0] == run]:
            _REPLICAS.pop(token).close()
        _REPLICAS[group.token] = replica
    return group.addresses[replica.comm.rank]


def retire(replica) -> bool | None:
    """Mark ``replica`` closed under its turn lock (a step that has not begun fails at once): whether its
    plans may serve another replica (no step running, none failed); None if it was closed already."""
    with replica.turn:
        if replica.closed:
            return None
        replica.closed = True
        reusable = not replica._running and replica.failed is None
        replica.failed = replica.failed or "its run ended (the replica was closed)"
        replica.turn.notify_all()
    return reusable


def run_step(
    token: str,
    step: int,
    rows: np.ndarray,
    offset: int,
    weight: float,
    scale,
    fetch_weight: float,
    sync: bool,
    _started,
    stats: bool = False,
    delay: float = 0.0,
) -> dict:
    """One replica's step ``step`` (``_started``: the replica's start task, a dependency for the order;
    ``stats``: also report the model's statistics, see :meth:`Replica.run`)."""
    replica = _REPLICAS.get(token)
    if replica is None:
        raise CollectiveError(f"no replica of run {token!r} on this worker (restarted?)")
    return replica.run(step, rows, offset, weight, scale, fetch_weight, sync, stats, delay)


def run_segment(task, topic: str, rank: int, steps: list, _started=None):
    """Rank ``rank``'s steps of one segment, in order, in one task: ``task`` (:func:`run_step` or a strategy
    replica's) called with each step's ``(arguments, keywords)``. Each step's result but the last is
    published on the scheduler's event topic ``topic`` as soon as it is made (``[rank, step, pickled
    result]``: the driver's :class:`~workbench.cluster.collective.segments.StepSlot` picks it up); the
    last one is the task's result, so a sync step's variables come home as a task result, never
    through the scheduler. A failed step fails the task: the steps after it are not run."""
    publish = _publisher(topic)
    for args, keywords in steps[:-1]:
        result = task(*args, **keywords)
        publish(rank, result)
    args, keywords = steps[-1]
    return task(*args, **keywords)


def _publisher(topic: str):
    """``publish(rank, result)``: a step's result on ``topic`` through this worker's stream to the scheduler."""
    from distributed import get_worker

    worker = get_worker()

    def publish(rank: int, result: dict) -> None:
        worker.log_event(topic, [rank, int(result["step"]), pickle.dumps(result, protocol=5)])

    return publish


def stop_replicas(token: str) -> None:
    """Forget the replicas of ``token``'s run, every generation (run with ``client.run``)."""
    run = token.rsplit(".", 1)[0]
    with _LOCK:
        for t in [t for t in _REPLICAS if t.rsplit(".", 1)[0] == run]:
            _REPLICAS.pop(t).close()


def held_runs() -> list[str]:
    """The tokens of the replicas this worker process holds (run with ``client.run``)."""
    with _LOCK:
        return sorted(_REPLICAS)


def expired(replicas: dict, wanted, now: float) -> list[str]:
    """The tokens of ``replicas`` whose lease ended: their start task is no longer among the ``wanted``
    keys (the scheduler released it), or no step came within their ``lease`` seconds."""
    out = []
    for token, replica in replicas.items():
        released = replica.start_key is not None and replica.start_key not in wanted
        idle = replica.lease > 0 and now - replica.used > replica.lease and not replica.turn_busy()
        if released or idle:
            out.append(token)
    return out


LEASES = "workbench-replica-leases"


def _watch_leases(period_ms: int = 1000) -> None:
    """Once per worker: every ``period_ms``, drop the replicas whose lease ended (a no-op outside a worker)."""
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):
        return
    if LEASES in worker.periodic_callbacks:
        return
    from tornado.ioloop import PeriodicCallback

    def sweep():
        with _LOCK:
            for token in expired(_REPLICAS, worker.state.tasks, time.monotonic()):
                _REPLICAS.pop(token).close()

    callback = worker.periodic_callbacks[LEASES] = PeriodicCallback(sweep, period_ms)
    worker.loop.add_callback(callback.start)


def held_variables(token: str) -> dict:
    """A copy of the variables this worker's replica of ``token`` holds (to compare replicas)."""
    replica = _REPLICAS.get(token)
    if replica is None:
        raise ClusterError(f"no replica of run {token!r} on this worker")
    return {name: value.copy() for name, value in replica.variables.items()}


def peers_gone(token: str, ranks: list[int]) -> None:
    """Tell this worker's replica of ``token`` that ``ranks`` left the cluster (run with ``client.run``):
    with backups, a step that used one of them is decided again (see :meth:`BackupRank.peer_gone`)."""
    replica = _REPLICAS.get(token)
    if replica is not None and replica.backup is not None:
        replica.backup.peer_gone(ranks)
