"""Normalization: layer_norm (one fused forward op, one fused backward op) and moments.

``layer_norm`` keeps the mean and the reciprocal standard deviation it computed as
two more outputs, so its gradient reuses them instead of recomputing the statistics.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import GradientError, ShapeError
from workbench.ops import rules
from workbench.ops.math import identity
from workbench.ops.reduce import _axis_attr, unreduce
from workbench.ops.registry import TensorSpec, apply, as_dtype, defop
from workbench.ops.state import constant

# -- layer_norm ----------------------------------------------------------------------------


def layer_norm(x, scale=None, offset=None, axis=-1, epsilon=1e-5, name=None):
    """``(x - mean) / sqrt(variance + epsilon) * scale + offset``, statistics over ``axis``.

    ``axis`` is an int or a tuple of ints; ``scale`` and ``offset`` have the shape of
    ``x`` on those axes (``(features,)`` for the default last axis), or are ``None``
    (1 and 0). As ``torch.nn.functional.layer_norm`` over the trailing axes, with
    TensorFlow's biased variance.

    >>> import numpy as np, workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     y = wb.layer_norm(wb.constant([[1.0, 2.0, 3.0]]), wb.constant([1.0, 1.0, 1.0]), wb.constant([0.0, 0.0, 0.0]))
    >>> [round(float(v), 4) for v in wb.Session(g).run(y)[0]]
    [-1.2247, 0.0, 1.2247]
    """
    axes = _axis_attr(axis)
    axes = (axes,) if isinstance(axes, int) else axes
    if scale is None or offset is None:
        xshape, like = getattr(x, "shape", None), as_dtype(getattr(x, "dtype", "float32"))
        shape = None if xshape is None else tuple(xshape[a % len(xshape)] for a in axes)
        if shape is None or None in shape:
            raise ShapeError("layer_norm without scale or offset needs the normalized axes' sizes to be known")
        scale = constant(np.ones(shape), dtype=like) if scale is None else scale
        offset = constant(np.zeros(shape), dtype=like) if offset is None else offset
    y, _mean, _rstd = apply("layer_norm", x, scale, offset, axis=axes, epsilon=float(epsilon), name=name)
    return y


def _norm_axes(x: TensorSpec, axis) -> tuple[int, ...]:
    return rules.axes_tuple(axis, len(x.shape))


def _layer_norm_spec(x: TensorSpec, scale: TensorSpec, offset: TensorSpec, *, axis, epsilon):
    rules.need_float(x)
    dtype = rules.same_dtype(x, scale, offset)
    axes = _norm_axes(x, axis)
    expected = tuple(x.shape[a] for a in axes)
    for what, spec in (("scale", scale), ("offset", offset)):
        if len(spec.shape) != len(expected) or not all(map(rules.dims_match, spec.shape, expected)):
            raise ShapeError(
                f"{what} {rules.fmt(spec.shape)} must have the shape {rules.fmt(expected)} of x "
                f"{rules.fmt(x.shape)} on axis {axis}"
            )
    if epsilon < 0:
        raise ShapeError(f"epsilon must not be negative, got {epsilon}")
    stats = TensorSpec(rules.reduced_shape(x.shape, axes, True), dtype)
    return TensorSpec(x.shape, dtype), stats, stats


def _broadcast_param(xp, p, ndim: int, axes: tuple[int, ...]):
    """``p`` (shaped like x on ``axes``) reshaped to broadcast against x."""
    if axes == tuple(range(ndim - len(axes), ndim)):
        return p  # trailing axes: NumPy broadcasting lines them up already
    shape = [1] * ndim
    for a, d in zip(axes, p.shape, strict=True):
        shape[a] = d
    return xp.reshape(p, tuple(shape))


def _layer_norm_kernel(xp, x, scale, offset, *, axis, epsilon):
    axes = _norm_axes(TensorSpec(x.shape, ""), axis)
    count = 1
    for a in axes:
        count *= x.shape[a]
    mean = xp.mean(x, axis=axes, keepdims=True)
    y = x - mean  # the one full-size temporary, which becomes the result
    if axes == (x.ndim - 1,) and hasattr(xp, "vecdot"):
        var = xp.vecdot(y, y, axis=-1)[..., None] / count  # no squared temporary
    else:
        var = xp.mean(y * y, axis=axes, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + epsilon)
    y *= rstd
    y *= _broadcast_param(xp, scale, x.ndim, axes)
    y += _broadcast_param(xp, offset, x.ndim, axes)
    return y, mean, rstd


def layer_norm_grad(g, x, scale, mean, rstd, axis, name=None):
    """Gradients of :func:`layer_norm` with respect to ``x``, ``scale`` and ``offset``, in one pass."""
    return apply("layer_norm_grad", g, x, scale, mean, rstd, axis=axis, name=name)


def _layer_norm_grad_spec(g, x, scale, mean, rstd, *, axis):
    return TensorSpec(x.shape, g.dtype), TensorSpec(scale.shape, g.dtype), TensorSpec(scale.shape, g.dtype)


def _layer_norm_grad_kernel(xp, g, x, scale, mean, rstd, *, axis):
    axes = _norm_axes(TensorSpec(x.shape, ""), axis)
    others = tuple(i for i in range(x.ndim) if i not in axes)
    xhat = x - mean
    xhat *= rstd
    gs = g * _broadcast_param(xp, scale, x.ndim, axes)  # d loss / d xhat
    # dx = rstd (gs - mean(gs) - xhat mean(gs xhat)), the means over the normalized axes
    proj = xp.mean(gs * xhat, axis=axes, keepdims=True)
    dx = gs - xp.mean(gs, axis=axes, keepdims=True)
    gs = xhat
    gs *= proj
    dx -= gs
    dx *= rstd
    xhat = x - mean
    xhat *= rstd
    dscale = xp.sum(g * xhat, axis=others) if others else g * xhat
    doffset = xp.sum(g, axis=others) if others else g
    # the sums keep the normalized axes in order, the shape of scale
    return dx, xp.reshape(dscale, scale.shape), xp.reshape(doffset, scale.shape)


def _layer_norm_grad(op, g, g_mean, g_rstd):
    if g_mean is not None or g_rstd is not None:
        raise GradientError("gradient of 'layer_norm' with respect to its saved statistics is not defined")
    x, scale, _offset = op.inputs
    _y, mean, rstd = op.outputs
    # each gradient through identity: a single-output op, which a distributed fit can cut the graph at
    return tuple(identity(d) for d in layer_norm_grad(g, x, scale, mean, rstd, axis=op.attrs["axis"]))


defop("layer_norm", infer=_layer_norm_spec, kernel=_layer_norm_kernel, grad=_layer_norm_grad, num_outputs=3)
defop(
    "layer_norm_grad",
    infer=_layer_norm_grad_spec,
    kernel=_layer_norm_grad_kernel,
    num_outputs=3,
    nondiff="gradient of layer_norm; second derivatives are not supported",
)

# -- moments ----------------------------------------------------------------------------------


def moments(x, axes, keepdims=False, name=None):
    """``(mean, variance)`` of ``x`` over ``axes``, as ``tf.nn.moments`` (the biased variance).

    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     m, v = wb.moments(wb.constant([[1.0, 3.0], [5.0, 7.0]]), axes=[0])
    >>> [a.tolist() for a in wb.Session(g).run([m, v])]
    [[3.0, 5.0], [4.0, 4.0]]
    """
    axes = _axis_attr(axes)
    return apply("moments", x, axis=axes, keepdims=bool(keepdims), name=name)


def _moments_spec(x: TensorSpec, *, axis, keepdims):
    rules.need_float(x)
    spec = TensorSpec(rules.reduced_shape(x.shape, axis, keepdims), x.dtype)
    return spec, spec


def _moments_kernel(xp, x, *, axis, keepdims):
    axes = rules.axes_tuple(axis, x.ndim)
    mean = xp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    centered *= centered
    var = xp.mean(centered, axis=axes, keepdims=keepdims)
    return (mean if keepdims else xp.reshape(mean, var.shape)), var


def _moments_grad(op, g_mean, g_var):
    x = op.inputs[0]
    attrs = {"axis": op.attrs["axis"], "keepdims": op.attrs["keepdims"]}
    grads = []
    if g_mean is not None:
        grads.append(unreduce(g_mean, x, mean=True, **attrs))
    if g_var is not None:  # d var / d x = 2 (x - mean) / n; the mean's own dependence sums to zero
        centered = x - unreduce(op.outputs[0], x, **attrs)
        grads.append(unreduce(g_var, x, mean=True, **attrs) * (2 * centered))
    total = grads[0]
    for part in grads[1:]:
        total = total + part
    return (total,)


defop("moments", infer=_moments_spec, kernel=_moments_kernel, grad=_moments_grad, num_outputs=2)
