"""Padding, running sums, top-k and scatter-add.

Each op: its public function, then its registry entry (shape rule, kernel,
gradient). The gradients are the ops' adjoints, written as ops of their own.
"""

from __future__ import annotations

from workbench.errors import DTypeError, GradientError, ShapeError
from workbench.ops import rules
from workbench.ops.array import _gather_grad_kernel, check_indices, gather
from workbench.ops.registry import INTS, TensorSpec, apply, defop

PAD_MODES = ("constant", "reflect")

# -- pad -------------------------------------------------------------------------------------


def pad(x, paddings, mode="constant", value=0, name=None):
    """``x`` padded with ``paddings[i] = (before, after)`` elements on axis ``i``, as ``tf.pad``.

    ``mode="constant"`` fills with ``value``; ``mode="reflect"`` mirrors ``x`` without
    repeating the edge (TensorFlow's ``REFLECT``, NumPy's ``"reflect"``), which needs
    each padding smaller than its axis.
    """
    try:
        pairs = tuple((int(b), int(a)) for b, a in paddings)
    except (TypeError, ValueError):
        pairs = repr(paddings)  # the rule says what is wrong, with the op's name and the line
    value = value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
    return apply("pad", x, paddings=pairs, mode=str(mode), value=value, name=name)


def _pad_spec(x: TensorSpec, *, paddings, mode, value) -> TensorSpec:
    if isinstance(paddings, str):
        raise ShapeError(f"paddings must be a list of (before, after) pairs, one per axis, got {paddings}")
    if mode not in PAD_MODES:
        raise ShapeError(f'mode must be "constant" or "reflect", got {mode!r}')
    if isinstance(value, str):
        raise ShapeError(f"value must be a number, got {value}")
    if len(paddings) != len(x.shape):
        raise ShapeError(f"paddings give {len(paddings)} axes for x {rules.fmt(x.shape)} of rank {len(x.shape)}")
    if any(b < 0 or a < 0 for b, a in paddings):
        raise ShapeError(f"paddings must not be negative, got {list(paddings)}")
    out = []
    for axis, (d, (b, a)) in enumerate(zip(x.shape, paddings)):
        if mode == "reflect" and d is not None and (b > d - 1 or a > d - 1):
            raise ShapeError(f"reflect padding ({b}, {a}) of axis {axis} needs at most {d - 1} on each side (size {d})")
        out.append(None if d is None else d + b + a)
    return TensorSpec(tuple(out), x.dtype)


def _reflect_index(xp, n: int, before: int, after: int):
    left = xp.arange(before, 0, -1, dtype=xp.int64)
    right = xp.arange(n - 2, n - 2 - after, -1, dtype=xp.int64)
    return xp.concat([left, xp.arange(n, dtype=xp.int64), right])


def _pad_kernel(xp, x, *, paddings, mode, value):
    if mode == "reflect":
        for axis, (b, a) in enumerate(paddings):
            if b or a:
                x = xp.take(x, _reflect_index(xp, x.shape[axis], b, a), axis=axis)
        return x
    shape = tuple(d + b + a for d, (b, a) in zip(x.shape, paddings))
    fill = float(value) if "float" in str(x.dtype) else int(value)
    out = xp.full(shape, fill, dtype=x.dtype)
    out[tuple(slice(b, b + d) for d, (b, _a) in zip(x.shape, paddings))] = x
    return out


def pad_grad(g, x, paddings, mode="constant", name=None):
    """Gradient of :func:`pad` with respect to ``x`` (``x`` gives only the shape)."""
    return apply("pad_grad", g, x, paddings=tuple(paddings), mode=mode, name=name)


def _pad_grad_kernel(xp, g, x, *, paddings, mode):
    if mode == "constant":
        return g[tuple(slice(b, b + d) for d, (b, _a) in zip(x.shape, paddings))]
    for axis in reversed(range(len(paddings))):  # each axis's mirrored parts are added back, last axis first
        b, a = paddings[axis]
        if not (b or a):
            continue
        n = x.shape[axis]
        pos = _reflect_index(xp, n, b, a)
        hot = xp.astype(xp.reshape(pos, (-1, 1)) == xp.reshape(xp.arange(n, dtype=xp.int64), (1, -1)), g.dtype)
        moved = xp.moveaxis(g, axis, -1)
        g = xp.moveaxis(xp.matmul(moved, hot), -1, axis)  # (..., padded) @ (padded, n)
    return g


def _pad_grad_grad(op, gg):
    return pad(gg, op.attrs["paddings"], mode=op.attrs["mode"]), None  # pad_grad is linear in g: its adjoint


defop(
    "pad",
    infer=_pad_spec,
    kernel=_pad_kernel,
    grad=lambda op, g: (pad_grad(g, op.inputs[0], op.attrs["paddings"], op.attrs["mode"]),),
)
defop(
    "pad_grad",
    infer=lambda g, x, *, paddings, mode: TensorSpec(x.shape, g.dtype),
    kernel=_pad_grad_kernel,
    grad=_pad_grad_grad,
)

# -- cumsum -----------------------------------------------------------------------------------


def cumsum(x, axis=0, exclusive=False, reverse=False, name=None):
    """Running sums of ``x`` along ``axis``, as ``tf.math.cumsum`` (``exclusive``: each sum leaves
    its own element out; ``reverse``: sums run from the end)."""
    return apply("cumsum", x, axis=int(axis), exclusive=bool(exclusive), reverse=bool(reverse), name=name)


def _cumsum_spec(x: TensorSpec, *, axis, exclusive, reverse) -> TensorSpec:
    if x.dtype == "bool":
        raise DTypeError("cannot sum a bool tensor; cast it to a number first")
    rules.axis_index(axis, len(x.shape))
    return x


def _cumsum_kernel(xp, x, *, axis, exclusive, reverse):
    axis %= x.ndim
    if reverse:
        x = xp.flip(x, axis=axis)
    if hasattr(xp, "cumulative_sum"):
        out = xp.cumulative_sum(x, axis=axis, dtype=x.dtype, include_initial=exclusive)
    else:  # namespaces before the 2023.12 standard (CuPy 13)
        out = xp.cumsum(x, axis=axis, dtype=x.dtype)
        if exclusive:
            zero = xp.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1 :], dtype=x.dtype)
            out = xp.concatenate([zero, out], axis=axis)
    if exclusive:  # drop the last running sum: each one now leaves its element out
        out = out[tuple(slice(None, -1) if i == axis else slice(None) for i in range(x.ndim))]
    return xp.flip(out, axis=axis) if reverse else out


def _cumsum_grad(op, g):
    attrs = op.attrs
    return (cumsum(g, attrs["axis"], exclusive=attrs["exclusive"], reverse=not attrs["reverse"]),)


defop("cumsum", infer=_cumsum_spec, kernel=_cumsum_kernel, grad=_cumsum_grad)

# -- top_k ------------------------------------------------------------------------------------


def top_k(x, k, name=None):
    """The ``k`` largest values along the last axis of ``x``, in descending order, and their
    indices (int64), as ``tf.math.top_k``; ties go to the lower index. The gradient flows to
    the values' positions; the indices are not differentiable.
    """
    values, indices = apply("top_k", x, k=int(k), name=name)
    return values, indices


def _top_k_spec(x: TensorSpec, *, k):
    if x.dtype == "bool":
        raise DTypeError("top_k needs a number tensor, got bool")
    if not x.shape:
        raise ShapeError("top_k needs a tensor of rank 1 or more, got a scalar")
    n = x.shape[-1]
    if k < 0 or (n is not None and k > n):
        raise ShapeError(f"k = {k} is out of range for a last axis of size {n}")
    shape = x.shape[:-1] + (k,)
    return TensorSpec(shape, x.dtype), TensorSpec(shape, "int64")


def _top_k_kernel(xp, x, *, k):
    # descending, ties to the lower index: a stable ascending sort of the reversed axis, reversed
    n = x.shape[-1]
    ascending = _stable_argsort(xp, xp.flip(x, axis=-1))
    order = (n - 1) - xp.astype(xp.flip(ascending, axis=-1)[..., :k], xp.int64)
    return xp.take_along_axis(x, order, axis=-1), order


def _stable_argsort(xp, x):
    try:
        return xp.argsort(x, axis=-1, stable=True)
    except TypeError:  # plain CuPy takes no ``stable``; its sorts are stable (CUB radix sort)
        return xp.argsort(x, axis=-1)


def top_k_grad(g, indices, x, name=None):
    """``g`` (the values' gradient) put back at ``indices`` along the last axis of zeros like ``x``."""
    return apply("top_k_grad", g, indices, x, name=name)


def _top_k_grad_kernel(xp, g, indices, x):
    if hasattr(xp, "put_along_axis"):
        out = xp.zeros(x.shape, dtype=g.dtype)
        xp.put_along_axis(out, indices, g, axis=-1)  # the indices of a row are distinct
        return out
    n = x.shape[-1]
    hot = xp.reshape(indices, indices.shape + (1,)) == xp.arange(n, dtype=indices.dtype)  # (..., k, n)
    return xp.sum(xp.astype(hot, g.dtype) * xp.reshape(g, g.shape + (1,)), axis=-2)


def _top_k_grad(op, g, g_indices):
    if g_indices is not None:
        raise GradientError("gradient of 'top_k' with respect to its indices output is not defined")
    return (top_k_grad(g, op.outputs[1], op.inputs[0]),)


defop("top_k", infer=_top_k_spec, kernel=_top_k_kernel, grad=_top_k_grad, num_outputs=2)
defop(
    "top_k_grad",
    infer=lambda g, indices, x: TensorSpec(x.shape, g.dtype),
    kernel=_top_k_grad_kernel,
    nondiff="gradient of top_k; second derivatives are not supported",
)

# -- scatter_add ----------------------------------------------------------------------------------


def scatter_add(base, indices, updates, name=None):
    """``base`` with ``updates[i]`` added at row ``indices[i]`` (along axis 0); repeated indices
    add up, as ``jax``'s ``base.at[indices].add(updates)``.

    ``updates`` has the shape ``indices.shape + base.shape[1:]``.
    """
    return apply("scatter_add", base, indices, updates, name=name)


def _scatter_add_spec(base: TensorSpec, indices: TensorSpec, updates: TensorSpec) -> TensorSpec:
    if indices.dtype not in INTS:
        raise DTypeError(f"indices must be an integer tensor, got {indices.dtype}")
    dtype = rules.same_dtype(base, updates)
    if not base.shape:
        raise ShapeError("scatter_add needs a base of rank 1 or more, got a scalar")
    expected = tuple(indices.shape) + tuple(base.shape[1:])
    if len(updates.shape) != len(expected) or not all(map(rules.dims_match, updates.shape, expected)):
        raise ShapeError(
            f"updates {rules.fmt(updates.shape)} must have the shape {rules.fmt(expected)}: "
            f"indices {rules.fmt(indices.shape)} followed by base {rules.fmt(base.shape)} without its first axis"
        )
    return TensorSpec(base.shape, dtype)


def _scatter_add_kernel(xp, base, indices, updates):
    check_indices(xp, indices, base.shape[0])
    return base + _gather_grad_kernel(xp, updates, base, indices, axis=0)


defop(
    "scatter_add",
    infer=_scatter_add_spec,
    kernel=_scatter_add_kernel,
    checks_values=True,
    grad=lambda op, g: (g, None, gather(g, op.inputs[1], axis=0)),
)
