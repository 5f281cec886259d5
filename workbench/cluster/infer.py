"""Sharded inference: ``sess.run(logits, feed_dict={x: dask_array})`` maps over the chunks.

Each chunk of the fed dask arrays (along the first axis) becomes one task that
runs the compiled plan on it with the session's current variables (sent once,
as one shared key); the result is a dask array per fetch, lazily, with the
same chunks along the first axis.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import FeedError, GraphError
from workbench.graph.core import Graph, Tensor
from workbench.graph.passes import optimize
from workbench.graph.plan import Plan
from workbench.ops import rules


@dataclass(frozen=True)
class InferenceProgram:
    graph_json: str
    fetches: tuple
    feeds: tuple  # placeholders fed chunk by chunk, in argument order
    constants: tuple  # placeholders fed the same value for every chunk
    seed: int = 0
    digest: str = field(default="", compare=False)


_PLANS: dict[str, tuple[Plan, dict]] = {}


def _plan(program: InferenceProgram) -> tuple[Plan, dict]:
    found = _PLANS.get(program.digest)
    if found is None:
        graph = Graph.from_json(program.graph_json)
        fed = list(program.feeds) + list(program.constants)
        optimized = optimize(graph, list(program.fetches), fed=fed)
        order = [op.name for op in optimized.operations if op.type == "placeholder"]
        state: dict = {}
        found = _PLANS[program.digest] = (Plan(optimized, list(program.fetches), order, np, state, program.seed), state)
        if len(_PLANS) > 32:
            _PLANS.pop(next(iter(_PLANS)))
    return found


def run_chunk(program: InferenceProgram, variables: dict, constants: tuple, *chunks) -> tuple:
    """The fetches for one chunk of the fed arrays."""
    plan, state = _plan(program)
    state.clear()
    state.update(variables)
    values = dict(zip(program.feeds, chunks))
    values.update(zip(program.constants, constants))
    order = [op.name for op in plan.graph.operations if op.type == "placeholder"]
    return tuple(np.asarray(v) for v in plan.run([values[name] for name in order]))


def run_sharded(graph: Graph, fetches: list[Tensor], feeds: dict, variables: dict, seed: int = 0) -> list:
    """Dask arrays of ``fetches`` computed chunk by chunk; ``feeds`` maps placeholder names to
    dask arrays (split along axis 0) or to arrays used whole for every chunk."""
    import dask
    import dask.array as da

    chunked = {k: v for k, v in feeds.items() if hasattr(v, "chunks") and hasattr(v, "to_delayed")}
    constants = {k: np.asarray(v) for k, v in feeds.items() if k not in chunked}
    for t in fetches:
        if t.shape is None or not t.shape or t.shape[0] is not None or None in t.shape[1:]:
            raise GraphError(
                f"cannot compute {t.name!r} chunk by chunk: its shape {rules.fmt(t.shape or ())} needs an unknown "
                "first (batch) axis and known other axes"
            )
    first = next(iter(chunked.values()))
    lengths = first.chunks[0]
    arrays = []
    for name, value in chunked.items():
        if value.shape[0] != first.shape[0]:
            raise FeedError(f"placeholder {name!r} gets {value.shape[0]} rows, but others get {first.shape[0]}")
        arrays.append(value.rechunk({0: lengths, **{i: -1 for i in range(1, value.ndim)}}))
    text = graph.to_json()
    names = tuple(t.name for t in fetches)
    digest = hashlib.sha1("\0".join([text, *names, *chunked, *constants]).encode()).hexdigest()[:16]
    program = InferenceProgram(text, names, tuple(chunked), tuple(constants), seed, digest)
    shared_program = dask.delayed(program, pure=True)
    shared_variables = dask.delayed(variables, pure=False)
    shared_constants = dask.delayed(tuple(constants.values()), pure=True)
    per_chunk = [
        dask.delayed(run_chunk, pure=True)(shared_program, shared_variables, shared_constants, *blocks)
        for blocks in zip(*[a.to_delayed().ravel() for a in arrays])
    ]
    outputs = []
    for j, t in enumerate(fetches):
        parts = [
            da.from_delayed(chunk[j], shape=(n, *t.shape[1:]), dtype=np.dtype(t.dtype))
            for chunk, n in zip(per_chunk, lengths)
        ]
        outputs.append(da.concatenate(parts, axis=0))
    return outputs
