"""Reverse-mode automatic differentiation that adds the backward pass to the graph."""

from __future__ import annotations

from collections.abc import Sequence

from workbench import ops
from workbench.errors import GradientError, GraphError
from workbench.graph import precision
from workbench.graph.core import Operation, Tensor
from workbench.ops.registry import is_float


def gradients(ys, xs, grad_ys=None) -> list[Tensor | None]:
    """Gradients of ``sum(ys)`` with respect to each of ``xs``, built as graph ops.

    ``ys`` and ``xs`` are tensors or lists of them; ``grad_ys`` optionally
    weights each y (default: ones). Contributions along several paths are
    summed and broadcasting is undone, so each gradient has its x's shape. An
    x that ``ys`` does not depend on gets ``None``.

    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(3,))
    ...     (dx,) = wb.gradients(wb.sum(x * x), [x])
    >>> wb.Session(g).run(dx, {x: [1.0, 2.0, 3.0]}).tolist()
    [2.0, 4.0, 6.0]
    """
    ys, xs = _as_list(ys), _as_list(xs)
    if not ys:
        raise GraphError("gradients() needs at least one y")
    graph = ys[0].graph
    for t in ys + xs:
        if not isinstance(t, Tensor):
            raise GraphError(f"gradients() takes tensors, got {t!r}")
        if t.graph is not graph:
            raise GraphError(f"tensor {t.name!r} belongs to graph {t.graph.name!r}, not {graph.name!r}")
        if not is_float(t.dtype):
            raise GradientError(f"cannot differentiate with respect to or of {t.name!r}: its dtype is {t.dtype}")
    grad_ys = [None] * len(ys) if grad_ys is None else _as_list(grad_ys)
    path = _ops_between(graph, ys, xs)
    wanted = set(xs)
    partials: dict[Tensor, list[Tensor]] = {}
    with graph.name_scope("gradients"), precision.suspended():  # the backward pass keeps the forward's dtypes
        for y, gy in zip(ys, grad_ys):
            partials.setdefault(y, []).append(ops.ones_like(y) if gy is None else gy)
        for op in sorted(path, key=lambda o: o.index, reverse=True):
            out_grads = [_total(partials.get(t)) for t in op.outputs]
            if all(g is None for g in out_grads):
                continue
            for x, g in zip(op.inputs, _input_grads(op, out_grads, path, wanted)):
                if g is not None and (x.op in path or x in wanted) and is_float(x.dtype):
                    partials.setdefault(x, []).append(_unbroadcast(op, x, g))
        return [_total(partials.get(x)) for x in xs]


def _input_grads(op: Operation, out_grads, path, wanted) -> Sequence[Tensor | None]:
    opdef = op.opdef
    if opdef.grad is None:
        needed = [i for i, x in enumerate(op.inputs) if (x.op in path or x in wanted) and is_float(x.dtype)]
        if needed:
            where = f"\n  {op.source}" if op.source else ""
            raise GradientError(
                f"gradient of '{op.type}' with respect to input {needed[0]} is not defined "
                f"({opdef.nondiff}); op {op.name!r}{where}"
            )
        return [None] * len(op.inputs)
    grads = opdef.grad(op, *out_grads)
    return grads


def _unbroadcast(op: Operation, x: Tensor, g: Tensor) -> Tensor:
    """Sum ``g`` back to ``x``'s shape where the op may have broadcast ``x``."""
    broadcasting = (op.opdef.elementwise and len(op.inputs) > 1) or op.type == "matmul"
    if not broadcasting or not _may_broadcast(op, x):
        return g
    if x.shape is not None and g.shape == x.shape and None not in x.shape:
        return g
    return ops.reduce_to_like(g, x)


def _may_broadcast(op: Operation, x: Tensor) -> bool:
    """Whether ``op`` may stretch ``x`` (its batch axes, for matmul) to a bigger shape.

    Known without running: an axis of ``x`` is never stretched when its size is known and
    not 1, or when every other input lacks the axis or has size 1 there. Then the gradient
    needs no ``reduce_to_like``, which would keep ``x``'s array alive just for its shape.
    """
    core = 2 if op.type == "matmul" else 0  # matmul broadcasts only the axes before the last two
    if x.shape is None or len(x.shape) < core:
        return True
    axes = x.shape[: len(x.shape) - core]
    for t in op.inputs:
        if t is x:
            continue
        if t.shape is None or len(t.shape) - core > len(axes):
            return True
        other = t.shape[: len(t.shape) - core]
        for d, o in zip(reversed(axes), reversed(other)):
            if not ((d is not None and d != 1) or o == 1):
                return True
    return False


def _total(parts: list[Tensor] | None) -> Tensor | None:
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _ops_between(graph, ys, xs) -> set[Operation]:
    """Operations that depend on some x (through float tensors) and that some y depends on."""
    reached = set(xs)
    start = min(x.op.index for x in xs) if xs else len(graph.operations)
    forward: set[Operation] = set()
    for op in graph.operations[start:]:
        if any(t in reached for t in op.inputs):
            forward.add(op)
            reached.update(t for t in op.outputs if is_float(t.dtype))
    backward: set[Operation] = set()
    stack = [y.op for y in ys]
    while stack:
        op = stack.pop()
        if op in backward:
            continue
        backward.add(op)
        stack.extend(t.op for t in op.inputs)
    return forward & backward


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]
