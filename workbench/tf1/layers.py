"""``tf.layers``: TensorFlow 1.x's layer functions in its ``channels_last`` layout, on :mod:`workbench.layers`.

``dense``, ``dropout`` and ``batch_normalization`` are :mod:`workbench.layers`' own (variables
under a scope per layer: ``dense/kernel``, ``batch_normalization/moving_mean``). ``conv2d`` and
the pooling layers take NHWC inputs and keep ``[height, width, in, out]`` kernels, as TensorFlow's,
through :mod:`workbench.tf1.nn` (the plan folds the layout's transposes away between layers).
Initializer and regularizer arguments are not supported and say so.
"""

from __future__ import annotations

import numpy as np

import workbench as wb
from workbench import layers as _wb_layers
from workbench.errors import ArgumentError, ShapeError
from workbench.graph.core import get_default_graph
from workbench.optimizers import _unused_scope as unused_scope
from workbench.tf1 import nn
from workbench.tf1._common import UnsupportedError

_NOT_SUPPORTED = (
    "kernel_initializer",
    "bias_initializer",
    "kernel_regularizer",
    "bias_regularizer",
    "activity_regularizer",
    "kernel_constraint",
    "bias_constraint",
)


def _refuse_extras(what: str, kwargs: dict) -> None:
    given = sorted(k for k, v in kwargs.items() if v is not None and k in _NOT_SUPPORTED)
    if given:
        raise UnsupportedError(
            f"tf.layers.{what}: {', '.join(given)} not supported (kernels start Glorot uniform, biases at zero); "
            "make the variables with tf.Variable(tf.truncated_normal(...)) and use tf.nn for other initial values"
        )
    unknown = sorted(k for k in kwargs if k not in _NOT_SUPPORTED and k not in ("reuse", "trainable"))
    if unknown:
        raise ArgumentError(f"tf.layers.{what}: unknown arguments {unknown}")
    if kwargs.get("reuse"):
        raise UnsupportedError(
            f"tf.layers.{what}(reuse=True): layers are not shared by name; call the layer's ops again"
        )


def _pair(value, what: str, arg: str) -> tuple[int, int]:
    values = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(values) != 2:
        raise ArgumentError(f"tf.layers.{what}: {arg} must be an int or a pair, got {value!r}")
    return int(values[0]), int(values[1])


def _channels_last(data_format, what: str) -> None:
    if data_format != "channels_last":
        raise UnsupportedError(
            f"tf.layers.{what}: data_format={data_format!r} is not supported here; "
            "use wb.layers (NCHW) or transpose to channels_last"
        )


def dense(inputs, units, activation=None, use_bias=True, name=None, **kwargs):
    """``tf.layers.dense``: :func:`workbench.layers.dense` (any rank, on the last axis)."""
    _refuse_extras("dense", kwargs)
    return _wb_layers.dense(inputs, units, activation=activation, use_bias=use_bias, name=name)


def conv2d(
    inputs,
    filters,
    kernel_size,
    strides=(1, 1),
    padding="valid",
    data_format="channels_last",
    dilation_rate=(1, 1),
    activation=None,
    use_bias=True,
    name=None,
    **kwargs,
):
    """``tf.layers.conv2d`` on NHWC inputs: variables ``<scope>/kernel`` ``[kh, kw, in, filters]`` (Glorot
    uniform) and ``<scope>/bias`` (zeros)."""
    _refuse_extras("conv2d", kwargs)
    _channels_last(data_format, "conv2d")
    if _pair(dilation_rate, "conv2d", "dilation_rate") != (1, 1):
        raise UnsupportedError(f"tf.layers.conv2d: dilation_rate {dilation_rate} is not supported (only 1)")
    if inputs.shape is None or len(inputs.shape) != 4 or inputs.shape[3] is None:
        raise ShapeError(f"tf.layers.conv2d needs [batch, height, width, channels] inputs, got {inputs.shape}")
    kh, kw = _pair(kernel_size, "conv2d", "kernel_size")
    sh, sw = _pair(strides, "conv2d", "strides")
    graph = get_default_graph()
    with graph.name_scope(name if name is not None else unused_scope(graph, "conv2d")):
        kernel = wb.variable("kernel", shape=(kh, kw, inputs.shape[3], int(filters)), init="glorot_uniform",
                             dtype=inputs.dtype)  # fmt: skip
        y = nn.conv2d(inputs, kernel, strides=[1, sh, sw, 1], padding=padding)
        if use_bias:
            y = nn.bias_add(y, wb.variable("bias", shape=(int(filters),), init="zeros", dtype=inputs.dtype))
        return y if activation is None else activation(y)


def _pool(kind: str, inputs, pool_size, strides, padding, data_format, name):
    _channels_last(data_format, kind)
    ph, pw = _pair(pool_size, kind, "pool_size")
    sh, sw = _pair(strides, kind, "strides")
    op = nn.max_pool if kind == "max_pooling2d" else nn.avg_pool
    return op(inputs, ksize=[1, ph, pw, 1], strides=[1, sh, sw, 1], padding=padding, name=name)


def max_pooling2d(inputs, pool_size, strides, padding="valid", data_format="channels_last", name=None):
    """``tf.layers.max_pooling2d`` on NHWC inputs."""
    return _pool("max_pooling2d", inputs, pool_size, strides, padding, data_format, name)


def average_pooling2d(inputs, pool_size, strides, padding="valid", data_format="channels_last", name=None):
    """``tf.layers.average_pooling2d`` on NHWC inputs ('same' averages over the real inputs)."""
    return _pool("average_pooling2d", inputs, pool_size, strides, padding, data_format, name)


def dropout(inputs, rate=0.5, noise_shape=None, seed=None, training=False, name=None):
    """``tf.layers.dropout``: drops ``rate`` of the values only while ``training`` (a bool or a bool
    tensor, e.g. ``tf.placeholder_with_default(False, ())``)."""
    if noise_shape is not None:
        raise ArgumentError("tf.layers.dropout: noise_shape is not supported")
    return _wb_layers.dropout(inputs, rate, training, seed=seed, name=name)


def batch_normalization(
    inputs, axis=-1, momentum=0.99, epsilon=1e-3, center=True, scale=True, training=False, name=None, **kwargs
):
    """``tf.layers.batch_normalization`` (channels on ``axis``, the last by default): :func:`workbench.layers.
    batch_norm`; the moving statistics are updated by the training op ``minimize`` returns (no ``UPDATE_OPS``
    to remember)."""
    unknown = sorted(k for k in kwargs if k not in ("fused", "renorm", "trainable", "reuse") or kwargs[k])
    if unknown or not center or not scale:
        raise UnsupportedError(
            "tf.layers.batch_normalization: only center=True, scale=True and the default initializers are supported"
            + (f" (got {unknown})" if unknown else "")
        )
    rank = None if inputs.shape is None else len(inputs.shape)
    if rank is None:
        raise ShapeError("tf.layers.batch_normalization needs an input of known rank")
    graph = get_default_graph()
    name = name if name is not None else unused_scope(graph, "batch_normalization")
    return _wb_layers.batch_norm(inputs, training, momentum=momentum, epsilon=epsilon, axis=int(axis) % rank, name=name)


def flatten(inputs, name=None, data_format="channels_last"):
    """``[batch, ...]`` to ``[batch, features]``."""
    _channels_last(data_format, "flatten")
    if inputs.shape is None or any(d is None for d in inputs.shape[1:]):
        raise ShapeError(f"tf.layers.flatten needs static sizes beyond the batch axis, got {inputs.shape}")
    return wb.reshape(inputs, (-1, int(np.prod(inputs.shape[1:], dtype=np.int64))), name=name)
