"""The ``parameter_server`` step engine: data-parallel synchronous SGD as Dask task graphs,
the thin shell around the coordinator of :mod:`workbench.cluster.sync`.

Variables stay on the workers as futures from step to step; a bounded window
of steps is submitted ahead, so the client's round trip never stalls the
workers; every ``sync_every`` steps the variables come home, which bounds what
a lost worker costs and keeps the task lineage short.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import uuid
from collections import deque
from typing import Any
from collections.abc import Iterator

import numpy as np
from dask.task_spec import List, TaskRef

from workbench.cluster.failures import ClientStopped, check_client, restartable
from workbench.cluster.health import StepDeadline
from workbench.cluster.lower import combine_tasks, replica_tasks, task_key
from workbench.cluster.membership import Membership
from workbench.cluster.options import ClusterOptions
from workbench.cluster.program import TrainingProgram, host_state, initial_state
from workbench.cluster.spans import Lanes, scheduler_now, task_spans
from workbench.cluster.uninterrupted import results_whole, scatter_whole
from workbench.cluster.sync import Coordinator, Finish, Record, Restart, Submit, Sync
from workbench.errors import ClusterError, FeedError, WorkbenchError
from workbench.events import EventStream, Restarted, Synced
from workbench.fitloop import FitRequest, StepOutcome
from workbench.stragglers import coerce as coerce_stragglers, step_delays
from workbench.training import batch_indices, is_dask_array


class ParameterServer:
    """The ``parameter_server`` step engine: each step is ``R`` replica tasks, a fixed-order
    reduction tree and one update task (see :mod:`workbench.cluster.lower`), driven by the
    :class:`~workbench.cluster.sync.Coordinator`. Backup replicas drop the slowest shards.

    A :class:`~workbench.fitloop.StepEngine`: it takes the variables as host arrays in
    :meth:`start`, keeps them on the workers from step to step, and brings them home at
    sync points (every ``sync_every`` steps, where the loop asks, and at the last step).
    """

    strategy = "parameter_server"

    def __init__(self, request: FitRequest, client, options: ClusterOptions, events: EventStream):
        self.client, self.request, self.events = client, request, events
        self.scheduler = client.scheduler.address  # where the dashboard's monitor hears of this fit
        self.graph_name = request.graph.name
        self.batch_size, self.steps = request.batch_size, request.steps
        self.replicas = options.replicas_for(client)
        self.workers = options.worker_count(client)
        self.window, self.sync_every = options.window, options.sync_every
        self.deadline = StepDeadline(options.step_timeout)
        self.membership = Membership(client, options.workers, self.deadline)
        self.excluded = self.membership.left_out  # workers left out after they stopped answering: seconds silent
        self.worker_addresses, self.backups = options.workers, options.backup_replicas
        self.reason = options.reason  # why fit chose this strategy, if it did
        self.program = TrainingProgram.for_fit(request)
        missing = set(self.program.feeds) - set(request.data)
        if missing:
            raise FeedError(f"data lacks the placeholders {sorted(missing)} that the gradients need")
        self.data = {name: request.data[name] for name in self.program.feeds}
        self.num_examples = len(next(iter(self.data.values())))
        self.labels = list(request.fetches)
        self.stragglers = coerce_stragglers(request.stragglers, self.replicas + self.backups)
        self.decided: dict[int, tuple] = {}  # backups: step -> (replicas used, wall time the step went on)
        self.restarts = 0
        self._transient = restartable()
        # what the workers hold for this fit, once placed (an interrupt may end the fit before)
        self.program_ref = self.state_ref = None
        self.sources: dict = {}
        self.updates: dict[int, Any] = {}
        self.metrics: deque = deque()

    # -- the StepEngine seam ------------------------------------------------------------------
    def start(self, variables: dict, step: int) -> None:
        if self.request.device.device_arrays:
            from workbench.cluster.transfers import DeviceTransfers

            self.client.register_plugin(DeviceTransfers())  # every worker can send CuPy arrays
        state = {n: np.asarray(variables[n]) for n in self.program.state_variables}
        self.host = ({**variables, **state}, step)
        self.lanes = Lanes(scheduler_now(self.client))  # each step's spans, on the scheduler's clock
        self._scatter(state, step)

    def variables(self) -> tuple[dict, int]:
        return self.host

    def settle(self, step: int) -> tuple[dict, int]:
        if self.host[1] != step and step in self.updates:
            try:
                self.host = ({**self.host[0], **self._fetch(self.updates[step], step)}, step)
            except (*self._transient, ClusterError):
                pass  # lost with its worker: the last host copy stays
        return self.host

    def close(self) -> None:
        # the scheduler forgets (and cancels) what nobody wants any more. Released explicitly: a failed
        # step's error, kept by its future's state on the client, holds the frames that waited for it,
        # and those frames the future, so dropping the references alone would keep its erred tasks
        held = [f for _, f in self.metrics] + list(self.updates.values()) + [self.state_ref, self.program_ref]
        held += [f for source in self.sources.values() for f in source.held()]
        for future in held:
            if future is not None:
                future.release()
        self.metrics, self.updates = deque(), {}
        self.state_ref = self.program_ref = None
        self.sources = {}

    def run(self, first: int, last: int, sync_at) -> Iterator[StepOutcome]:
        coordinator = Coordinator(first - 1, last, window=self.window, sync_every=self.sync_every, sync_at=sync_at)
        todo, outcomes = deque(coordinator.start()), deque()
        while True:
            finished = self._carry_out(todo, coordinator, outcomes)
            # a step the loop checkpoints is reported once its variables are home
            while outcomes and (not sync_at(outcomes[0].step) or self.host[1] >= outcomes[0].step):
                yield outcomes.popleft()
            if finished:
                break
            todo.extend(self._wait(coordinator))
        self.restarts = coordinator.restarts

    # -- the shell around the coordinator -------------------------------------------------------
    def _carry_out(self, todo: deque, coordinator: Coordinator, outcomes: deque) -> bool:
        """Carry out the coordinator's instructions; True once it says Finish."""
        while todo:
            instruction = todo.popleft()
            try:
                if isinstance(instruction, Submit):
                    self._submit(instruction.step)
                elif isinstance(instruction, Record):
                    outcomes.append(self._outcome(instruction.step, instruction.metrics))
                elif isinstance(instruction, Sync):
                    self._sync(instruction.step)
                    todo.extend(coordinator.synced(instruction.step))
                elif isinstance(instruction, Restart):
                    self._restart(instruction)
                elif isinstance(instruction, Finish):
                    return True
            except self._transient as e:
                todo.clear()
                todo.extend(self._recover(coordinator, getattr(instruction, "step", coordinator.done), e))
        return False

    def _wait(self, coordinator: Coordinator) -> list:
        """Wait for the oldest step in flight; the coordinator's next instructions."""
        step, future = self.metrics[0]
        waited = time.perf_counter()
        try:
            ready = threading.Event()  # the wait an interrupt may cut short (the fetch below it may not)
            future.add_done_callback(lambda _: ready.set())
            deadline = waited + self.deadline.seconds
            while not ready.wait(min(1.0, max(deadline - time.perf_counter(), 0.0))):
                check_client(self.client)  # a lost scheduler ends the fit now, not at the deadline
                if time.perf_counter() >= deadline:
                    raise TimeoutError(f"step {step} made no progress for {self.deadline.seconds:g} s")
            (metrics,) = results_whole([future], timeout=self.deadline.seconds)
        except self._transient as e:
            return self._recover(coordinator, step, e)
        except (WorkbenchError, ClientStopped):
            raise
        except Exception as e:
            raise ClusterError(f"step {step} failed on the cluster: {type(e).__name__}: {e}") from e
        self.deadline.progressed(time.perf_counter() - waited)
        self.metrics.popleft()
        # the step before stays until this one is reported: an early end may want its variables
        for old in [s for s in self.updates if s < step - 1]:
            del self.updates[old]
        return coordinator.step_done(step, metrics)

    def _recover(self, coordinator: Coordinator, step: int, error: BaseException) -> list:
        """Lost work: leave out the workers that stopped answering, then restart from the last sync.

        ClusterError (naming them) when no worker is left; the error itself when the client
        cannot go on (closed, or its scheduler gone: :mod:`workbench.cluster.failures` says so).
        """
        if self.client.status != "running":
            raise error
        candidates = self._workers_now()
        silent = self.membership.leave_out_silent(candidates, self.deadline.seconds)
        if silent and not [w for w in candidates if w not in silent]:
            named = ", ".join(f"{w} (silent for {s:.0f} s)" for w, s in sorted(self.excluded.items()))
            raise ClusterError(
                f"step {step} made no progress for {self.deadline.seconds:g} s and no worker is left: {named} "
                "stopped answering (a stopped process, a stuck GPU?); fix or restart those workers and fit again"
            ) from error
        self.deadline.restarted()
        return coordinator.failed(step, error)

    def _workers_now(self) -> list:
        """The workers this fit may use now (the ones asked for, or all), without those left out."""
        return self.membership.workers(listed=False)

    def _placement(self) -> tuple | None:
        """Where data and tasks may go (see :meth:`Membership.placement`)."""
        return self.membership.placement()

    def _scatter(self, variables: dict, step: int) -> None:
        client, where, timeout = self.client, self._placement(), self.deadline.seconds
        self.token = uuid.uuid4().hex[:8]
        self.program_ref = scatter_whole(
            client, self.program, broadcast=True, hash=False, workers=where, timeout=timeout
        )
        # a list, so that scatter keeps the dict whole
        self.state_ref = scatter_whole(
            client, [initial_state(variables, step)], hash=False, workers=where, timeout=timeout
        )[0]
        self.sources = {}
        for name, value in self.data.items():
            if is_dask_array(value):
                self.sources[name] = _Chunks(client, value, where)
            else:
                future = scatter_whole(
                    client, np.asarray(value), broadcast=True, hash=False, workers=where, timeout=timeout
                )
                self.sources[name] = _Whole(future)
        self.updates: dict[int, Any] = {}
        self.metrics: deque = deque()
        self.state_bytes = int(sum(np.asarray(v).nbytes for v in variables.values()))
        self.worker_list = list(where or self._workers_now()) or [None]

    def _batch(self, step: int) -> np.ndarray:
        # backup replicas get shards of their own: the step draws their rows too
        size = self.batch_size + self.backups * (self.batch_size // self.replicas)
        seed = self.request.batch_seed
        return next(batch_indices(self.num_examples, size, self.steps, seed, start=step - 1))

    def _submit(self, step: int) -> None:
        index = self._batch(step)
        previous = self.updates.get(step - 1, self.state_ref)
        sources = [self.sources[name] for name in self.program.feeds]

        def data(rows):  # each replica gets only the chunks its rows live in
            return [source.select(rows) for source in sources]

        shards_ = self.replicas + self.backups
        weight = (lambda part: len(part) / len(index)) if not self.backups else (lambda part: 1.0 / self.replicas)
        delays = step_delays(self.stragglers, step, shards_)
        tasks, keys = replica_tasks(
            self.program_ref, previous, data, index, shards_, weight, self.graph_name, step, self.token, delays
        )
        # replica i prefers worker i (mod the count): the scheduler alone would put every
        # replica next to the variables, on one worker
        # (once a worker is left out, the workers left, strictly: the scheduler would still pick it)
        replicas, where = [], self._placement()
        for i, key in enumerate(keys["grads"]):
            preferred = [self.worker_list[i % len(self.worker_list)]] if not self.excluded else list(where)
            replicas += self.client.get(
                {key: tasks[key]}, [key], sync=False, workers=preferred, allow_other_workers=not self.excluded
            )
        if self.backups:
            replicas = self._first_to_finish(replicas)
            self.decided[step] = ([int(f.key[1].rsplit("-r", 1)[-1]) for f in replicas], time.time())
        combine = combine_tasks(self.program_ref, previous, [TaskRef(f.key) for f in replicas], keys, self.token)
        metrics, update = self.client.get(combine, [keys["metrics"], keys["update"]], sync=False, workers=where)
        self.updates[step] = update
        self.metrics.append((step, metrics))

    def _first_to_finish(self, replicas: list) -> list:
        """Backup replicas (Chen et al. 2016): the first ``self.replicas`` to finish, in replica order.

        The client waits for them (one round trip per step), the rest are dropped.
        """
        finished: queue.Queue = queue.Queue()
        for future in replicas:
            future.add_done_callback(finished.put)
        order = {f.key: i for i, f in enumerate(replicas)}
        chosen, failed = [], 0
        while len(chosen) < self.replicas:
            try:
                future = finished.get(timeout=self.deadline.seconds)
            except queue.Empty:
                raise TimeoutError(f"no replica finished within {self.deadline.seconds:g} s") from None
            if future.status == "finished":
                chosen.append(future)
            else:
                failed += 1
                if failed > self.backups:
                    raise concurrent.futures.CancelledError(f"{failed} of {len(replicas)} replicas failed")
        return sorted(chosen, key=lambda f: order[f.key])

    def _outcome(self, step: int, metrics: dict) -> StepOutcome:
        compute = metrics["compute"]
        measured = {
            "replicas": self.replicas,
            "compute_seconds": max(compute.values()) if compute else 0.0,
            "reduce_seconds": metrics["reduce_seconds"],
            "update_seconds": metrics["update_seconds"],
            "workers": compute,
            "bytes_moved": (self.replicas - 1) * 2 * self.state_bytes,
            "dropped": self.backups,
            "spans": task_spans(self.lanes, step, metrics.get("tasks", [])),
            **self._arrivals(step, metrics.get("ready", {})),
        }
        return StepOutcome(step, dict(zip(self.labels, metrics["fetches"])), measured)

    def _arrivals(self, step: int, ready: dict) -> dict:
        """``delays``, ``arrivals`` (from the earliest replica's start, wall clock) and ``dropped``: a
        dropped replica's arrival is no earlier than when the step went on without it."""
        shards_ = self.replicas + self.backups
        used, decided = self.decided.pop(step, (list(range(shards_)), None))
        begun = min((start for start, _ in ready.values()), default=0.0)
        arrivals = [ready[r][1] - begun if r in ready else decided - begun for r in range(shards_)]
        dropped = [r for r in range(shards_) if r not in used]
        return {"delays": step_delays(self.stragglers, step, shards_), "arrivals": arrivals, "dropped": dropped}

    def _sync(self, step: int) -> None:
        variables, state = self._fetch(self.updates.pop(step), step, whole=True)
        self.host = ({**self.host[0], **variables}, step)
        # the next steps start from this copy: the lineage ends here
        where, timeout = self._placement(), self.deadline.seconds
        self.state_ref = scatter_whole(self.client, [state], hash=False, workers=where, timeout=timeout)[0]
        self.events.emit(Synced, step=step)

    def _fetch(self, update, step: int, whole: bool = False):
        """Step ``step``'s variables as host arrays (and the whole state with ``whole``)."""
        if not self.request.device.host_arrays:  # the worker copies the variables off its GPU
            key = task_key(self.graph_name, "host", step, token=self.token)
            update = self.client.submit(host_state, update, key=key, pure=False)
        (state,) = results_whole([update], timeout=self.deadline.seconds)
        variables = {n: np.asarray(v) for n, v in state["variables"].items()}
        return (variables, state) if whole else variables

    def _restart(self, instruction: Restart) -> None:
        # Drop the old attempt's futures: the scheduler forgets what nobody wants. (Cancelling
        # keys that other tasks still need trips an assertion in the scheduler.)
        self.metrics.clear()
        self.updates.clear()
        variables, step = self.host
        self.events.emit(Restarted, step=step, attempt=instruction.attempt)
        self._scatter({n: variables[n] for n in self.program.state_variables}, step)


class _Whole:
    """A data set scattered to every worker once."""

    def __init__(self, future):
        self.future = future

    def select(self, rows: np.ndarray):
        return self.future

    def held(self) -> list:
        return [self.future]


class _Chunks:
    """A dask array persisted on the cluster: each replica gets the chunks holding its rows."""

    def __init__(self, client, array, workers=None):
        from distributed import Future

        if len(array.chunks) > 1 and any(len(c) > 1 for c in array.chunks[1:]):
            array = array.rechunk({i: -1 for i in range(1, array.ndim)})
        array = client.persist(array, workers=workers)
        self.offsets = np.concatenate([[0], np.cumsum(array.chunks[0])])
        self.futures = [Future(d.key, client) for d in array.to_delayed().ravel()]
        self.array = array  # keeps the persisted chunks alive

    def held(self) -> list:
        return list(self.futures)

    def select(self, rows: np.ndarray):
        first = np.searchsorted(self.offsets, rows.min(), side="right") - 1
        last = np.searchsorted(self.offsets, rows.max(), side="right") - 1
        picked = range(first, last + 1)
        # a dask List, so that the scheduler sees the chunks as dependencies (a Task does not
        # look inside plain tuples and lists) and the worker gets the arrays, not their Futures
        return List([int(self.offsets[i]) for i in picked], List(*(self.futures[i] for i in picked)))
