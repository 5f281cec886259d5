"""Lowering a training step to a Dask task graph, partitioned rather than exploded.

Each step of data-parallel synchronous SGD becomes ``2R + 1`` tasks whatever
the number of ops: ``R`` replica tasks (forward and backward pass of one shard
each), ``R - 1`` pairwise reductions in a fixed tree order (so the sum never
depends on timing or worker count), one update task (the optimizer) and one
small metrics task for the client. Keys read like the model::

    ("mlp-grad-12-r0", token)   ("mlp-reduce-12-1-0", token)
    ("mlp-update-12", token)    ("mlp-metrics-12", token)

Each phase is its own Dask key prefix (``key_split`` gives ``mlp-grad``, ``mlp-reduce``,
``mlp-update``, ``mlp-metrics``), so the dashboard's task stream and progress bars tell
them apart; the step and the replica are the rest of the key. ``token`` keeps
concurrent runs apart.

With ``strategy="allreduce"`` a step is ``R`` tasks, ``("mlp-allreduce-12-r0", token)``
...: each computes its shard's gradients, all-reduces them with its peers worker to
worker and updates its worker's replica of the variables (:mod:`workbench.cluster.collective.replica`).
They depend on one start task per worker, ``("mlp-allreduce-start-r0", token)``, that
places the replica, and not on each other: the engine pins them one per worker and orders
them by priority. The lowered graph is that picture, to inspect; ``fit`` runs it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from dask.task_spec import DataNode, Task, TaskRef

from workbench.cluster.program import (
    TrainingProgram,
    apply_update,
    initial_state,
    reduce_pair,
    replica_gradients,
    step_metrics,
)
from workbench.cluster.collective.replica import run_step, start_replica
from workbench.errors import ClusterError
from workbench.graph.core import Graph
from workbench.ops.state import initial_value
from workbench.training import batch_indices, check_data


def shards(index: np.ndarray, replicas: int) -> list[np.ndarray]:
    """Split one global batch into ``replicas`` contiguous shards of near-equal size."""
    if replicas < 1:
        raise ClusterError(f"replicas must be at least 1, got {replicas}")
    if len(index) < replicas:
        raise ClusterError(f"a batch of {len(index)} examples cannot be split across {replicas} replicas")
    return np.array_split(index, replicas)


PHASES = ("grad", "reduce", "update", "metrics", "host", "allreduce")
_TASK_NAME = re.compile(rf"^(?P<graph>.+)-(?P<phase>{'|'.join(PHASES)})-(?P<step>\d+)(?:-(?P<rest>.*))?$")


def task_name(graph: str, phase: str, step: int, *rest) -> str:
    """``<graph>-<phase>-<step>[-<rest>]``: a training task's name (see :func:`key_label`).

    >>> task_name("mlp", "grad", 12, "r0")
    'mlp-grad-12-r0'
    >>> from dask.utils import key_split
    >>> key_split(("mlp-grad-12-r0", "9f2c41d7"))
    'mlp-grad'
    """
    return "-".join([graph, phase, str(step), *map(str, rest)])


class TaskName(NamedTuple):
    graph: str
    phase: str
    step: int
    rest: str


def task_key(graph: str, phase: str, step: int | str, *rest, token: str) -> tuple[str, str, str]:
    """The key of a training task: ``("<graph>-<phase>", "<step>[-<rest>]", token)``.

    The step is in the second element, so that the scheduler makes one task group per phase of a
    fit (it groups tuple keys by their first element), not one per task kept for its whole life; the
    prefix the dashboard shows is the phase's, as before.

    >>> from dask.utils import key_split
    >>> from distributed.utils import key_split_group
    >>> key = task_key("mlp", "grad", 12, "r0", token="9f2c41d7")
    >>> key, key_split(key), key_split_group(key)
    (('mlp-grad', '12-r0', '9f2c41d7'), 'mlp-grad', 'mlp-grad')
    """
    return (f"{graph}-{phase}", "-".join([str(step), *map(str, rest)]), token)


def key_label(key) -> str:
    """A training task's key as one name, ``<graph>-<phase>-<step>[-<rest>]`` (other keys: their first part).

    >>> key_label(task_key("mlp", "update", 3, token="9f2c41d7"))
    'mlp-update-3'
    """
    if isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key):
        return f"{key[0]}-{key[1]}"
    return str(key[0] if isinstance(key, tuple) and key else key)


def parse_key(key) -> TaskName | None:
    """What a training task's key says (graph, phase, step, rest), or None for other keys.

    >>> parse_key(task_key("mlp", "reduce", 12, 1, 0, token="9f2c41d7"))
    TaskName(graph='mlp', phase='reduce', step=12, rest='1-0')
    """
    name = key_label(key) if isinstance(key, tuple) and key else key
    match = _TASK_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        return None
    return TaskName(match["graph"], match["phase"], int(match["step"]), match["rest"] or "")


def step_keys(name: str, step: int, replicas: int, token: str) -> dict[str, Any]:
    """The keys of one step's tasks (and ``reduce(depth, index)``, the key of a reduction)."""
    return {
        "grads": [task_key(name, "grad", step, f"r{i}", token=token) for i in range(replicas)],
        "update": task_key(name, "update", step, token=token),
        "metrics": task_key(name, "metrics", step, token=token),
        "reduce": lambda depth, index: task_key(name, "reduce", step, depth, index, token=token),
    }


def replica_tasks(
    program, state, data, index: np.ndarray, shards_: int, weight, name: str, step: int, token: str, delays=None
):
    """The replica tasks of one step: one per shard, each the forward and backward pass of its rows.

    ``weight(part)`` scales a shard's gradient (its share of the global batch); each task
    also gets where its shard starts in the batch (random ops key their draws by global row);
    ``delays``: each replica's injected delay (``fit(stragglers=...)``).
    """
    keys = step_keys(name, step, shards_, token)
    tasks, offset = {}, 0
    for i, (key, part) in enumerate(zip(keys["grads"], shards(index, shards_))):
        sources = data(part) if callable(data) else data
        late = {"replica": i, "delay": float(delays[i])} if delays is not None else {"replica": i}
        tasks[key] = Task(key, replica_gradients, program, state, part, weight(part), offset, *sources, **late)
        offset += len(part)
    return tasks, keys


def combine_tasks(program, state, replicas: list, keys: dict, token: str) -> dict:
    """The fixed-order reduction tree over ``replicas`` (refs, in replica order), the update and the metrics."""
    tasks: dict = {}
    level, depth = list(replicas), 0
    while len(level) > 1:  # fixed pairwise tree: (r0 + r1) + (r2 + r3) ...
        depth += 1
        nxt = []
        for j in range(0, len(level) - 1, 2):
            key = keys["reduce"](depth, j // 2)
            tasks[key] = Task(key, reduce_pair, level[j], level[j + 1])
            nxt.append(TaskRef(key))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    root = level[0]
    tasks[keys["update"]] = Task(keys["update"], apply_update, program, state, root)
    tasks[keys["metrics"]] = Task(keys["metrics"], step_metrics, root, TaskRef(keys["update"]))
    return tasks


def step_tasks(
    program: Any,
    state: Any,
    data,
    index: np.ndarray,
    replicas: int,
    name: str,
    step: int,
    token: str,
) -> tuple[dict, dict]:
    """The tasks of one synchronous step.

    ``data`` holds one source per placeholder of the program's feeds, in order
    (or is a function of a shard's rows that returns them).
    ``program``, ``state`` and the data sources may be literal values,
    ``TaskRef``s or Futures; the returned dict maps keys to ``Task``s. The
    shard weights make the reduced gradient the gradient of the global batch's
    loss: each shard's share of the rows for a loss that is a mean over them,
    1 for a sum (the program's ``loss_reduction``).
    """
    total = len(index)
    tasks, keys = replica_tasks(
        program, state, data, index, replicas, lambda part: len(part) / total, name, step, token
    )
    tasks.update(combine_tasks(program, state, [TaskRef(k) for k in keys["grads"]], keys, token))
    return tasks, keys


def allreduce_key(name: str, step: int | str, rank: int, token: str) -> tuple[str, str, str]:
    """The key of rank ``rank``'s task of step ``step`` (``"start"``: the task placing its replica).

    >>> from dask.utils import key_split
    >>> key = allreduce_key("mlp", 12, 0, "9f2c41d7")
    >>> key, key_split(key)
    (('mlp-allreduce', '12-r0', '9f2c41d7'), 'mlp-allreduce')
    """
    if step == "start":  # its own prefix on the dashboard, as before
        return (f"{name}-allreduce-start", f"r{rank}", token)
    return task_key(name, "allreduce", step, f"r{rank}", token=token)


def allreduce_calls(
    name: str,
    token: str,
    step: int,
    index: np.ndarray,
    ranks: int,
    started: list,
    sync: bool,
    reduction: str = "mean",
):
    """The ``(key, arguments of run_step)`` of one all-reduce step's ``ranks`` tasks.

    Rank ``i`` trains on shard ``i`` of ``index``. ``reduction`` is how the loss reduces over the
    batch's rows (the program's ``loss_reduction``). A mean: each gradient goes into its bucket
    multiplied by its shard's share of the rows and the buckets are summed as they are, so the
    ``"allreduce"`` strategy function (``wb.all_reduce(g * r.weight)``) gives the same bits at every
    R. A sum: the gradients are summed as they are. Mean fetches
    are weighted by the shard's share; rank 0 brings the variables home when ``sync``.
    ``started[i]``: rank ``i``'s start task (a future or a ref), for the order.
    """
    if reduction not in ("mean", "sum"):
        raise ClusterError(f"a loss reduction is 'mean' or 'sum', not {reduction!r}")
    parts = shards(index, ranks)
    total, scale = len(index), None
    calls, offset = [], 0
    for i, part in enumerate(parts):
        weight = 1.0 if reduction == "sum" or ranks == 1 else len(part) / total
        args = (token, step, part, offset, weight, scale, len(part) / total, sync and i == 0, started[i])
        calls.append((allreduce_key(name, step, i, token), args))
        offset += len(part)
    return calls


def _allreduce_tasks(
    dsk: dict,
    program,
    variables: dict,
    data_refs: list,
    index_of,
    replicas: int,
    name: str,
    steps: int,
    token: str,
    bucket_bytes: int = 4 << 20,
    reduction: str = "mean",
) -> tuple[list, int]:
    """Add the all-reduce strategy's tasks of ``steps`` steps to ``dsk``; the per-step keys of rank 0 and R."""
    from workbench.cluster.collective.group import CollectiveGroup

    group = CollectiveGroup(token, tuple(f"rank-{i}" for i in range(replicas)))  # the engine's names the workers
    dsk[("group", token)] = DataNode(("group", token), group)
    dsk[("variables-0", token)] = DataNode(("variables-0", token), dict(variables))
    started = []
    for i in range(replicas):
        key = allreduce_key(name, "start", i, token)
        refs = (TaskRef(("group", token)), bucket_bytes, *data_refs)
        dsk[key] = Task(key, start_replica, program, TaskRef(("variables-0", token)), 0, *refs)
        started.append(TaskRef(key))
    firsts = []
    for step, index in enumerate(index_of, 1):
        calls = allreduce_calls(name, token, step, index, replicas, started, step == steps, reduction)
        for key, args in calls:
            dsk[key] = Task(key, run_step, *args)
        firsts.append(allreduce_key(name, step, 0, token))
    return firsts, replicas


@dataclass
class Lowered:
    """A lowered training run: ``dsk`` is a plain Dask graph (``key -> Task``).

    Compute it with any Dask scheduler, e.g. ``dask.get(lowered.dsk, [lowered.state_key])``
    or ``client.get(lowered.dsk, lowered.metric_keys)``.
    """

    dsk: dict
    state_key: Any
    metric_keys: list
    tasks_per_step: int
    program: TrainingProgram

    def __len__(self) -> int:
        return len(self.dsk)


def lower(
    graph: Graph,
    train,
    data: dict,
    batch_size: int,
    replicas: int = 1,
    steps: int = 1,
    fetches=(),
    variables: dict | None = None,
    seed: int = 0,
    batch_seed=None,
    device: str = "cpu",
    device_options: dict | None = None,
    strategy: str = "parameter_server",
) -> Lowered:
    """Lower ``steps`` of synchronous data-parallel training to a Dask task graph.

    Parameters
    ----------
    graph, train : the graph and its optimizer update operation.
    data : dict of placeholder name (or tensor) to NumPy array.
    batch_size : the global batch, split across ``replicas``.
    fetches : tensors each replica computes (their weighted sum is in the metrics).
    variables : starting values (default: the graph's initializers with ``seed``).
    batch_seed : what seeds the batch order (default ``seed``).
    device, device_options : where workers run the plans (see :class:`TrainingProgram`).
    strategy : ``"parameter_server"`` (``2R + 1`` tasks a step; computable with any Dask
        scheduler) or ``"allreduce"`` (``R`` tasks a step and one start task per replica,
        for inspection: its tasks run on workers of a collective, placed by ``fit``; the
        state key is the last step's rank 0, whose result holds the variables).

    Examples
    --------
    >>> import dask, numpy as np, workbench as wb
    >>> g = wb.Graph(name="lin")
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(None, 2))
    ...     w = wb.variable("w", shape=(2,), init="zeros")
    ...     loss = wb.mean((wb.sum(x * w, axis=1) - 1.0) ** 2)
    ...     train = wb.optimizers.SGD(0.1).minimize(loss)
    >>> low = wb.cluster.lower(g, train, {"x": np.ones((8, 2))}, batch_size=4, replicas=2, steps=3)
    >>> low.tasks_per_step
    5
    >>> state = dask.get(low.dsk, [low.state_key])[0]
    >>> state["step"], state["variables"]["w"].round(3).tolist()
    (3, [0.392, 0.392])
    """
    program = TrainingProgram.from_graph(
        graph, train, _names(fetches), seed=seed, device=device, device_options=device_options
    )
    arrays = {_name(k): np.asarray(v) for k, v in data.items()}
    missing = set(program.feeds) - set(arrays)
    if missing:
        raise ClusterError(f"data lacks the placeholders {sorted(missing)} that the gradients need")
    n = check_data(arrays)
    if variables is None:
        variables = {v: initial_value(v, graph.operation(v).attrs, seed) for v in program.state_variables}
    if strategy not in ("parameter_server", "allreduce"):
        raise ClusterError(f"cannot lower strategy {strategy!r}; use 'parameter_server' or 'allreduce'")
    name, token = graph.name, uuid.uuid4().hex[:8]
    dsk: dict = {("program", token): DataNode(("program", token), program)}
    for key in arrays:
        dsk[("data", key, token)] = DataNode(("data", key, token), arrays[key])
    data_refs = [TaskRef(("data", key, token)) for key in program.feeds]
    batches = batch_indices(n, batch_size, steps, seed if batch_seed is None else batch_seed)
    if strategy == "allreduce":
        ref, reduction = TaskRef(("program", token)), program.loss_reduction
        firsts, per_step = _allreduce_tasks(
            dsk, ref, variables, data_refs, batches, replicas, name, steps, token, reduction=reduction
        )
        return Lowered(dsk, firsts[-1], firsts, per_step, program)
    dsk[("state-0", token)] = DataNode(("state-0", token), initial_state(variables))
    state = TaskRef(("state-0", token))
    metrics, per_step = [], 0
    for step, index in enumerate(batches, 1):
        tasks, keys = step_tasks(TaskRef(("program", token)), state, data_refs, index, replicas, name, step, token)
        dsk.update(tasks)
        per_step = len(tasks)
        state = TaskRef(keys["update"])
        metrics.append(keys["metrics"])
    return Lowered(dsk, state.key, metrics, per_step, program)


def _name(key) -> str:
    return key if isinstance(key, str) else key.name


def _names(fetches) -> list[str]:
    return [_name(f) for f in (fetches or ())]
