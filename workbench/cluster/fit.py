"""Data-parallel synchronous SGD on a Dask cluster: the thin shell around the coordinator.

Variables stay on the workers as futures from step to step; a bounded window
of steps is submitted ahead, so the client's round trip never stalls the
workers; every ``sync_every`` steps the variables come home, which bounds what
a lost worker costs and keeps the task lineage short.
"""

from __future__ import annotations

import concurrent.futures
import queue
import time
import uuid
from collections import deque
from typing import Any, Callable

import numpy as np
from dask.task_spec import List, TaskRef

from workbench import checkpoint
from workbench.cluster.lower import combine_tasks, replica_tasks
from workbench.cluster.program import TrainingProgram, host_state, initial_state
from workbench.cluster.sync import Coordinator, Finish, Record, Restart, Submit, Sync
from workbench.errors import ClusterError, FeedError, WorkbenchError
from workbench.events import FitFinished, FitStarted, Restarted, Step, Synced
from workbench.training import History, batch_indices, is_dask_array


def _infrastructure_errors() -> tuple:
    from distributed import KilledWorker

    errors: list = [KilledWorker, concurrent.futures.CancelledError, OSError, TimeoutError]
    try:
        from distributed.client import FutureCancelledError

        errors.append(FutureCancelledError)
    except ImportError:  # pragma: no cover - older distributed
        pass
    return tuple(errors)


class ClusterFit:
    """One ``fit`` on a cluster. See :meth:`workbench.Session.fit` for the parameters."""

    def __init__(
        self,
        session,
        client,
        train,
        data: dict,
        batch_size: int,
        steps: int,
        replicas: int,
        fetches: list[str],
        labels: list[str],
        batch_seed,
        window: int = 4,
        sync_every: int = 20,
        checkpoint_dir=None,
        checkpoint_every: int | None = None,
        workers=None,
        callback: Callable[[dict], Any] | None = None,
        step_timeout: float = 300.0,
        backup_replicas: int = 0,
    ):
        self.session, self.client, self.graph = session, client, session.graph
        self.batch_size, self.steps, self.replicas = batch_size, steps, replicas
        self.labels, self.batch_seed, self.window = labels, batch_seed, window
        self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, checkpoint_every
        self.workers, self.callback, self.step_timeout = workers, callback, step_timeout
        self.sync_every = min(sync_every, checkpoint_every) if checkpoint_every else sync_every
        self.backups = int(backup_replicas)
        if self.backups < 0:
            raise ClusterError(f"backup_replicas must be 0 or more, got {backup_replicas}")
        self.program = TrainingProgram.from_graph(
            self.graph, train, fetches, seed=session.seed, device=session.device.kind, device_options=session.device.options
        )
        missing = set(self.program.feeds) - set(data)
        if missing:
            raise FeedError(f"data lacks the placeholders {sorted(missing)} that the gradients need")
        self.data = {name: data[name] for name in self.program.feeds}
        self.num_examples = len(next(iter(self.data.values())))
        self.history = History()
        self._transient = _infrastructure_errors()

    # -- set-up ---------------------------------------------------------------------------
    def _start_state(self) -> tuple[dict, int]:
        resumed = checkpoint.latest(self.checkpoint_dir)
        if resumed is not None:
            variables, step = resumed
            missing = set(self.program.state_variables) - set(variables)
            if missing:
                raise ClusterError(f"checkpoint in {self.checkpoint_dir!r} lacks variables {sorted(missing)}")
            return {n: variables[n] for n in self.program.state_variables}, min(step, self.steps)
        self.session._ensure_initialized(self.program.state_variables)
        return {n: np.asarray(self.session.device.to_host(self.session._state[n])) for n in self.program.state_variables}, 0

    def _scatter(self, variables: dict, step: int) -> None:
        client = self.client
        self.token = uuid.uuid4().hex[:8]
        self.program_ref = client.scatter(self.program, broadcast=True, hash=False)
        # a list, so that scatter keeps the dict whole
        self.state_ref = client.scatter([initial_state(variables, step)], hash=False, workers=self.workers)[0]
        self.sources = {}
        for name, value in self.data.items():
            if is_dask_array(value):
                self.sources[name] = _Chunks(client, value)
            else:
                future = client.scatter(np.asarray(value), broadcast=True, hash=False, workers=self.workers)
                self.sources[name] = _Whole(future)
        self.updates: dict[int, Any] = {}
        self.metrics: deque = deque()
        self.state_bytes = int(sum(np.asarray(v).nbytes for v in variables.values()))
        self.worker_list = list(self.workers or sorted(client.scheduler_info().get("workers", {}))) or [None]

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> History:
        options = dict(self.program.device_options)
        if self.program.device == "gpu" and not options.get("emulate"):
            from workbench.cluster.transfers import DeviceTransfers

            self.client.register_plugin(DeviceTransfers())  # every worker can send CuPy arrays
        variables, start = self._start_state()
        self.host = (variables, start)
        self._scatter(variables, start)
        coordinator = Coordinator(start, self.steps, window=self.window, sync_every=self.sync_every)
        self.session.events.emit(
            FitStarted, steps=self.steps, batch_size=self.batch_size, fetches=tuple(self.labels), strategy="parameter_server",
            replicas=self.replicas, start=start, workers=len(self.workers or self.client.scheduler_info().get("workers", {})),
        )  # fmt: skip
        self._last_time = time.perf_counter()
        todo = deque(coordinator.start())
        finished = False
        while not finished:
            while todo:
                instruction = todo.popleft()
                if isinstance(instruction, Submit):
                    self._submit(instruction.step)
                elif isinstance(instruction, Record):
                    self._record(instruction.step, instruction.metrics)
                elif isinstance(instruction, Sync):
                    try:
                        self._sync(instruction.step)
                    except self._transient as e:
                        todo = deque(coordinator.failed(instruction.step, e))
                        continue
                    todo.extend(coordinator.synced(instruction.step))
                elif isinstance(instruction, Restart):
                    self._restart(instruction)
                elif isinstance(instruction, Finish):
                    finished = True
            if finished:
                break
            step, future = self.metrics[0]
            try:
                metrics = future.result(timeout=self.step_timeout)
            except self._transient as e:
                todo.extend(coordinator.failed(step, e))
                continue
            except WorkbenchError:
                raise
            except Exception as e:
                raise ClusterError(f"step {step} failed on the cluster: {type(e).__name__}: {e}") from e
            self.metrics.popleft()
            todo.extend(coordinator.step_done(step, metrics))
            for old in [s for s in self.updates if s < coordinator.done]:
                del self.updates[old]
        variables, _ = self.host
        self.session._state.update({n: self.session.xp.asarray(v) for n, v in variables.items()})
        self.session.events.emit(FitFinished, steps=self.steps, restarts=coordinator.restarts)
        return self.history

    def _batch(self, step: int) -> np.ndarray:
        # backup replicas get shards of their own: the step draws their rows too
        size = self.batch_size + self.backups * (self.batch_size // self.replicas)
        return next(batch_indices(self.num_examples, size, self.steps, self.batch_seed, start=step - 1))

    def _submit(self, step: int) -> None:
        index = self._batch(step)
        previous = self.updates.get(step - 1, self.state_ref)
        sources = [self.sources[name] for name in self.program.feeds]

        def data(rows):  # each replica gets only the chunks its rows live in
            return [source.select(rows) for source in sources]

        shards_ = self.replicas + self.backups
        weight = (lambda part: len(part) / len(index)) if not self.backups else (lambda part: 1.0 / self.replicas)
        tasks, keys = replica_tasks(self.program_ref, previous, data, index, shards_, weight, self.graph.name, step, self.token)
        # replica i prefers worker i (mod the count): the scheduler alone would put every
        # replica next to the variables, on one worker
        replicas = []
        for i, key in enumerate(keys["grads"]):
            preferred = [self.worker_list[i % len(self.worker_list)]]
            replicas += self.client.get({key: tasks[key]}, [key], sync=False, workers=preferred, allow_other_workers=True)
        if self.backups:
            replicas = self._first_to_finish(replicas)
        combine = combine_tasks(self.program_ref, previous, [TaskRef(f.key) for f in replicas], keys, self.token)
        metrics, update = self.client.get(combine, [keys["metrics"], keys["update"]], sync=False, workers=self.workers)
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
            future = finished.get(timeout=self.step_timeout)
            if future.status == "finished":
                chosen.append(future)
            else:
                failed += 1
                if failed > self.backups:
                    raise concurrent.futures.CancelledError(f"{failed} of {len(replicas)} replicas failed")
        return sorted(chosen, key=lambda f: order[f.key])

    def _record(self, step: int, metrics: dict) -> None:
        now = time.perf_counter()
        elapsed, self._last_time = now - self._last_time, now
        compute = metrics["compute"]
        measured = {
            "replicas": self.replicas,
            "compute_seconds": max(compute.values()) if compute else 0.0,
            "reduce_seconds": metrics["reduce_seconds"],
            "update_seconds": metrics["update_seconds"],
            "workers": compute,
            "bytes_moved": (self.replicas - 1) * 2 * self.state_bytes,
            "dropped": self.backups,
        }
        rate = self.batch_size / elapsed if elapsed > 0 else float("inf")
        fetches = dict(zip(self.labels, metrics["fetches"]))
        event = Step(session=self.session.token, graph=self.graph.token, step=step, time=elapsed, samples_per_s=rate,
                     fetches=fetches, metrics=measured)  # fmt: skip
        record = event.record()
        self.history.append(record)
        self.session.events.emit(event)
        if self.callback is not None:
            self.callback(record)

    def _sync(self, step: int) -> None:
        update = self.updates.pop(step)
        if self.program.device != "cpu":  # the worker copies the variables off its GPU
            key = (f"{self.graph.name}-step-{step}-host", self.token)
            update = self.client.submit(host_state, update, key=key, pure=False)
        state = update.result(timeout=self.step_timeout)
        variables = {n: np.asarray(v) for n, v in state["variables"].items()}
        self.host = (variables, step)
        # the next steps start from this copy: the lineage ends here
        self.state_ref = self.client.scatter([state], hash=False, workers=self.workers)[0]
        if self.checkpoint_dir is not None and (step % (self.checkpoint_every or self.sync_every) == 0 or step == self.steps):
            checkpoint.save_step(self.checkpoint_dir, variables, step)
        self.session.events.emit(Synced, step=step)

    def _restart(self, instruction: Restart) -> None:
        # Drop the old attempt's futures: the scheduler forgets what nobody wants. (Cancelling
        # keys that other tasks still need trips an assertion in the scheduler.)
        self.metrics.clear()
        self.updates.clear()
        variables, step = self.host
        self.session.events.emit(Restarted, step=step, attempt=instruction.attempt)
        self._scatter(variables, step)


class _Whole:
    """A data set scattered to every worker once."""

    def __init__(self, future):
        self.future = future

    def select(self, rows: np.ndarray):
        return self.future


class _Chunks:
    """A dask array persisted on the cluster: each replica gets the chunks holding its rows."""

    def __init__(self, client, array):
        from distributed import Future

        if len(array.chunks) > 1 and any(len(c) > 1 for c in array.chunks[1:]):
            array = array.rechunk({i: -1 for i in range(1, array.ndim)})
        array = client.persist(array)
        self.offsets = np.concatenate([[0], np.cumsum(array.chunks[0])])
        self.futures = [Future(d.key, client) for d in array.to_delayed().ravel()]
        self.array = array  # keeps the persisted chunks alive

    def select(self, rows: np.ndarray):
        first = np.searchsorted(self.offsets, rows.min(), side="right") - 1
        last = np.searchsorted(self.offsets, rows.max(), side="right") - 1
        picked = range(first, last + 1)
        # a dask List, so that the scheduler sees the chunks as dependencies (a Task does not
        # look inside plain tuples and lists) and the worker gets the arrays, not their Futures
        return List([int(self.offsets[i]) for i in picked], List(*(self.futures[i] for i in picked)))
