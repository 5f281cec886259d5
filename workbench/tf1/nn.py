"""``tf.nn``: activations, dropout, convolution and pooling in TensorFlow's NHWC layout, cross-entropies.

NHWC data and HWIO filters (``[height, width, in, out]``) are mapped onto workbench's
NCHW ops with transposes around each op; ``data_format="NCHW"`` passes through. The plan
compiler folds the transposes between layers away (:mod:`workbench.graph.layout`): the bias
adds and activations between them run in NCHW, and a stack of layers keeps one transpose at
its input and one at its output.
"""

from __future__ import annotations

import workbench as wb
from workbench.errors import ArgumentError, ShapeError
from workbench.graph.core import Tensor, user_source
from workbench.ops import rules
from workbench.tf1._common import unsupported

relu = wb.relu
sigmoid = wb.sigmoid
tanh = wb.tanh

_TO_NCHW, _TO_NHWC, _HWIO_TO_OIHW = (0, 3, 1, 2), (0, 2, 3, 1), (3, 2, 0, 1)


def softmax(logits, axis=None, name=None, dim=None):
    """``tf.nn.softmax(logits, axis=-1)`` (``dim`` is the old spelling of ``axis``)."""
    axis = -1 if axis is None and dim is None else axis if dim is None else dim
    return wb.softmax(logits, axis=axis, name=name)


def log_softmax(logits, axis=None, name=None, dim=None):
    """``tf.nn.log_softmax(logits, axis=-1)``."""
    axis = -1 if axis is None and dim is None else axis if dim is None else dim
    return wb.log_softmax(logits, axis=axis, name=name)


def relu6(features, name=None):
    """``min(max(features, 0), 6)``."""
    return wb.minimum(wb.relu(features), 6.0, name=name)


def leaky_relu(features, alpha=0.2, name=None):
    """``max(features, alpha * features)`` (for ``0 <= alpha <= 1``)."""
    return wb.maximum(features, wb.multiply(features, float(alpha)), name=name)


def elu(features, name=None):
    """``features`` where positive, ``exp(features) - 1`` elsewhere."""
    return wb.where(wb.greater(features, 0.0), features, wb.exp(wb.minimum(features, 0.0)) - 1.0, name=name)


def selu(features, name=None):
    """The scaled ELU of Klambauer et al. (2017), TensorFlow's constants."""
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    negative = wb.multiply(wb.exp(wb.minimum(features, 0.0)) - 1.0, alpha)
    return wb.multiply(wb.where(wb.greater(features, 0.0), features, negative), scale, name=name)


def softplus(features, name=None):
    """``log(1 + exp(features))``, as ``max(x, 0) + log(1 + exp(-|x|))`` so that it does not overflow."""
    return wb.add(wb.relu(features), wb.log(wb.exp(wb.negative(wb.abs(features))) + 1.0), name=name)


def moments(x, axes, shift=None, name=None, keep_dims=None, keepdims=None):
    """``(mean, variance)`` over ``axes``: :func:`workbench.moments`."""
    keep = bool(keepdims if keep_dims is None else keep_dims)
    return wb.moments(x, [int(a) for a in axes], keepdims=keep, name=name)


def batch_normalization(x, mean, variance, offset, scale, variance_epsilon, name=None):
    """``(x - mean) / sqrt(variance + variance_epsilon) * scale + offset`` (``offset``/``scale`` may be None)."""
    y = (x - mean) * wb.rsqrt(variance + variance_epsilon)
    if scale is not None:
        y = y * scale
    if offset is not None:
        y = y + offset
    return y if name is None else wb.identity(y, name=name)


def embedding_lookup(params, ids, partition_strategy="mod", name=None, max_norm=None):
    """The rows of ``params`` at ``ids`` (one table: a list of shards is not supported)."""
    if isinstance(params, (list, tuple)):
        if len(params) != 1:
            raise ArgumentError("tf.nn.embedding_lookup: sharded tables (a list of params) are not supported")
        params = params[0]
    if max_norm is not None:
        raise ArgumentError("tf.nn.embedding_lookup: max_norm is not supported")
    return wb.gather(params, ids, name=name)


def l2_normalize(x, axis=None, epsilon=1e-12, name=None, dim=None):
    """``x / sqrt(max(sum(x ** 2, axis), epsilon))``."""
    axis = dim if axis is None else axis
    axis = None if axis is None else int(axis) if isinstance(axis, int) else tuple(int(a) for a in axis)
    squares = wb.sum(wb.square(x), axis=axis, keepdims=True)
    return wb.multiply(x, wb.rsqrt(wb.maximum(squares, float(epsilon))), name=name)


def top_k(input, k=1, sorted=True, name=None):  # noqa: A002 - TensorFlow's names
    """``(values, indices)`` of the ``k`` largest entries of the last axis, largest first."""
    if not sorted:
        raise ArgumentError("tf.nn.top_k: only sorted=True is supported")
    return wb.top_k(input, int(k), name=name)


def in_top_k(predictions, targets, k, name=None):
    """Whether each row's target class is among the ``k`` largest predictions (ties broken by index)."""
    _, indices = wb.top_k(predictions, int(k))
    hits = wb.equal(indices, wb.expand_dims(wb.cast(targets, indices.dtype), -1))
    return wb.greater(wb.sum(wb.cast(hits, "int32"), axis=-1), 0, name=name)


def l2_loss(t, name=None):
    """``sum(t ** 2) / 2``."""
    return wb.multiply(wb.sum(t * t), 0.5, name=name)


def bias_add(value, bias, data_format="NHWC", name=None):
    """``value + bias`` along the channel axis (the last one, or axis 1 with ``data_format="NCHW"``)."""
    if _layout(data_format, "bias_add") == "NCHW" and value.shape is not None and len(value.shape) > 2:
        bias = wb.reshape(bias, (-1,) + (1,) * (len(value.shape) - 2))
    return wb.add(value, bias, name=name)


def dropout(x, keep_prob=None, noise_shape=None, seed=None, name=None, rate=None):
    """``tf.nn.dropout(x, keep_prob)``: keep each element with probability ``keep_prob`` (a float or a
    scalar tensor, e.g. a placeholder fed 0.5 for training and 1.0 for evaluation), scaled by ``1 / keep_prob``.

    ``rate=`` (TensorFlow 1.13+) is ``1 - keep_prob``. ``keep_prob`` 1.0 returns ``x``.
    """
    if noise_shape is not None:
        raise ArgumentError("tf.nn.dropout: noise_shape is not supported; dropout draws one mask element per element")
    if (keep_prob is None) == (rate is None):
        raise ArgumentError("tf.nn.dropout needs keep_prob or rate (one of them)")
    if rate is None:
        if not isinstance(keep_prob, Tensor):
            keep_prob = float(keep_prob)
            if not 0.0 < keep_prob <= 1.0:
                raise ArgumentError(f"tf.nn.dropout: keep_prob must be in (0, 1], got {keep_prob}")
            if keep_prob == 1.0:
                return x
        elif keep_prob.shape is None:  # tf.placeholder(tf.float32): any shape; a probability is a scalar
            keep_prob = wb.reshape(keep_prob, ())
        rate = 1.0 - keep_prob
    return wb.dropout(x, rate, seed=seed, name=name)


# -- convolution and pooling -----------------------------------------------------------


def _layout(data_format, what: str) -> str:
    if data_format not in ("NHWC", "NCHW"):
        raise ArgumentError(f"tf.nn.{what}: data_format must be 'NHWC' or 'NCHW', got {data_format!r}")
    return data_format


def _spatial(values, data_format: str, what: str, arg: str) -> tuple[int, int]:
    """(height, width) from TensorFlow's strides/ksize: an int, 2 values, or 4 with 1 on batch and channels."""
    if isinstance(values, int):
        return (values, values)
    values = [int(v) for v in values]
    if len(values) == 1:
        return (values[0], values[0])
    if len(values) == 2:
        return (values[0], values[1])
    if len(values) == 4:
        batch, channels = (values[0], values[3]) if data_format == "NHWC" else (values[0], values[1])
        if batch != 1 or channels != 1:
            raise ArgumentError(f"tf.nn.{what}: {arg}={values} must be 1 on the batch and channel axes ({data_format})")
        return (values[1], values[2]) if data_format == "NHWC" else (values[2], values[3])
    raise ArgumentError(f"tf.nn.{what}: {arg} has 1, 2 or 4 values, got {values}")


def _padding(padding, what: str) -> str:
    if not isinstance(padding, str) or padding.upper() not in ("SAME", "VALID"):
        raise ArgumentError(f"tf.nn.{what}: padding must be 'SAME' or 'VALID', got {padding!r}")
    return padding.lower()


def _rank4(x, what: str, data_format: str) -> None:
    if x.shape is None or len(x.shape) != 4:
        shape = "unknown" if x.shape is None else rules.fmt(x.shape)
        axes = "[batch, height, width, channels]" if data_format == "NHWC" else "[batch, channels, height, width]"
        raise ShapeError(f"tf.nn.{what}: input must be 4-D {axes} ({data_format}), got shape {shape}{_where()}")


def _where() -> str:
    source = user_source()
    return f"\n  {source}" if source else ""


def conv2d(
    input,  # noqa: A002 - TensorFlow's name
    filter=None,  # noqa: A002
    strides=None,
    padding=None,
    use_cudnn_on_gpu=True,
    data_format="NHWC",
    dilations=None,
    name=None,
    filters=None,
):
    """``tf.nn.conv2d``: ``filter`` is ``[height, width, in_channels, out_channels]``; ``input`` is
    ``[batch, height, width, channels]`` (NHWC, the default) or ``[batch, channels, height, width]`` (NCHW).

    ``strides`` is ``[1, sh, sw, 1]`` for NHWC (or ``[1, 1, sh, sw]`` for NCHW), ``padding`` ``'SAME'``
    or ``'VALID'``. A ShapeError names the layout when the shapes fit the other one.
    """
    w = filter if filters is None else filters
    if w is None or strides is None or padding is None:
        raise ArgumentError("tf.nn.conv2d needs input, filter, strides and padding")
    if dilations is not None and any(int(d) != 1 for d in ([dilations] if isinstance(dilations, int) else dilations)):
        raise ArgumentError(f"tf.nn.conv2d: dilations {dilations} are not supported (only 1)")
    layout = _layout(data_format, "conv2d")
    stride, pad = _spatial(strides, layout, "conv2d", "strides"), _padding(padding, "conv2d")
    _rank4(input, "conv2d", layout)
    if w.shape is None or len(w.shape) != 4:
        raise ShapeError(f"tf.nn.conv2d: filter must be 4-D [height, width, in, out], got {w.shape}{_where()}")
    _check_channels(input.shape, w.shape, layout)
    with wb.name_scope(name or "Conv2D"):
        x = wb.transpose(input, _TO_NCHW) if layout == "NHWC" else input
        y = wb.conv2d(x, wb.transpose(w, _HWIO_TO_OIHW), stride=stride, padding=pad)
        return wb.transpose(y, _TO_NHWC) if layout == "NHWC" else y


def _check_channels(xs, ws, layout: str) -> None:
    channels, other = (xs[3], xs[1]) if layout == "NHWC" else (xs[1], xs[3])
    if rules.dims_match(channels, ws[2]):
        return
    axis = "last" if layout == "NHWC" else "second"
    message = (
        f"tf.nn.conv2d: input {rules.fmt(xs)} has {channels} channels on its {axis} axis (data_format='{layout}') "
        f"but filter {rules.fmt(ws)} ([height, width, in, out]) expects {ws[2]}"
    )
    if other is not None and other == ws[2]:
        flip = "NCHW" if layout == "NHWC" else "NHWC"
        message += f"; the input fits data_format='{flip}': pass that, or transpose the input"
    raise ShapeError(message + _where())


def _pool(kind: str, value, ksize, strides, padding, data_format, name):
    layout = _layout(data_format, kind)
    size, stride = _spatial(ksize, layout, kind, "ksize"), _spatial(strides, layout, kind, "strides")
    pad = _padding(padding, kind)
    _rank4(value, kind, layout)
    op = wb.max_pool2d if kind == "max_pool" else wb.avg_pool2d
    with wb.name_scope(name or ("MaxPool" if kind == "max_pool" else "AvgPool")):
        x = wb.transpose(value, _TO_NCHW) if layout == "NHWC" else value
        y = op(x, size, stride=stride, padding=pad)
        return wb.transpose(y, _TO_NHWC) if layout == "NHWC" else y


def max_pool(value, ksize, strides, padding, data_format="NHWC", name=None, input=None):  # noqa: A002
    """``tf.nn.max_pool(value, ksize=[1, kh, kw, 1], strides=[1, sh, sw, 1], padding)`` in NHWC (or NCHW)."""
    return _pool("max_pool", value if input is None else input, ksize, strides, padding, data_format, name)


def avg_pool(value, ksize, strides, padding, data_format="NHWC", name=None, input=None):  # noqa: A002
    """``tf.nn.avg_pool``, as :func:`max_pool` (padding ``'SAME'`` averages over the window's real inputs)."""
    return _pool("avg_pool", value if input is None else input, ksize, strides, padding, data_format, name)


# -- losses --------------------------------------------------------------------------


def softmax_cross_entropy_with_logits(_sentinel=None, labels=None, logits=None, dim=-1, name=None, axis=None):
    """Per-example cross-entropy of ``softmax(logits)`` against ``labels``, a probability distribution
    over the classes (one-hot rows, as in the TensorFlow tutorials). Keyword arguments only.

    As in TensorFlow 1.x, no gradient flows into ``labels``
    (``softmax_cross_entropy_with_logits_v2`` lets it).
    """
    return _dense_cross_entropy(_sentinel, labels, logits, dim if axis is None else axis, name, stop=True)


def softmax_cross_entropy_with_logits_v2(_sentinel=None, labels=None, logits=None, dim=-1, name=None, axis=None):
    """As :func:`softmax_cross_entropy_with_logits`, with gradients into ``labels`` too."""
    return _dense_cross_entropy(_sentinel, labels, logits, dim if axis is None else axis, name, stop=False)


def _dense_cross_entropy(sentinel, labels, logits, axis, name, stop):
    _keywords_only(sentinel, labels, logits, "softmax_cross_entropy_with_logits")
    if labels.dtype != logits.dtype:
        labels = wb.cast(labels, logits.dtype)
    if stop:
        labels = wb.stop_gradient(labels)
    return wb.negative(wb.sum(labels * wb.log_softmax(logits, axis=axis), axis=axis), name=name)


def sparse_softmax_cross_entropy_with_logits(_sentinel=None, labels=None, logits=None, name=None):
    """Per-example cross-entropy of ``softmax(logits)`` against integer class ``labels``. Keyword arguments only."""
    _keywords_only(_sentinel, labels, logits, "sparse_softmax_cross_entropy_with_logits")
    return wb.softmax_cross_entropy(logits, labels, name=name)


def sigmoid_cross_entropy_with_logits(_sentinel=None, labels=None, logits=None, name=None):
    """``max(x, 0) - x * z + log(1 + exp(-|x|))`` for logits ``x`` and labels ``z``, without overflow."""
    _keywords_only(_sentinel, labels, logits, "sigmoid_cross_entropy_with_logits")
    x, z = logits, labels if labels.dtype == logits.dtype else wb.cast(labels, logits.dtype)
    return wb.add(wb.relu(x) - x * z, wb.log(1.0 + wb.exp(wb.negative(wb.abs(x)))), name=name)


def _keywords_only(sentinel, labels, logits, what: str) -> None:
    if sentinel is not None:
        raise ArgumentError(f"tf.nn.{what}: give labels= and logits= by keyword, as TensorFlow requires")
    if labels is None or logits is None:
        raise ArgumentError(f"tf.nn.{what} needs labels= and logits=")


depthwise_conv2d = unsupported("nn.depthwise_conv2d", "use tf.nn.conv2d (full convolutions only)")
conv2d_transpose = unsupported("nn.conv2d_transpose", "not available; use tf.nn.conv2d on upsampled input")
