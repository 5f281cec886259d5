"""More reductions: ``min`` and ``prod`` (``sum``, ``mean``, ``max`` and ``all`` are in math.py)."""

from __future__ import annotations

from workbench.errors import DTypeError
from workbench.ops import rules
from workbench.ops.math import _axis_attr, _reduce_spec, cast, equal, sum, unreduce
from workbench.ops.registry import TensorSpec, apply, defop


def min(x, axis=None, keepdims=False, name=None):  # noqa: A001 - the op's name
    """Minimum over ``axis``; the gradient is shared equally between tied minima."""
    return apply("min", x, axis=_axis_attr(axis), keepdims=bool(keepdims), name=name)


def _min_grad(op, g):
    x, y = op.inputs[0], op.outputs[0]
    axis, keepdims = op.attrs["axis"], op.attrs["keepdims"]
    is_min = cast(equal(x, unreduce(y, x, axis=axis, keepdims=keepdims)), x.dtype)
    ties = unreduce(sum(is_min, axis=axis, keepdims=keepdims), x, axis=axis, keepdims=keepdims)
    return (is_min * unreduce(g, x, axis=axis, keepdims=keepdims) / ties,)


defop(
    "min",
    infer=_reduce_spec,
    kernel=lambda xp, x, *, axis, keepdims: xp.min(x, axis=axis, keepdims=keepdims),
    grad=_min_grad,
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
