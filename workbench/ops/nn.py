"""Neural-network ops: softmax, cross-entropy, conv2d, max_pool2d, dropout."""

from __future__ import annotations

import numpy as np

from workbench.errors import ArgumentError, DTypeError, GradientError, ShapeError
from workbench.ops import im2col, registry, rules
from workbench.ops.im2col import out_size as _out_size
from workbench.ops.array import check_indices
from workbench.ops.fused import device_kernel
from workbench.ops.math import exp, where
from workbench.ops.reduce import sum
from workbench.ops.registry import INTS, TensorSpec, apply, defop

# -- softmax family ----------------------------------------------------------------


def softmax(x, axis=-1, name=None):
    """``exp(x) / sum(exp(x))`` along ``axis``, computed without overflow."""
    return apply("softmax", x, axis=int(axis), name=name)


def log_softmax(x, axis=-1, name=None):
    """``x - log(sum(exp(x)))`` along ``axis``, computed without overflow."""
    return apply("log_softmax", x, axis=int(axis), name=name)


def _softmax_spec(x: TensorSpec, *, axis) -> TensorSpec:
    rules.need_float(x)
    rules.axis_index(axis, len(x.shape))
    return x


def _softmax_kernel(xp, x, *, axis):
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def _log_softmax_kernel(xp, x, *, axis):
    z = x - xp.max(x, axis=axis, keepdims=True)
    return z - xp.log(xp.sum(xp.exp(z), axis=axis, keepdims=True))


def _softmax_grad(op, g):
    y, axis = op.outputs[0], op.attrs["axis"]
    return (y * (g - sum(g * y, axis=axis, keepdims=True)),)


def _log_softmax_grad(op, g):
    y, axis = op.outputs[0], op.attrs["axis"]
    return (g - exp(y) * sum(g, axis=axis, keepdims=True),)


defop("softmax", infer=_softmax_spec, kernel=_softmax_kernel, grad=_softmax_grad)
defop("log_softmax", infer=_softmax_spec, kernel=_log_softmax_kernel, grad=_log_softmax_grad)


def softmax_cross_entropy(logits, labels, name=None):
    """Per-example cross-entropy of ``softmax(logits)`` against integer class ``labels``.

    ``logits`` has shape ``(..., classes)`` and ``labels`` the leading shape
    ``(...)``. Computed from log-softmax, so it never overflows; the softmax is
    kept as a second output for the gradient, as TensorFlow does.
    """
    loss, _probs = apply("softmax_cross_entropy", logits, labels, name=name)
    return loss


def _sce_spec(logits: TensorSpec, labels: TensorSpec):
    rules.need_float(logits, "logits")
    if labels.dtype not in INTS:
        raise DTypeError(f"labels must be an integer tensor of class indices, got {labels.dtype}")
    lead = logits.shape[:-1]
    if len(logits.shape) < 1 or len(labels.shape) != len(lead) or not all(map(rules.dims_match, labels.shape, lead)):
        raise ShapeError(
            f"labels {rules.fmt(labels.shape)} must have the shape of logits {rules.fmt(logits.shape)} "
            "without its last (class) axis"
        )
    return TensorSpec(lead, logits.dtype), logits


def _sce_kernel(xp, logits, labels):
    check_indices(xp, labels, logits.shape[-1], "label")
    z = logits - xp.max(logits, axis=-1, keepdims=True)
    e = xp.exp(z)
    s = xp.sum(e, axis=-1, keepdims=True)
    return xp.log(s[..., 0]) - _picked(xp, z, labels), e / s


def _picked(xp, z, labels):
    """``z[..., labels]`` row by row: one ``take`` from the flat ``z`` at ``row * classes + label``
    (NumPy's ``take_along_axis`` builds an index per axis in Python, a few times the cost)."""
    classes = z.shape[-1]
    starts = xp.arange(0, labels.size * classes, classes, dtype=xp.int64)
    flat = xp.take(xp.reshape(z, (-1,)), xp.reshape(xp.astype(labels, xp.int64, copy=False), (-1,)) + starts)
    return xp.reshape(flat, labels.shape)


def _sce_grad(op, g, g_probs):
    if g_probs is not None:
        raise_second_output(op)
    probs, labels = op.outputs[1], op.inputs[1]
    return apply("softmax_cross_entropy_grad", probs, labels, g), None


def raise_second_output(op):
    raise GradientError(f"gradient of '{op.type}' with respect to its softmax output is not defined")


def _sce_grad_kernel(xp, probs, labels, g):
    classes = xp.arange(probs.shape[-1], dtype=labels.dtype)
    hot = xp.astype(labels[..., None] == classes, probs.dtype)
    return (probs - hot) * g[..., None]


defop("softmax_cross_entropy", infer=_sce_spec, kernel=_sce_kernel, grad=_sce_grad, num_outputs=2, checks_values=True)
defop(
    "softmax_cross_entropy_grad",
    infer=lambda probs, labels, g: probs,
    kernel=_sce_grad_kernel,
    nondiff="gradient of the cross-entropy; second derivatives are not supported",
)

# -- convolution and pooling (NCHW) ---------------------------------------------------


def _pair(v, what: str = "stride") -> tuple[int, int]:
    """An int or (height, width) pair; TensorFlow's 4-element lists are refused with a pointer."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return (int(v), int(v))
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(d, (int, np.integer)) for d in v):
        return (int(v[0]), int(v[1]))
    hint = ""
    if isinstance(v, (list, tuple)) and len(v) == 4:
        hint = (
            f"; {list(v)} is TensorFlow's per-axis form: here give ({v[1]}, {v[2]}) for NHWC, or use "
            "workbench.tf1.nn (conv2d, max_pool, avg_pool), which takes it with data_format='NHWC'"
        )
    raise ShapeError(f"{what} is an int or a pair (height, width), got {v!r}{hint}")


def _padding(padding):
    """``padding`` in lower case: ``'SAME'`` as TensorFlow writes it is ``"same"`` (the shape rule checks it)."""
    return padding.lower() if isinstance(padding, str) else padding


def _check_padding(padding: str) -> str:
    if padding not in ("same", "valid"):
        raise ShapeError(f'padding must be "same" or "valid" (in any case), got {padding!r}')
    return padding


def conv2d(x, w, stride=1, padding="valid", name=None):
    """2-D convolution (cross-correlation) of ``x`` (N, C, H, W) with ``w`` (O, C, kh, kw).

    ``padding="same"`` pads so that the output has ``ceil(H / stride)`` rows,
    the extra row going at the bottom, as in TensorFlow.
    """
    return apply("conv2d", x, w, stride=_pair(stride), padding=_padding(padding), name=name)


def _conv_spec(x: TensorSpec, w: TensorSpec, *, stride, padding) -> TensorSpec:
    _check_padding(padding)
    dtype = rules.same_dtype(x, w)
    rules.need_float(x)
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(
            f"needs x of shape (N, C, H, W) and w of shape (O, C, kh, kw), got {rules.fmt(x.shape)} and {rules.fmt(w.shape)}"
        )
    if not rules.dims_match(x.shape[1], w.shape[1]):
        raise ShapeError(
            f"x has {x.shape[1]} channels but w {rules.fmt(w.shape)} expects {w.shape[1]}{_layout_hint(x, w)}"
        )
    if min(stride) < 1:
        raise ShapeError(f"stride must be positive, got {stride}")
    outs = []
    for size, k, s in zip(x.shape[2:], w.shape[2:], stride):
        out = _out_size(size, k, s, padding)[2]
        if out is not None and out < 1:
            raise ShapeError(f"kernel {rules.fmt(w.shape[2:])} is larger than the input {rules.fmt(x.shape[2:])}")
        outs.append(out)
    return TensorSpec((x.shape[0], w.shape[0], *outs), dtype)


def _layout_hint(x: TensorSpec, w: TensorSpec) -> str:
    """Why NCHW shapes do not fit, when they would fit TensorFlow's NHWC data or HWIO filters."""
    xs, ws = x.shape, w.shape
    if xs[3] is not None and xs[3] == ws[2]:
        found = "x as (N, H, W, C) and w as (kh, kw, in, out)"
    elif xs[3] is not None and xs[3] == ws[1]:
        found = "x as (N, H, W, C)"
    elif xs[1] is not None and xs[1] == ws[2] and ws[2] != ws[3]:
        found = "w as (kh, kw, in, out)"
    else:
        return ""
    return (
        f"; conv2d takes x as (N, C, H, W) and w as (out, in, kh, kw), and these shapes fit TensorFlow's "
        f"layout ({found}): transpose them, or use workbench.tf1.nn.conv2d(x, w, strides, padding, data_format='NHWC')"
    )


def _padded(xp, x, pads, fill=0.0):
    (pt, pb), (pl, pr) = pads
    if not (pt or pb or pl or pr):
        return x
    n, c, h, w = x.shape
    out = xp.full((n, c, h + pt + pb, w + pl + pr), fill, dtype=x.dtype)
    out[:, :, pt : pt + h, pl : pl + w] = x
    return out


def _geometry(shape, kernel, stride, padding):
    """Padding and output size of both spatial axes."""
    (pt, pb, ho), (pl, pr, wo) = (_out_size(shape[i + 2], kernel[i], stride[i], padding) for i in (0, 1))
    return ((pt, pb), (pl, pr)), ho, wo


def _windows(xp, x, kernel, stride, padding, fill=0.0):
    """The kh*kw shifted, strided views of padded ``x``: a list of (N, C, Ho, Wo) arrays."""
    pads, ho, wo = _geometry(x.shape, kernel, stride, padding)
    xp_ = _padded(xp, x, pads, fill)
    (kh, kw), (sh, sw) = kernel, stride
    return [
        xp_[:, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw] for i in range(kh) for j in range(kw)
    ]


def _unwindow(xp, parts, shape, kernel, stride, padding):
    """Adjoint of :func:`_windows`: add each (N, C, Ho, Wo) part back at its offset."""
    pads, ho, wo = _geometry(shape, kernel, stride, padding)
    (pt, pb), (pl, pr) = pads
    n, c, h, w = shape
    out = xp.zeros((n, c, h + pt + pb, w + pl + pr), dtype=parts[0].dtype)
    (_, kw), (sh, sw) = kernel, stride
    for p, part in enumerate(parts):
        i, j = divmod(p, kw)
        region = (slice(None), slice(None), slice(i, i + sh * (ho - 1) + 1, sh), slice(j, j + sw * (wo - 1) + 1, sw))
        out[region] = out[region] + part
    return out[:, :, pt : pt + h, pl : pl + w]


def _im2col(xp, x, kernel, stride, padding):
    """(N, C*kh*kw, Ho*Wo) columns of ``x``."""
    cols = xp.stack(_windows(xp, x, kernel, stride, padding), axis=2)  # (N, C, kh*kw, Ho, Wo)
    n, c, k, ho, wo = cols.shape
    return xp.reshape(cols, (n, c * k, ho * wo)), ho, wo


def _conv_kernel(xp, x, w, *, stride, padding):
    fast = device_kernel("conv2d", xp, (x, w), {"stride": stride, "padding": padding})
    if fast is not None:  # a device's generated kernels (see workbench.gpu.conv_kernels)
        return fast(x, w)
    if im2col.strided(xp):
        return im2col.conv(xp, x, w, stride, padding)
    cols, ho, wo = _im2col(xp, x, w.shape[2:], stride, padding)  # any array-API namespace
    out = xp.matmul(xp.reshape(w, (w.shape[0], -1)), cols)  # (N, O, Ho*Wo)
    return xp.reshape(out, (x.shape[0], w.shape[0], ho, wo))


def _conv_input_grad_kernel(xp, g, x, w, *, stride, padding):
    fast = device_kernel("conv2d_input_grad", xp, (g, x, w), {"stride": stride, "padding": padding})
    if fast is not None:
        return fast(g, x, w)
    if im2col.strided(xp):
        return im2col.conv_input_grad(xp, g, x.shape, w, stride, padding)
    o, c, kh, kw = w.shape
    n = g.shape[0]
    cols = xp.matmul(xp.matrix_transpose(xp.reshape(w, (o, -1))), xp.reshape(g, (n, o, -1)))  # (N, C*kh*kw, Ho*Wo)
    cols = xp.reshape(cols, (n, c, kh * kw) + g.shape[2:])
    parts = [cols[:, :, p, ...] for p in range(kh * kw)]
    return _unwindow(xp, parts, x.shape, (kh, kw), stride, padding)


def _conv_filter_grad_kernel(xp, x, g, w, *, stride, padding):
    fast = device_kernel("conv2d_filter_grad", xp, (x, g, w), {"stride": stride, "padding": padding})
    if fast is not None:
        return fast(x, g, w)
    if im2col.strided(xp):
        return im2col.conv_filter_grad(xp, x, g, w, stride, padding)
    cols, _, _ = _im2col(xp, x, w.shape[2:], stride, padding)
    n, o = g.shape[:2]
    per_example = xp.matmul(xp.reshape(g, (n, o, -1)), xp.matrix_transpose(cols))  # (N, O, C*kh*kw)
    return xp.reshape(xp.sum(per_example, axis=0), w.shape)


def conv2d_input_grad(g, x, w, stride=1, padding="valid", name=None):
    """Gradient of :func:`conv2d` with respect to ``x`` (``x`` gives only the shape)."""
    return apply("conv2d_input_grad", g, x, w, stride=_pair(stride), padding=_padding(padding), name=name)


def conv2d_filter_grad(x, g, w, stride=1, padding="valid", name=None):
    """Gradient of :func:`conv2d` with respect to ``w`` (``w`` gives only the shape)."""
    return apply("conv2d_filter_grad", x, g, w, stride=_pair(stride), padding=_padding(padding), name=name)


def _conv_grad(op, g):
    x, w = op.inputs
    return conv2d_input_grad(g, x, w, **op.attrs), conv2d_filter_grad(x, g, w, **op.attrs)


def _conv_input_grad_grad(op, gg):
    g, x, w = op.inputs  # the op is linear in g and in w
    return conv2d(gg, w, **op.attrs), None, conv2d_filter_grad(gg, g, w, **op.attrs)


def _conv_filter_grad_grad(op, gg):
    x, g, w = op.inputs  # the op is linear in x and in g
    return conv2d_input_grad(g, x, gg, **op.attrs), conv2d(x, gg, **op.attrs), None


defop("conv2d", infer=_conv_spec, kernel=_conv_kernel, grad=_conv_grad)
defop(
    "conv2d_input_grad",
    infer=lambda g, x, w, **_: TensorSpec(x.shape, g.dtype),
    kernel=_conv_input_grad_kernel,
    grad=_conv_input_grad_grad,
)
defop(
    "conv2d_filter_grad",
    infer=lambda x, g, w, **_: TensorSpec(w.shape, g.dtype),
    kernel=_conv_filter_grad_kernel,
    grad=_conv_filter_grad_grad,
)


def max_pool2d(x, size, stride=None, padding="valid", name=None):
    """Max pooling of ``x`` (N, C, H, W) over ``size`` windows; ``stride`` defaults to ``size``."""
    size = _pair(size, "size")
    stride = size if stride is None else _pair(stride)
    return apply("max_pool2d", x, size=size, stride=stride, padding=_padding(padding), name=name)


def _pool_spec(x: TensorSpec, *, size, stride, padding) -> TensorSpec:
    _check_padding(padding)
    rules.need_float(x)
    if len(x.shape) != 4:
        raise ShapeError(f"needs x of shape (N, C, H, W), got {rules.fmt(x.shape)}")
    if min(size) < 1 or min(stride) < 1:
        raise ShapeError(f"size and stride must be positive, got {size} and {stride}")
    outs = []
    for dim, k, s in zip(x.shape[2:], size, stride):
        out = _out_size(dim, k, s, padding)[2]
        if out is not None and out < 1:
            raise ShapeError(f"window {size} is larger than the input {rules.fmt(x.shape[2:])}")
        outs.append(out)
    return TensorSpec(x.shape[:2] + tuple(outs), x.dtype)


def _pool_kernel(xp, x, *, size, stride, padding):
    if im2col.strided(xp):
        return im2col.max_pool(xp, x, size, stride, padding)
    parts = _windows(xp, x, size, stride, padding, fill=-float("inf"))
    return xp.max(xp.stack(parts, axis=0), axis=0)


def _pool_grad_kernel(xp, g, x, y=None, *, size, stride, padding):
    if im2col.strided(xp):
        return im2col.max_pool_grad(xp, g, x, size, stride, padding, pooled=y)
    parts = xp.stack(_windows(xp, x, size, stride, padding, fill=-float("inf")), axis=0)
    winner = xp.argmax(parts, axis=0)  # the first maximum of each window takes the gradient
    zero = xp.zeros_like(g)
    grads = [xp.where(winner == p, g, zero) for p in range(parts.shape[0])]
    return _unwindow(xp, grads, x.shape, size, stride, padding)


def _pool_grad(op, g):
    # the forward's output comes along, so the backward pass does not take the maxima again
    return (apply("max_pool2d_grad", g, op.inputs[0], op.outputs[0], **op.attrs),)


defop("max_pool2d", infer=_pool_spec, kernel=_pool_kernel, grad=_pool_grad)
defop(
    "max_pool2d_grad",
    infer=lambda g, x, y=None, **_: TensorSpec(x.shape, g.dtype),
    kernel=_pool_grad_kernel,
    nondiff="gradient of max_pool2d; second derivatives are not supported",
)

# -- dropout -------------------------------------------------------------------------------


def dropout(x, rate, training=True, seed=None, name=None):
    """Zero each element with probability ``rate`` and scale the rest by ``1 / (1 - rate)``.

    ``rate`` is a float in [0, 1) or a scalar float tensor (a placeholder: ``keep_prob``
    style). ``training`` switches it: a Python bool (``False``: ``x`` comes back as it
    is) or a scalar bool tensor, usually ``placeholder("training", (), "bool",
    default=False)``; where it is false the output is ``x``, and a plan compiled with
    ``training`` left at a known value keeps only the branch it takes.

    The mask comes from a generator seeded by the session's seed, this op's
    ``seed`` (its name when ``None``) and the run count, so runs repeat exactly.
    """
    if isinstance(training, (bool, np.bool_)):
        if not training:
            return x
        return _dropout(x, rate, seed, name)
    if isinstance(training, (int, np.integer)):
        raise ArgumentError(
            f"dropout: training must be a bool or a bool tensor, got {training!r} "
            "(the third argument is training; give the seed as seed=)"
        )
    if getattr(training, "dtype", None) != "bool" or training.shape not in ((), None):
        got = (
            f"{training.dtype} tensor of shape {rules.fmt(training.shape or ())}"
            if hasattr(training, "op")
            else repr(training)
        )
        raise DTypeError(f"dropout: training must be a bool, or a scalar bool tensor, got {got}")
    dropped = _dropout(x, rate, seed, name)
    return where(training, dropped, x, name=None if name is None else f"{name}_switch")


def _dropout(x, rate, seed, name):
    if hasattr(rate, "op"):  # a tensor: the rate is read when the graph runs
        y, _mask = apply("dropout", x, rate, rate=None, seed=seed, name=name)
    else:
        y, _mask = apply("dropout", x, rate=float(rate), seed=seed, name=name)
    return y


def _dropout_spec(x: TensorSpec, *rate_tensor: TensorSpec, rate, seed):
    if rate_tensor:
        (r,) = rate_tensor
        if not registry.is_float(r.dtype) or (r.shape is not None and len(r.shape) != 0):
            raise DTypeError(f"a rate tensor must be a float scalar, got {r.dtype} of shape {rules.fmt(r.shape or ())}")
    elif not 0.0 <= rate < 1.0:
        raise ShapeError(f"rate must be in [0, 1), got {rate}")
    rules.need_float(x)
    return x, x


def _dropout_kernel(xp, x, *rate_value, rate, seed, rng):
    draws = rng.random(tuple(x.shape))  # drawn on the host: the same mask on every device
    if rate_value:
        keep = 1.0 - xp.astype(xp.asarray(rate_value[0]), x.dtype)
        kept = xp.asarray(draws) < keep
        scale = 1.0 / xp.where(keep > 0, keep, 1.0)  # a rate of 1 keeps nothing: no division by 0
        mask = xp.where(kept, scale, 0.0)
        return x * xp.astype(mask, x.dtype), xp.astype(mask, x.dtype)
    mask = xp.astype(xp.asarray(draws < (1.0 - rate)), x.dtype) / (1.0 - rate)
    return x * mask, mask


def _dropout_grad(op, g, g_mask):
    # the mask does not depend on x's values: a gradient reaching only the mask (a second-order one,
    # through the first gradient's ``g * mask``) is zero for x
    if g is None:
        return (None,) * len(op.inputs)
    return (g * op.outputs[1],) + (None,) * (len(op.inputs) - 1)


defop(
    "dropout",
    infer=_dropout_spec,
    kernel=_dropout_kernel,
    grad=_dropout_grad,
    num_outputs=2,
    random=True,
    variadic=True,
)
