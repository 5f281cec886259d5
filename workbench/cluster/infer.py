"""Sharded inference: ``sess.run(logits, feed_dict={x: dask_array})`` maps over the chunks.

Each chunk of the fed dask arrays (along the first axis) becomes one task that
runs the compiled plan on it with the session's current variables (sent once,
as one shared key); the result is a dask array per fetch, lazily, with the
same chunks along the first axis. The client ships the graph already pruned
and optimized; a worker compiles it once for the session's kind of device (a
GPU session's chunks run on each worker's GPU) through the one plan compiler.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from workbench.cluster.program import worker_device
from workbench.cluster.worker_plans import open_worker_device
from workbench.errors import FeedError, GraphError
from workbench.graph.compile import PlanCache, compile_plan
from workbench.graph.core import Graph, Tensor
from workbench.graph.plan import Plan
from workbench.ops import rules


@dataclass(frozen=True)
class InferenceProgram:
    """What every chunk task runs: the graph already pruned and optimized for the fetches
    (workers only compile it for their device), as JSON."""

    graph_json: str
    fetches: tuple
    feeds: tuple  # placeholders fed chunk by chunk, in argument order
    constants: tuple  # placeholders fed the same value for every chunk
    seed: int = 0
    digest: str = field(default="", compare=False)
    device: str = "cpu"  # "cpu" or "gpu": the session's device kind, opened on the worker
    device_options: tuple = ()


#: Plans of the inference programs this process has run, by digest.
PLANS = PlanCache(maxsize=32)


def _compile(program: InferenceProgram) -> Plan:
    device = open_worker_device(program.device, program.device_options)
    graph = Graph.from_json(program.graph_json)
    fed = [*program.feeds, *program.constants]
    return compile_plan(graph, list(program.fetches), fed, device, seed=program.seed, optimized=True)


def run_chunk(program: InferenceProgram, variables: dict, constants: tuple, *chunks) -> tuple:
    """The fetches for one chunk of the fed arrays (NumPy, whatever the device)."""
    plan = PLANS.get(program.digest, lambda: _compile(program))
    device = open_worker_device(program.device, program.device_options)
    # every chunk of a program sets the same names: no clear(), which would race with
    # chunks running in other threads of this process
    plan.state.update({n: device.put(np.asarray(v)) for n, v in variables.items()})
    values = dict(zip(program.feeds, chunks))
    values.update(zip(program.constants, constants))
    fetched = device.run(plan, [device.put(np.asarray(values[name])) for name in plan.feed_names])
    return tuple(np.asarray(device.to_host(v)) for v in fetched)


def run_whole(program: InferenceProgram, variables: dict, *arrays) -> tuple:
    """The fetches on whole arrays (one per ``program.constants``): a task of ``fit``'s validation."""
    return run_chunk(program, variables, arrays)


def inference_program(
    graph: Graph, fetches: tuple, chunked: tuple, constants: tuple, seed: int, device: tuple
) -> InferenceProgram:
    """The program of ``graph`` (pruned and optimized already) for ``fetches``, fed ``chunked``
    placeholders chunk by chunk and ``constants`` whole; ``device`` is the session's ``(kind, options)``."""
    text = graph.to_json()
    kind, options = worker_device(*device)
    digest = hashlib.sha1("\0".join([text, *fetches, *chunked, *constants, kind, repr(options)]).encode()).hexdigest()[
        :16
    ]
    return InferenceProgram(text, fetches, chunked, constants, seed, digest, kind, options)


def run_sharded(
    graph: Graph, fetches: list[Tensor], feeds: dict, variables: dict, seed: int = 0, device: tuple = ("cpu", {})
) -> list:
    """Dask arrays of ``fetches`` computed chunk by chunk; ``feeds`` maps placeholder names to
    dask arrays (split along axis 0) or to arrays used whole for every chunk.

    ``graph`` is already pruned and optimized for the fetches; ``device`` is the
    session's ``(kind, options)``, opened on whichever worker runs a chunk.
    """
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
    names = tuple(t.name for t in fetches)
    program = inference_program(graph, names, tuple(chunked), tuple(constants), seed, device)
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
