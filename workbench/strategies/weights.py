"""How a fit's loss splits over the global batch: what ``r.weight`` is.

A replica computes its loss and gradients on its shard of the global batch. The sum over
replicas of ``r.weight * g`` is the gradient of the global batch's loss when

- the loss is a **mean** over the batch (plus terms that do not depend on it, regularizers):
  a replica's weight is its share of the rows, ``len(shard) / len(batch)``;
- the loss is a **sum** over the batch: every weight is 1.

Any other loss (a sum plus a regularizer, a product of batch terms, a max ...) cannot be
split exactly, and :func:`batch_reduction` refuses it, naming the op and its line.
"""

from __future__ import annotations

from workbench.errors import StrategyError
from workbench.graph.core import Graph, Tensor

_SAME = ("identity", "cast", "negative", "reshape", "squeeze")  # a scalar op of one batch term keeps its kind
_LINEAR = ("add", "subtract")


def batch_reduction(graph: Graph, loss: str) -> str:
    """``"mean"`` or ``"sum"``: how the loss named ``loss`` reduces the batch; StrategyError when neither.

    A loss that does not depend on the batch at all counts as a mean (every weight sums to 1).
    """
    tensor = graph.get(loss)
    memo: dict[Tensor, str] = {}
    kind = _kind(tensor, memo, _batch_dependence(graph))
    return "mean" if kind == "const" else kind


def weight(kind: str, rows: int, total: int) -> float:
    """A replica's ``r.weight`` for a loss of ``kind`` (see :func:`batch_reduction`) and a shard of ``rows``."""
    return rows / total if kind == "mean" else 1.0


def _batch_dependence(graph: Graph):
    """Whether a tensor depends on a placeholder fed with rows of the batch (first axis unknown)."""
    memo: dict = {}

    def depends(t: Tensor) -> bool:
        found = memo.get(t)
        if found is None:
            op = t.op
            if op.type == "placeholder":
                shape = op.attrs["shape"]
                found = shape is None or (len(shape) > 0 and shape[0] is None)
            else:
                found = any(depends(x) for x in op.inputs)
            memo[t] = found
        return found

    return depends


def _refuse(t: Tensor, why: str) -> StrategyError:
    where = f" ({t.op.source})" if t.op.source else ""
    return StrategyError(
        f"cannot split the loss over replicas exactly: {why}{where}; r.weight needs a loss that is a mean over "
        "the batch (plus terms that do not depend on it) or a sum over it"
    )


def _kind(t: Tensor, memo: dict, depends) -> str:
    """``"const"`` (no batch in it), ``"mean"``, ``"sum"``, or ``"rows"`` (a tensor with a batch axis)."""
    found = memo.get(t)
    if found is not None:
        return found
    op = t.op
    if not depends(t):
        found = "const"
    elif t.shape is None or (t.shape and t.shape[0] is None):
        found = "rows"
    elif op.type in ("mean", "sum"):
        axes = op.attrs["axis"]
        x = op.inputs[0]
        if _kind(x, memo, depends) != "rows" or not (axes is None or 0 in _axes(axes, x)):
            raise _refuse(t, f"{op.type} {op.name!r} does not reduce the batch axis of per-example values")
        found = op.type
    elif op.type in _SAME and len(op.inputs) == 1:
        found = _scalar_kind(t, _kind(op.inputs[0], memo, depends))
    elif op.type in _LINEAR:
        found = _sum_kind(t, [_kind(x, memo, depends) for x in op.inputs])
    elif op.type in ("multiply", "divide"):
        kinds = [_kind(x, memo, depends) for x in op.inputs]
        if op.type == "divide" and kinds[1] != "const":
            raise _refuse(t, f"{op.name!r} divides by a value of the batch")
        batch = [k for k in kinds if k != "const"]
        if len(batch) != 1:
            raise _refuse(t, f"{op.name!r} multiplies two values of the batch")
        found = _scalar_kind(t, batch[0])
    else:
        raise _refuse(t, f"{op.type} {op.name!r} of the batch is neither a mean nor a sum")
    memo[t] = found
    return found


def _axes(axes, x: Tensor) -> tuple:
    ndim = len(x.shape) if x.shape is not None else 1
    return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


def _scalar_kind(t: Tensor, kind: str) -> str:
    if kind == "rows":
        raise _refuse(t, f"{t.op.name!r} is not reduced over the batch")
    return kind


def _sum_kind(t: Tensor, kinds: list[str]) -> str:
    batch = {k for k in kinds if k != "const"}
    if "rows" in batch:
        raise _refuse(t, f"{t.op.name!r} is not reduced over the batch")
    if batch == {"mean"}:
        return "mean"
    if batch == {"sum"} and "const" not in kinds:
        return "sum"
    if batch == {"sum"}:
        raise _refuse(t, f"{t.op.name!r} adds a term that does not depend on the batch to a sum over it")
    raise _refuse(t, f"{t.op.name!r} adds a mean over the batch to a sum over it")
