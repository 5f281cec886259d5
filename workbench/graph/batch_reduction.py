"""How a tensor depends on the rows of the batch: what data-parallel training needs to split it exactly.

A data-parallel step gives each replica a shard of the global batch's rows. Its loss and its fetches are
computed per shard; the step must still be the step of the *global* batch. Whether that is possible, and
how, depends on how each tensor reduces over the rows:

========  ===========================================  ==========================================
kind      the tensor is                                 the global batch's value from the shards'
========  ===========================================  ==========================================
``mean``  a mean over the rows (plus terms that do not  the shards' values weighted by their share
          depend on them)                               of the rows
``sum``   a sum over the rows                           the sum of the shards' values
``max``   a maximum over the rows                       the maximum of the shards' values
``min``   a minimum over the rows                       the minimum of the shards' values
``rows``  one slice per row along ``axis``              the shards' values concatenated, in order
``same``  independent of the rows                       any shard's value (they are all equal)
========  ===========================================  ==========================================

:func:`batch_reduction` walks the graph from the placeholders fed with rows and derives the kind of
every tensor op by op (a mean of per-row values is a ``mean``, a mean times a constant too, a mean
plus a sum is neither). A loss must be a ``mean`` (each replica's gradient weighted by its share) or a
``sum`` (weight 1): :func:`loss_reduction` refuses anything else with an error naming the op and line
that mixes the rows. :func:`fetch_reduction` says how a fetch combines, or why it cannot;
:func:`combine` combines the shards' values of one.

>>> import workbench as wb
>>> g = wb.Graph()
>>> with g.as_default():
...     x = wb.placeholder("x", (None, 3))
...     w = wb.variable("w", (3, 2))
...     per_row = wb.sum(wb.matmul(x, w) ** 2.0, axis=1)
...     total, average = wb.sum(per_row), wb.mean(per_row)
>>> loss_reduction(g, total), loss_reduction(g, 0.5 * average + wb.sum(w * w))
('sum', 'mean')
>>> fetch_reduction(g, per_row)
Reduction(kind='rows', axis=0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable, Sequence

import numpy as np

from workbench.errors import ClusterError
from workbench.graph.core import Graph, Operation, Tensor
from workbench.ops import rules

KINDS = ("mean", "sum", "max", "min", "rows", "same")


@dataclass(frozen=True)
class Reduction:
    """How a tensor depends on the batch's rows (see the module's table).

    ``axis``: the row axis of a ``rows`` tensor. ``op``/``why``: for a tensor that cannot be split
    (``kind="mixed"``), the op that mixes the rows and how.
    """

    kind: str
    axis: int | None = None
    op: Operation | None = field(default=None, repr=False, compare=False)
    why: str = field(default="", repr=False, compare=False)

    @property
    def splits(self) -> bool:
        return self.kind != "mixed"


SAME = Reduction("same")
_LINEAR = ("mean", "sum")  # kinds that commute with linear maps of their elements
_INCREASING = {"identity", "stop_gradient", "cast", "exp", "log", "sqrt", "tanh", "sigmoid", "relu"}
_ROWWISE = {"conv2d", "max_pool2d", "avg_pool2d", "dropout", "one_hot", "layer_norm"}
_PASS = {"identity", "stop_gradient", "isfinite", "zeros_like", "ones_like"}  # one input, unchanged reduction


def _mixed(op: Operation, why: str) -> Reduction:
    return Reduction("mixed", op=op, why=why)


def _rows_axis(op: Operation, axis: int, rank_in: int) -> int:
    """Where a row axis of an input of rank ``rank_in`` lands in the broadcast output of ``op``."""
    return axis + len(op.outputs[0].shape) - rank_in


def _elementwise(op: Operation, ins: list[Reduction]) -> Reduction:
    """An elementwise op (with broadcasting): rows stay rows; aggregates combine only linearly."""
    tensors = op.inputs
    rows = {_rows_axis(op, r.axis, t.ndim) for r, t in zip(ins, tensors, strict=True) if r.kind == "rows"}
    kinds = {r.kind for r in ins} - {"same"}
    if not kinds:
        return SAME
    if "rows" in kinds:
        if kinds != {"rows"} or len(rows) > 1:
            return _mixed(op, "combines per-row values with values reduced over the rows")
        axis = rows.pop()
        for r, t in zip(ins, tensors, strict=True):  # a constant must broadcast along the rows, not be a row of its own
            moved = axis - len(op.outputs[0].shape) + t.ndim
            if r.kind == "same" and 0 <= moved < t.ndim and t.shape[moved] not in (1,):
                return _mixed(op, "combines per-row values with a tensor as long as the batch")
        return Reduction("rows", axis)
    if len(kinds) > 1:
        return _mixed(op, f"combines values reduced differently over the rows ({' and '.join(sorted(kinds))})")
    return _aggregate(op, ins, kinds.pop())


def _aggregate(op: Operation, ins: list[Reduction], kind: str) -> Reduction:
    """An elementwise op over values that all reduce over the rows as ``kind`` (or do not depend on them)."""
    t, n = op.type, sum(r.kind == kind for r in ins)
    flip = {"max": "min", "min": "max"}
    if t in _INCREASING and (kind in ("max", "min") or t == "cast" and np.issubdtype(op.outputs[0].dtype, np.floating)):
        return Reduction(kind)
    if t == "negative":
        return Reduction(flip.get(kind, kind))
    if t in ("add", "subtract"):
        if n == 2:
            if kind in _LINEAR:
                return Reduction(kind)
            return _mixed(op, f"adds two values that are each a {kind} over the rows")
        if kind == "sum":
            return _mixed(op, "adds a term that does not depend on the rows to a sum over the rows")
        subtracted = t == "subtract" and ins[1].kind == kind
        return Reduction(flip.get(kind, kind) if subtracted else kind)  # shares add up to 1: a mean takes a constant
    if t in ("multiply", "divide") and n == 1 and kind in _LINEAR:
        if t == "multiply" or ins[0].kind == kind:
            return Reduction(kind)
    return _mixed(op, f"applies '{t}' to a {kind} over the rows, which is not linear in it")


def _reduce(op: Operation, x: Reduction, kind: str) -> Reduction:
    """``sum``/``mean``/``max``/``min`` over ``op.attrs['axis']`` of an input that reduces as ``x``."""
    if x.kind == "same":
        return SAME
    rank = op.inputs[0].ndim
    axis = op.attrs.get("axis")
    axes = set(range(rank)) if axis is None else {a % rank for a in (axis if isinstance(axis, tuple) else (axis,))}
    if x.kind == "rows":
        if x.axis in axes:
            return Reduction(kind)
        kept = x.axis if op.attrs.get("keepdims") else x.axis - sum(a < x.axis for a in axes)
        return Reduction("rows", kept)
    if x.kind == kind or (x.kind in _LINEAR and kind in _LINEAR):
        return Reduction(x.kind)
    return _mixed(op, f"takes a {kind} of a {x.kind} over the rows")


def _reshape(op: Operation, x: Reduction) -> Reduction:
    if x.kind != "rows":
        return x
    before, after = op.inputs[0].shape, op.outputs[0].shape
    rest_in, rest_out = before[1:], after[1:]
    if x.axis == 0 and None not in rest_in and None not in rest_out and after[0] in (None, before[0]):
        if int(np.prod(rest_out)) and int(np.prod(rest_in)) % int(np.prod(rest_out)) == 0:
            return Reduction("rows", 0)  # each row becomes whole slices of the new leading axis
    return _mixed(op, f"reshapes {before} to {after}, mixing the rows")


def _getitem(op: Operation, x: Reduction) -> Reduction:
    if x.kind != "rows":
        return x
    axis, out = 0, 0  # walk the index: ``axis`` over the input's axes, ``out`` over the output's
    for item in op.attrs["index"]:
        if item[0] == "ellipsis":
            return _mixed(op, "indexes the rows with an ellipsis")
        if item[0] == "newaxis":
            out += 1
            continue
        if axis == x.axis:
            if item[0] == "slice" and item[1:] in ((None, None, None), (None, None, 1)):
                return Reduction("rows", out)
            return _mixed(op, "picks some of the rows")
        axis += 1
        out += item[0] == "slice"
    return Reduction("rows", out + x.axis - axis)


def _matmul(op: Operation, a: Reduction, b: Reduction) -> Reduction:
    if a.kind == b.kind == "same":
        return SAME
    ra, rb = op.inputs[0].ndim, op.inputs[1].ndim
    row_a = ra - 1 if op.attrs.get("transpose_a") else ra - 2  # a's axis that stays, b's contracted one
    col_b = rb - 2 if op.attrs.get("transpose_b") else rb - 1
    if a.kind == "rows" and b.kind == "same" and ra == 2 and a.axis == row_a:
        return Reduction("rows", 0)
    if b.kind == "rows" and a.kind == "same" and rb == 2 and b.axis == col_b:
        return Reduction("rows", 1)
    contracted_a, contracted_b = ra - 1 - (row_a == ra - 1), rb - 1 - (col_b == rb - 1)
    if a.kind == b.kind == "rows" and ra == rb == 2 and (a.axis, b.axis) == (contracted_a, contracted_b):
        return Reduction("sum")  # a sum over the rows of outer products
    if a.kind == b.kind == "rows" and ra == rb and ra > 2 and a.axis == b.axis and a.axis < ra - 2:
        return Reduction("rows", a.axis)
    if a.kind in ("rows", "same") and b.kind in ("rows", "same") and ra == rb and ra > 2:
        r = a if a.kind == "rows" else b
        if r.axis < ra - 2:
            return Reduction("rows", r.axis)
    out = op.outputs[0].ndim  # batch axes broadcast from the right
    if a.kind == "rows" and b.kind == "same":  # (batch, tokens, d) @ (d, k): each row times the same matrix
        if a.axis == row_a:
            return Reduction("rows", out - 2)
        if a.axis < ra - 2:
            return Reduction("rows", a.axis + out - ra)
    if b.kind == "rows" and a.kind == "same":
        if b.axis == col_b:
            return Reduction("rows", out - 1)
        if b.axis < rb - 2:
            return Reduction("rows", b.axis + out - rb)
    return _mixed(op, "multiplies matrices across the rows")


def _same_axis(op: Operation, ins: list[Reduction], shift: int) -> Reduction:
    """``concat`` (``shift=0``) or ``stack`` (``shift=1``) along ``op.attrs['axis']``."""
    kinds = {r.kind for r in ins}
    if kinds == {"same"}:
        return SAME
    rank = op.outputs[0].ndim
    along = op.attrs.get("axis", 0) % rank
    axes = {r.axis for r in ins}
    if kinds == {"rows"} and len(axes) == 1:
        axis = axes.pop()
        axis += shift and along <= axis
        if axis != along:
            return Reduction("rows", axis)
    if kinds <= set(_LINEAR) | {"max", "min"} and len(kinds) == 1 and shift:
        return Reduction(kinds.pop())
    return _mixed(op, f"joins per-shard values along axis {along}")


def _rule(op: Operation, ins: list[Reduction]) -> Reduction:
    """The reduction of ``op``'s outputs from its inputs'."""
    t = op.type
    if all(r.kind == "same" for r in ins):
        return SAME
    if t in ("sum", "mean", "max", "min"):
        return _reduce(op, ins[0], t)
    if t in ("reshape", "reshape_like"):
        return _reshape(op, ins[0])
    if t == "getitem":
        return _getitem(op, ins[0])
    if t == "matmul":
        return _matmul(op, ins[0], ins[1])
    if t in ("concat", "stack"):
        return _same_axis(op, ins, int(t == "stack"))
    x = ins[0]
    if t == "transpose" and x.kind == "rows":
        perm = op.attrs.get("perm") or tuple(reversed(range(op.inputs[0].ndim)))
        return Reduction("rows", list(perm).index(x.axis))
    if t == "expand_dims" and x.kind == "rows":
        at = op.attrs["axis"] % op.outputs[0].ndim
        return Reduction("rows", x.axis + (at <= x.axis))
    if t in ("transpose", "expand_dims") and x.kind in _LINEAR + ("max", "min"):
        return x
    if t == "gather" and ins[0].kind == "same" and ins[1].kind == "rows" and op.attrs.get("axis", 0) == 0:
        return Reduction("rows", ins[1].axis)
    if t in ("softmax", "log_softmax", "argmax") and x.kind == "rows":
        if op.attrs.get("axis", -1) % op.inputs[0].ndim != x.axis:
            return Reduction("rows", x.axis)
        return _mixed(op, f"takes '{t}' across the rows")
    if t == "softmax_cross_entropy":
        if all(r.kind == "rows" and r.axis == 0 for r in ins):
            return Reduction("rows", 0)
        return _mixed(op, "takes logits and labels that are not both one per row")
    if t == "layer_norm" and x.kind == "rows" and x.axis in rules.axes_tuple(op.attrs["axis"], op.inputs[0].ndim):
        return _mixed(op, "normalizes across the rows")
    if t == "scaled_dot_product_attention" and all(r.kind == "same" or r == Reduction("rows", 0) for r in ins):
        return Reduction("rows", 0)  # (batch, heads, length, depth): each example attends within itself
    if t == "cumsum" and x.kind == "rows" and op.attrs["axis"] % op.inputs[0].ndim != x.axis:
        return Reduction("rows", x.axis)
    if t in _ROWWISE and x.kind == "rows" and x.axis == 0 and all(r.kind == "same" for r in ins[1:]):
        return Reduction("rows", 0)
    if t in _PASS:
        return x
    if op.opdef.elementwise:
        return _elementwise(op, ins)
    if t == "scan":
        return _scan(op, ins)
    if t == "cond":
        return _cond(op, ins)
    return _mixed(op, f"'{t}' is not known to keep the rows apart")


def _body(body, ins: list[Reduction]) -> list[Reduction]:
    """The reductions of a control-flow body's outputs, its inputs reducing as ``ins``."""
    found = _walk(body.graph, dict(zip(body.inputs, ins, strict=True)))
    return [found[n] for n in body.outputs]


def _stacked(r: Reduction) -> Reduction:
    """A per-step value stacked along a new axis 0 (a scan's outputs and carries)."""
    return Reduction("rows", r.axis + 1) if r.kind == "rows" else r


def _scan(op: Operation, ins: list[Reduction]) -> tuple[Reduction, ...] | Reduction:
    """``scan``: the body, run with its carries' reductions until they stop changing (rows scanned
    over axis 0 would mix them); the outputs stacked per step."""
    nc, ns = op.attrs["carries"], op.attrs["sequences"]
    steps = []
    for r in ins[nc : nc + ns]:
        if r.kind == "rows" and r.axis == 0:
            return _mixed(op, "scans over the rows of the batch")
        if r.kind not in ("rows", "same"):
            return _mixed(op, "scans over values reduced over the rows")
        steps.append(Reduction("rows", r.axis - 1) if r.kind == "rows" else SAME)
    carry = list(ins[:nc])
    for _ in range(nc + 1):
        outs = _body(op.attrs["body"], carry + steps + list(ins[nc + ns :]))
        mixed = next((r for r in outs if r.kind == "mixed"), None)
        if mixed is not None:
            return mixed
        if outs[:nc] == carry:
            break
        if any(c != o and c.kind != "same" for c, o in zip(carry, outs[:nc], strict=True)):
            return _mixed(op, "has a carry that changes how it depends on the rows from one step to the next")
        carry = outs[:nc]
    else:
        return _mixed(op, "has carries whose dependence on the rows does not settle")
    found = (*carry, *(_stacked(r) for r in outs[nc:]), *(_stacked(r) for r in carry))
    return found[0] if len(found) == 1 else found


def _cond(op: Operation, ins: list[Reduction]) -> tuple[Reduction, ...] | Reduction:
    """``cond``: both branches must depend on the rows alike, and the choice must not depend on them."""
    if ins[0].kind != "same":
        return _mixed(op, "picks a branch by a value that depends on the rows")
    branches = [_body(op.attrs[key], list(ins[1:])) for key in ("true_body", "false_body")]
    for outs in branches:
        mixed = next((r for r in outs if r.kind == "mixed"), None)
        if mixed is not None:
            return mixed
    if branches[0] != branches[1]:
        return _mixed(op, "has branches that depend on the rows differently")
    return branches[0][0] if len(branches[0]) == 1 else tuple(branches[0])


def batch_reductions(graph: Graph, rows: Iterable[str] | None = None) -> dict[str, Reduction]:
    """The :class:`Reduction` of every tensor of ``graph``, by name.

    ``rows``: the placeholders fed with the batch's rows (along their first axis); default: every
    placeholder of rank 1 or more.
    """
    fed = None if rows is None else set(rows)
    start = {}
    for op in graph.operations:
        if op.type == "placeholder":
            is_rows = op.outputs[0].ndim >= 1 if fed is None else op.name in fed
            start[op.name] = Reduction("rows", 0) if is_rows else SAME
    return _walk(graph, start)


def _walk(graph: Graph, start: dict[str, Reduction]) -> dict[str, Reduction]:
    """Every tensor's reduction, the placeholders' given by ``start`` (a control-flow body's too)."""
    out: dict[str, Reduction] = {}
    for op in graph.operations:
        if op.type == "placeholder":
            found = start.get(op.name, SAME)
        elif op.type in ("variable", "constant") or not op.inputs:
            found = SAME
        else:
            ins = [out.get(t.name, SAME) for t in op.inputs]
            mixed = next((r for r in ins if r.kind == "mixed"), None)
            if op.opdef.collective:  # every replica gets the same bits (batch norm's global moments)
                found = SAME
            else:
                found = mixed if mixed is not None else _rule(op, ins)
        per_output = found if isinstance(found, tuple) else (found,) * len(op.outputs)  # scan, cond: one each
        for t, r in zip(op.outputs, per_output, strict=True):
            out[t.name] = r
    return out


def _where(op: Operation | None) -> str:
    if op is None:
        return ""
    return f" (op '{op.name}' of type '{op.type}'" + (f", {op.source}" if op.source else "") + ")"


def _tensor(graph: Graph, tensor) -> Tensor:
    found = graph.get(tensor) if isinstance(tensor, str) else tensor
    if not isinstance(found, Tensor):
        raise ClusterError(f"{tensor!r} is an operation, not a tensor")
    return found


def loss_reduction(graph: Graph, loss, rows: Iterable[str] | None = None) -> str:
    """``"mean"`` or ``"sum"``: how ``loss`` reduces over the batch's rows.

    A data-parallel fit weights each replica's gradient by its share of the rows for a ``mean`` and
    by 1 for a ``sum``, so that their sum is the gradient of the global batch's loss. A loss that does
    not depend on the rows is a ``mean`` (the shares add up to 1).

    Raises
    ------
    ClusterError
        For a loss that the shards' losses do not add up to (a ``max``, per-row values, a sum plus a
        constant, a nonlinear function of a mean, ...): names the op that mixes the rows and its line.
    """
    tensor = _tensor(graph, loss)
    found = batch_reductions(graph, rows)[tensor.name]
    if found.kind in _LINEAR:
        return found.kind
    if found.kind == "same":
        return "mean"
    if found.kind == "mixed":
        why = f"it {found.why}{_where(found.op)}"
    else:
        why = f"it is a {found.kind} over the rows" + ("" if found.kind != "rows" else " (reduce it with wb.mean)")
    raise ClusterError(
        f"the loss {tensor.name!r}{_where(tensor.op)} cannot be split across replicas exactly: {why}; "
        "a distributed fit needs a loss that is a mean or a sum over the batch's rows"
    )


def fetch_reduction(graph: Graph, fetch, rows: Iterable[str] | None = None) -> Reduction:
    """How the replicas' values of ``fetch`` combine into the global batch's (see :func:`combine`).

    Raises
    ------
    ClusterError
        For a fetch that cannot be combined, naming the op that mixes the rows.
    """
    tensor = _tensor(graph, fetch)
    found = batch_reductions(graph, rows)[tensor.name]
    if found.kind == "mixed":
        raise ClusterError(
            f"the fetch {tensor.name!r}{_where(tensor.op)} cannot be combined across replicas: it "
            f"{found.why}{_where(found.op)}; fetch values that are a mean, sum, max or min over the rows, "
            "one value per row, or independent of the rows"
        )
    return found


def weighted(reduction: Reduction, value, share: float):
    """What a replica contributes to a fetch: a ``mean`` weighted by its share of the rows, else its value.

    Works on any array namespace's arrays (NumPy, CuPy), in the value's dtype.
    """
    if reduction.kind != "mean":
        return value
    dtype = getattr(value, "dtype", None)
    if dtype is not None and np.issubdtype(dtype, np.floating):
        return value * dtype.type(share)
    return value * share


def join(reduction: Reduction, a, b):
    """Two replicas' (or partial results') contributions to a fetch as one; ``a``'s rows come first."""
    kind = reduction.kind
    if kind in _LINEAR:
        return a + b
    if kind == "max":
        return np.maximum(a, b)
    if kind == "min":
        return np.minimum(a, b)
    if kind == "rows":
        return np.concatenate([a, b], axis=reduction.axis)
    if kind == "same":
        return a
    raise ClusterError(f"a fetch that {reduction.why}{_where(reduction.op)} cannot be combined across replicas")


def combine(reduction: Reduction, values: Sequence, shares: Sequence[float] | None = None):
    """The global batch's value of a fetch from the replicas' ``values`` (in row order).

    ``shares``: each replica's share of the rows (they add up to 1), used by a ``mean``; ``None``
    when the values are already :func:`weighted`. The contributions are joined in a fixed pairwise
    order, ``(v0 + v1) + (v2 + v3)``, as the gradients are.
    """
    if shares is None:
        level = [np.asarray(v) for v in values]
    else:
        level = [weighted(reduction, np.asarray(v), s) for v, s in zip(values, shares, strict=True)]
    while len(level) > 1:
        paired = [join(reduction, level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + level[len(level) - len(level) % 2 :]
    return level[0]
