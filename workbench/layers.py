"""Layers in the spirit of TensorFlow 1's ``tf.layers``: functions that add ops and variables.

Each layer creates its variables under a name scope of its own (``dense``, ``dense_1``, ...,
or the ``name`` given), so GraphView folds a model into one box per layer, and checkpoints
name the variables after their layer (``conv2d/kernel``, ``batch_norm/moving_mean``).

``training`` is a Python bool or a scalar bool tensor, usually
``wb.placeholder("training", shape=(), dtype="bool", default=False)`` fed ``True`` by
``fit(..., feed_dict={"training": True})``: validation and ``Session.run`` without it then
run the model in inference mode, and the plan keeps only the branch it takes.

>>> import numpy as np, workbench as wb
>>> g = wb.Graph(name="tiny")
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 5, 3))
...     y = wb.layers.dense(x, 4, activation=wb.relu)
>>> y.shape, [v.name for v in g.variables]
((None, 5, 4), ['dense/kernel', 'dense/bias'])
"""

from __future__ import annotations

import math

import numpy as np

from workbench import ops
from workbench.errors import ArgumentError, ShapeError
from workbench.graph.core import Tensor, get_default_graph
from workbench.ops import attention, norm, special
from workbench.optimizers import _unused_scope as unused_scope

__all__ = ["dense", "conv2d", "batch_norm", "layer_norm", "embedding", "multi_head_attention", "dropout"]


def _graph_of(x):
    return x.graph if isinstance(x, Tensor) else get_default_graph()


def _scope(x, name: str | None, default: str):
    """The name scope of a new layer: ``name``, or ``default`` made unique (``dense_1``)."""
    graph = _graph_of(x)
    return graph.name_scope(name if name is not None else unused_scope(graph, default))


def _last_dim(x, layer: str) -> int:
    if x.shape is None or not x.shape or x.shape[-1] is None:
        shape = "unknown" if x.shape is None else x.shape
        raise ShapeError(f"{layer} needs the size of the last axis of its input, got shape {shape}")
    return x.shape[-1]


def dense(x, units: int, activation=None, use_bias: bool = True, name: str | None = None):
    """``activation(x @ kernel + bias)`` on the last axis of ``x`` (any rank, as ``tf.layers.dense``).

    Variables ``<scope>/kernel`` (features, units; Glorot uniform) and ``<scope>/bias`` (zeros).
    """
    features = _last_dim(x, "dense")
    with _scope(x, name, "dense"):
        kernel = ops.variable("kernel", shape=(features, int(units)), init="glorot_uniform", dtype=x.dtype)
        y = ops.matmul(x, kernel)
        if use_bias:
            y = y + ops.variable("bias", shape=(int(units),), init="zeros", dtype=x.dtype)
        return activation(y) if activation is not None else y


def conv2d(x, filters: int, size, stride=1, padding: str = "same", activation=None, use_bias=True, name=None):
    """A 2-D convolution of ``x`` (N, C, H, W) with ``filters`` output channels of ``size`` windows.

    Variables ``<scope>/kernel`` (filters, C, kh, kw; He uniform) and ``<scope>/bias`` (filters,).
    """
    if x.shape is None or len(x.shape) != 4 or x.shape[1] is None:
        raise ShapeError(f"conv2d needs an input of shape (N, C, H, W) with C known, got {x.shape}")
    kh, kw = (size, size) if isinstance(size, int) else tuple(size)
    with _scope(x, name, "conv2d"):
        kernel = ops.variable("kernel", shape=(int(filters), x.shape[1], kh, kw), init="he_uniform", dtype=x.dtype)
        y = ops.conv2d(x, kernel, stride=stride, padding=padding.lower())
        if use_bias:
            bias = ops.variable("bias", shape=(int(filters),), init="zeros", dtype=x.dtype)
            y = y + ops.reshape(bias, (int(filters), 1, 1))
        return activation(y) if activation is not None else y


def _switch(training, on, off):
    """``on`` where ``training`` (a Python bool or a bool tensor) holds, else ``off``."""
    if isinstance(training, (bool, np.bool_)):
        return on() if training else off()
    return ops.where(training, on(), off())


def batch_norm(x, training, momentum: float = 0.99, epsilon: float = 1e-3, axis: int = 1, name=None):
    """Batch normalization over every axis but ``axis`` (1: the channels of NCHW, the features of (N, F)).

    Training (``training`` true): normalizes with the batch's mean and (biased) variance, and
    moves ``<scope>/moving_mean`` and ``<scope>/moving_variance`` (not trainable) towards them
    by ``1 - momentum`` (the variance unbiased, as TensorFlow's fused kernel and PyTorch do).
    Those updates belong to the training op: ``opt.minimize(loss)`` runs them whenever the loss
    depends on this layer, so there is no collection to remember. Inference (``training``
    false): normalizes with the moving statistics. ``<scope>/gamma`` and ``<scope>/beta`` scale
    and shift. Checkpoints save and restore the moving statistics with the other variables.

    In a replicated fit (a cluster or the one-process simulation) the moments are the global
    batch's, over every replica's rows (:func:`_global_moments`), and the moving statistics move
    by them, the same bits on every replica: a model with batch norm trains to the variables of
    local training on any number of workers.
    """
    if x.shape is None or not -len(x.shape) <= axis < len(x.shape) or x.shape[axis] is None:
        raise ShapeError(f"batch_norm needs the size of axis {axis} of its input, got shape {x.shape}")
    if not 0.0 <= momentum < 1.0:
        raise ArgumentError(f"batch_norm momentum must be in [0, 1), got {momentum}")
    axis = axis % len(x.shape)
    channels = x.shape[axis]
    shape = tuple(channels if i == axis else 1 for i in range(len(x.shape)))
    reduced = [i for i in range(len(x.shape)) if i != axis]
    graph = _graph_of(x)
    with _scope(x, name, "batch_norm"):
        gamma = ops.variable("gamma", shape=(channels,), init="ones", dtype=x.dtype)
        beta = ops.variable("beta", shape=(channels,), init="zeros", dtype=x.dtype)
        moving_mean = ops.variable("moving_mean", shape=(channels,), init="zeros", dtype=x.dtype, trainable=False)
        moving_var = ops.variable("moving_variance", shape=(channels,), init="ones", dtype=x.dtype, trainable=False)
        if training is False:
            mean, var = moving_mean, moving_var
        else:
            batch_mean, batch_var, count = _global_moments(x, reduced)
            mean = _switch(training, lambda: batch_mean, lambda: moving_mean)
            var = _switch(training, lambda: batch_var, lambda: moving_var)
        scale = special.rsqrt(ops.reshape(var, shape) + epsilon) * ops.reshape(gamma, shape)
        y = (x - ops.reshape(mean, shape)) * scale + ops.reshape(beta, shape)
        if training is not False:
            _moving_updates(graph, y, training, momentum, count, (moving_mean, batch_mean), (moving_var, batch_var))
        return y


def _global_moments(x, reduced):
    """The mean, (biased) variance and count of ``x`` over the axes ``reduced`` of the *global* batch.

    Each replica takes its shard's count ``n_r``, mean ``m_r`` and variance ``v_r``; the replicas
    add up ``n_r`` and ``n_r m_r`` (one sum), then ``n_r (v_r + (m_r - m)^2)`` with ``cross_replica_sum``
    (Chan et al.'s combination of centred sums, stabler than sums of squares), in the collective's
    fixed rank order, so every replica gets the same bits. Shards may be unequal. Outside a
    replicated fit the sums are the identity and these are the batch's own moments.

    The backward pass is the gradient of the global batch's loss ``L = sum_r w_r L_r`` (``w_r``:
    the replica's share, ``r.weight``). Replica ``s``'s shard enters every ``L_r`` through the
    sums, so it needs ``sum_r w_r dL_r/dsum``: ``cross_replica_sum``'s gradient all-reduces the
    replicas' upstream gradients weighted by their shares and divides by ``w_s`` again, which the
    engine's weighting of replica ``s``'s gradient by ``w_s`` then cancels exactly.
    """
    mean, var = norm.moments(x, reduced)
    count = _count(x, reduced, mean.dtype)
    sums = ops.cross_replica_sum(ops.concat([ops.reshape(count, (1,)), mean * count]))  # one collective for both
    total = sums[0]
    global_mean = sums[1:] / total
    shift = mean - global_mean
    global_var = ops.cross_replica_sum((var + shift * shift) * count) / total
    return global_mean, global_var, total


def _moving_updates(graph, y, training, momentum, count, means, variances):
    """Assign ops moving the statistics, recorded in ``graph.updates`` as belonging to ``y``
    (``count``: the global batch's, for the unbiased variance)."""
    (moving_mean, batch_mean), (moving_var, batch_var) = means, variances
    unbiased = batch_var * (count / ops.maximum(count - 1.0, 1.0))
    rate = 1.0 - momentum
    for moving, batch, label in ((moving_mean, batch_mean, "mean"), (moving_var, unbiased, "variance")):
        moved = moving + (ops.stop_gradient(batch) - moving) * rate
        value = _switch(training, lambda moved=moved: moved, lambda moving=moving: moving)
        update = ops.assign(moving, value, name=f"update_moving_{label}")
        graph.updates[update.op.name] = y.name


def _count(x, reduced, dtype: str) -> Tensor:
    """How many values each statistic is taken over (with the batch size known only at run time), in
    ``dtype``: the moments' (float32 under float16 mixed precision, where a count may pass float16's range)."""
    known = [x.shape[i] for i in reduced]
    if all(d is not None for d in known):
        return ops.constant(float(math.prod(known)), dtype=dtype)
    # one value per position of the unknown axes (a thin slice of x), times the known sizes
    thin = x[tuple(slice(None) if d is None else slice(0, 1) for d in x.shape)]
    known_product = float(math.prod(d for d in known if d is not None))
    return ops.sum(ops.ones_like(ops.stop_gradient(thin))) * known_product


def layer_norm(x, epsilon: float = 1e-5, name=None):
    """Layer normalization over the last axis, with ``<scope>/gamma`` (ones) and ``<scope>/beta`` (zeros)."""
    features = _last_dim(x, "layer_norm")
    with _scope(x, name, "layer_norm"):
        gamma = ops.variable("gamma", shape=(features,), init="ones", dtype=x.dtype)
        beta = ops.variable("beta", shape=(features,), init="zeros", dtype=x.dtype)
        return norm.layer_norm(x, gamma, beta, axis=-1, epsilon=epsilon)


def embedding(ids, vocab_size: int, dim: int, name=None, dtype: str = "float32"):
    """Rows of ``<scope>/embeddings`` (vocab_size, dim; normal(0, 0.05)) picked by integer ``ids``:
    an ``ids.shape + (dim,)`` tensor."""
    with _scope(ids, name, "embedding"):
        table = ops.variable("embeddings", shape=(int(vocab_size), int(dim)), init="normal", dtype=dtype)
        return ops.gather(table, ids)


def multi_head_attention(x, heads: int, causal: bool = False, mask=None, qkv_bias: bool = True, name=None):
    """Multi-head self-attention: (batch, length, d) to (batch, length, d).

    Queries, keys and values come from one projection ``<scope>/qkv`` (d -> 3d), the heads'
    outputs are joined by ``<scope>/out`` (d -> d); ``d`` must divide into ``heads``.
    ``causal`` lets position i attend to positions up to i only. ``qkv_bias=False`` leaves the
    projection's bias out (the keys' part of it never changes the output: its gradient is zero,
    and an adaptive optimizer would move it by rounding noise).
    """
    if x.shape is None or len(x.shape) != 3 or x.shape[1] is None or x.shape[2] is None:
        raise ShapeError(f"multi_head_attention needs (batch, length, d) with length and d known, got {x.shape}")
    _, length, d = x.shape
    if d % heads:
        raise ShapeError(f"multi_head_attention: d={d} does not divide into {heads} heads")
    depth = d // heads
    with _scope(x, name, "multi_head_attention"):
        qkv = dense(x, 3 * d, use_bias=qkv_bias, name="qkv")  # (batch, length, 3d)
        split = ops.transpose(ops.reshape(qkv, (-1, length, 3, heads, depth)), (2, 0, 3, 1, 4))
        out = attention.scaled_dot_product_attention(split[0], split[1], split[2], mask=mask, causal=causal)
        joined = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (-1, length, d))
        return dense(joined, d, name="out")


def dropout(x, rate, training, seed=None, name=None):
    """:func:`workbench.dropout` with ``training`` required: ``rate`` of the values dropped while
    training (the rest scaled by ``1 / (1 - rate)``), ``x`` as it is otherwise."""
    return ops.dropout(x, rate, training=training, seed=seed, name=name)
