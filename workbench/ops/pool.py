"""Average pooling (NCHW), with TensorFlow's padding rules.

``padding="same"`` pads as :func:`~workbench.ops.nn.max_pool2d` does (the extra row
or column at the end) and divides each window by the number of real pixels in it,
as ``tf.nn.avg_pool2d``: the padding never counts.
"""

from __future__ import annotations

from workbench.ops.nn import _geometry, _padded, _pair, _pool_spec, _unwindow
from workbench.ops.registry import TensorSpec, apply, defop


def avg_pool2d(x, size, stride=None, padding="valid", name=None):
    """Average pooling of ``x`` (N, C, H, W) over ``size`` windows; ``stride`` defaults to ``size``.

    >>> import numpy as np, workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     y = wb.avg_pool2d(wb.constant(np.arange(9.0).reshape(1, 1, 3, 3)), 2, padding="same")
    >>> wb.Session(g).run(y)[0, 0].tolist()
    [[2.0, 3.5], [6.5, 8.0]]
    """
    size = _pair(size)
    stride = size if stride is None else _pair(stride)
    return apply("avg_pool2d", x, size=size, stride=stride, padding=padding, name=name)


def _counts(xp, shape, size, stride, padding, dtype):
    """(Ho, Wo) array: how many real pixels each window covers."""
    pads, ho, wo = _geometry(shape, size, stride, padding)
    per_axis = []
    for (before, _after), n, k, s, length in zip(pads, (ho, wo), size, stride, shape[2:]):
        start = xp.arange(n, dtype=xp.int64) * s - before
        stop = start + k
        count = xp.minimum(stop, length) - xp.maximum(start, 0)
        per_axis.append(xp.astype(count, dtype))
    return xp.reshape(per_axis[0], (ho, 1)) * xp.reshape(per_axis[1], (1, wo))


def _window_sum(xp, x, size, stride, padding):
    pads, ho, wo = _geometry(x.shape, size, stride, padding)
    padded = _padded(xp, x, pads)
    (kh, kw), (sh, sw) = size, stride
    total = None
    for i in range(kh):
        for j in range(kw):
            part = padded[:, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]
            if total is None:
                total = part + 0  # a copy: the running sum is written in place
            else:
                total += part
    return total


def _avg_pool_kernel(xp, x, *, size, stride, padding):
    total = _window_sum(xp, x, size, stride, padding)
    total /= _counts(xp, x.shape, size, stride, padding, x.dtype)
    return total


def avg_pool2d_grad(g, x, size, stride, padding="valid", name=None):
    """Gradient of :func:`avg_pool2d` with respect to ``x`` (``x`` gives only the shape)."""
    return apply("avg_pool2d_grad", g, x, size=_pair(size), stride=_pair(stride), padding=padding, name=name)


def _avg_pool_grad_kernel(xp, g, x, *, size, stride, padding):
    share = g / _counts(xp, x.shape, size, stride, padding, g.dtype)
    return _unwindow(xp, [share] * (size[0] * size[1]), x.shape, size, stride, padding)


def _avg_pool_grad_grad(op, gg):
    return avg_pool2d(gg, **op.attrs), None  # the op is linear in g: its adjoint is the pooling


defop(
    "avg_pool2d",
    infer=_pool_spec,
    kernel=_avg_pool_kernel,
    grad=lambda op, g: (avg_pool2d_grad(g, op.inputs[0], **op.attrs),),
)
defop(
    "avg_pool2d_grad",
    infer=lambda g, x, **_: TensorSpec(x.shape, g.dtype),
    kernel=_avg_pool_grad_kernel,
    grad=_avg_pool_grad_grad,
)
