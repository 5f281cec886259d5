"""Forward kernels against plain NumPy references, and against the array API standard.

``KERNEL_CASES`` maps every op with a kernel to sample inputs, the op's static
attributes (as its op function records them) and a reference written with plain
NumPy (naive loops for convolution and pooling). Each case also runs with
``array_api_strict`` as the namespace, which rejects anything outside the standard.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import array_api_strict as xps
import numpy as np
import pytest

from workbench.ops.array import encode_index
from workbench.ops.registry import REGISTRY, TensorSpec
from workbench.testing import assert_close


class KCase(NamedTuple):
    inputs: tuple
    attrs: dict
    reference: Callable  # inputs -> expected output (a tuple for several outputs)


def K(inputs, reference, **attrs):
    return KCase(tuple(inputs), attrs, reference)


RNG = np.random.default_rng(0)


def normal(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, shape)


def ints(*values, dtype=np.int64):
    return np.array(values, dtype=dtype)


# -- naive references -------------------------------------------------------------------


def pads(size, k, stride, padding):
    """(before, after, out) as TensorFlow pads: the extra row or column goes last."""
    if padding == "valid":
        return 0, 0, (size - k) // stride + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2, out


def padded(x, kernel, stride, padding, fill=0.0):
    (t, b, ho), (left, right, wo) = (pads(x.shape[2 + i], kernel[i], stride[i], padding) for i in (0, 1))
    out = np.full(x.shape[:2] + (x.shape[2] + t + b, x.shape[3] + left + right), fill)
    out[:, :, t : t + x.shape[2], left : left + x.shape[3]] = x
    return out, (t, left), ho, wo


def window(a, i, j, kernel, stride):
    return a[..., i * stride[0] : i * stride[0] + kernel[0], j * stride[1] : j * stride[1] + kernel[1]]


def naive_conv(x, w, stride, padding):
    xpad, _, ho, wo = padded(x, w.shape[2:], stride, padding)
    out = np.zeros((x.shape[0], w.shape[0], ho, wo))
    for n, o, i, j in itertools.product(range(x.shape[0]), range(w.shape[0]), range(ho), range(wo)):
        out[n, o, i, j] = np.sum(window(xpad[n], i, j, w.shape[2:], stride) * w[o])
    return out


def naive_conv_input_grad(g, x, w, stride, padding):
    dpad, (t, left), ho, wo = padded(np.zeros_like(x), w.shape[2:], stride, padding)
    for n, o, i, j in itertools.product(range(g.shape[0]), range(w.shape[0]), range(ho), range(wo)):
        window(dpad[n], i, j, w.shape[2:], stride)[...] += g[n, o, i, j] * w[o]
    return dpad[:, :, t : t + x.shape[2], left : left + x.shape[3]]


def naive_conv_filter_grad(x, g, w, stride, padding):
    xpad, _, ho, wo = padded(x, w.shape[2:], stride, padding)
    dw = np.zeros_like(w)
    for n, o, i, j in itertools.product(range(x.shape[0]), range(w.shape[0]), range(ho), range(wo)):
        dw[o] += g[n, o, i, j] * window(xpad[n], i, j, w.shape[2:], stride)
    return dw


def naive_pool(x, size, stride, padding):
    xpad, _, ho, wo = padded(x, size, stride, padding, fill=-np.inf)
    out = np.zeros(x.shape[:2] + (ho, wo))
    for i, j in itertools.product(range(ho), range(wo)):
        out[:, :, i, j] = window(xpad, i, j, size, stride).max(axis=(2, 3))
    return out


def naive_pool_grad(g, x, size, stride, padding):
    xpad, (t, left), ho, wo = padded(x, size, stride, padding, fill=-np.inf)
    dpad = np.zeros_like(xpad)
    for n, c, i, j in itertools.product(range(x.shape[0]), range(x.shape[1]), range(ho), range(wo)):
        win = window(xpad[n, c], i, j, size, stride)
        r, s = np.unravel_index(np.argmax(win), win.shape)  # the first maximum takes the gradient
        dpad[n, c, i * stride[0] + r, j * stride[1] + s] += g[n, c, i, j]
    return dpad[:, :, t : t + x.shape[2], left : left + x.shape[3]]


def naive_log_softmax(x, axis=-1):
    def row(v):
        m = np.max(v)
        return v - m - np.log(np.sum(np.exp(v - m)))

    return np.apply_along_axis(row, axis, x)


def sce_reference(logits, labels):
    logp = naive_log_softmax(logits)
    loss = -np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return loss, np.exp(logp)


def gather_grad_reference(g, params, indices, axis):
    axis %= params.ndim
    out = np.zeros_like(params)
    for pos in np.ndindex(indices.shape):
        lead = (slice(None),) * axis
        out[lead + (indices[pos],)] += g[lead + pos]
    return out


def dropout_reference(x, rate):
    kept = np.random.default_rng(7).random(x.shape) < 1 - rate
    mask = kept / (1 - rate)
    return x * mask, mask


def stable_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def getitem_grad_reference(g, x, index):
    out = np.zeros_like(x)
    out[index] = g
    return out


def getitem_cases():
    x = normal(3, 4, 5)
    index_list = [
        (slice(1, None), slice(None, None, 2)),
        (Ellipsis, 1),
        (None, 0, slice(None), slice(None, None, -1)),
        (slice(None), None, slice(1, 3)),
        -1,
        (1, Ellipsis, None),
        (slice(-2, None), 2, slice(4, 0, -2)),
    ]
    get = [K([x], lambda x, i=i: x[i], index=encode_index(i)) for i in index_list]
    put = [
        K([normal(*x[i].shape), x], lambda g, x, i=i: getitem_grad_reference(g, x, i), index=encode_index(i))
        for i in index_list
    ]
    return get, put


GETITEM, GETITEM_GRAD = getitem_cases()
X34, Y34 = normal(3, 4), normal(3, 4)
Y34[0] = X34[0]  # ties for the comparisons
CONV_GEOMETRY = [
    ((5, 5), (3, 3), (1, 1), "valid"),
    ((5, 7), (3, 3), (2, 2), "same"),
    ((6, 5), (3, 2), (2, 2), "valid"),
    ((4, 4), (2, 2), (1, 1), "same"),
    ((5, 5), (3, 2), (2, 1), "same"),
]
POOL_GEOMETRY = [
    ((2, 2), (2, 2), "valid"),
    ((3, 3), (2, 2), "same"),
    ((2, 2), (1, 1), "valid"),
    ((2, 2), (2, 2), "same"),
    ((2, 3), (1, 2), "valid"),
]


def conv_cases(kind):
    cases = []
    for (h, w), k, s, p in CONV_GEOMETRY:
        x, f = normal(2, 2, h, w), normal(3, 2, *k)
        g = normal(2, 3, pads(h, k[0], s[0], p)[2], pads(w, k[1], s[1], p)[2])
        if kind == "conv2d":
            cases.append(K([x, f], lambda x, f, s=s, p=p: naive_conv(x, f, s, p), stride=s, padding=p))
        elif kind == "input":
            cases.append(
                K([g, x, f], lambda g, x, f, s=s, p=p: naive_conv_input_grad(g, x, f, s, p), stride=s, padding=p)
            )
        else:
            cases.append(
                K([x, g, f], lambda x, g, f, s=s, p=p: naive_conv_filter_grad(x, g, f, s, p), stride=s, padding=p)
            )
    return cases


def pool_cases(grad):
    cases = []
    for k, s, p in POOL_GEOMETRY:
        x = normal(2, 2, 5, 6)
        x[0, 0, :2, :2] = 1.5  # a tie inside a window: the first maximum wins
        if grad:
            g = normal(2, 2, pads(5, k[0], s[0], p)[2], pads(6, k[1], s[1], p)[2])
            cases.append(
                K([g, x], lambda g, x, k=k, s=s, p=p: naive_pool_grad(g, x, k, s, p), size=k, stride=s, padding=p)
            )
            y = naive_pool(x, k, s, p)  # the forward's output, as the gradient op gets it
            cases.append(
                K([g, x, y], lambda g, x, y, k=k, s=s, p=p: naive_pool_grad(g, x, k, s, p), size=k, stride=s, padding=p)
            )
        else:
            cases.append(K([x], lambda x, k=k, s=s, p=p: naive_pool(x, k, s, p), size=k, stride=s, padding=p))
    return cases


UPDATE_PROGRAM = (  # lanes of (m, v, g) and a shared lr: m' = 0.9 m + g; v' = v - lr m'
    ("constant", (), (("value", 0.9),), "float64"),
    ("multiply", (4, 0), (), "float64"),
    ("add", (5, 2), (), "float64"),
    ("multiply", (3, 6), (), "float64"),
    ("subtract", (1, 7), (), "float64"),
)


def update_reference(m0, v0, g0, m1, v1, g1, lr):
    return 0.9 * m0 + g0, v0 - lr * (0.9 * m0 + g0), 0.9 * m1 + g1, v1 - lr * (0.9 * m1 + g1)


def sce_with_grad_reference(logits, labels, upstream, rows):
    loss, probs = sce_reference(logits, labels)
    return loss, (probs - np.eye(logits.shape[-1])[labels]) * (upstream / rows)


FUSED_PROGRAM = (  # (x * y + exp(x)) * 2, the steps numbered after the two inputs
    ("multiply", (0, 1), (), "float64"),
    ("exp", (0,), (), "float64"),
    ("add", (2, 3), (), "float64"),
    ("constant", (), (("value", 2.0),), "float64"),
    ("multiply", (4, 5), (), "float64"),
)


def reduce_cases(fn, values):
    return [
        K([values], lambda x, a=a, k=k: fn(x, axis=a, keepdims=k), axis=a, keepdims=k)
        for a, k in [(None, False), (1, False), ((0, 2), False), (-1, True), (None, True)]
    ]


# -- the table: every op with a kernel ------------------------------------------------

KERNEL_CASES: dict[str, list[KCase]] = {
    "add": [K([normal(3, 4), normal(4)], np.add), K([normal(3, 1), normal(1, 5)], np.add)],
    "subtract": [K([normal(3, 4), normal(4)], np.subtract), K([ints(1, 2), ints(5, 7)], np.subtract)],
    "multiply": [K([normal(3, 1), normal(1, 5)], np.multiply), K([normal(2, 3, dtype=np.float32)] * 2, np.multiply)],
    "divide": [K([normal(3, 4), positive(4)], np.divide)],
    "pow": [K([positive(3, 4), normal(3, 4)], np.power), K([positive(3, 4), normal(4)], np.power)],
    "maximum": [K([X34, Y34], np.maximum), K([X34, normal(4)], np.maximum)],
    "minimum": [K([X34, Y34], np.minimum), K([X34, normal(3, 1)], np.minimum)],
    "less": [K([X34, Y34], np.less), K([ints(1, 2, 3), ints(2, 2, 2)], np.less)],
    "less_equal": [K([X34, Y34], np.less_equal), K([ints(1, 2, 3), ints(2, 2, 2)], np.less_equal)],
    "greater": [K([X34, Y34], np.greater), K([X34, normal(4)], np.greater)],
    "greater_equal": [K([X34, Y34], np.greater_equal), K([ints(1, 2, 3), ints(2, 2, 2)], np.greater_equal)],
    "equal": [K([X34, Y34], np.equal), K([ints(1, 2, 3), ints(2, 2, 2)], np.equal)],
    "not_equal": [K([X34, Y34], np.not_equal), K([ints(1, 2, 3), ints(2, 2, 2)], np.not_equal)],
    "isfinite": [K([np.array([[1.0, np.inf, -np.inf], [np.nan, -0.0, 1e300]])], np.isfinite),
                 K([np.array([1.0, 7e4, -np.inf], dtype=np.float32)], np.isfinite)],
    "negative": [K([normal(3, 4)], np.negative), K([ints(1, -2)], np.negative)],
    "exp": [K([normal(3, 4)], np.exp), K([normal(3, 4, dtype=np.float32)], np.exp)],
    "log": [K([positive(3, 4)], np.log)],
    "sqrt": [K([positive(3, 4)], np.sqrt)],
    "tanh": [K([normal(3, 4)], np.tanh)],
    "sigmoid": [K([normal(3, 4) * 3], stable_sigmoid), K([np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0])], stable_sigmoid)],
    "relu": [K([normal(3, 4)], lambda x: np.where(x > 0, x, 0.0)),
             K([normal(3, 4, dtype=np.float32)], lambda x: np.where(x > 0, x, np.float32(0)))],
    "relu_grad": [K([normal(3, 4), normal(3, 4)], lambda g, y: np.where(y > 0, g, 0.0)),
                  K([normal(3, 4, dtype=np.float32), normal(1, 4, dtype=np.float32)], lambda g, y: np.where(y > 0, g, np.float32(0)))],
    "abs": [K([normal(3, 4)], np.abs), K([ints(-3, 0, 2)], np.abs)],
    "sign": [K([np.array([-2.0, 0.0, 3.0])], np.sign)],
    "where": [K([RNG.random((3, 4)) < 0.5, normal(3, 4), normal(4)], np.where),
              K([RNG.random((3, 1)) < 0.5, normal(1, 4), normal(3, 4)], np.where)],
    "cast": [K([normal(3, 4)], lambda x: x.astype(np.float32), dtype="float32"),
             K([normal(3, 4, dtype=np.float32)], lambda x: x.astype(np.float64), dtype="float64"),
             K([normal(3, 4) * 5], lambda x: x.astype(np.int32), dtype="int32"),
             K([RNG.random(5) < 0.5], lambda x: x.astype(np.float32), dtype="float32"),
             K([ints(0, 2, -1)], lambda x: x.astype(bool), dtype="bool")],
    "identity": [K([normal(3, 4)], lambda x: x)],
    "stop_gradient": [K([normal(3, 4)], lambda x: x)],
    "zeros_like": [K([normal(3, 4)], np.zeros_like), K([ints(1, 2)], np.zeros_like)],
    "ones_like": [K([normal(3, 4, dtype=np.float32)], np.ones_like)],
    "matmul": [K([normal(3, 4), normal(4, 2)], np.matmul, transpose_a=False, transpose_b=False),
               K([normal(4, 3), normal(4, 2)], lambda a, b: a.T @ b, transpose_a=True, transpose_b=False),
               K([normal(3, 4), normal(2, 4)], lambda a, b: a @ b.T, transpose_a=False, transpose_b=True),
               K([normal(4, 3), normal(2, 4)], lambda a, b: a.T @ b.T, transpose_a=True, transpose_b=True),
               K([normal(2, 1, 3, 4), normal(3, 4, 2)], np.matmul, transpose_a=False, transpose_b=False),
               K([normal(1, 4, 3), normal(2, 2, 4)], lambda a, b: np.swapaxes(a, -1, -2) @ np.swapaxes(b, -1, -2),
                 transpose_a=True, transpose_b=True)],
    "sum": reduce_cases(np.sum, normal(2, 3, 4)) + [K([ints(1, 2, 3, dtype=np.int32)], lambda x: np.int32(6), axis=None,
                                                      keepdims=False)],
    "mean": reduce_cases(np.mean, normal(2, 3, 4)),
    "all": [K([np.isfinite(np.array([[1.0, np.inf, 2.0], [0.0, 1.0, 3.0]]))], lambda x, a=a, k=k: np.all(x, axis=a, keepdims=k),
              axis=a, keepdims=k) for a, k in [(None, False), (1, False), (0, True), ((0, 1), False)]] +
           [K([np.ones((2, 3), dtype=bool)], lambda x: np.all(x), axis=None, keepdims=False)],
    "argmax": [K([normal(2, 3, 4)], lambda x, a=a, k=k: np.argmax(x, axis=a, keepdims=k), axis=a, keepdims=k)
               for a, k in [(-1, False), (0, True), (1, False), (None, False), (None, True)]] +
              [K([np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])], lambda x: np.array([1, 0]), axis=1, keepdims=False),
               K([ints(4, 9, 9, 2, dtype=np.int32)], lambda x: np.int64(1), axis=0, keepdims=False)],
    "max": reduce_cases(np.max, normal(2, 3, 4)) + [K([ints(4, 9, 2)], lambda x: np.int64(9), axis=0, keepdims=False)],
    # own generators: the shared one's later draws (other ops' cases) stay as they were
    "min": reduce_cases(np.min, np.random.default_rng(101).standard_normal((2, 3, 4))),
    "prod": reduce_cases(np.prod, np.random.default_rng(102).standard_normal((2, 3, 4))),
    "prod_others": [K([np.array([[2.0, 0.0, 3.0], [1.0, 4.0, 5.0]])], lambda x: np.array([[0.0, 6.0, 0.0], [20.0, 5.0, 4.0]]), axis=1),
                    K([np.array([[2.0, 0.0], [3.0, 4.0]])], lambda x: np.array([[0.0, 24.0], [0.0, 0.0]]), axis=None)],
    "unreduce": [K([normal(2, 4), normal(2, 3, 4)], lambda g, x: np.broadcast_to(g[:, None, :], x.shape),
                   axis=1, keepdims=False, mean=False),
                 K([normal(), normal(2, 3)], lambda g, x: np.full(x.shape, g / 6), axis=None, keepdims=False, mean=True),
                 K([normal(1, 3, 1), normal(2, 3, 4)], lambda g, x: np.broadcast_to(g, x.shape) / 8,
                   axis=(0, 2), keepdims=True, mean=True)],
    "reduce_to_like": [K([normal(2, 3, 4), normal(3, 1)], lambda g, x: g.sum(axis=0).sum(axis=1)[:, None]),
                       K([normal(3, 4), normal(3, 4)], lambda g, x: g),
                       K([normal(2, 3, 4), normal(1, 1, 4)], lambda g, x: g.sum(axis=(0, 1))[None, None])],
    "broadcast_like": [K([normal(4), normal(3, 4)], lambda a, b: np.tile(a, (3, 1))),
                       K([normal(3, 1), normal(2, 3, 5)], lambda a, b: np.tile(a, (2, 1, 5)))],
    "softmax": [K([normal(3, 4) * 500], lambda x: np.exp(naive_log_softmax(x)), axis=-1),
                K([normal(3, 4)], lambda x: np.exp(naive_log_softmax(x, 0)), axis=0)],
    "log_softmax": [K([normal(3, 4) * 500], naive_log_softmax, axis=-1),
                    K([normal(2, 3, 4)], lambda x: naive_log_softmax(x, 1), axis=1)],
    "softmax_cross_entropy": [K([normal(4, 5) * 300, ints(0, 4, 2, 2)], sce_reference),
                              K([normal(2, 3, 4), ints([0, 1, 3], [3, 3, 2], dtype=np.int32)], sce_reference)],
    "softmax_cross_entropy_grad": [
        K([np.exp(naive_log_softmax(normal(4, 5))), ints(0, 4, 2, 2), normal(4)],
          lambda p, y, g: (p - np.eye(5)[y]) * g[:, None])],
    "reshape": [K([normal(2, 6)], lambda x: x.reshape(3, 4), shape=(3, -1)), K([normal(4, 3)], np.ravel, shape=(12,))],
    "reshape_like": [K([normal(2, 6), normal(3, 4)], lambda x, like: x.reshape(3, 4))],
    "transpose": [K([normal(3, 4)], np.transpose, perm=None),
                  K([normal(2, 3, 4)], lambda x: np.transpose(x, (1, 2, 0)), perm=(1, 2, 0))],
    "expand_dims": [K([normal(3, 4)], lambda x: x[None], axis=0), K([normal(3, 4)], lambda x: x[..., None], axis=-1)],
    "concat": [K([normal(2, 3), normal(1, 3), normal(3, 3)], lambda *xs: np.concatenate(xs), axis=0),
               K([normal(2, 3), normal(2, 1)], lambda *xs: np.concatenate(xs, axis=-1), axis=-1)],
    "concat_part": [K([normal(6, 3), normal(2, 3), normal(1, 3), normal(3, 3)], lambda g, *xs: g[2:3], index=1, axis=0),
                    K([normal(2, 4), normal(2, 3), normal(2, 1)], lambda g, *xs: g[:, 3:], index=1, axis=1)],
    "stack": [K([normal(2, 3), normal(2, 3)], lambda *xs: np.stack(xs), axis=0),
              K([normal(2, 3)] * 3, lambda *xs: np.stack(xs, axis=-1), axis=-1)],
    "getitem": GETITEM,
    "getitem_grad": GETITEM_GRAD,
    "gather": [K([normal(5, 3), ints(0, 2, 2, 4)], lambda p, i: p[i], axis=0),
               K([normal(2, 3, 4), ints([0, 1], [2, 2])], lambda p, i: np.take(p, i, axis=1), axis=1),
               K([normal(2, 3), ints(2, 0, dtype=np.int32)], lambda p, i: p[:, i], axis=-1)],
    "gather_grad": [K([normal(4, 3, 2), normal(5, 3, 2), ints(0, 2, 2, 4)], lambda *a: gather_grad_reference(*a, 0), axis=0),
                    K([normal(2, 2, 2, 4), normal(2, 3, 4), ints([0, 1], [1, 1])],
                      lambda *a: gather_grad_reference(*a, 1), axis=1),
                    K([normal(2, 3), normal(2, 4), ints(3, 3, 0, dtype=np.int32)],
                      lambda *a: gather_grad_reference(*a, -1), axis=-1)],
    "one_hot": [K([ints(0, 3, 1)], lambda i: np.eye(4, dtype=np.float32)[i], depth=4, dtype="float32"),
                K([ints([0, 1], [2, 2], dtype=np.int32)], lambda i: np.eye(3)[i], depth=3, dtype="float64")],
    "conv2d": conv_cases("conv2d"),
    "conv2d_input_grad": conv_cases("input"),
    "conv2d_filter_grad": conv_cases("filter"),
    "max_pool2d": pool_cases(grad=False),
    "max_pool2d_grad": pool_cases(grad=True),
    "dropout": [K([normal(4, 5)], lambda x: dropout_reference(x, 0.5), rate=0.5, seed=None),
                K([normal(3, 3, dtype=np.float32)], lambda x: dropout_reference(x, 0.25), rate=0.25, seed=3)],
    "constant": [K([], lambda: np.arange(6.0).reshape(2, 3), value=np.arange(6.0).reshape(2, 3))],
    "fused_elementwise": [K([normal(3, 4), normal(4)], lambda x, y: (x * y + np.exp(x)) * 2.0, program=FUSED_PROGRAM)],
    "fused_update": [K([normal(3, 4), normal(3, 4), normal(3, 4), normal(5), normal(5), normal(5), np.array(0.1)],
                       update_reference, program=UPDATE_PROGRAM, stores=(6, 8), lanes=2, width=3)],
    "softmax_cross_entropy_with_grad": [
        K([normal(4, 5) * 30, ints(0, 4, 2, 2), np.array(1.5)], lambda x, y, u: sce_with_grad_reference(x, y, u, 4),
          axis=None, keepdims=False, mean=True),
        K([normal(4, 5), ints(1, 1, 3, 0), np.array(2.0)], lambda x, y, u: sce_with_grad_reference(x, y, u, 1),
          axis=None, keepdims=False, mean=False)],
    "assign": [K([normal(3, 4), normal(3, 4)], lambda cur, v: v), K([normal(3, 4), normal(4)], lambda cur, v: np.tile(v, (3, 1)))],
    "assign_add": [K([normal(3, 4), normal(3, 4)], np.add), K([normal(3, 4), normal(4)], np.add)],
    "assign_sub": [K([normal(3, 4), normal(3, 4)], np.subtract)],
    # collectives without a group: one replica (see tests/strategies for R > 1)
    "all_reduce": [K([normal(3, 4)], lambda x: x, op="sum", replicas=1), K([normal(5)], lambda x: x, op="mean", replicas=1),
                   K([normal(2, 2)], lambda x: x, op="max", replicas=1)],
    "all_gather": [K([normal(3, 4)], lambda x: x[None], replicas=1)],
    "broadcast": [K([normal(3)], lambda x: x, root=0, replicas=1)],
    "cross_replica_sum": [K([normal(3, 4)], lambda x: x, op="sum"), K([normal(2)], lambda x: x, op="sum", weighted=True)],
}  # fmt: skip

# -- references of the normalization, attention, pooling, padding, special and indexing ops ----------

ERF = np.vectorize(math.erf)


def gelu_reference(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return x * 0.5 * (1 + ERF(x / math.sqrt(2)))


def gelu_grad_reference(g, x, approximate, eps=1e-6):
    # the derivative written out, checked against a central difference in the gradient tests
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x**3))
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))
    return g * (0.5 * (1 + ERF(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi))


def ln_reference(x, scale, offset, axis, epsilon):
    axes = tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    shape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    rstd = 1 / np.sqrt(var + epsilon)
    return (x - mean) * rstd * scale.reshape(shape) + offset.reshape(shape), mean, rstd


def ln_grad_reference(g, x, scale, mean, rstd, axis):
    """Backward of layer norm by the chain rule over every element (a Jacobian per row)."""
    axes = tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    others = tuple(i for i in range(x.ndim) if i not in axes)
    shape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    xhat = (x - mean) * rstd
    n = np.prod([x.shape[a] for a in axes])
    gx = np.moveaxis(g * scale.reshape(shape), axes, range(-len(axes), 0)).reshape(-1, n)
    xh = np.moveaxis(xhat, axes, range(-len(axes), 0)).reshape(-1, n)
    r = np.moveaxis(np.broadcast_to(rstd, x.shape), axes, range(-len(axes), 0)).reshape(-1, n)[:, 0]
    dx = np.empty_like(gx)
    for row in range(gx.shape[0]):
        jac = r[row] * (np.eye(n) - 1 / n - np.outer(xh[row], xh[row]) / n)  # d xhat / d x, symmetric
        dx[row] = jac @ gx[row]
    moved = np.moveaxis(xhat, axes, range(-len(axes), 0)).shape
    dx = np.moveaxis(dx.reshape(moved), range(-len(axes), 0), axes)
    return dx, (g * xhat).sum(axis=others).reshape(scale.shape), g.sum(axis=others).reshape(scale.shape)


def naive_avg_pool(x, size, stride, padding):
    xpad, _, ho, wo = padded(x, size, stride, padding, fill=np.nan)
    out = np.zeros(x.shape[:2] + (ho, wo))
    for i, j in itertools.product(range(ho), range(wo)):
        out[:, :, i, j] = np.nanmean(window(xpad, i, j, size, stride), axis=(2, 3))  # padding never counts
    return out


def naive_avg_pool_grad(g, x, size, stride, padding):
    xpad, (t, left), ho, wo = padded(x, size, stride, padding, fill=np.nan)
    dpad = np.zeros_like(xpad)
    for n, c, i, j in itertools.product(range(x.shape[0]), range(x.shape[1]), range(ho), range(wo)):
        win = window(xpad[n, c], i, j, size, stride)
        real = ~np.isnan(win)
        window(dpad[n, c], i, j, size, stride)[real] += g[n, c, i, j] / real.sum()
    return dpad[:, :, t : t + x.shape[2], left : left + x.shape[3]]


def naive_pad_grad(g, x, paddings, mode):
    # the adjoint: add each output element's gradient to the input element it copies
    ids = np.arange(x.size).reshape(x.shape)
    source = np.pad(ids, paddings, mode="reflect") if mode == "reflect" else np.pad(ids, paddings, constant_values=-1)
    out = np.zeros(x.size)
    for k, v in zip(source.ravel(), g.ravel()):
        if k >= 0:
            out[k] += v
    return out.reshape(x.shape)


def naive_cumsum(x, axis, exclusive, reverse):
    x = np.flip(x, axis) if reverse else x
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        out = out - x
    return np.flip(out, axis) if reverse else out


def naive_top_k(x, k):
    flat = x.reshape(-1, x.shape[-1])
    idx = np.array(
        [
            sorted(range(len(row)), key=lambda i, row=row: (-int(row[i]) if row.dtype.kind == "u" else -row[i], i))[:k]
            for row in flat
        ],
        dtype=np.int64,
    )
    return np.take_along_axis(flat, idx, axis=-1).reshape(x.shape[:-1] + (k,)), idx.reshape(x.shape[:-1] + (k,))


def naive_top_k_grad(g, indices, x):
    out = np.zeros(x.shape)
    for pos in np.ndindex(indices.shape):
        out[pos[:-1] + (indices[pos],)] += g[pos]
    return out


def naive_scatter_add(base, indices, updates):
    out = base.copy()
    for pos in np.ndindex(indices.shape):
        out[indices[pos]] += updates[pos]
    return out


def attention_reference(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    allowed = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if causal:
        allowed = allowed & np.tril(np.ones(s.shape[-2:], bool))
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v), p


def attention_grad_reference(g, q, k, v, p, scale):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    dp = np.einsum("bhqd,bhkd->bhqk", g, v)
    ds = np.empty_like(p)
    for pos in np.ndindex(p.shape[:-1]):  # the softmax Jacobian, row by row
        row = p[pos]
        ds[pos] = (np.diag(row) - np.outer(row, row)) @ dp[pos]
    ds = ds * scale
    return np.einsum("bhqk,bhkd->bhqd", ds, k), np.einsum("bhqk,bhqd->bhkd", ds, q), np.einsum("bhqk,bhqd->bhkd", p, g)


def ln_cases():
    cases = []
    for shape, axis in [((3, 5), (1,)), ((2, 3, 4), (1, 2)), ((2, 3, 4), (1,)), ((4, 6), (0,))]:
        x = normal(*shape) * 3 + 1
        pshape = tuple(shape[a] for a in axis)
        s, o = normal(*pshape), normal(*pshape)
        cases.append(K([x, s, o], lambda x, s, o, a=axis: ln_reference(x, s, o, a, 1e-5), axis=axis, epsilon=1e-5))
    return cases


def ln_grad_cases():
    cases = []
    for shape, axis in [((3, 5), (1,)), ((2, 3, 4), (1, 2)), ((2, 3, 4), (1,))]:
        x, g = normal(*shape), normal(*shape)
        s = normal(*(shape[a] for a in axis))
        _, mean, rstd = ln_reference(x, s, s, axis, 1e-5)
        cases.append(K([g, x, s, mean, rstd], lambda *a, ax=axis: ln_grad_reference(*a, ax), axis=axis))
    return cases


def avg_pool_cases(grad):
    cases = []
    for k, st, p in POOL_GEOMETRY + [((3, 3), (1, 1), "same"), ((3, 2), (2, 3), "same")]:
        x = normal(2, 2, 5, 6)
        if grad:
            g = normal(2, 2, pads(5, k[0], st[0], p)[2], pads(6, k[1], st[1], p)[2])
            cases.append(
                K([g, x], lambda g, x, k=k, s=st, p=p: naive_avg_pool_grad(g, x, k, s, p), size=k, stride=st, padding=p)
            )
        else:
            cases.append(K([x], lambda x, k=k, s=st, p=p: naive_avg_pool(x, k, s, p), size=k, stride=st, padding=p))
    return cases


def attention_kernel_cases(grad):
    q, k, v = normal(2, 3, 4, 5), normal(2, 3, 6, 5), normal(2, 3, 6, 2)
    mask = RNG.random((2, 1, 4, 6)) < 0.6
    mask[..., 0] = True
    cases = [
        ((q, k, v), {"causal": False, "scale": None}),
        ((q, k[:, :, :4], v[:, :, :4]), {"causal": True, "scale": None}),
        ((q, k, v, mask), {"causal": True, "scale": 0.25}),
    ]
    if not grad:
        return [K(ins, lambda *a, at=at: attention_reference(*a, **at), **at) for ins, at in cases]
    out = []
    for ins, at in cases:
        _, p = attention_reference(*ins, **at)
        g = normal(*ins[0].shape[:3], ins[2].shape[-1])
        out.append(K([g, *ins[:3], p], lambda *a, sc=at["scale"]: attention_grad_reference(*a, sc), scale=at["scale"]))
    return out


def control_flow_cases():
    """A scan and a cond built in a graph: their attributes hold the bodies the kernels run."""
    import workbench as wb

    with wb.Graph().as_default():
        xs, h0, w = (
            wb.placeholder(n, shape=s, dtype="float64") for n, s in (("xs", (5, 3)), ("h0", (3,)), ("w", (3,)))
        )
        final, _ = wb.scan(lambda h, x: (wb.tanh(h * w + x), h * x), xs, h0)
        back, _ = wb.scan(lambda c, x: (c + x, c * 2.0), xs, h0, reverse=True)
        p = wb.placeholder("p", shape=(), dtype="bool")
        picked = wb.cond(p, lambda: (h0 * w, wb.cast(wb.argmax(w), "float64")), lambda: (h0 - 1.0, wb.sum(w)))
    x_v, h_v, w_v = normal(5, 3), normal(3), normal(3)

    def rnn(h, xs, w):
        ys, hist = [], []
        for x in xs:
            hist.append(h)
            ys.append(h * x)
            h = np.tanh(h * w + x)
        return h, np.stack(ys), np.stack(hist)

    def suffix(c, xs):
        ys, hist = [None] * len(xs), [None] * len(xs)
        for t in reversed(range(len(xs))):
            hist[t], ys[t] = c, c * 2.0
            c = c + xs[t]
        return c, np.stack(ys), np.stack(hist)

    branch = lambda p, h, w: (h * w, np.float64(np.argmax(w))) if p else (h - 1.0, np.sum(w))  # noqa: E731
    scans = [K([h_v, x_v, w_v], rnn, **final.op.attrs), K([h_v, x_v], suffix, **back.op.attrs)]
    conds = [K([np.array(v), h_v, w_v], branch, **picked[0].op.attrs) for v in (True, False)]
    return scans, conds


SCAN_CASES, COND_CASES = control_flow_cases()

KERNEL_CASES.update({
    "scan": SCAN_CASES,
    "cond": COND_CASES,
    "erf": [K([normal(3, 4) * 2], ERF), K([np.array([-7.0, -5.9, -3.0, -1e-9, 0.0, 0.3, 2.5, 5.5, 30.0])], ERF)],
    "rsqrt": [K([positive(3, 4)], lambda x: 1 / np.sqrt(x)), K([positive(3).astype(np.float32)], lambda x: (1 / np.sqrt(x)))],
    "square": [K([normal(3, 4)], np.square), K([ints(-3, 4)], np.square)],
    "gelu": [K([normal(3, 4) * 3], lambda x, a=a: gelu_reference(x, a), approximate=a) for a in ("none", "tanh")] +
            [K([normal(5, dtype=np.float32)], lambda x: gelu_reference(x.astype(np.float64), "none").astype(np.float32),
               approximate="none")],
    "gelu_grad": [K([normal(3, 4), x, gelu_reference(x, a)], lambda g, x, y, a=a: gelu_grad_reference(g, x, a), approximate=a)
                  for a in ("none", "tanh") for x in (np.concatenate([normal(3, 3) * 3, np.zeros((3, 1))], axis=1),)],
    "clip": [K([normal(3, 4), np.array(-0.5), np.array(0.5)], np.clip), K([normal(3, 4), normal(4) - 1, normal(3, 1) + 1],
                                                                              lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi)),
             K([ints(-5, 0, 7), ints(-1), ints(3)], np.clip)],
    "layer_norm": ln_cases(),
    "layer_norm_grad": ln_grad_cases(),
    "moments": [K([normal(2, 3, 4)], lambda x, a=a, k=k: (x.mean(axis=a, keepdims=k), x.var(axis=a, keepdims=k)),
                  axis=a, keepdims=k) for a, k in [((0,), False), ((0, 2), True), (-1, False), (None, False)]],
    "avg_pool2d": avg_pool_cases(grad=False),
    "avg_pool2d_grad": avg_pool_cases(grad=True),
    "pad": [K([normal(3, 4)], lambda x: np.pad(x, ((1, 2), (0, 3)), constant_values=1.5), paddings=((1, 2), (0, 3)),
              mode="constant", value=1.5),
            K([normal(4, 5)], lambda x: np.pad(x, ((2, 1), (1, 4)), mode="reflect"), paddings=((2, 1), (1, 4)), mode="reflect",
              value=0),
            K([ints([1, 2], [3, 4])], lambda x: np.pad(x, ((0, 1), (1, 0)), constant_values=7), paddings=((0, 1), (1, 0)),
              mode="constant", value=7)],
    "pad_grad": [K([normal(6, 7), normal(3, 4)], lambda g, x: naive_pad_grad(g, x, ((1, 2), (0, 3)), "constant"),
                   paddings=((1, 2), (0, 3)), mode="constant"),
                 K([normal(7, 10), normal(4, 5)], lambda g, x: naive_pad_grad(g, x, ((2, 1), (1, 4)), "reflect"),
                   paddings=((2, 1), (1, 4)), mode="reflect")],
    "cumsum": [K([normal(3, 4)], lambda x, a=a, e=e, r=r: naive_cumsum(x, a, e, r), axis=a, exclusive=e, reverse=r)
               for a, e, r in [(0, False, False), (1, True, False), (-1, False, True), (0, True, True)]] +
              [K([ints([1, 2], [3, 4], dtype=np.int32)], lambda x: naive_cumsum(x, 1, False, False), axis=1, exclusive=False,
                 reverse=False)],
    "top_k": [K([normal(3, 6)], lambda x: naive_top_k(x, 3), k=3),
              K([np.array([[1.0, 3.0, 3.0, 2.0, 3.0]])], lambda x: naive_top_k(x, 4), k=4),  # ties: the lower index first
              K([ints([4, 9, 9, 2], [0, 0, 0, 0], dtype=np.uint8)], lambda x: naive_top_k(x, 2), k=2)],
    "top_k_grad": [K([normal(3, 2), ints([0, 4], [3, 1], [2, 0]), normal(3, 5)], naive_top_k_grad)],
    "scatter_add": [K([normal(4, 3), ints(1, 3, 1, 1), normal(4, 3)], naive_scatter_add),
                    K([normal(5), ints([0, 4], [4, 2]), normal(2, 2)], naive_scatter_add),
                    K([ints(0, 0, 0), ints(2, 2), ints(5, 6)], naive_scatter_add)],
    "scaled_dot_product_attention": attention_kernel_cases(grad=False),
    "scaled_dot_product_attention_grad": attention_kernel_cases(grad=True),
})  # fmt: skip

CASES = [(name, i, case) for name, cases in KERNEL_CASES.items() for i, case in enumerate(cases)]
IDS = [f"{name}-{i}" for name, i, _ in CASES]


def run_kernel(xp, name, case):
    """The op's outputs as a tuple, computed with namespace ``xp``."""
    opdef = REGISTRY[name]
    attrs = dict(case.attrs)
    if opdef.random:
        attrs["rng"] = np.random.default_rng(7)
    inputs = [xp.asarray(a) for a in case.inputs]
    out = opdef.kernel(xp, *inputs, **attrs)
    return out if isinstance(out, tuple) else (out,)


def expected_outputs(case):
    out = case.reference(*case.inputs)
    return tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))


def output_specs(name, case):
    specs = REGISTRY[name].infer(*(TensorSpec(a.shape, a.dtype.name) for a in case.inputs), **case.attrs)
    return (specs,) if isinstance(specs, TensorSpec) else tuple(specs)


# -- the tests ------------------------------------------------------------------------


def test_every_op_with_a_kernel_has_a_case():
    with_kernel = {name for name, opdef in REGISTRY.items() if opdef.kernel is not None}
    assert sorted(with_kernel - set(KERNEL_CASES)) == []
    assert sorted(set(KERNEL_CASES) - with_kernel) == []


@pytest.mark.parametrize("name, i, case", CASES, ids=IDS)
def test_kernel_matches_numpy_reference(name, i, case):
    got = run_kernel(np, name, case)
    expected = expected_outputs(case)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_close(g, e, rtol=1e-6 if g.dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("name, i, case", CASES, ids=IDS)
def test_kernel_output_agrees_with_the_shape_rule(name, i, case):
    got = run_kernel(np, name, case)
    specs = output_specs(name, case)
    assert [(g.shape, g.dtype.name) for g in got] == [(tuple(s.shape), s.dtype) for s in specs]


@pytest.mark.parametrize("name, i, case", CASES, ids=IDS)
def test_kernel_keeps_to_the_array_api(name, i, case):
    got = run_kernel(xps, name, case)
    expected = run_kernel(np, name, case)
    for g, e in zip(got, expected):
        assert not isinstance(g, np.ndarray), "the kernel left the namespace it was given"
        g = np.asarray(g)
        assert (g.shape, g.dtype) == (e.shape, e.dtype)
        assert_close(g, e, rtol=1e-6 if e.dtype == np.float32 else 1e-12)


def test_gather_grad_adds_repeated_indices_on_both_paths():
    g, params, idx = np.ones((4, 2)), np.zeros((3, 2)), ints(2, 0, 2, 2)
    kernel = REGISTRY["gather_grad"].kernel
    expected = [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]
    np.testing.assert_array_equal(kernel(np, g, params, idx, axis=0), expected)
    via_matmul = kernel(xps, xps.asarray(g), xps.asarray(params), xps.asarray(idx), axis=0)
    np.testing.assert_array_equal(np.asarray(via_matmul), expected)


def test_assign_makes_a_new_array():
    current, value = np.zeros(3), np.arange(3.0)
    new = REGISTRY["assign"].kernel(np, current, value)
    value[0] = 99.0
    np.testing.assert_array_equal(new, [0.0, 1.0, 2.0])


def test_float32_erf_is_within_a_few_ulp_of_erf_and_stays_in_range():
    """float32 erf (the rational approximation TensorFlow's CPU kernels use) against float64 erf
    on a dense grid, the clamp, infinities, signed zeros, NaN, and the GELU built on it."""
    from workbench.ops.special import _gelu_kernel, erf_values

    x = np.concatenate([np.linspace(-7, 7, 400_001), [np.inf, -np.inf, 0.0, -0.0, 1e-30, -3e-9]]).astype(np.float32)
    exact = ERF(x.astype(np.float64))
    y = erf_values(np, x)
    assert y.dtype == np.float32 and np.abs(y - exact).max() < 5e-7
    assert np.abs(y).max() == 1.0 and np.array_equal(erf_values(np, -x), -y)  # in range, odd
    assert np.signbit(y[-3]) and not np.signbit(y[-4]) and abs(y[-2] / exact[-2] - 1) < 1e-6
    assert np.isnan(erf_values(np, np.array([np.nan], np.float32)))[0]
    scratch = x.copy()
    assert np.array_equal(erf_values(np, scratch, out_ok=True), y)  # the temporary may be used
    gelu = _gelu_kernel(np, x[:-6], approximate="none")
    x64 = x[:-6].astype(np.float64)
    exact_gelu = 0.5 * x64 * (1 + ERF(x64 / math.sqrt(2)))
    assert gelu.dtype == np.float32 and np.abs(gelu - exact_gelu).max() < 2e-6


@pytest.mark.parametrize("block_bytes", [1, 2 * 9 * 2 * 8, 4 * 9 * 2 * 8 * 3])
@pytest.mark.parametrize("geometry", CONV_GEOMETRY)
def test_conv_kernels_in_cache_blocks_match_the_naive_loops(monkeypatch, block_bytes, geometry):
    """The NumPy convolution and its two gradients, taken block by block of output positions:
    one position a block (1 byte), pieces of a row, and several rows a block."""
    from workbench.ops import im2col

    monkeypatch.setattr(im2col, "BLOCK_BYTES", block_bytes)
    (h, w), k, s, p = geometry
    rng = np.random.default_rng(7)
    x, f = rng.standard_normal((2, 2, h + 3, w + 2)), rng.standard_normal((3, 2, *k))
    ho, wo = pads(h + 3, k[0], s[0], p)[2], pads(w + 2, k[1], s[1], p)[2]
    g = rng.standard_normal((2, 3, ho, wo))
    view_shape = (2, *k, ho, wo, 2)
    assert len(im2col.blocks(view_shape, 8)) > 1
    assert_close(im2col.conv(np, x, f, s, p), naive_conv(x, f, s, p), rtol=1e-12)
    assert_close(im2col.conv_input_grad(np, g, x.shape, f, s, p), naive_conv_input_grad(g, x, f, s, p), rtol=1e-12)
    assert_close(im2col.conv_filter_grad(np, x, g, f, s, p), naive_conv_filter_grad(x, g, f, s, p), rtol=1e-12)
