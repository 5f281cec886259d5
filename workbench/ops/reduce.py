"""Reductions (sum, mean, max, min, prod, argmax, all) and the broadcasting helpers gradients use
(unreduce, reduce_to_like, broadcast_like).

Each op: its public function, then its registry entry (shape rule, kernel,
gradient) on adjacent lines, as in :mod:`workbench.ops.math`.
"""

from __future__ import annotations

import builtins
import functools

from workbench.errors import DTypeError, ShapeError
from workbench.ops import rules
from workbench.ops.math import _BOOLEAN, cast, equal
from workbench.ops.registry import TensorSpec, apply, defop

# -- reductions -----------------------------------------------------------------


def sum(x, axis=None, keepdims=False, name=None):  # noqa: A001 - the op's name
    """Sum over ``axis`` (an int, a tuple, or ``None`` for all axes)."""
    return apply("sum", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


def mean(x, axis=None, keepdims=False, name=None):
    """Mean over ``axis`` (an int, a tuple, or ``None`` for all axes)."""
    return apply("mean", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


def max(x, axis=None, keepdims=False, name=None):  # noqa: A001 - the op's name
    """Maximum over ``axis``; the gradient is shared equally between tied maxima."""
    return apply("max", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


def _axis_attr(axis):
    if axis is None or isinstance(axis, int):
        return axis
    return tuple(int(a) for a in axis)


def _reduce_spec(x: TensorSpec, *, axis, keepdims) -> TensorSpec:
    return TensorSpec(rules.reduced_shape(x.shape, axis, keepdims), x.dtype)


def _sum_spec(x: TensorSpec, *, axis, keepdims) -> TensorSpec:
    if x.dtype == "bool":
        raise DTypeError("cannot sum a bool tensor; cast it to a number first")
    return _reduce_spec(x, axis=axis, keepdims=keepdims)


def _mean_spec(x: TensorSpec, *, axis, keepdims) -> TensorSpec:
    rules.need_float(x)
    return _reduce_spec(x, axis=axis, keepdims=keepdims)


def _extremum_grad(op, g):
    """``max`` and ``min``: the gradient goes to the elements equal to the result, shared between ties."""
    x, y = op.inputs[0], op.outputs[0]
    axis, keepdims = op.attrs["axis"], op.attrs["keepdims"]
    hit = cast(equal(x, unreduce(y, x, axis=axis, keepdims=keepdims)), x.dtype)
    ties = unreduce(sum(hit, axis=axis, keepdims=keepdims), x, axis=axis, keepdims=keepdims)
    return (hit * unreduce(g, x, axis=axis, keepdims=keepdims) / ties,)


defop(
    "sum",
    infer=_sum_spec,  # dtype=: small ints would otherwise sum to int64
    kernel=lambda xp, x, *, axis, keepdims: xp.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype),
    grad=lambda op, g: (unreduce(g, op.inputs[0], **op.attrs),),
)
defop(
    "mean",
    infer=_mean_spec,
    kernel=lambda xp, x, *, axis, keepdims: xp.mean(x, axis=axis, keepdims=keepdims),
    grad=lambda op, g: (unreduce(g, op.inputs[0], mean=True, **op.attrs),),
)
defop(
    "max",
    infer=_reduce_spec,
    kernel=lambda xp, x, *, axis, keepdims: xp.max(x, axis=axis, keepdims=keepdims),
    grad=_extremum_grad,
)


def argmax(x, axis=-1, keepdims=False, name=None):
    """Index of the largest value along ``axis`` (an int, or ``None`` for the flattened tensor), as
    int64; the first one on ties. Not differentiable: ``gradients()`` gives ``None`` through it.

    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     i = wb.argmax(wb.constant([[1.0, 3.0, 2.0], [5.0, 4.0, 5.0]]), axis=1)
    >>> wb.Session(g).run(i).tolist()
    [1, 0]
    """
    if axis is not None and not isinstance(axis, int):
        raise ShapeError(f"argmax takes one axis (an int) or None, got {axis!r}")
    return apply("argmax", x, axis=axis, keepdims=bool(keepdims), name=name)


def _argmax_spec(x: TensorSpec, *, axis, keepdims) -> TensorSpec:
    if x.dtype == "bool":
        raise DTypeError("argmax needs a number tensor, got bool; cast it first")
    if axis is None and keepdims:
        return TensorSpec(tuple(1 for _ in x.shape), "int64")
    return TensorSpec(rules.reduced_shape(x.shape, axis, keepdims), "int64")


def _argmax_kernel(xp, x, *, axis, keepdims):
    return xp.astype(xp.argmax(x, axis=axis, keepdims=keepdims), xp.int64)


defop("argmax", infer=_argmax_spec, kernel=_argmax_kernel, nondiff="integer output (an index)")


def all(x, axis=None, keepdims=False, name=None):  # noqa: A001 - the op's name
    """Whether every element of the bool tensor ``x`` is true, over ``axis``."""
    return apply("all", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


def _all_spec(x: TensorSpec, *, axis, keepdims) -> TensorSpec:
    if x.dtype != "bool":
        raise DTypeError(f"needs a bool tensor, got {x.dtype}; compare it first (for example with isfinite)")
    return _reduce_spec(x, axis=axis, keepdims=keepdims)


defop(
    "all",
    infer=_all_spec,
    nondiff=_BOOLEAN,
    kernel=lambda xp, x, *, axis, keepdims: xp.all(x, axis=axis, keepdims=keepdims),
)

# -- broadcasting helpers used by gradients ----------------------------------------------


def unreduce(g, x, axis=None, keepdims=False, mean=False, name=None):
    """Broadcast ``g``, the result of reducing ``x`` over ``axis``, back to ``x``'s shape.

    With ``mean=True`` it also divides by the number of reduced elements: the
    gradient of :func:`mean`. It is the adjoint of ``sum`` (or ``mean``).
    """
    return apply("unreduce", g, x, axis=_axis_attr(axis), keepdims=bool(keepdims), mean=bool(mean), name=name)


def _unreduce_spec(g: TensorSpec, x: TensorSpec, *, axis, keepdims, mean) -> TensorSpec:
    expected = rules.reduced_shape(x.shape, axis, keepdims)
    if len(g.shape) != len(expected) or not builtins.all(map(rules.dims_match, g.shape, expected)):
        raise ShapeError(f"{rules.fmt(g.shape)} is not {rules.fmt(x.shape)} reduced over axis {axis}")
    return TensorSpec(x.shape, g.dtype)


def _unreduce_kernel(xp, g, x, *, axis, keepdims, mean):
    kept, count = _unreduced(x.shape, tuple(axis) if isinstance(axis, list) else axis)
    if mean:  # divide the reduced values, before they are broadcast
        g = g / count
    return xp.broadcast_to(xp.reshape(g, kept), x.shape)


@functools.lru_cache(maxsize=256)
def _unreduced(shape: tuple, axis) -> tuple[tuple, int]:
    """``shape`` with the reduced axes kept as 1s, and how many elements each reduced value stands
    for: worked out once per shape, not once per run."""
    axes = rules.axes_tuple(axis, len(shape))
    count = 1
    for a in axes:
        count *= shape[a]
    return tuple(1 if i in axes else d for i, d in enumerate(shape)), count


def _unreduce_grad(op, gg):
    reduce = mean if op.attrs["mean"] else sum
    return reduce(gg, axis=op.attrs["axis"], keepdims=op.attrs["keepdims"]), None


defop("unreduce", infer=_unreduce_spec, kernel=_unreduce_kernel, grad=_unreduce_grad)


def reduce_to_like(g, x, name=None):
    """Sum ``g`` down to ``x``'s shape: undoes NumPy broadcasting of ``x`` (a no-op when shapes agree)."""
    return apply("reduce_to_like", g, x, name=name)


def broadcast_like(a, b, name=None):
    """``a`` broadcast to ``b``'s shape."""
    return apply("broadcast_like", a, b, name=name)


def _reduce_to_like_spec(g: TensorSpec, x: TensorSpec) -> TensorSpec:
    rules.broadcast(g.shape, x.shape)  # raises unless x broadcasts to g
    return TensorSpec(x.shape, g.dtype)


def _reduce_to_like_kernel(xp, g, x):
    if g.shape == x.shape:
        return g
    axes, leading = _broadcast_axes(g.shape, x.shape)
    if leading:  # already x's shape, and not a view: later steps may write into it
        return xp.sum(g, axis=axes)
    return xp.reshape(xp.sum(g, axis=axes, keepdims=True), x.shape)


@functools.lru_cache(maxsize=256)
def _broadcast_axes(shape: tuple, like: tuple) -> tuple[tuple, bool]:
    """The axes of ``shape`` that broadcasting ``like`` to it made or stretched, and whether they
    are all leading ones (summing them leaves ``like``'s shape); once per pair of shapes."""
    lead = len(shape) - len(like)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(like) if d == 1 and shape[lead + i] != 1)
    return axes, bool(like) and builtins.all(a < lead for a in axes)


def _broadcast_like_spec(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    shape = rules.broadcast(a.shape, b.shape)
    if len(shape) != len(b.shape):
        raise ShapeError(f"{rules.fmt(a.shape)} has more axes than {rules.fmt(b.shape)}")
    return TensorSpec(b.shape, a.dtype)


defop(
    "reduce_to_like",
    infer=_reduce_to_like_spec,
    kernel=_reduce_to_like_kernel,
    grad=lambda op, gg: (broadcast_like(gg, op.inputs[0]), None),
)
defop(
    "broadcast_like",
    infer=_broadcast_like_spec,
    kernel=lambda xp, a, b: xp.broadcast_to(a, b.shape),
    grad=lambda op, gg: (reduce_to_like(gg, op.inputs[0]), None),
)


# -- min and prod ----------------------------------------------------------------


def min(x, axis=None, keepdims=False, name=None):  # noqa: A001 - the op's name
    """Minimum over ``axis``; the gradient is shared equally between tied minima."""
    return apply("min", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


defop(
    "min",
    infer=_reduce_spec,
    kernel=lambda xp, x, *, axis, keepdims: xp.min(x, axis=axis, keepdims=keepdims),
    grad=_extremum_grad,
)


def prod(x, axis=None, keepdims=False, name=None):
    """Product over ``axis``; the gradient is exact where elements are zero (the product of the others)."""
    return apply("prod", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


def _prod_spec(x: TensorSpec, *, axis, keepdims) -> TensorSpec:
    if x.dtype == "bool":
        raise DTypeError("cannot multiply a bool tensor; cast it to a number first")
    return _reduce_spec(x, axis=axis, keepdims=keepdims)


def _products_of_others(xp, x, axis):
    """For each element, the product of the other elements of its reduced group (no division)."""
    axes = rules.axes_tuple(axis, x.ndim)
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = xp.permute_dims(x, tuple(kept) + axes)
    lead = moved.shape[: len(kept)]
    flat = xp.reshape(moved, lead + (-1,))
    ones = xp.ones(lead + (1,), dtype=x.dtype)
    cumprod = getattr(xp, "cumulative_prod", None) or xp.cumprod  # the array API's name, or CuPy's
    before = xp.concat([ones, cumprod(flat[..., :-1], axis=-1)], axis=-1)
    after = xp.flip(xp.concat([ones, cumprod(xp.flip(flat, axis=-1)[..., :-1], axis=-1)], axis=-1), axis=-1)
    others = xp.reshape(before * after, moved.shape)
    inverse = [0] * x.ndim
    for i, a in enumerate(tuple(kept) + axes):
        inverse[a] = i
    return xp.permute_dims(others, tuple(inverse))


def _prod_grad(op, g):
    x, (axis, keepdims) = op.inputs[0], (op.attrs["axis"], op.attrs["keepdims"])
    others = apply("prod_others", x, axis=axis)
    return (others * unreduce(g, x, axis=axis, keepdims=keepdims),)


defop(
    "prod",
    infer=_prod_spec,
    kernel=lambda xp, x, *, axis, keepdims: xp.prod(x, axis=axis, keepdims=keepdims, dtype=x.dtype),
    grad=_prod_grad,
)
defop(
    "prod_others",
    infer=lambda x, *, axis: x,
    kernel=lambda xp, x, *, axis: _products_of_others(xp, x, axis),
    nondiff="gradient of prod; second derivatives are not supported",
)
