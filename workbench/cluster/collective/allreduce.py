"""The all-reduce strategy's driver: data-parallel training with worker-resident replicas.

Each worker of the run keeps its own replica of the variables
(:mod:`workbench.cluster.collective.replica`); a step is ``R`` tasks, one pinned to each
worker, keyed like the model (``("mlp-allreduce", "12-r0", token)``). Each computes
its shard's gradients, all-reduces them worker to worker
(:mod:`workbench.cluster.collective.group`) and applies the optimizer to its own replica.
No gradient or variable passes through a task result: the client gets small
metrics, and at the steps it asks to sync, rank 0's copy of the variables.

Steps are submitted ``window`` ahead without dependencies between them; explicit
priorities (``-step``) make each worker run them in order (a worker that ran a later
step first would wait for peers that wait for it). A dead or hung worker makes its
peers fail within the group's timeout; the driver then starts again from the last host
copy of the variables, on the workers still alive, with a new communicator (the
next generation of the run's token), and redoes the lost steps without reporting
them twice.

The interface is the step-engine one (``start``, ``run``, ``variables``, ``close``)::

    engine = AllReduceEngine(client, program, {"x": x, "y": y}, batch_size=64, batch_seed=(0, 1))
    engine.start(variables, step=0)
    for outcome in engine.run(1, 100, sync_at=lambda s: s % 20 == 0):
        print(outcome.step, outcome.fetches["loss"], outcome.metrics["compute_seconds"])
    variables, step = engine.variables()
    engine.close()
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
import uuid
from collections import deque

import numpy as np

from workbench.cluster.chunked import ChunkedArray, feed_value
from workbench.cluster.collective.group import CollectiveGroup
from workbench.cluster.collective.segments import Segments, StepSlot
from workbench.cluster.coordinated import Coordinated
from workbench.cluster.failures import check_client, drop
from workbench.cluster.failures import restartable as _restartable
from workbench.cluster.health import StepDeadline, scheduler_workers
from workbench.cluster.lower import allreduce_calls, allreduce_key, key_label
from workbench.cluster.membership import Membership
from workbench.cluster.program import TrainingProgram
from workbench.cluster.collective.replica import run_step, start_replica, stop_replicas
from workbench.cluster.resident import digests_soon
from workbench.cluster.spans import Lanes, scheduler_now
from workbench.cluster.collective.stat_combine import combine_stats, stat_rules
from workbench.cluster.uninterrupted import results_whole, scatter_whole
from workbench.devices import device_type
from workbench.errors import ClusterError, CollectiveError, FeedError, WorkbenchError
from workbench.fitloop import StepOutcome
from workbench.stragglers import coerce as check_stragglers
from workbench.stragglers import step_delays
from workbench.graph.batch_reduction import Reduction, combine
from workbench.training import batch_indices, check_data


def arrival_metrics(results: list) -> dict:
    """A step's ``"delays"`` and ``"arrivals"`` per replica (rank order): seconds from the step's start
    (the earliest replica's, on the workers' wall clocks) until each gradient was ready, delay included."""
    begun = min(r["start_wall"] for r in results)
    return {"delays": [r["delay"] for r in results], "arrivals": [r["ready_wall"] - begun for r in results]}


def _outcome_fetches(program, labels: list, results: list, rescale: float = 1.0) -> dict:
    """The step's fetches from the replicas' results: each replica weighted its means (``rescale``
    multiplies those, for the rows used); the rest combine as they are."""
    fetches = {}
    reductions = program.fetch_reductions or (Reduction("mean"),) * len(labels)
    for k, label in enumerate(labels):
        value = np.asarray(combine(reductions[k], [r["fetches"][k] for r in results]))
        if rescale != 1.0 and reductions[k].kind == "mean":
            value = value * rescale
        fetches[label] = value.item() if value.ndim == 0 else value
    return fetches


def fit_keywords(request, options, events) -> dict:
    """What every engine of the all-reduce family takes from one fit (a :class:`~workbench.fitloop.FitRequest`)
    and its :class:`~workbench.cluster.options.ClusterOptions`, besides its program, data and replicas."""
    return {
        "workers": options.workers,
        "window": options.window,
        "timeout": min(60.0, options.step_timeout or 60.0),
        "step_timeout": options.step_timeout,
        "name": request.graph.name,
        "labels": list(request.fetches),
        "sync_every": options.sync_every,
        "events": events,
        "reason": options.reason,
        "stats_labels": list(request.stats),
        "stats_every": request.stats_every,
        "resident": options.resident,
        "segment_steps": options.segment_steps,
    }


class AllReduceEngine(Coordinated):
    """Synchronous data-parallel training where replicas all-reduce their gradients worker to worker.

    Its ``run`` is :class:`~workbench.cluster.coordinated.Coordinated`'s: the coordinator says what
    to submit, record, bring home, leave out and redo; this class says how (``_submit``, ``_gather``,
    ``_launch``, ``_drop``, ``_outcome``).

    Parameters
    ----------
    client : distributed.Client
    program : TrainingProgram
        The training step (see :meth:`TrainingProgram.from_graph`); CPU programs.
    data : dict
        Placeholder name to NumPy array or dask array, one per feed of the program (a dask array is read
        on the workers from its chunks: :mod:`workbench.cluster.chunked`).
    batch_size : int
        The global batch, split across the replicas in contiguous shards.
    batch_seed :
        Seeds the batch order (:func:`workbench.training.batch_indices`).
    workers : list of str, optional
        Workers to use (default: every worker), one replica each.
    replicas : int, optional
        At most this many replicas (default: one per worker).
    window : int
        Steps in flight.
    timeout : float
        Seconds a replica waits for a peer before the step fails (and the run restarts).
    step_timeout : float, optional
        Seconds without progress before the steps in flight count as lost (default: from the
        measured step time, see :class:`workbench.cluster.health.StepDeadline`); members the
        scheduler stopped hearing from are then left out of the fit.
    bucket_bytes : int
        Gradient bytes per all-reduce bucket.
    algorithm : {"auto", "direct", "ring", "gather"}
    max_restarts : int
    name : str
        The first part of task keys (the graph's name).
    labels : sequence of str, optional
        What each of the program's fetches is called in the outcomes (default: its tensor name).
    sync_every : int, optional
        Steps between host copies of the variables besides those ``run`` is asked for
        (what a lost worker costs at most; default: only those).
    events : EventStream, optional
        Where :class:`~workbench.events.Synced` and :class:`~workbench.events.Restarted` go.
    reason : str
        Why ``fit`` chose this strategy, if it chose it for a reason (shown in ``FitStarted``).
    lease : float, optional
        Seconds a worker keeps its replica without a step (default: the larger of 300 and 4 x
        ``timeout``); it drops it at once when the scheduler releases the run's start task (this
        client left the scheduler, or dropped the run). 0: only the latter.
    resident : ResidentData, optional
        Where the session keeps its data on the workers between fits
        (:mod:`workbench.cluster.resident`); without it, the data are sent at every launch.
    segment_steps : int
        Steps each member runs in one task (:mod:`workbench.cluster.collective.segments`: their results
        stream back step by step; a segment ends at a sync step); the window then holds at least two
        segments. 1: one task per member and step.
    """

    strategy = "allreduce"

    def __init__(
        self,
        client,
        program: TrainingProgram,
        data: dict,
        batch_size: int,
        batch_seed,
        *,
        workers=None,
        replicas: int | None = None,
        window: int = 4,
        timeout: float = 60.0,
        step_timeout: float | None = None,
        bucket_bytes: int = 4 << 20,
        algorithm: str = "auto",
        max_restarts: int = 5,
        name: str = "train",
        labels=None,
        sync_every: int | None = None,
        events=None,
        reason: str = "",
        lease: float | None = None,
        stats_labels=(),
        stats_every: int = 0,
        stragglers=None,
        resident=None,
        segment_steps: int = 16,
    ):
        missing = set(program.feeds) - set(data)
        if missing:
            raise FeedError(f"data lacks the placeholders {sorted(missing)} that the gradients need")
        if window < 1:
            raise ClusterError(f"window must be at least 1, got {window}")
        if isinstance(segment_steps, bool) or not isinstance(segment_steps, int) or segment_steps < 1:
            raise ClusterError(f"segment_steps must be at least 1 (a whole number), got {segment_steps!r}")
        if not device_type(program.device).host_arrays:  # its buckets and communicator take NumPy arrays
            raise ClusterError(
                f"the all-reduce strategy runs on CPU workers for now, not {program.device!r}; "
                "use strategy='parameter_server'"
            )
        self.client, self.program, self.batch_size, self.batch_seed = client, program, batch_size, batch_seed
        self.data = {n: feed_value(n, data[n]) for n in program.feeds}  # a dask array stays on the cluster
        self.num_examples = check_data(self.data)
        self.addresses, self.max_replicas, self.window = workers, replicas, window
        self.labels = list(program.fetches if labels is None else labels)
        self.sync_every, self.events = sync_every, events
        self.replicas: int | None = None  # the members of the current generation, once started
        self.workers: int | None = None
        self.reason = reason  # why fit chose this strategy (see workbench.cluster.engines)
        # fit(stats=k): every k-th step, the replicas also compute the program's statistic ops; joined here
        self.stats_labels, self.stats_every = list(stats_labels), int(stats_every) if program.stats else 0
        self._stat_rules = None
        self.scheduler = client.scheduler.address  # where the dashboard's monitor hears of this fit
        self.timeout, self.bucket_bytes = timeout, bucket_bytes
        self.lease = max(300.0, 4 * timeout) if lease is None else float(lease)
        self.deadline = StepDeadline(step_timeout)  # no progress for this long: a hung worker is left out
        self.membership = Membership(client, workers, self.deadline)
        self.left_out = self.membership.left_out  # workers that stopped answering during this fit
        self.algorithm, self.max_restarts, self.name = algorithm, max_restarts, name
        self.poll = 0.5  # seconds between checks that the members are still there, while a step runs
        self.run_id = f"{name}-{uuid.uuid4().hex[:8]}"
        self.generation = -1
        self.restarts = 0
        self.host: tuple[dict, int] | None = None
        self.group: CollectiveGroup | None = None
        self.flight: deque = deque()  # (step, futures), in step order
        self.started: list = []  # each member's start task
        self._transient = _restartable()
        self.stragglers = stragglers  # fit(stragglers=...): each rank's delay, drawn by (step, rank)
        self.backups = 0  # fit(backup_replicas=b): see workbench.cluster.collective.backup_engine
        self.resident = resident  # the session's data on the workers, reused while unchanged (None: sent each launch)
        self.segment_steps = segment_steps
        self.segments: Segments | None = None  # this generation's (workbench.cluster.collective.segments)
        self._last = None  # the last step of the run in progress

    @classmethod
    def for_fit(cls, request, client, options, events) -> AllReduceEngine:
        """The engine of one ``Session.fit`` (a :class:`~workbench.fitloop.FitRequest` and its
        :class:`~workbench.cluster.options.ClusterOptions`): the ``allreduce`` strategy's factory."""
        program = TrainingProgram.for_fit(request)
        stragglers = None
        if request.stragglers is not None:  # the replicas they name checked (asks the scheduler for the workers)
            total = options.replicas_for(client) + (options.backup_replicas if options.replicas else 0)
            stragglers = check_stragglers(request.stragglers, total)
        engine = cls(
            client,
            program,
            request.data,
            request.batch_size,
            request.batch_seed,
            replicas=options.replicas,
            stragglers=stragglers,
            **fit_keywords(request, options, events),
        )
        engine.backups = options.backup_replicas
        return engine

    # -- the step-engine interface ----------------------------------------------------------------
    def start(self, variables: dict, step: int) -> None:
        """Place a replica of ``variables`` (the values after ``step``) on each worker."""
        self.host = ({n: np.array(v, copy=True) for n, v in variables.items()}, int(step))
        self.lanes = Lanes(scheduler_now(self.client))  # each step's spans, on the scheduler's clock
        self._launch(self._choose_members())

    def variables(self) -> tuple[dict, int]:
        """The latest host copy of the variables, and the step it is from."""
        if self.host is None:
            raise ClusterError("start(variables, step) comes before variables()")
        return self.host

    def close(self) -> None:
        """Drop the steps in flight and the replicas on the workers."""
        self._drop()

    # -- placing replicas (the members: see workbench.cluster.membership) -----------------------
    def _launch(self, members: list[str]) -> None:
        client = self.client
        step = self.host[1]
        self.generation += 1
        self.group = CollectiveGroup.create(
            client, members, run=self.run_id, generation=self.generation, timeout=self.timeout, algorithm=self.algorithm
        )
        # the program and variables scattered again for each generation (Dask keeps one replica of
        # broadcast data once no task waits for it, and the worker holding it may be the one that died);
        # the data through the session's copies, checked against the scheduler (_place_data)
        digests = self._digests()  # hashed while the variables go out
        program, states = self._place_states(members)
        data = self._place_data(members, digests)
        token = self.group.token
        self.replicas = self.workers = len(members)
        if self.segment_steps > 1:  # its steps' results come on the generation's topic, subscribed before any runs
            self.segments = Segments(client, self.name, token, members, self.segment_steps)
        self.started = []
        for i, w in enumerate(members):
            task, args, keywords = self._start_task(program, states[i], step, len(members))
            self.started.append(
                client.submit(
                    task,
                    *args,
                    *data[i],
                    **keywords,
                    lease=self.lease,
                    key=allreduce_key(self.name, "start", i, token),
                    workers=[w],
                    allow_other_workers=False,
                    priority=1 << 30,
                    pure=False,
                )
            )

    def _place_states(self, members: list[str]) -> tuple:
        """The program on the new group's members, and each member's state to start from: here one copy
        of the host's variables on every member."""
        program, state = self._scatter([self.program, self.host[0]])
        return program, [state] * len(members)

    def _start_task(self, program, state, step: int, members: int) -> tuple:
        """What a member runs to hold its replica: the task function, its arguments (before the member's
        data sources) and keywords. The hook, with :meth:`_place_states` and :meth:`_step_task`, of an
        engine whose members hold another kind of replica (:mod:`workbench.cluster.collective.strategy_engine`)."""
        return start_replica, (program, state, step, self.group, self.bucket_bytes), {"needed": self._needed(members)}

    def _digests(self):
        """The NumPy feeds' content digests on their way (:func:`~workbench.cluster.resident.digests_soon`), or
        None without a :class:`~workbench.cluster.resident.ResidentData`."""
        if self.resident is None:
            return None
        return digests_soon([self.data[n] for n in self.program.feeds if not isinstance(self.data[n], ChunkedArray)])

    def _place_data(self, members: list[str], digests=None) -> list[list]:
        """Each member's sources of the feeds (program feed order). A NumPy feed: the session's copies on the
        workers (:class:`~workbench.cluster.resident.ResidentData`: sent only where a member lacks them, or
        they changed), or without one, broadcast for this generation. A dask array: the keys and boundaries
        of its chunks on the cluster, read by rows where each member runs (:mod:`workbench.cluster.chunked`)."""
        feeds = self.program.feeds
        chunked = [n for n in feeds if isinstance(self.data[n], ChunkedArray)]
        arrays = [self.data[n] for n in feeds if n not in chunked]
        timeout = self.deadline.seconds
        if not arrays:
            placed = [[] for _ in members]
        elif self.resident is None:
            placed = [self._scatter(arrays)] * len(members)
        else:
            placed = self.resident.place(self.client, arrays, members, self._scatter, timeout=timeout, digests=digests)
        sources = {n: self.data[n].source(self.client, members, self.timeout, len(chunked)) for n in chunked}
        merged = []
        for own in placed:  # each member's NumPy sources, in feed order, with the chunked ones between them
            host = iter(own)
            merged.append([sources[n] if n in sources else next(host) for n in feeds])
        return merged

    def _scatter(self, values: list, workers: list[str] | None = None) -> list:
        """``values`` on ``workers`` (default: every member of the new group, each a copy), bounded by the
        step deadline and whole though interrupted; a member that left meanwhile is a lost generation."""
        members = self.group.addresses if workers is None else workers
        try:
            return scatter_whole(
                self.client, values, broadcast=True, hash=False, workers=list(members), timeout=self.deadline.seconds
            )
        except KeyError as e:  # the scheduler no longer knows a member: it died since they were chosen
            raise CollectiveError(f"worker {e.args[0] if e.args else '?'} left the cluster as the run started") from e

    def _needed(self, members: int) -> int | None:
        """How many gradients a backup group applies (None: an all-reduce of every member's)."""
        return None

    def _calls(self, step: int, sync: bool) -> list:
        """The ``(key, arguments of run_step)`` of each rank's task of ``step``."""
        index = next(batch_indices(self.num_examples, self.batch_size, step, self.batch_seed, start=step - 1))
        group, reduction = self.group, self.program.loss_reduction
        return allreduce_calls(self.name, group.token, step, index, group.size, self.started, sync, reduction)

    def in_flight(self) -> int:
        """Steps the coordinator keeps in flight: the window, and with segments at least two segments (the
        next one is on its way while one runs)."""
        return max(self.window, 2 * self.segment_steps) if self.segment_steps > 1 else self.window

    def _submit(self, step: int, sync: bool) -> None:
        group, futures = self.group, []
        calls = self._calls(step, sync)
        delays = step_delays(self.stragglers, step, group.size)
        due = bool(self.stats_every) and step % self.stats_every == 0
        if self.segments is not None:  # with the step's segment (workbench.cluster.collective.segments)
            tasks = []
            for rank, (_, args) in enumerate(calls):
                task, args, keywords = self._step_task(rank, args, sync, due)
                tasks.append((task, args, {**keywords, "delay": delays[rank]}))
            self.flight.append((step, self.segments.add(step, sync, tasks, last=step == self._last)))
            return
        for rank, ((key, args), worker) in enumerate(zip(calls, group.addresses, strict=True)):
            task, args, keywords = self._step_task(rank, args, sync, due)
            futures.append(
                self.client.submit(
                    task,
                    *args,
                    **keywords,
                    delay=delays[rank],
                    key=key,
                    workers=[worker],
                    allow_other_workers=False,
                    priority=-step,
                    pure=False,
                )
            )
        self.flight.append((step, futures))

    def _step_task(self, rank: int, args: tuple, sync: bool, stats_due: bool) -> tuple:
        """What rank ``rank`` runs for a step: the task function, its arguments (those of
        :func:`~workbench.cluster.lower.allreduce_calls`) and keywords. The hook an engine whose
        members hold another kind of replica overrides (:mod:`workbench.cluster.collective.strategy_engine`)."""
        return run_step, args, {"stats": stats_due}  # every replica on its shard; _outcome joins them

    # -- results and failures ---------------------------------------------------------------------
    def _gather(self, step: int, futures: list) -> list[dict]:
        """The step's results; a failure raised as soon as a task fails or a member leaves the cluster."""
        changed = threading.Event()
        for f in futures:
            f.add_done_callback(lambda _: changed.set())
        waited = time.monotonic()
        deadline = waited + self.deadline.seconds
        while True:
            changed.clear()
            for f in futures:
                if f.status == "error":
                    error = f.exception()
                    if isinstance(error, (self._transient, WorkbenchError)):
                        raise error  # a NumericsError names the op, as locally
                    what = f"{type(error).__name__}: {error}"
                    raise ClusterError(f"step {step} failed in {key_label(f.key)}: {what}") from error
                if f.status == "cancelled":
                    raise concurrent.futures.CancelledError(f"step {step}: task {key_label(f.key)} was cancelled")
            if all(f.status == "finished" for f in futures):  # results come from the workers: bounded too
                results = results_whole(futures, timeout=max(1.0, deadline - time.monotonic()))
                self.deadline.progressed(time.monotonic() - waited)
                return results
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step} made no progress for {self.deadline.seconds:g} s")
            if not changed.wait(self.poll):
                self._check_members(step)

    def _choose_members(self) -> list[str]:
        """The members of a new attempt (the hook the backup engine overrides: R + b of them)."""
        return self.membership.choose(self.max_replicas)

    def _check_members(self, step: int) -> None:
        """A member that left the cluster fails the step now, not when its peers' waits time out (a lost
        scheduler or a closed client too)."""
        check_client(self.client)
        gone = self.membership.departed(self.group.addresses)
        if gone:
            raise CollectiveError(f"step {step}: worker {', '.join(sorted(gone))} left the cluster")

    def tasks_of(self, futures: list) -> list:
        """The task futures that carry a step's results in flight (``self.flight[k][1]``): with segments,
        the segments' tasks, submitted now if the step still waited for its segment to fill."""
        if any(isinstance(f, StepSlot) and f.segment is None for f in futures):
            self.segments.flush()
        return [f.segment if isinstance(f, StepSlot) else f for f in futures]

    def _before_waiting_for(self, step: int) -> None:
        """The coordinated loop waits for ``step`` next: if it still waits for its segment to fill, the
        steps not submitted yet go now."""
        if self.segments is not None and any(s.segment is None for s in self.flight[0][1]):
            self.segments.flush()

    def _gathered(self, step: int) -> None:
        """``step`` left the window: the segments that ended by it are let go."""
        if self.segments is not None:
            self.segments.gathered(step)

    def _bring_home(self, step: int, results: list[dict]) -> None:
        super()._bring_home(step, results)
        if self.segments is not None:  # what the members published up to here was read
            self.segments.truncate()

    def _cancel(self) -> None:
        futures = [f for _, fs in self.flight for f in fs if not isinstance(f, StepSlot)] + list(self.started)
        if self.segments is not None:
            futures += self.segments.cancel()
        self.flight.clear()
        self.started = []
        drop(self.client, futures)

    def _drop(self) -> None:
        self._cancel()
        if self.segments is not None:
            self.segments.close()
            self.segments = None
        if self.group is not None and getattr(self.client, "status", "running") != "running":
            self.group = None  # no scheduler to ask, or a closed client: the replicas' leases end them
        if self.group is not None:
            known = set(scheduler_workers(self.client, min(self.deadline.seconds, 10.0)))
            members = [a for a in self.group.addresses if a in known and a not in self.left_out]
            if members:  # bounded: a member that stopped answering must not hold the driver
                with contextlib.suppress(TimeoutError, OSError):
                    self.client.run(
                        stop_replicas, self.group.token, workers=members, on_error="return", callback_timeout=5
                    )
            self.group.release(self.client, skip=self.left_out, timeout=min(self.deadline.seconds, 10.0))
            self.group = None

    def _outcome(self, step: int, results: list[dict]) -> StepOutcome:
        fetches = _outcome_fetches(self.program, self.labels, results)
        compute = {r["worker"]: r["compute_seconds"] for r in results}
        metrics = {
            "replicas": len(results),
            "compute_seconds": max(compute.values()),
            "reduce_seconds": max(r["allreduce_wait_seconds"] for r in results),  # waited for, after compute
            "update_seconds": max(r["update_seconds"] for r in results),
            "workers": compute,
            "bytes_moved": sum(r["bytes_received"] for r in results),
            "bytes_received": max(r["bytes_received"] for r in results),
            "bytes_sent": max(r["bytes_sent"] for r in results),
            "dropped": [],
            "restarts": self.restarts,
            "tasks": len(results),
            **arrival_metrics(results),
        }
        metrics["spans"] = self.lanes.record(step, results)  # laid out when read
        stats = {}
        reported = sorted((r for r in results if "stats" in r), key=lambda r: r["rank"])
        if reported:  # the global batch's statistics (workbench.cluster.collective.stat_combine)
            if self._stat_rules is None:
                self._stat_rules = self._join_rules()
            joined = combine_stats(
                self._stat_rules, [r["stats"] for r in reported], [r["stats_share"] for r in reported]
            )
            stats = dict(zip(self.stats_labels, joined, strict=True))
        return StepOutcome(step, fetches, metrics, stats=stats)

    def _join_rules(self) -> list:
        """How each statistic joins across the replicas (:func:`~workbench.cluster.collective.stat_combine.stat_rules`)."""
        return stat_rules(self.program)
