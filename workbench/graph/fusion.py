"""Elementwise fusion: a pure pass that merges trees of elementwise ops into one op.

A *group* is a tree of elementwise ops whose inner results have exactly one
consumer, the next op of the group: bias add then activation, the Adam moment
and step updates, the elementwise part of a gradient. Each group of two or more
ops becomes one ``fused_elementwise`` op (see :mod:`workbench.ops.fused`) that
keeps the name of the group's last op, so its consumers and fetches still find
it. Inner ops disappear, scalar constants are written into the program, and
everything else (matmul, reductions, variable updates) is left as it is.

>>> import workbench as wb
>>> from workbench.graph.fusion import fuse_elementwise
>>> g = wb.Graph()
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 3))
...     b = wb.variable("b", shape=(3,), init="zeros")
...     y = wb.relu(x * 2.0 + b, name="y")
>>> fused = fuse_elementwise(g, keep=["y"])
>>> [op.type for op in fused.operations]
['placeholder', 'variable', 'fused_elementwise']
>>> [step[0] for step in fused.operation("y").attrs["program"]]
['constant', 'multiply', 'add', 'relu']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from workbench.graph.core import Graph, Operation, Tensor
from workbench.ops.fused import FUSED

#: Ops that are elementwise for fusion though the registry does not flag them
#: (their output at i depends on nothing, or only on input i).
ALSO_ELEMENTWISE = frozenset({"zeros_like", "ones_like", "identity", "stop_gradient"})


def fusable(op: Operation) -> bool:
    """Whether ``op`` may be part of a fused group at all."""
    opdef = op.opdef
    if opdef.stateful or opdef.random or opdef.kernel is None or len(op.outputs) != 1 or op.type == FUSED:
        return False
    return opdef.elementwise or op.type in ALSO_ELEMENTWISE


def fuse_elementwise(
    graph: Graph,
    keep: Iterable[str] = (),
    supported: Callable[[Operation], bool] | None = None,
    min_ops: int = 2,
) -> Graph:
    """A copy of ``graph`` with each maximal elementwise group of ``min_ops`` or more ops fused.

    Parameters
    ----------
    graph : Graph
    keep : names of tensors or operations that must stay visible (the fetches):
        they end groups instead of disappearing inside one.
    supported : optional predicate; ops it rejects stay unfused (a device whose
        kernel generator lacks an expression for them).
    min_ops : the smallest group worth fusing.
    """
    ok = (lambda op: fusable(op) and supported(op)) if supported is not None else fusable
    uses = _uses(graph)
    kept = {_resolve(graph, name) for name in keep}
    controlled = {c for op in graph.operations for c in op.control_inputs}

    def inner(op: Operation) -> Operation | None:
        """The one op of the graph that consumes ``op``'s output, when ``op`` may hide inside it."""
        if not ok(op) or op.name in kept or op in controlled:
            return None
        users = {u for u, _ in uses.get(op.outputs[0], ())}
        return users.pop() if len(users) == 1 else None

    groups: dict[Operation, list[Operation]] = {}
    owner: dict[Operation, Operation] = {}
    for op in reversed(graph.operations):
        if op in owner or not ok(op):
            continue
        members = _collect(op, inner, ok)
        if len(members) >= min_ops:
            groups[op] = sorted(members, key=lambda o: o.index)
            owner.update(dict.fromkeys(members, op))

    programs = {root: _program(members) for root, members in groups.items()}
    inlined = _dead_constants(programs, owner, uses, kept, controlled)
    return _rebuild(graph, groups, owner, programs, inlined)


def _collect(root: Operation, inner, ok) -> list[Operation]:
    members, stack = [root], [root]
    while stack:
        op = stack.pop()
        for t in op.inputs:
            child = t.op
            if child not in members and ok(child) and inner(child) is op:
                members.append(child)
                stack.append(child)
    return members


def _scalar_constant(t: Tensor):
    """The value of a finite 0-d constant (written into programs), else None."""
    if t.op.type != "constant" or t.shape != ():
        return None
    value = t.op.attrs["value"]
    item = value.item()
    if isinstance(item, float) and not math.isfinite(item):
        return None
    return item if value.dtype != np.bool_ else bool(item)


def _program(members: list[Operation]):
    """(program, input tensors, inlined constant tensors) of a group, members in graph order."""
    inside = set(members)
    inputs: list[Tensor] = []
    for op in members:
        for t in op.inputs:
            if t.op not in inside and t not in inputs and _scalar_constant(t) is None:
                inputs.append(t)
    if not inputs:  # a program needs at least one array to take its shape from
        inputs.append(next(t for op in members for t in op.inputs if t.op not in inside))
    ref = {t: i for i, t in enumerate(inputs)}
    steps, inlined = [], []
    for op in members:
        refs = []
        for t in op.inputs:
            if t not in ref:  # a scalar constant: one step that makes it
                inlined.append(t)
                steps.append(("constant", (), (("value", _scalar_constant(t)),), t.dtype))
                ref[t] = len(inputs) + len(steps) - 1
            refs.append(ref[t])
        steps.append((op.type, tuple(refs), tuple(sorted(op.attrs.items())), op.outputs[0].dtype))
        ref[op.outputs[0]] = len(inputs) + len(steps) - 1
    return tuple(steps), inputs, inlined


def _dead_constants(programs, owner, uses, kept, controlled) -> set[Operation]:
    """Constants whose every use was written into a program."""
    dead = set()
    for _, _, inlined in programs.values():
        for t in inlined:
            if t.op.name in kept or t.op in controlled:
                continue
            if all(u in owner and t in programs[owner[u]][2] for u, _ in uses.get(t, ())):
                dead.add(t.op)
    return dead


def _rebuild(graph, groups, owner, programs, inlined) -> Graph:
    new = Graph(name=graph.name)
    tensors: dict[Tensor, Tensor] = {}
    copies: dict[Operation, Operation] = {}
    for op in graph.operations:
        if op in inlined or (op in owner and owner[op] is not op):
            continue
        if op in groups:
            program, inputs, _ = programs[op]
            control = _ordered({copies[c] for m in groups[op] for c in m.control_inputs if c in copies})
            copy = new.add_op(
                FUSED,
                tuple(tensors[t] for t in inputs),
                {"program": program},
                name=op.name,
                control_inputs=control,
                source=op.source,
            )
        else:
            control = [copies[c] for c in op.control_inputs if c in copies]
            inputs = tuple(tensors[t] for t in op.inputs)
            copy = new.add_op(op.type, inputs, op.attrs, name=op.name, control_inputs=control, source=op.source)
        copies[op] = copy
        tensors.update(zip(op.outputs, copy.outputs))
    new.set_aliases(graph.aliases)
    return new


def _ordered(ops_) -> list[Operation]:
    return sorted(ops_, key=lambda o: o.index)


def _uses(graph: Graph) -> dict[Tensor, list[tuple[Operation, int]]]:
    uses: dict[Tensor, list] = {}
    for op in graph.operations:
        for i, t in enumerate(op.inputs):
            uses.setdefault(t, []).append((op, i))
    return uses


def _resolve(graph: Graph, name: str) -> str:
    base = name.partition(":")[0]
    seen = set()
    while base in graph.aliases and base not in seen:
        seen.add(base)
        base = graph.aliases[base]
    return base
