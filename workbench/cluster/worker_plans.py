"""What a worker compiles, for each role a fit gives it, in one place; and the plans it keeps warm.

- the parameter-server role (:mod:`workbench.cluster.parameter_server`): :class:`WorkerPlans`, the
  program's gradient and update plans, each with its own state; cached by the program's digest
  (:data:`PLANS`, :func:`compiled`);
- an all-reduce replica (:mod:`workbench.cluster.collective.replica`): :class:`ReplicaPlans`, the
  forward/backward and update plans bound to the replica's own variables, and its gradient buckets;
- a strategy replica (:mod:`workbench.cluster.collective.strategy_replica`): :class:`StrategyPlans`,
  a plan per variant of the strategy's program, bound to the replica's variables and slots.

A replica's plans outlive its run: when it ends cleanly they go back to :data:`WARM`, and the next
replica of the same program on this worker (a later fit of the same session, or another's) copies its
starting values into their arrays instead of parsing and compiling the program again.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from typing import TYPE_CHECKING

from workbench.devices import open_device
from workbench.graph.compile import PlanCache, compile_plan
from workbench.graph.core import Graph
from workbench.graph.device import Device
from workbench.strategies.program import UPDATE

if TYPE_CHECKING:
    from workbench.cluster.program import TrainingProgram


@dataclass(frozen=True)
class Bucket:
    """Gradients reduced together: their indices (in the program's order), offsets and shapes."""

    gradients: tuple
    offsets: tuple  # (start, stop) of each gradient in the flat buffer
    shapes: tuple
    dtype: str
    size: int


def plan_buckets(order: list[int], shapes: list[tuple], dtypes: list[str], bucket_bytes: int) -> list[Bucket]:
    """Gradients in ``order`` (when the backward pass makes them) cut into buckets of about ``bucket_bytes``.

    A bucket closes when it reaches the size or when the dtype changes (a bucket is one flat array).
    """
    buckets, current, dtype = [], [], None

    def close():
        if current:
            offsets, start = [], 0
            for i in current:
                n = int(np.prod(shapes[i], dtype=np.int64))
                offsets.append((start, start + n))
                start += n
            buckets.append(Bucket(tuple(current), tuple(offsets), tuple(shapes[i] for i in current), dtype, start))
            current.clear()

    size = 0
    for i in order:
        if dtypes[i] != dtype or size >= bucket_bytes:
            close()
            dtype, size = dtypes[i], 0
        current.append(i)
        size += int(np.prod(shapes[i], dtype=np.int64)) * np.dtype(dtypes[i]).itemsize
    close()
    return buckets


# -- the devices a worker opens ------------------------------------------------------------------


_DEVICES: dict[tuple, Device] = {}


def open_worker_device(kind: str, options: tuple) -> Device:
    """This process's device of ``kind`` (``"cpu"`` or ``"gpu"``) with ``options``, opened once."""
    key = (kind, options)
    found = _DEVICES.get(key)
    if found is None:
        found = _DEVICES[key] = open_device(kind, **dict(options))
    return found


def opened_devices() -> list[Device]:
    """The devices this process opened for programs."""
    return list(_DEVICES.values())


# -- replicas: the all-reduce and strategy roles ---------------------------------------------


class _BoundPlans:
    """Plans bound to arrays of their own (``variables``), made under ``key``; ``owner``: the replica using them."""

    key: tuple
    variables: dict
    owner = None

    def fits(self, variables: dict) -> bool:
        """Whether ``variables`` are the names, shapes and dtypes these plans were made for."""
        return variables.keys() == self.variables.keys() and all(
            np.shape(v) == self.variables[n].shape and np.asarray(v).dtype == self.variables[n].dtype
            for n, v in variables.items()
        )

    def load(self, variables: dict) -> None:
        """Start from ``variables``: copied into the arrays the plans are bound to."""
        for name, value in variables.items():
            np.copyto(self.variables[name], value)


class ReplicaPlans(_BoundPlans):
    """What a replica compiles from its program, and the arrays those plans are bound to: its variables
    (the optimizer writes into them in place), the forward pass's state and the flat gradient buckets.

    A replica's plans outlive it: when its run ends cleanly they go back to :data:`WARM`, and the next
    replica of the same program on this worker (a later fit of the same session, or of another) takes
    them and copies its starting variables into their arrays instead of parsing and compiling again.
    """

    def __init__(self, program: TrainingProgram, variables: dict, bucket_bytes: int):
        self.key = (program.digest, int(bucket_bytes))
        device = open_worker_device(program.device, program.device_options)
        shipped = {"seed": program.seed, "optimized": True}  # the client pruned and optimized both graphs
        n = len(program.gradients)
        self.variables = {name: np.array(v, copy=True) for name, v in variables.items()}
        self.forward_state: dict = {}
        replica = Graph.from_json(program.replica_json)
        self.forward = compile_plan(
            replica, [*program.gradients, *program.fetches], program.feeds, device, state=self.forward_state, **shipped
        )
        # on the steps that report the model's statistics (fit(stats=k)): the same step, plus those ops
        self.forward_stats = (
            compile_plan(
                replica,
                [*program.gradients, *program.fetches, *program.stats],
                program.feeds,
                device,
                state=self.forward_state,
                **shipped,
            )
            if program.stats
            else None
        )
        # the optimizer writes into these variables (own_state): no fresh arrays per step
        self.update = compile_plan(
            Graph.from_json(program.update_json),
            [program.train],
            program.gradient_ops,
            device,
            state=self.variables,
            own_state=True,
            **shipped,
        )
        self.update_order = [program.gradient_ops.index(name) for name in self.update.feed_names]
        self.feed_order = [program.feeds.index(name) for name in self.forward.feed_names]
        self._layout(program, [str(replica.get(g).dtype) for g in program.gradients], bucket_bytes)
        self.forward.watch(range(n), self._produced)
        if self.forward_stats is not None:
            self.forward_stats.watch(range(n), self._produced)

    def _layout(self, program: TrainingProgram, dtypes: list[str], bucket_bytes: int) -> None:
        """Buckets in the order the backward pass makes the gradients, and each gradient's view into its bucket."""
        n = len(program.gradients)
        shapes = [tuple(self.variables[v].shape) for v in program.gradient_variables]
        made = self.forward.producers()[:n]
        order = sorted(range(n), key=made.__getitem__)
        self.buckets = plan_buckets(order, shapes, dtypes, bucket_bytes)
        self.flats = [np.empty(b.size, dtype=b.dtype) for b in self.buckets]  # reused every step
        self.views: list = [None] * n
        self.bucket_of = [0] * n
        for b, bucket in enumerate(self.buckets):
            for i, (start, stop), shape in zip(bucket.gradients, bucket.offsets, bucket.shapes):
                self.views[i] = self.flats[b][start:stop].reshape(shape)
                self.bucket_of[i] = b

    def _produced(self, i: int, value) -> None:
        self.owner._produced(i, value)

    def load(self, variables: dict) -> None:
        super().load(variables)
        self.forward_state.clear()


class StrategyPlans(_BoundPlans):
    """A strategy replica's plans (:mod:`workbench.cluster.collective.strategy_replica`): one per variant
    of its program (the steps where exactly those ``every`` blocks run), and with ``stats`` each variant's
    with the statistic ops, all bound to its variables and slots (updated in place). Kept warm as
    :class:`ReplicaPlans` are."""

    def __init__(self, program, variables: dict, key: tuple | None = None):
        self.key = self.key_of(program) if key is None else key
        self.program = program
        self.variables = {n: np.array(v, copy=True) for n, v in variables.items()}
        device = open_worker_device(program.device, program.device_options)
        fed = [*program.feeds, *dict(program.inputs).values()]
        self.plans, self.stats_plans = {}, {}
        for due, text in program.variants:
            graph = Graph.from_json(text)
            self.plans[tuple(due)] = self._compile(graph, [UPDATE, *program.fetches], fed, device)
            if program.stats:  # the steps that report the model's statistics
                fetched = [UPDATE, *program.fetches, *program.stats, *program.stat_gradients]
                self.stats_plans[tuple(due)] = self._compile(graph, fetched, fed, device)

    @staticmethod
    def key_of(program) -> tuple:
        """What the plans depend on: the whole program (its graphs, feeds, fetches, seed and buckets)."""
        return ("strategy", hashlib.sha1(repr(program).encode()).hexdigest())

    def _compile(self, graph: Graph, fetches: list, fed: list, device):
        program = self.program
        return compile_plan(
            graph,
            fetches,
            fed,
            device,
            state=self.variables,
            seed=program.seed,
            own_state=True,
            bucket_bytes=program.bucket_bytes,
        )


class WarmPlans:
    """The plans of replicas whose runs ended cleanly on this worker, by (program digest, bucket size):
    the ``maxsize`` most recent sets (each holds about two copies of its model's variables)."""

    def __init__(self, maxsize: int = 2):
        self.maxsize = maxsize
        self._free: list = []  # oldest first
        self._lock = threading.Lock()
        self.compiled = self.reused = 0  # counts, for tests and benchmarks

    def replica(self, program: TrainingProgram, variables: dict, bucket_bytes: int) -> ReplicaPlans:
        """An all-reduce replica's plans of ``program``, starting from ``variables``: warm ones if any fit."""
        return self.take(
            (program.digest, int(bucket_bytes)), variables, lambda: ReplicaPlans(program, variables, bucket_bytes)
        )

    def strategy(self, program, variables: dict) -> StrategyPlans:
        """A strategy replica's plans of ``program`` (a ``StrategyProgram``), starting from ``variables``."""
        key = StrategyPlans.key_of(program)  # a hash of the whole program: once per replica
        return self.take(key, variables, lambda: StrategyPlans(program, variables, key))

    def take(self, key, variables: dict, build):
        """Free plans made under ``key`` for ``variables``' names, shapes and dtypes (loaded with them), else
        ``build()``'s."""
        with self._lock:
            for k, plans in enumerate(reversed(self._free)):
                if plans.key == key and plans.fits(variables):
                    del self._free[len(self._free) - 1 - k]
                    self.reused += 1
                    break
            else:
                plans = None
                self.compiled += 1
        if plans is None:
            return build()
        plans.load(variables)
        return plans

    def give_back(self, plans) -> None:
        plans.owner = None
        with self._lock:
            self._free.append(plans)
            del self._free[: max(0, len(self._free) - self.maxsize)]

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


#: This worker's warm plans (see :class:`ReplicaPlans`).
WARM = WarmPlans()


# -- the parameter-server role --------------------------------------------------------------


class WorkerPlans:
    """The two plans of a program in one worker process, each with its own state dict,
    compiled for the worker's device (fused on a GPU, as a local GPU session's are)."""

    def __init__(self, program: TrainingProgram):
        self.device = device = open_worker_device(program.device, program.device_options)
        self.replica_state: dict[str, Any] = {}
        self.update_state: dict[str, Any] = {}
        replica = Graph.from_json(program.replica_json)
        fetches = [*program.gradients, *program.fetches]
        shipped = {"seed": program.seed, "optimized": True}  # the client pruned and optimized both graphs
        self.replica = compile_plan(replica, fetches, program.feeds, device, state=self.replica_state, **shipped)
        update = Graph.from_json(program.update_json)
        trains = [program.train]
        self.update = compile_plan(update, trains, program.gradient_ops, device, state=self.update_state, **shipped)
        self.update_order = [program.gradient_ops.index(n) for n in self.update.feed_names]

    def variables(self, state: dict, names) -> dict:
        """``state``'s variables ``names`` on this device (a sync or restart scatters host arrays)."""
        variables, put = state["variables"], self.device.put
        return {n: put(variables[n]) for n in names}


#: The compiled plans of the programs this process has run, by digest.
PLANS = PlanCache(maxsize=16)


def compiled(program: TrainingProgram) -> WorkerPlans:
    """The plans of ``program`` in this process (compiled the first time)."""
    return PLANS.get(program.digest, lambda: WorkerPlans(program))
