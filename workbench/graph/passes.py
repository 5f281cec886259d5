"""Graph passes: pure functions from a graph to a new graph with the same names.

``prune`` keeps what the fetches need, ``bind_placeholders`` turns placeholders
into constants of given values (``bind_defaults``: the defaults of those not fed),
``fold_constants`` evaluates ops whose inputs are all constants (and picks the
branch of a ``where`` whose condition is a known scalar), ``eliminate_common_subexpressions`` merges ops that
compute the same thing (the removed names become aliases of the kept ones), and
``validate`` checks a graph's invariants; the tests run it after every pass.
``optimize`` chains them for a plan, with ``layout.fold_transposes`` (transposes that
cancel or that elementwise ops and reductions do without).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from workbench.errors import GraphError
from workbench.graph.core import Graph, Operation
from workbench.graph.layout import fold_transposes
from workbench.ops import registry, rules

FOLD_LIMIT = 1 << 16  # fold only results of at most this many elements


def rebuild(
    graph: Graph, keep: Callable[[Operation], bool] = lambda op: True, replace=None, merged: dict | None = None
) -> tuple[Graph, dict]:
    """A copy of ``graph`` with the ops that ``keep`` accepts, in order.

    ``replace(op, inputs)`` may return ``(type, inputs, attrs)`` to change an op
    (its name stays), or ``None`` to keep it. ``merged`` maps ops to an earlier op
    that computes the same: they are not copied, their consumers use that op's
    outputs and their names become aliases of it. Returns the new graph and a
    map from old to new tensors.
    """
    merged = merged or {}
    new = Graph(name=graph.name)
    tensors: dict = {}
    ops_: dict[Operation, Operation] = {}
    aliases = {a: graph.resolve(a) for a in graph.aliases}
    for op in graph.operations:
        if op in merged:
            kept = merged[op]
            tensors.update(zip(op.outputs, (tensors[t] for t in kept.outputs)))
            ops_[op] = ops_[kept]
            aliases[op.name] = kept.name
            continue
        if not keep(op):
            continue
        inputs = tuple(tensors.get(t) for t in op.inputs)  # None: cut away (the op must be replaced)
        kind, attrs = op.type, op.attrs
        if replace is not None:
            changed = replace(op, inputs)
            if changed is not None:
                kind, inputs, attrs = changed
        if None in inputs:
            raise GraphError(f"op {op.name!r} needs {op.inputs[inputs.index(None)].name!r}, which was removed")
        control = [ops_[c] for c in op.control_inputs if c in ops_]  # add_op drops repeats
        copy = new.add_op(kind, inputs, attrs, name=op.name, control_inputs=control, source=op.source)
        ops_[op] = copy
        tensors.update(zip(op.outputs, copy.outputs))
    new.set_aliases(aliases)  # no chains, and only names the new graph still has: each alias names a kept op
    return new, tensors


def needed_ops(graph: Graph, targets: Iterable[Operation], fed: Iterable[str] = ()) -> set[Operation]:
    """The operations that ``targets`` depend on through inputs and control inputs."""
    fed = set(fed)
    needed: set[Operation] = set()
    stack = list(targets)
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        if op.name in fed:
            continue
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return needed


def prune(graph: Graph, fetches: Iterable[str], fed: Iterable[str] = ()) -> Graph:
    """Only what the named fetches need, stopping at the fed ops.

    A fed op that is not a placeholder (a single-output op whose value is
    supplied, as distributed training does with gradients) becomes a
    placeholder of the same name, shape and dtype: the graph is cut there.
    """
    fed = {graph.get(name).op.name if ":" in name else graph.resolve(name) for name in fed}
    targets = [_op_of(graph, name) for name in fetches]
    needed = needed_ops(graph, targets, fed)

    def cut(op, inputs):
        if op.name not in fed or op.type == "placeholder":
            return None
        if len(op.outputs) != 1:
            raise GraphError(f"cannot feed {op.name!r}: it has {len(op.outputs)} outputs")
        spec = op.outputs[0].spec
        return "placeholder", (), {"shape": spec.shape, "dtype": spec.dtype}

    return rebuild(graph, keep=needed.__contains__, replace=cut)[0]


def bind_placeholders(graph: Graph, values: dict) -> Graph:
    """``graph`` with each placeholder named in ``values`` (name to array) replaced by a
    constant of that value, under the same name; the optimizer records are kept."""
    if not values:
        return graph

    def bind(op, inputs):
        if op.type != "placeholder" or op.name not in values:
            return None
        value = np.array(values[op.name], dtype=op.outputs[0].dtype)
        value.setflags(write=False)
        return "constant", (), {"value": value}

    new = rebuild(graph, replace=bind)[0]
    new.training, new.updates = dict(graph.training), dict(graph.updates)
    return new


def placeholder_defaults(graph: Graph, fed: Iterable[str] = ()) -> dict:
    """Name to default value of the placeholders of ``graph`` that have one and are not in ``fed``."""
    fed = {name.partition(":")[0] for name in fed}
    return {
        op.name: op.attrs["default"]
        for op in graph.operations
        if op.type == "placeholder" and op.attrs.get("default") is not None and op.name not in fed
    }


def bind_defaults(graph: Graph, fed: Iterable[str] = ()) -> Graph:
    """``graph`` with every placeholder that has a default and is not ``fed`` bound to its default."""
    return bind_placeholders(graph, placeholder_defaults(graph, fed))


def _chosen_branch(op: Operation, inputs):
    """For ``where(c, a, b)`` with ``c`` a constant scalar: ``a`` or ``b``, when it has the output's shape."""
    if op.type != "where" or inputs[0].op.type != "constant" or inputs[0].op.attrs["value"].ndim != 0:
        return None
    branch = inputs[1] if bool(inputs[0].op.attrs["value"]) else inputs[2]
    return branch if branch.spec == op.outputs[0].spec else None


def _foldable(op: Operation, inputs) -> bool:
    """Whether ``op`` (with ``inputs``, its already folded inputs) can become a constant."""
    opdef = op.opdef
    if opdef.stateful or opdef.random or opdef.collective or opdef.kernel is None or op.type == "constant":
        return False
    if len(op.outputs) != 1:
        return False
    if opdef.bodies:  # control flow: its bodies may draw random numbers, a new draw each run
        return False
    size = rules.num_elements(op.outputs[0].shape) if op.outputs[0].shape is not None else None
    if size is None or size > FOLD_LIMIT:
        return False
    if op.type in ("zeros_like", "ones_like"):  # the values of the input do not matter
        return True
    return all(t.op.type == "constant" for t in inputs)


def fold_constants(graph: Graph) -> Graph:
    """Replace ops whose value is known before the graph runs by constants."""

    def replace(op, inputs):
        branch = _chosen_branch(op, inputs)
        if branch is not None:
            return "identity", (branch,), {}
        if not _foldable(op, inputs):
            return None
        spec = op.outputs[0].spec
        if op.type in ("zeros_like", "ones_like"):
            value = (np.zeros if op.type == "zeros_like" else np.ones)(spec.shape, dtype=spec.dtype)
        else:
            arrays = [t.op.attrs["value"] for t in inputs]
            try:
                with np.errstate(all="ignore"):
                    value = op.opdef.kernel(np, *arrays, **op.attrs)
            except Exception:  # noqa: BLE001 - leave it to fail, with context, at run time
                return None
        value = np.array(value, dtype=spec.dtype)
        value.setflags(write=False)
        return "constant", (), {"value": value}

    return rebuild(graph, replace=replace)[0]


def _attrs_key(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _attrs_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_attrs_key(v) for v in value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    return value


def eliminate_common_subexpressions(graph: Graph, max_constant: int = 1024) -> Graph:
    """Merge ops of the same type, inputs and attributes; removed names become aliases."""
    seen: dict = {}
    merged: dict[Operation, Operation] = {}

    def key(op: Operation):
        opdef = op.opdef
        if opdef.stateful or opdef.random or opdef.collective or op.type in ("placeholder", "no_op"):
            return None  # a collective is a message each peer waits for: never merged away
        if op.type == "constant" and op.attrs["value"].size > max_constant:
            return None
        inputs = tuple((merged.get(t.op, t.op).name, t.index) for t in op.inputs)
        controls = tuple(sorted(merged.get(c, c).name for c in op.control_inputs))
        return op.type, inputs, controls, _attrs_key(op.attrs)

    for op in graph.operations:
        k = key(op)
        if k is None:
            continue
        if k in seen:
            merged[op] = seen[k]
        else:
            seen[k] = op

    return rebuild(graph, merged=merged)[0]


def optimize(graph: Graph, fetches: Iterable[str], fed: Iterable[str] = (), *, transposes: bool = True) -> Graph:
    """The passes a plan runs: prune, bind the defaults of placeholders not fed, fold constants,
    merge common subexpressions, fold transposes away (:func:`~workbench.graph.layout.fold_transposes`;
    not with ``transposes=False``), prune again."""
    fetches, fed = list(fetches), list(fed)
    graph = bind_defaults(prune(graph, fetches, fed), fed)
    graph = eliminate_common_subexpressions(fold_constants(graph))
    if transposes:
        graph = fold_transposes(graph, fetches)
    return prune(graph, fetches, fed)


def validate(graph: Graph) -> None:
    """Raise GraphError unless every op is registered, unique, in topological order
    and still passes its shape rule."""
    names: set[str] = set()
    position = {op: i for i, op in enumerate(graph.operations)}
    for i, op in enumerate(graph.operations):
        if op.type not in registry.REGISTRY:
            raise GraphError(f"op {op.name!r} has unknown type {op.type!r}")
        if op.name in names:
            raise GraphError(f"op name {op.name!r} is used twice")
        names.add(op.name)
        for t in op.inputs:
            if position.get(t.op, i) >= i:
                raise GraphError(f"op {op.name!r} uses {t.name!r}, which is not defined before it")
        for c in op.control_inputs:
            if position.get(c, i) >= i:
                raise GraphError(f"op {op.name!r} waits for {c.name!r}, which is not defined before it")
        specs = op.opdef.infer(*(t.spec for t in op.inputs), **op.attrs)
        specs = (specs,) if isinstance(specs, registry.TensorSpec) else tuple(specs)
        if tuple(t.spec for t in op.outputs) != specs:
            raise GraphError(f"op {op.name!r} has outputs {[t.spec for t in op.outputs]}, its rule says {list(specs)}")
    for alias, target in graph.aliases.items():
        if target not in names and target not in graph.aliases:
            raise GraphError(f"alias {alias!r} points to missing op {target!r}")


def _op_of(graph: Graph, name: str) -> Operation:
    found = graph.get(name)
    return found if isinstance(found, Operation) else found.op
