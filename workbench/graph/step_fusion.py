"""Passes that fold a training step's tail into few kernels (after :func:`fuse_elementwise`).

:func:`fuse_updates` turns the optimizer's updates into one ``fused_update`` op
per parameter group (see :mod:`workbench.ops.fused_train`). A *cluster* is the
updates of one parameter, with the elementwise op that computes each update's
value: Adam's ``m``, ``v`` and weight updates, Momentum's accumulator and
weight, SGD's weight alone (weight decay, clipping's scale and a dynamic loss
scale's finiteness flag are inputs like any other). Clusters whose programs
are the same, and whose one-element inputs are the same tensors, become the
*lanes* of one op: the whole Adam update of an MLP is one kernel.

:func:`fuse_cross_entropy` turns ``softmax_cross_entropy`` and its gradient
(when the loss is reduced by ``sum`` or ``mean``) into one
``softmax_cross_entropy_with_grad`` op.

>>> import workbench as wb
>>> from workbench.graph.passes import optimize
>>> g = wb.Graph()
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 3))
...     y = wb.placeholder("y", shape=(None,), dtype="int64")
...     w = wb.variable("w", shape=(3, 4))
...     b = wb.variable("b", shape=(4,), init="zeros")
...     loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w) + b, y), name="loss")
...     train = wb.optimizers.Adam(0.01).minimize(loss)
>>> step = fuse_step(optimize(g, [train.name]), keep=[train.name])
>>> [op.type for op in step.operations if op.opdef.stateful and op.type != "variable"]
['assign_add', 'fused_update']
>>> [op.type for op in step.operations if "cross_entropy" in op.type]
['softmax_cross_entropy_with_grad']
>>> [op.attrs["lanes"] for op in step.operations if op.type == "fused_update"]
[2]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable

from workbench.graph.core import Graph, Operation, Tensor
from workbench.graph.fusion import _resolve, _uses, fusable, fuse_elementwise
from workbench.ops.fused import FUSED
from workbench.ops.fused_train import FUSED_UPDATE, SCE_WITH_GRAD

#: Updates a cluster may hold, and the program step that combines variable and value.
UPDATE_STEPS = {"assign": None, "assign_add": "add", "assign_sub": "subtract"}


@dataclass
class Contraction:
    """Ops of the old graph that become one op, emitted where ``at`` was."""

    at: Operation
    type: str
    inputs: list[Tensor]
    attrs: dict
    name: str
    absorbed: list[Operation]
    outputs: dict[Tensor, int]  # old tensors the new op's outputs stand for
    hoist: list[Operation] = field(default_factory=list)  # ops (after ``at``) the new op needs first


def contract(graph: Graph, contractions: list[Contraction]) -> Graph:
    """A copy of ``graph`` with each contraction's ops replaced by its one op."""
    at = {c.at: c for c in contractions}
    absorbed = {op for c in contractions for op in c.absorbed}
    new = Graph(name=graph.name)
    tensors: dict[Tensor, Tensor] = {}
    copies: dict[Operation, Operation] = {}

    def copy(op: Operation) -> None:
        control = list(dict.fromkeys(copies[c] for c in op.control_inputs if c in copies))
        made = new.add_op(
            op.type,
            tuple(tensors[t] for t in op.inputs),
            op.attrs,
            name=op.name,
            control_inputs=control,
            source=op.source,
        )
        copies[op] = made
        tensors.update(zip(op.outputs, made.outputs))

    for op in graph.operations:
        c = at.get(op)
        if c is None:
            if op not in absorbed and op not in copies:  # a hoisted op is copied already
                copy(op)
            continue
        for h in c.hoist:
            copy(h)
        control = list(dict.fromkeys(copies[x] for m in c.absorbed for x in m.control_inputs if x in copies))
        made = new.add_op(
            c.type,
            tuple(tensors[t] for t in c.inputs),
            c.attrs,
            name=c.name,
            control_inputs=control,
            source=c.at.source,
        )
        copies.update(dict.fromkeys(c.absorbed, made))
        tensors.update({t: made.outputs[i] for t, i in c.outputs.items()})
    new._aliases = {a: t for a, t in graph._aliases.items() if t in new._by_name}
    return new


# -- parameter-group updates -----------------------------------------------------------------


@dataclass
class Cluster:
    """The updates of one parameter as one program over its inputs (stored variables first)."""

    members: list[Operation]
    inlined: list[Operation]
    inputs: list[Tensor] = field(default_factory=list)
    program: tuple = ()
    stores: tuple = ()
    scalars: tuple = ()  # positions of one-element inputs read once (shared by a group's lanes)


def fuse_updates(
    graph: Graph, keep: Iterable[str] = (), supported: Callable[[Operation], bool] | None = None, max_lanes: int = 32
) -> Graph:
    """A copy of ``graph`` with its variable updates fused, one ``fused_update`` op per parameter group.

    Parameters
    ----------
    graph : Graph
        Usually the output of :func:`workbench.graph.fusion.fuse_elementwise`.
    keep : names that must stay visible (the fetches): their ops are never absorbed.
    supported : optional predicate on the single elementwise ops a program may absorb.
    max_lanes : the most parameters one op updates (a kernel's argument list is finite).
    """
    uses = _uses(graph)
    kept = {_resolve(graph, n) for n in keep}
    clusters = _clusters(graph, uses, kept, supported)
    groups: dict[tuple, list[Cluster]] = {}
    for cluster in clusters:
        groups.setdefault(_group_key(cluster), []).append(cluster)
    controllers: dict[Operation, list[Operation]] = {}
    for op in graph.operations:
        for c in op.control_inputs:
            controllers.setdefault(c, []).append(op)
    contractions, names = [], set()
    for lanes in groups.values():
        for start in range(0, len(lanes), max_lanes):
            for chunk in _placeable(lanes[start : start + max_lanes], uses, controllers):
                contractions.append(_update_contraction(graph, chunk, names))
    return contract(graph, contractions) if contractions else graph


def _clusters(graph: Graph, uses, kept, supported) -> list[Cluster]:
    writes: dict[str, int] = {}
    for op in graph.operations:
        if op.opdef.stateful and op.inputs and op.type != "variable":
            writes[op.inputs[0].op.name] = writes.get(op.inputs[0].op.name, 0) + 1
    updates = [
        op
        for op in graph.operations
        if op.type in UPDATE_STEPS
        and op.inputs[0].op.type == "variable"
        and writes[op.inputs[0].op.name] == 1
        and op.name not in kept
    ]
    controlled = {c for op in graph.operations for c in op.control_inputs}
    value_op = {u: _inlinable(u, uses, kept, controlled, supported) for u in updates}
    root = {u: u for u in updates}

    def find(u):
        while root[u] is not u:
            u = root[u]
        return u

    for u in updates:
        v = value_op[u]
        for t in (*u.inputs[1:], *(v.inputs if v is not None else ())):
            if t.op in root:
                root[find(t.op)] = find(u)
    members: dict[Operation, list[Operation]] = {}
    for u in updates:
        members.setdefault(find(u), []).append(u)
    found = []
    for group in members.values():
        inlined = [value_op[u] for u in group if value_op[u] is not None]
        cluster = Cluster(group, inlined)
        if len(group) + len(inlined) >= 2 and _build_program(cluster, value_op):
            found.append(cluster)
    return found


def _inlinable(update: Operation, uses, kept, controlled, supported) -> Operation | None:
    """The op computing ``update``'s value when the program may absorb it."""
    v = update.inputs[1].op
    if v.name in kept or v in controlled or len(v.outputs) != 1:
        return None
    if [u for u, _ in uses.get(v.outputs[0], ())] != [update]:
        return None
    if v.type == FUSED or (fusable(v) and (supported is None or supported(v))):
        return v
    return None


def _build_program(cluster: Cluster, value_op) -> bool:
    """Fill in the cluster's program; False when its inputs do not fit one elementwise loop."""
    steps, made, stores = [], {}, []

    def ref(t: Tensor):
        return made.get(t, ("in", t))

    for m in cluster.members:
        v = value_op[m]
        if v is not None and v.type == FUSED:
            local = [ref(t) for t in v.inputs]
            for kind, refs, attrs, dtype in v.attrs["program"]:
                local.append(("step", len(steps)))
                steps.append((kind, tuple(local[r] for r in refs), attrs, dtype))
            made[v.outputs[0]] = local[-1]
        elif v is not None:
            steps.append((v.type, tuple(ref(t) for t in v.inputs), tuple(sorted(v.attrs.items())), v.outputs[0].dtype))
            made[v.outputs[0]] = ("step", len(steps) - 1)
        var, value = m.inputs
        if UPDATE_STEPS[m.type] is not None:
            steps.append((UPDATE_STEPS[m.type], (ref(var), ref(value)), (), var.dtype))
            made[m.outputs[0]] = ("step", len(steps) - 1)
        else:
            made[m.outputs[0]] = ref(value)
        stores.append(made[m.outputs[0]])
    variables = [m.inputs[0] for m in cluster.members]
    others = [r[1] for _, refs, _, _ in steps for r in refs if r[0] == "in" and r[1] not in variables]
    others += [r[1] for r in stores if r[0] == "in" and r[1] not in variables]
    cluster.inputs = variables + list(dict.fromkeys(others))
    shape = variables[0].shape
    if any(v.shape != shape for v in variables):
        return False
    kinds = [_kind(t.shape, shape) for t in cluster.inputs]
    if None in kinds:
        return False
    cluster.scalars = tuple(i for i, k in enumerate(kinds) if k == "scalar")
    index = {t: i for i, t in enumerate(cluster.inputs)}
    n = len(index)

    def number(r) -> int:
        return index[r[1]] if r[0] == "in" else n + r[1]

    cluster.program = tuple((kind, tuple(number(r) for r in refs), attrs, dtype) for kind, refs, attrs, dtype in steps)
    cluster.stores = tuple(number(r) for r in stores)
    return bool(cluster.program)


def _kind(shape, var_shape) -> str | None:
    """``"full"``: one element per variable element; ``"scalar"``: one element for all; None: neither."""
    if shape is None or any(d is None for d in shape):
        return None
    size = math.prod(shape)
    if tuple(shape) == tuple(var_shape) or (size == 1 == math.prod(var_shape) and len(shape) <= len(var_shape)):
        return "full"
    return "scalar" if size == 1 and len(shape) <= len(var_shape) else None


def _group_key(cluster: Cluster) -> tuple:
    scalars = tuple(cluster.inputs[i] for i in cluster.scalars)
    dtypes = tuple(t.dtype for t in cluster.inputs)
    return cluster.program, cluster.stores, cluster.scalars, scalars, dtypes, len(cluster.members)


def _placeable(lanes: list[Cluster], uses, controllers) -> list[list[Cluster]]:
    """``lanes`` as one op where nothing before the last member needs what they make, else each alone."""
    if _fits(lanes, uses, controllers):
        return [lanes]
    return [[c] for c in lanes if _fits([c], uses, controllers)] if len(lanes) > 1 else []


def _fits(lanes: list[Cluster], uses, controllers) -> bool:
    ops_ = {op for c in lanes for op in (*c.members, *c.inlined)}
    position = max(m.index for c in lanes for m in c.members)
    for op in ops_:
        users = [u for t in op.outputs for u, _ in uses.get(t, ())] + controllers.get(op, [])
        if any(u not in ops_ and u.index < position for u in users):
            return False
    return True


def _update_contraction(graph: Graph, lanes: list[Cluster], names: set) -> Contraction:
    first = lanes[0]
    scalars = set(first.scalars)
    width = len(first.inputs) - len(scalars)
    order = [i for i in range(len(first.inputs)) if i not in scalars] + sorted(scalars)
    moved = {old: new for new, old in enumerate(order)}  # cluster input position -> lane program position
    program = tuple(
        (kind, tuple(_moved(r, moved) for r in refs), attrs, dtype) for kind, refs, attrs, dtype in first.program
    )
    inputs = [c.inputs[i] for c in lanes for i in order[:width]] + [first.inputs[i] for i in order[width:]]
    outputs = {m.outputs[0]: lane * len(c.members) + k for lane, c in enumerate(lanes) for k, m in enumerate(c.members)}
    scope = first.members[0].name.rpartition("/")[0]
    name = _unused(graph, f"{scope}/fused_update" if scope else "fused_update", names)
    attrs = {
        "program": program,
        "stores": tuple(_moved(r, moved) for r in first.stores),
        "lanes": len(lanes),
        "width": width,
    }
    at = max((m for c in lanes for m in c.members), key=lambda o: o.index)
    absorbed = [op for c in lanes for op in (*c.members, *c.inlined)]
    return Contraction(at, FUSED_UPDATE, inputs, attrs, name, absorbed, outputs)


def _moved(ref: int, moved: dict) -> int:
    return moved.get(ref, ref)


def _unused(graph: Graph, base: str, taken: set) -> str:
    name, i = base, 0
    while graph._taken(name) or name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


# -- cross-entropy with its gradient -------------------------------------------------------------


def fuse_cross_entropy(graph: Graph, keep: Iterable[str] = ()) -> Graph:
    """A copy of ``graph`` where each ``softmax_cross_entropy`` whose loss is summed or averaged
    and whose softmax only feeds its gradient is one ``softmax_cross_entropy_with_grad`` op."""
    uses = _uses(graph)
    kept = {_resolve(graph, n) for n in keep}
    contractions = []
    for op in graph.operations:
        if op.type == "softmax_cross_entropy" and op.name not in kept:
            found = _cross_entropy_contraction(op, uses, kept)
            if found is not None:
                contractions.append(found)
    return contract(graph, contractions) if contractions else graph


def _only_user(t: Tensor, uses) -> Operation | None:
    users = {u for u, _ in uses.get(t, ())}
    return users.pop() if len(users) == 1 else None


def _cross_entropy_contraction(sce: Operation, uses, kept) -> Contraction | None:
    loss, probs = sce.outputs
    grad = _only_user(probs, uses)
    if (
        grad is None
        or grad.type != "softmax_cross_entropy_grad"
        or grad.name in kept
        or grad.inputs[1] is not sce.inputs[1]
    ):
        return None
    unreduce = grad.inputs[2].op
    if unreduce.type != "unreduce" or unreduce.inputs[1] is not loss or unreduce.name in kept:
        return None
    if _only_user(unreduce.outputs[0], uses) is not grad:
        return None
    upstream = unreduce.inputs[0]
    hoist = _ancestors_after(upstream.op, sce)
    if hoist is None:
        return None
    return Contraction(
        sce,
        SCE_WITH_GRAD,
        [*sce.inputs, upstream],
        dict(unreduce.attrs),
        sce.name,
        [sce, unreduce, grad],
        {loss: 0, grad.outputs[0]: 1},
        hoist,
    )


def _ancestors_after(op: Operation, start: Operation) -> list[Operation] | None:
    """The ops after ``start`` that ``op`` needs (``op`` too), in graph order, when all may run
    before ``start``: None when one of them depends on ``start`` or changes state or draws."""
    found, stack = set(), [op]
    while stack:
        o = stack.pop()
        if o.index <= start.index or o in found:
            if o is start:
                return None
            continue
        if (o.opdef.stateful and o.type != "variable") or o.opdef.random:
            return None
        found.add(o)
        stack.extend(t.op for t in o.inputs)
        stack.extend(o.control_inputs)
    return sorted(found, key=lambda o: o.index)


def fuse_step(graph: Graph, keep: Iterable[str] = (), supported: Callable[[Operation], bool] | None = None) -> Graph:
    """Every fusion of a training step: elementwise chains, cross-entropy with its gradient, updates."""
    fused = fuse_elementwise(graph, keep=keep, supported=supported)
    return fuse_updates(fuse_cross_entropy(fused, keep), keep, supported)
