"""What workers run: a training graph split into a replica part and an update part.

A :class:`TrainingProgram` is plain data (the pruned graph of each role as JSON, plus names), sent to
the workers once. Each worker process compiles it into two plans the first time
it sees it and keeps them: the **replica** plan computes the gradients (and the
fetches) of one shard, the **update** plan applies the optimizer to reduced
gradients. The task functions below are what the Dask graph calls.

Workers compile through the one plan compiler
(:func:`workbench.graph.compile.compile_plan`) for the device they open: on GPU
workers (a program with ``device="gpu"``) both plans run with the GPU namespace
and fusion of :class:`workbench.gpu.GPU`, as a local GPU session's do: each
replica task copies its shard to the device once, and variables and gradients
stay CuPy arrays in the task results from replica to reduce to
update. Distributed serializes CuPy arrays itself: over TCP a move between
workers goes through host memory, with UCX (``ucx://`` addresses, when
installed) device to device. What the client reads (metrics, the variables of
a sync) is converted to NumPy on the worker first.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from workbench.cluster.chunked import ChunkedSource, read_rows
from workbench.cluster.spans import task_mark
from workbench.cluster.worker_plans import compiled
from workbench.devices import device_type
from workbench.errors import ClusterError, DeviceError
from workbench.graph.batch_reduction import batch_reductions, fetch_reduction, join, loss_reduction, weighted
from workbench.graph.core import Graph, Operation
from workbench.graph.passes import bind_placeholders, optimize


@dataclass(frozen=True)
class TrainingProgram:
    """A training step of a graph, split for data-parallel execution.

    The client prunes and optimizes the graph once for each role and ships the
    results; workers only compile them for their device (:func:`compiled`).

    Attributes
    ----------
    replica_json : str
        The replica role (see :meth:`Graph.to_json`): the gradients and fetches
        from the feeds, pruned and optimized. Workers rebuild it, never unpickle it.
    update_json : str
        The update role: the optimizer step, with each gradient fed as a placeholder
        named after the gradient's op (``gradient_ops``).
    train : str
        The update operation (``optimizer.minimize(...)``).
    feeds : tuple of str
        Placeholders fed with each shard's rows.
    gradients : tuple of str
        Gradient tensors, cut between the replica and the update part.
    gradient_ops : tuple of str
        The op name of each gradient: its placeholder in the update role.
    fetches : tuple of str
        Tensors each replica also computes (the loss, metrics).
    replica_variables, state_variables : tuple of str
        Variables the replicas read; every variable the update reads or writes.
    seed : int
    device : {"cpu", "gpu"}
        Where workers run the plans: NumPy, or each worker's first visible GPU
        (dask-cuda gives every worker its own GPU as device 0).
    device_options : tuple of (name, value)
        Options of :class:`workbench.gpu.GPU` for the workers (``memory_pool``,
        ``memory_limit``, ``fuse``, ``emulate``).
    loss_scale : str
        The variable of the optimizer's dynamic loss scale, or "".
    gradient_variables : tuple of str
        The variable each gradient belongs to (same order as ``gradients``).
    loss_reduction : {"mean", "sum"}
        How the loss reduces over the batch's rows (:func:`~workbench.graph.batch_reduction.loss_reduction`):
        each replica's gradient is weighted by its share of the rows for a mean, by 1 for a sum.
    fetch_reductions : tuple of Reduction
        How each fetch combines across replicas (same order as ``fetches``).
    check_numerics : bool
        Workers run both plans checking every op's output for NaN and Inf (``fit(check_numerics=True)``):
        a :class:`~workbench.errors.NumericsError` naming the op ends the fit, as it does locally.
    """

    replica_json: str
    update_json: str
    train: str
    feeds: tuple
    gradients: tuple
    gradient_ops: tuple
    fetches: tuple
    replica_variables: tuple
    state_variables: tuple
    seed: int = 0
    digest: str = field(default="", compare=False)
    device: str = "cpu"
    device_options: tuple = ()
    loss_scale: str = ""
    gradient_variables: tuple = ()
    loss_reduction: str = "mean"
    fetch_reductions: tuple = ()
    check_numerics: bool = False
    stats: tuple = ()  # the statistic ops (workbench.watch) the replica graph also computes, when asked

    def gradient_weight(self, share: float) -> float:
        """What a replica's gradients are multiplied by, for a shard with ``share`` of the global batch's rows."""
        return share if self.loss_reduction == "mean" else 1.0

    @classmethod
    def for_fit(cls, request) -> TrainingProgram:
        """The program of one ``Session.fit`` (a :class:`~workbench.fitloop.FitRequest`), for any strategy."""
        return cls.from_graph(
            bind_placeholders(request.graph, request.feeds),  # fit(feed_dict=...): the same at every step
            request.train,
            list(request.fetches.values()),
            seed=request.seed,
            device=request.device.kind,
            device_options=request.device.options,
            fed=list(request.data),
            check_numerics=request.check_numerics,
            stats=tuple(request.stats.values()) if request.stats_every else (),
        )

    @classmethod
    def from_graph(
        cls,
        graph: Graph,
        train,
        fetches=(),
        seed: int = 0,
        device: str = "cpu",
        device_options: dict | None = None,
        fed=None,
        check_numerics: bool = False,
        stats=(),
    ) -> TrainingProgram:
        """Split ``graph`` at the gradients that the optimizer behind ``train`` recorded.

        ``fed`` names the placeholders the data feeds (default: those without a default
        value); the others take their defaults.
        """
        train_name = (
            train.name if isinstance(train, Operation) else train.op.name if hasattr(train, "op") else str(train)
        )
        record = graph.training.get(train_name)
        if record is None:
            known = ", ".join(repr(n) for n in graph.training) or "none"
            raise ClusterError(
                f"{train_name!r} is not an optimizer update; distributed training needs the operation "
                f"returned by optimizer.minimize() or apply_gradients() (this graph has: {known})"
            )
        gradients = tuple(record.gradient_names)
        gradient_ops = tuple(graph.get(g).op.name for g in gradients)
        fetches = tuple(fetches)
        if fed is None:
            fed = [p.name for p in graph.placeholders if p.op.attrs.get("default") is None]
        stats = tuple(stats)
        replica = optimize(graph, list(gradients) + list(fetches) + list(stats), fed=list(fed))
        update = optimize(graph, [train_name], fed=gradients)
        fed_to_update = {op.name for op in update.operations if op.type == "placeholder"} - set(gradient_ops)
        if fed_to_update:
            raise ClusterError(
                f"the update of {train_name!r} depends on placeholders {sorted(fed_to_update)}; "
                "only the gradients may depend on the data"
                + (
                    " (moving statistics updated from each batch, as batch norm's: train the graph with "
                    "strategy='allreduce' (the default), whose replica programs take the global batch's moments)"
                    if graph.updates
                    else ""
                )
            )
        feeds = tuple(op.name for op in replica.operations if op.type == "placeholder")
        loss_kind, reductions = split_rule(graph, record, fetches, feeds)
        replica_vars = tuple(op.name for op in replica.operations if op.type == "variable")
        state_vars = tuple(sorted({op.name for op in update.operations if op.type == "variable"} | set(replica_vars)))
        device, options = worker_device(device, device_options or {})
        texts = [replica.to_json(), update.to_json()]
        parts = [*texts, train_name, *feeds, *gradients, *fetches, *stats, str(seed), device, repr(options)]
        digest = hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]
        return cls(
            *texts,
            train_name,
            feeds,
            gradients,
            gradient_ops,
            fetches,
            replica_vars,
            state_vars,
            seed,
            digest,
            device,
            options,
            loss_scale=record.loss_scale,
            gradient_variables=tuple(v for _, v in record.gradients),
            loss_reduction=loss_kind,
            fetch_reductions=reductions,
            check_numerics=bool(check_numerics),
            stats=stats,
        )


def split_rule(graph: Graph, record, fetches, feeds) -> tuple[str, tuple]:
    """How a fit's loss and fetches split across replicas (see :mod:`workbench.graph.batch_reduction`).

    A record without a loss (``apply_gradients`` of the user's own gradients) is taken as a mean.
    """
    found = batch_reductions(graph, rows=feeds)
    loss = loss_reduction(graph, record.loss, rows=feeds) if record.loss else "mean"
    reductions = []
    for name in fetches:
        reduction = found[graph.get(name).name]
        if not reduction.splits:
            fetch_reduction(graph, name, rows=feeds)  # raises, naming the op
        reductions.append(reduction)
    return loss, tuple(reductions)


def worker_device(device: str, options: dict) -> tuple[str, tuple]:
    """What a program tells workers about the device: ``"cpu"`` or ``"gpu"``, and the options that apply there.

    Any ``"gpu:<i>"`` becomes ``"gpu"``: a worker's GPU is its own first visible one.
    Options that only concern the client's session (a GPU's ``results``, ``cuda_graphs``) are left out:
    the device's ``worker_options`` say which apply.
    """
    try:
        kind = device_type(str(device))
    except DeviceError:
        raise ClusterError(f"unknown device {device!r} for workers; use 'cpu' or 'gpu'") from None
    if options and not kind.worker_options:
        raise ClusterError(f"device {kind.kind!r} takes no options, got {', '.join(sorted(options))}")
    kept = {k: v for k, v in options.items() if k in kind.worker_options}
    odd = sorted(k for k, v in kept.items() if not isinstance(v, (str, int, float, bool, type(None))))
    if odd:
        raise ClusterError(f"device options {odd} must be plain values to reach the workers (a pool object cannot)")
    return kind.kind, tuple(sorted(kept.items()))


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return "local"


# -- the task functions -------------------------------------------------------------------


def to_host(value) -> np.ndarray:
    """``value`` as a NumPy array; a CuPy array is copied off the device (and waited for)."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("cupy"):
        return value.get()
    return np.asarray(value)


def host_state(state: dict) -> dict:
    """A state with every variable as a NumPy array: what a sync brings to the client."""
    return {**state, "variables": {n: to_host(v) for n, v in state["variables"].items()}}


def _scale(value, weight: float):
    """``value * weight`` in ``value``'s dtype."""
    if isinstance(value, np.ndarray):
        return np.multiply(value, weight, dtype=value.dtype)
    return value * value.dtype.type(weight)


def take_rows(source, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of a data source, in that order: an array, a
    :class:`~workbench.cluster.chunked.ChunkedSource` (a dask array's chunks on the cluster, read on the
    worker), or ``(offsets, chunks)``: the contiguous chunks holding the rows, and where each starts."""
    if isinstance(source, np.ndarray):
        return source[index]
    if isinstance(source, ChunkedSource):
        return source.take(index)
    offsets, chunks = source
    boundaries = np.array([*offsets, offsets[-1] + len(chunks[-1])], dtype=np.int64)
    first = chunks[0]
    return read_rows(index, boundaries, lambda blocks: {b: chunks[b] for b in blocks}, first.dtype, first.shape[1:])


def replica_gradients(
    program: TrainingProgram,
    state: dict,
    index: np.ndarray,
    weight: float,
    offset: int,
    *data,
    replica: int = 0,
    delay: float = 0.0,
) -> dict:
    """One replica's shard: gradients weighted for the global batch's loss.

    ``weight`` is the shard's share of the global batch's rows: the gradients are multiplied by it
    when the loss is a mean over the rows, by 1 when it is a sum; mean fetches by it too (the others
    combine by what they are, in :func:`reduce_pair`). ``offset`` is where the shard starts in the
    global batch; ``data`` holds one source per placeholder of ``program.feeds``, in order.
    ``replica``: the shard's replica id; ``delay``: seconds it waits after computing (``fit(stragglers=...)``).
    """
    started, start_wall = time.perf_counter(), time.time()
    plans = compiled(program)
    device = plans.device
    plans.replica_state.clear()
    plans.replica_state.update(plans.variables(state, program.replica_variables))
    share, weight = weight, program.gradient_weight(weight)
    if program.loss_scale:  # scale the shard's loss by its weight, so float16 overflows where the whole batch's does
        plans.replica_state[program.loss_scale] = _scale(plans.replica_state[program.loss_scale], weight)
    rows = {name: device.put(take_rows(source, index)) for name, source in zip(program.feeds, data)}  # up once
    # random ops (dropout) draw per step, and per row of the global batch, however it is split
    feeds = [rows[name] for name in plans.replica.feed_names]
    checked = program.check_numerics
    values = device.run(plans.replica, feeds, check_numerics=checked, step=state["step"], row_offset=offset)
    n = len(program.gradients)
    grads = [_scale(g, weight) for g in values[:n]]
    reductions = program.fetch_reductions or (None,) * (len(values) - n)
    fetches = [  # on the device until step_metrics
        device.xp.asarray(v) * share if r is None else weighted(r, device.xp.asarray(v), share)
        for v, r in zip(values[n:], reductions, strict=True)
    ]
    computed = time.perf_counter() - started
    if delay > 0:  # a straggler: its worker's thread is free meanwhile (the server's update may run there)
        _leave_thread_pool()
        time.sleep(delay)
    return {
        "grads": grads,
        "fetches": fetches,
        "reductions": program.fetch_reductions,
        "compute": {_worker_address(): computed},
        "reduce_seconds": 0.0,
        "shards": 1,
        "tasks": [task_mark(_worker_address(), "compute", start_wall)],  # the step's timeline (cluster.spans)
        "ready": {int(replica): (start_wall, time.time())},  # wall clock: when it began and handed in
    }


def _leave_thread_pool() -> None:
    """``distributed.secede`` inside a worker's task (a no-op elsewhere)."""
    try:
        from distributed import secede

        secede()
    except (ImportError, ValueError):
        pass


def reduce_pair(a: dict, b: dict) -> dict:
    """The sum of two replicas' (or partial sums') results; always ``a`` first."""
    started, began = time.perf_counter(), time.time()
    grads = [x + y for x, y in zip(a["grads"], b["grads"])]
    reductions = a.get("reductions") or (None,) * len(a["fetches"])
    fetches = [x + y if r is None else join(r, x, y) for x, y, r in zip(a["fetches"], b["fetches"], reductions)]
    compute = dict(a["compute"])
    for worker, seconds in b["compute"].items():
        compute[worker] = compute.get(worker, 0.0) + seconds
    return {
        "grads": grads,
        "fetches": fetches,
        "reductions": a.get("reductions", ()),
        "compute": compute,
        "reduce_seconds": a["reduce_seconds"] + b["reduce_seconds"] + time.perf_counter() - started,
        "shards": a["shards"] + b["shards"],
        "tasks": [
            *a["tasks"],
            *b["tasks"],
            task_mark(_worker_address(), "communicate", began, (a["tasks"][-1], b["tasks"][-1])),
        ],
        "ready": {**a.get("ready", {}), **b.get("ready", {})},
    }


def apply_update(program: TrainingProgram, state: dict, reduced: dict) -> dict:
    """The optimizer step: the new values of every variable (slots included)."""
    started, began = time.perf_counter(), time.time()
    plans = compiled(program)
    plans.update_state.clear()
    plans.update_state.update(plans.variables(state, state["variables"]))
    grads = reduced["grads"]
    plans.device.run(plans.update, [grads[i] for i in plans.update_order], check_numerics=program.check_numerics)
    return {
        "variables": dict(plans.update_state),
        "step": state["step"] + 1,
        "update_seconds": time.perf_counter() - started,
        "update_worker": _worker_address(),
        "tasks": [*reduced["tasks"], task_mark(_worker_address(), "update", began, reduced["tasks"][-1:])],
    }


def step_metrics(reduced: dict, new_state: dict) -> dict:
    """What the client reads each step: small numbers only, never the variables."""
    return {
        "fetches": [f.item() if f.ndim == 0 else f for f in map(to_host, reduced["fetches"])],
        "compute": reduced["compute"],
        "reduce_seconds": reduced["reduce_seconds"],
        "update_seconds": new_state["update_seconds"],
        "update_worker": new_state["update_worker"],
        "shards": reduced["shards"],
        "step": new_state["step"],
        "tasks": new_state.get("tasks", []),
        "ready": reduced.get("ready", {}),
    }


def initial_state(variables: dict, step: int = 0) -> dict:
    return {"variables": dict(variables), "step": step}
