"""What workers run: a training graph split into a replica part and an update part.

A :class:`TrainingProgram` is plain data (the graph as JSON plus names), sent to
the workers once. Each worker process compiles it into two plans the first time
it sees it and keeps them: the **replica** plan computes the gradients (and the
fetches) of one shard, the **update** plan applies the optimizer to reduced
gradients. The task functions below are what the Dask graph calls.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.errors import ClusterError, GraphError
from workbench.graph.core import Graph, Operation
from workbench.graph.passes import optimize
from workbench.graph.plan import Plan


@dataclass(frozen=True)
class TrainingProgram:
    """A training step of a graph, split for data-parallel execution.

    Attributes
    ----------
    graph_json : str
        The whole graph (see :meth:`Graph.to_json`); workers rebuild it, never unpickle it.
    train : str
        The update operation (``optimizer.minimize(...)``).
    feeds : tuple of str
        Placeholders fed with each shard's rows.
    gradients : tuple of str
        Gradient tensors, cut between the replica and the update part.
    fetches : tuple of str
        Tensors each replica also computes (the loss, metrics).
    replica_variables, state_variables : tuple of str
        Variables the replicas read; every variable the update reads or writes.
    seed : int
    """

    graph_json: str
    train: str
    feeds: tuple
    gradients: tuple
    fetches: tuple
    replica_variables: tuple
    state_variables: tuple
    seed: int = 0
    digest: str = field(default="", compare=False)

    @classmethod
    def from_graph(cls, graph: Graph, train, fetches=(), seed: int = 0) -> TrainingProgram:
        """Split ``graph`` at the gradients that the optimizer behind ``train`` recorded."""
        train_name = train.name if isinstance(train, Operation) else train.op.name if hasattr(train, "op") else str(train)
        record = graph.training.get(train_name)
        if record is None:
            known = ", ".join(repr(n) for n in graph.training) or "none"
            raise ClusterError(
                f"{train_name!r} is not an optimizer update; distributed training needs the operation "
                f"returned by optimizer.minimize() or apply_gradients() (this graph has: {known})"
            )
        gradients = tuple(g for g, _ in record["gradients"])
        fetches = tuple(fetches)
        replica = optimize(graph, list(gradients) + list(fetches), fed=[p.name for p in graph.placeholders])
        update = optimize(graph, [train_name], fed=gradients)
        fed_to_update = {op.name for op in update.operations if op.type == "placeholder"} - {
            graph.get(g).op.name for g in gradients
        }
        if fed_to_update:
            raise ClusterError(
                f"the update of {train_name!r} depends on placeholders {sorted(fed_to_update)}; "
                "only the gradients may depend on the data"
            )
        feeds = tuple(op.name for op in replica.operations if op.type == "placeholder")
        replica_vars = tuple(op.name for op in replica.operations if op.type == "variable")
        state_vars = tuple(sorted({op.name for op in update.operations if op.type == "variable"} | set(replica_vars)))
        text = graph.to_json()
        digest = hashlib.sha1(
            "\0".join([text, train_name, *feeds, *gradients, *fetches, str(seed)]).encode()
        ).hexdigest()[:16]
        return cls(text, train_name, feeds, gradients, fetches, replica_vars, state_vars, seed, digest)


class _Compiled:
    """The two plans of a program in one worker process, each with its own state dict."""

    def __init__(self, program: TrainingProgram):
        graph = Graph.from_json(program.graph_json)
        self.replica_state: dict[str, Any] = {}
        self.update_state: dict[str, Any] = {}
        fetches = list(program.gradients) + list(program.fetches)
        replica = optimize(graph, fetches, fed=program.feeds)
        self.replica = Plan(replica, fetches, list(program.feeds), np, self.replica_state, program.seed)
        update = optimize(graph, [program.train], fed=program.gradients)
        order = [op.name for op in update.operations if op.type == "placeholder"]
        names = {graph.get(g).op.name: i for i, g in enumerate(program.gradients)}
        self.update_order = [names[n] for n in order]
        self.update = Plan(update, [program.train], order, np, self.update_state, program.seed)


_COMPILED: dict[str, _Compiled] = {}


def compiled(program: TrainingProgram) -> _Compiled:
    found = _COMPILED.get(program.digest)
    if found is None:
        if len(_COMPILED) > 16:  # programs of finished runs
            _COMPILED.clear()
        found = _COMPILED[program.digest] = _Compiled(program)
    return found


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return "local"


# -- the task functions -------------------------------------------------------------------


def take_rows(source, index: np.ndarray) -> np.ndarray:
    """Rows ``index`` of a data source: an array, or ``(offsets, chunks)`` of a chunked one."""
    if isinstance(source, np.ndarray):
        return source[index]
    offsets, chunks = source
    pieces = []
    for offset, chunk in zip(offsets, chunks):
        mine = index[(index >= offset) & (index < offset + len(chunk))]
        if len(mine):
            pieces.append(chunk[mine - offset])
    return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def replica_gradients(
    program: TrainingProgram, state: dict, index: np.ndarray, weight: float, offset: int, *data
) -> dict:
    """One replica's shard: gradients scaled by the shard's share of the global batch.

    ``offset`` is where the shard starts in the global batch; ``data`` holds one
    source per placeholder of ``program.feeds``, in order.
    """
    started = time.perf_counter()
    plan = compiled(program)
    variables = state["variables"]
    plan.replica_state.clear()
    plan.replica_state.update({n: variables[n] for n in program.replica_variables})
    rows = [take_rows(source, index) for source in data]
    plan.replica.run_count = state["step"]  # random ops (dropout) draw per step
    plan.replica.row_offset = offset  # and per row of the global batch, however it is split
    values = plan.replica.run(rows)
    n = len(program.gradients)
    grads = [np.multiply(g, weight, dtype=g.dtype) for g in values[:n]]
    fetches = [np.asarray(v) * weight for v in values[n:]]
    return {
        "grads": grads,
        "fetches": fetches,
        "compute": {_worker_address(): time.perf_counter() - started},
        "reduce_seconds": 0.0,
        "shards": 1,
    }


def reduce_pair(a: dict, b: dict) -> dict:
    """The sum of two replicas' (or partial sums') results; always ``a`` first."""
    started = time.perf_counter()
    grads = [x + y for x, y in zip(a["grads"], b["grads"])]
    fetches = [x + y for x, y in zip(a["fetches"], b["fetches"])]
    compute = dict(a["compute"])
    for worker, seconds in b["compute"].items():
        compute[worker] = compute.get(worker, 0.0) + seconds
    return {
        "grads": grads,
        "fetches": fetches,
        "compute": compute,
        "reduce_seconds": a["reduce_seconds"] + b["reduce_seconds"] + time.perf_counter() - started,
        "shards": a["shards"] + b["shards"],
    }


def apply_update(program: TrainingProgram, state: dict, reduced: dict) -> dict:
    """The optimizer step: the new values of every variable (slots included)."""
    started = time.perf_counter()
    plan = compiled(program)
    plan.update_state.clear()
    plan.update_state.update(state["variables"])
    grads = reduced["grads"]
    plan.update.run([grads[i] for i in plan.update_order])
    return {
        "variables": dict(plan.update_state),
        "step": state["step"] + 1,
        "update_seconds": time.perf_counter() - started,
        "update_worker": _worker_address(),
    }


def step_metrics(reduced: dict, new_state: dict) -> dict:
    """What the client reads each step: small numbers only, never the variables."""
    return {
        "fetches": [f.item() if f.ndim == 0 else f for f in (np.asarray(v) for v in reduced["fetches"])],
        "compute": reduced["compute"],
        "reduce_seconds": reduced["reduce_seconds"],
        "update_seconds": new_state["update_seconds"],
        "update_worker": new_state["update_worker"],
        "shards": reduced["shards"],
        "step": new_state["step"],
    }


def initial_state(variables: dict, step: int = 0) -> dict:
    return {"variables": dict(variables), "step": step}


def check_fetches(graph: Graph, fetches) -> list[str]:
    names = []
    for f in fetches:
        name = f if isinstance(f, str) else f.name
        found = graph.get(name)
        if isinstance(found, Operation):
            raise GraphError(f"{name!r} is an operation; fit() records tensors")
        names.append(found.name)
    return names
