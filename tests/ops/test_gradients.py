"""Every differentiable op's gradient against central finite differences, in float64.

``GRADIENT_CASES`` maps each op with a gradient rule to a function that makes
sample inputs for it. Float64 arrays become placeholders (the gradient is
checked with respect to each), other arrays (labels, indices, conditions)
become constants. The checked scalar is ``sum(output * fixed random weights)``
over the op's outputs, so every output element gets its own weight.
"""

from __future__ import annotations

import math
from typing import NamedTuple
from collections.abc import Callable

import numpy as np
import pytest

import workbench as wb
from workbench import ops
from workbench.graph.tree import flatten
from workbench.ops.array import encode_index
from workbench.ops.registry import REGISTRY


class Case(NamedTuple):
    fn: Callable  # input tensors -> a tensor or a tuple of tensors
    inputs: tuple  # float64 arrays become placeholders, other arrays constants
    dynamic: bool = False  # placeholders with an unknown first dimension
    fresh: bool = False  # a new session per evaluation: random ops repeat their first draw
    eps: float = 1e-6


# -- sample inputs --------------------------------------------------------------------


def normal(rng, *shape):
    return rng.standard_normal(shape)


def positive(rng, *shape):
    return rng.uniform(0.5, 2.0, shape)


def away_from_zero(rng, *shape):
    """Values at least 0.1 from zero: no kink of relu, abs or sign within eps."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.1, 2.0, shape)


def distinct(rng, *shape):
    """Values at least 0.1 apart: no ties for max, maximum or pooling within eps."""
    n = math.prod(shape)
    return (rng.permutation(n) * 0.1 - 0.05 * n + rng.uniform(0, 0.01, n)).reshape(shape)


def indices(*values):
    return np.array(values, dtype=np.int64)


def conv_out(size, k, stride, padding):
    return -(-size // stride) if padding == "same" else (size - k) // stride + 1


def conv_case(rng, n, c, h, w, o, kh, kw, stride, padding):
    x, f = normal(rng, n, c, h, w), normal(rng, o, c, kh, kw)
    return Case(lambda x, f: wb.conv2d(x, f, stride=stride, padding=padding), (x, f))


def conv_grad_cases(rng, which):
    cases = []
    for h, w, k, stride, padding in [(5, 5, 3, 1, "valid"), (5, 6, 3, 2, "same"), (6, 5, 2, 2, "valid")]:
        x, f = normal(rng, 2, 2, h, w), normal(rng, 3, 2, k, k)
        g = normal(rng, 2, 3, conv_out(h, k, stride, padding), conv_out(w, k, stride, padding))
        if which == "input":
            fn = lambda g, x, f, s=stride, p=padding: ops.conv2d_input_grad(g, x, f, stride=s, padding=p)  # noqa: E731
            cases.append(Case(fn, (g, x, f)))
        else:
            fn = lambda x, g, f, s=stride, p=padding: ops.conv2d_filter_grad(x, g, f, stride=s, padding=p)  # noqa: E731
            cases.append(Case(fn, (x, g, f)))
    return cases


def getitem_cases(rng):
    x = normal(rng, 3, 4, 5)
    index_list = [
        (slice(1, None), slice(None, None, 2)),
        (Ellipsis, 1),
        (None, 0, slice(None), slice(None, None, -1)),
        (slice(None), None, slice(1, 3)),
        -1,
        (1, Ellipsis, None),
        (slice(-2, None), 2, slice(4, 0, -2)),
    ]
    return [Case(lambda x, i=i: x[i], (x,)) for i in index_list]


def getitem_grad_cases(rng):
    x = normal(rng, 3, 4, 5)
    cases = []
    for index in [(slice(1, None), slice(None, None, 2)), (Ellipsis, 1), (None, 0, slice(None), slice(None, None, -1))]:
        g = normal(rng, *x[index].shape)
        cases.append(Case(lambda g, x, i=index: ops.getitem_grad(g, x, encode_index(i)), (g, x)))
    return cases


def gather_grad_cases(rng):
    params = normal(rng, 4, 3, 2)
    out = []
    for idx, axis in [(indices(0, 2, 2, 3), 0), (indices([0, 1], [1, 1]), 1), (indices(1, 0, 1), -1)]:
        shape = params.shape[: axis % 3] + idx.shape + params.shape[axis % 3 + 1 :]
        out.append(Case(lambda g, p, i, a=axis: ops.gather_grad(g, p, i, axis=a), (normal(rng, *shape), params, idx)))
    return out


def cast_case(rng):
    # multiples of 2**-10 with eps 2**-10: x and x +- eps are exact in float32, so the
    # round trip float64 -> float32 -> float64 is exactly linear around them
    x = rng.integers(-2048, 2048, (3, 4)) / 1024.0
    return Case(lambda x: wb.cast(wb.cast(x, "float32"), "float64"), (x,), eps=2.0**-10)


def maximum_cases(rng, op):
    a = normal(rng, 3, 4)
    b = a[0] + away_from_zero(rng, 3, 4)
    return [Case(op, (a, b)), Case(op, (a, normal(rng, 4) + 5.0)), Case(op, (a[:, :1] + 0.05, distinct(rng, 1, 4)))]


# -- the table: every differentiable op ----------------------------------------------

GRADIENT_CASES: dict[str, Callable[[np.random.Generator], list[Case]]] = {
    "add": lambda r: [Case(wb.add, (normal(r, 3, 4), normal(r, 4))), Case(wb.add, (normal(r, 3, 1), normal(r, 1, 5)))],
    "subtract": lambda r: [Case(wb.subtract, (normal(r, 4), normal(r, 3, 4))),
                           Case(wb.subtract, (normal(r, 2, 1, 3), normal(r, 4, 1)))],
    "multiply": lambda r: [Case(wb.multiply, (normal(r, 3, 1), normal(r, 1, 5))),
                           Case(wb.multiply, (normal(r, 3, 4), normal(r, 4)))],
    "divide": lambda r: [Case(wb.divide, (normal(r, 3, 4), positive(r, 4))),
                         Case(wb.divide, (normal(r, 3, 1), positive(r, 1, 5)))],
    "pow": lambda r: [Case(wb.pow, (positive(r, 3, 4), normal(r, 3, 4))), Case(wb.pow, (positive(r, 3, 4), normal(r, 4)))],
    "maximum": lambda r: maximum_cases(r, wb.maximum),
    "minimum": lambda r: maximum_cases(r, wb.minimum),
    "negative": lambda r: [Case(wb.negative, (normal(r, 3, 4),))],
    "exp": lambda r: [Case(wb.exp, (normal(r, 3, 4),))],
    "log": lambda r: [Case(wb.log, (positive(r, 3, 4),))],
    "sqrt": lambda r: [Case(wb.sqrt, (positive(r, 3, 4),))],
    "tanh": lambda r: [Case(wb.tanh, (normal(r, 3, 4),))],
    "sigmoid": lambda r: [Case(wb.sigmoid, (normal(r, 3, 4) * 3,))],
    "relu": lambda r: [Case(wb.relu, (away_from_zero(r, 3, 4),))],
    "relu_grad": lambda r: [Case(lambda g, y: wb.ops.math.relu_grad(g, y), (r.normal(size=(3, 4)), away_from_zero(r, 3, 4)))],
    "abs": lambda r: [Case(wb.abs, (away_from_zero(r, 3, 4),))],
    "sign": lambda r: [Case(lambda x: wb.sign(x) * x, (away_from_zero(r, 3, 4),))],
    "where": lambda r: [Case(wb.where, (r.random((3, 4)) < 0.5, normal(r, 3, 4), normal(r, 4))),
                        Case(wb.where, (r.random((3, 1)) < 0.5, normal(r, 1, 4), normal(r, 3, 4)))],
    "cast": lambda r: [cast_case(r)],
    "identity": lambda r: [Case(wb.identity, (normal(r, 3, 4),))],
    # one replica outside a replicated fit: the identity (tests/strategies checks it across replicas)
    "cross_replica_sum": lambda r: [Case(lambda x: wb.cross_replica_sum(wb.tanh(x)), (normal(r, 3, 4),))],
    "stop_gradient": lambda r: [Case(lambda x: wb.stop_gradient(wb.tanh(x)), (normal(r, 3, 4),))],
    "zeros_like": lambda r: [Case(lambda x: wb.zeros_like(wb.tanh(x)) + x, (normal(r, 3, 4),))],
    "ones_like": lambda r: [Case(lambda x: wb.ones_like(wb.tanh(x)) * x, (normal(r, 3, 4),))],
    "matmul": lambda r: [
        Case(wb.matmul, (normal(r, 3, 4), normal(r, 4, 2))),
        Case(lambda a, b: wb.matmul(a, b, transpose_a=True), (normal(r, 4, 3), normal(r, 4, 2))),
        Case(lambda a, b: wb.matmul(a, b, transpose_b=True), (normal(r, 3, 4), normal(r, 2, 4))),
        Case(lambda a, b: wb.matmul(a, b, True, True), (normal(r, 4, 3), normal(r, 2, 4))),
        Case(wb.matmul, (normal(r, 2, 3, 4), normal(r, 4, 2))),
        Case(wb.matmul, (normal(r, 3, 4), normal(r, 2, 4, 2))),
        Case(wb.matmul, (normal(r, 2, 1, 3, 4), normal(r, 3, 4, 2))),
        Case(lambda a, b: wb.matmul(a, b, True, False), (normal(r, 1, 4, 3), normal(r, 2, 4, 2))),
        Case(lambda a, b: wb.matmul(a, b, False, True), (normal(r, 2, 3, 4), normal(r, 1, 2, 4))),
    ],
    "sum": lambda r: [Case(lambda x, a=a, k=k: wb.sum(x, axis=a, keepdims=k), (normal(r, 2, 3, 4),))
                      for a, k in [(None, False), (1, False), ((0, 2), False), (None, True), (-1, True), ((0, 1), True)]],
    "mean": lambda r: [Case(lambda x, a=a, k=k: wb.mean(x, axis=a, keepdims=k), (normal(r, 2, 3, 4),))
                       for a, k in [(None, False), (1, False), ((0, 2), True), (-1, True)]],
    "max": lambda r: [Case(lambda x, a=a, k=k: wb.max(x, axis=a, keepdims=k), (distinct(r, 2, 3, 4),))
                      for a, k in [(None, False), (1, False), ((0, 2), False), (-1, True), (None, True)]],
    "min": lambda r: [Case(lambda x, a=a, k=k: wb.min(x, axis=a, keepdims=k), (distinct(r, 2, 3, 4),))
                      for a, k in [(None, False), (1, False), ((0, 2), False), (-1, True)]],
    "prod": lambda r: [Case(lambda x, a=a, k=k: wb.prod(x, axis=a, keepdims=k), (normal(r, 2, 3, 4),))
                       for a, k in [(None, False), (1, False), ((0, 2), True), (-1, True)]],
    "unreduce": lambda r: [
        Case(lambda g, x: ops.unreduce(g, x, axis=1), (normal(r, 2, 4), normal(r, 2, 3, 4))),
        Case(lambda g, x: ops.unreduce(g, x), (normal(r),  normal(r, 2, 3))),
        Case(lambda g, x: ops.unreduce(g, x, axis=(0, 2), keepdims=True, mean=True), (normal(r, 1, 3, 1), normal(r, 2, 3, 4))),
        Case(lambda g, x: ops.unreduce(g, x, axis=-1, mean=True), (normal(r, 2, 3), normal(r, 2, 3, 4))),
    ],
    "reduce_to_like": lambda r: [Case(ops.reduce_to_like, (normal(r, 2, 3, 4), normal(r, 3, 1))),
                                 Case(ops.reduce_to_like, (normal(r, 3, 4), normal(r, 3, 4))),
                                 Case(ops.reduce_to_like, (normal(r, 2, 3, 4), normal(r, 1, 1, 4)))],
    "broadcast_like": lambda r: [Case(ops.broadcast_like, (normal(r, 4), normal(r, 3, 4))),
                                 Case(ops.broadcast_like, (normal(r, 3, 1), normal(r, 2, 3, 5)))],
    "softmax": lambda r: [Case(wb.softmax, (normal(r, 3, 4),)), Case(lambda x: wb.softmax(x, axis=0), (normal(r, 3, 4),))],
    "log_softmax": lambda r: [Case(wb.log_softmax, (normal(r, 3, 4),)),
                              Case(lambda x: wb.log_softmax(x, axis=1), (normal(r, 2, 3, 4),))],
    "softmax_cross_entropy": lambda r: [
        Case(wb.softmax_cross_entropy, (normal(r, 4, 5), indices(0, 4, 2, 2))),
        Case(wb.softmax_cross_entropy, (normal(r, 2, 3, 4) * 5, indices([0, 1, 3], [3, 3, 2]))),
        Case(wb.softmax_cross_entropy, (normal(r, 4, 5), indices(1, 0, 4, 3)), dynamic=True),
    ],
    "reshape": lambda r: [Case(lambda x: wb.reshape(x, (3, -1)), (normal(r, 2, 6),)),
                          Case(lambda x: wb.reshape(x, (12,)), (normal(r, 4, 3),)),
                          Case(lambda x: wb.reshape(x, (-1, 3)), (normal(r, 2, 6),), dynamic=True)],
    "reshape_like": lambda r: [Case(ops.reshape_like, (normal(r, 2, 6), normal(r, 3, 4)))],
    "transpose": lambda r: [Case(wb.transpose, (normal(r, 3, 4),)),
                            Case(lambda x: wb.transpose(x, (1, 2, 0)), (normal(r, 2, 3, 4),))],
    "expand_dims": lambda r: [Case(lambda x: wb.expand_dims(x, 0), (normal(r, 3, 4),)),
                              Case(lambda x: wb.expand_dims(x, -1), (normal(r, 3, 4),))],
    "concat": lambda r: [Case(lambda *xs: wb.concat(xs, axis=0), (normal(r, 2, 3), normal(r, 1, 3), normal(r, 3, 3))),
                         Case(lambda *xs: wb.concat(xs, axis=-1), (normal(r, 2, 3), normal(r, 2, 1))),
                         Case(lambda *xs: wb.concat(xs, axis=0), (normal(r, 2, 3), normal(r, 1, 3)), dynamic=True)],
    "stack": lambda r: [Case(lambda *xs: wb.stack(xs), (normal(r, 2, 3), normal(r, 2, 3))),
                        Case(lambda *xs: wb.stack(xs, axis=-1), (normal(r, 2, 3), normal(r, 2, 3), normal(r, 2, 3)))],
    "getitem": getitem_cases,
    "getitem_grad": getitem_grad_cases,
    "gather": lambda r: [Case(wb.gather, (normal(r, 5, 3), indices(0, 2, 2, 4))),
                         Case(lambda p, i: wb.gather(p, i, axis=1), (normal(r, 2, 3, 4), indices([0, 1], [2, 2]))),
                         Case(lambda p, i: p[i], (normal(r, 4, 2), indices(3, 3, 0)))],
    "gather_grad": gather_grad_cases,
    "conv2d": lambda r: [conv_case(r, 2, 2, 5, 5, 3, 3, 3, 1, "valid"), conv_case(r, 1, 2, 5, 5, 2, 3, 3, 1, "same"),
                         conv_case(r, 2, 1, 5, 7, 2, 3, 3, 2, "same"), conv_case(r, 1, 2, 6, 5, 2, 3, 2, 2, "valid"),
                         conv_case(r, 1, 1, 4, 4, 2, 2, 2, 1, "same"), conv_case(r, 1, 2, 5, 5, 1, 3, 2, (2, 1), "same")],
    "conv2d_input_grad": lambda r: conv_grad_cases(r, "input"),
    "conv2d_filter_grad": lambda r: conv_grad_cases(r, "filter"),
    "max_pool2d": lambda r: [Case(lambda x, a=a: wb.max_pool2d(x, *a), (distinct(r, 1, 2, 5, 5),))
                             for a in [(2,), (3, 2, "same"), (2, 1), (2, 2, "same"), ((2, 3), (1, 2))]],
    "dropout": lambda r: [Case(lambda x: wb.dropout(x, 0.5, seed=3), (normal(r, 4, 5),), fresh=True),
                          Case(lambda x: wb.dropout(x, 0.5, seed=3), (normal(r, 4, 5),), dynamic=True, fresh=True)],
}  # fmt: skip


def leaves(value):
    """The tensors of a nested result (a scan's carry and outputs), as one tuple."""
    return tuple(flatten(value)[0])


def ln_case(r, shape, axis):
    axes = (axis,) if isinstance(axis, int) else axis
    pshape = tuple(shape[a] for a in axes)
    return Case(
        lambda x, s, o: wb.layer_norm(x, s, o, axis=axis), (normal(r, *shape), normal(r, *pshape), normal(r, *pshape))
    )


def attention_cases(r):
    q, k, v = normal(r, 2, 2, 3, 4), normal(r, 2, 2, 5, 4), normal(r, 2, 2, 5, 3)
    mask = r.random((2, 1, 3, 5)) < 0.7
    mask[..., 0] = True  # every query sees a key
    sdpa = wb.scaled_dot_product_attention
    return [
        Case(sdpa, (q, k, v)),
        Case(lambda q, k, v: sdpa(q, k, v, causal=True), (q, k[:, :, :3], v[:, :, :3])),
        Case(lambda q, k, v, m: sdpa(q, k, v, mask=m, scale=0.3), (q, k, v, mask)),
    ]


def avg_pool_grad_cases(r):
    cases = []
    for size, stride, padding in [((2, 2), (2, 2), "valid"), ((3, 3), (2, 2), "same"), ((2, 3), (1, 2), "same")]:
        g = normal(r, 1, 2, conv_out(5, size[0], stride[0], padding), conv_out(6, size[1], stride[1], padding))
        fn = lambda g, x, a=(size, stride, padding): wb.ops.pool.avg_pool2d_grad(g, x, *a)  # noqa: E731
        cases.append(Case(fn, (g, normal(r, 1, 2, 5, 6))))
    return cases


def pad_grad_cases(r):
    cases = []
    for paddings, mode in [(((1, 0), (2, 1)), "constant"), (((2, 1), (1, 3)), "reflect")]:
        x = normal(r, 4, 5)
        g = normal(r, *(d + b + a for d, (b, a) in zip(x.shape, paddings)))
        cases.append(Case(lambda g, x, p=paddings, m=mode: wb.ops.indexing.pad_grad(g, x, p, m), (g, x)))
    return cases


GRADIENT_CASES.update({
    "erf": lambda r: [Case(wb.erf, (normal(r, 3, 4),))],
    "rsqrt": lambda r: [Case(wb.rsqrt, (positive(r, 3, 4),))],
    "square": lambda r: [Case(wb.square, (normal(r, 3, 4),))],
    "gelu": lambda r: [Case(wb.gelu, (normal(r, 3, 4) * 2,)), Case(lambda x: wb.gelu(x, "tanh"), (normal(r, 3, 4) * 2,))],
    "clip": lambda r: [Case(wb.clip, (away_from_zero(r, 3, 4), -0.5 + 0.05 * normal(r, 4), 0.5 + 0.05 * normal(r, 3, 1))),
                       Case(lambda x: wb.clip(x, -1.0, 1.0), (normal(r, 3, 4) * 2 + 0.03,))],
    "layer_norm": lambda r: [ln_case(r, (3, 5), -1), ln_case(r, (2, 3, 4), (1, 2)), ln_case(r, (2, 3, 4), 1)],
    "moments": lambda r: [Case(lambda x, a=a, k=k: wb.moments(x, a, keepdims=k), (normal(r, 2, 3, 4),))
                          for a, k in [((0,), False), ((0, 2), True), (-1, False)]],
    "avg_pool2d": lambda r: [Case(lambda x, a=a: wb.avg_pool2d(x, *a), (normal(r, 1, 2, 5, 6),))
                             for a in [(2,), (3, 2, "same"), (2, 1), (2, 2, "same"), ((2, 3), (1, 2), "same")]],
    "avg_pool2d_grad": avg_pool_grad_cases,
    "pad": lambda r: [Case(lambda x: wb.pad(x, [(1, 2), (0, 3)], value=1.5), (normal(r, 3, 4),)),
                      Case(lambda x: wb.pad(x, [(2, 1), (1, 3)], "reflect"), (normal(r, 4, 5),)),
                      Case(lambda x: wb.pad(x, [(0, 0), (1, 1), (2, 0)], "reflect"), (normal(r, 2, 3, 4),))],
    "pad_grad": pad_grad_cases,
    "cumsum": lambda r: [Case(lambda x, a=a, e=e, v=v: wb.cumsum(x, a, exclusive=e, reverse=v), (normal(r, 3, 4),))
                         for a, e, v in [(0, False, False), (1, True, False), (-1, False, True), (0, True, True)]],
    "top_k": lambda r: [Case(lambda x: wb.top_k(x, 2)[0], (distinct(r, 3, 5),)),
                        Case(lambda x: wb.top_k(x, 3)[0], (distinct(r, 2, 2, 4),))],
    "scatter_add": lambda r: [Case(wb.scatter_add, (normal(r, 4, 3), indices(1, 3, 1, 1), normal(r, 4, 3))),
                              Case(wb.scatter_add, (normal(r, 5), indices([0, 4], [4, 2]), normal(r, 2, 2)))],
    "scaled_dot_product_attention": attention_cases,
    "scan": lambda r: [
        Case(lambda xs, h, w: wb.scan(lambda h, x: (wb.tanh(h * w + x), h * x), xs, h), (normal(r, 4, 3), normal(r, 3), normal(r, 3))),
        Case(lambda xs, a, b: leaves(wb.scan(lambda c, x: ((c[0] * x[0], c[1] + wb.sum(x[1])), [c[0] - x[1]]), (xs, xs * 2.0),
                                             (a, b), reverse=True)), (normal(r, 3, 2), normal(r, 2), normal(r))),
        Case(lambda h, w: wb.scan(lambda h, _: (wb.tanh(h) * w, None), None, h, length=3)[0], (normal(r, 2), normal(r, 2))),
    ],
    "cond": lambda r: [
        Case(lambda p, x, y: wb.cond(p, lambda: x * y, lambda: wb.exp(x)), (np.array(v), normal(r, 3), normal(r, 3)))
        for v in (True, False)
    ] + [Case(lambda p, x, y: wb.cond(p, lambda: (x, y * 2.0), lambda: (y, x * x)), (np.array(v), normal(r, 2), normal(r, 2)))
         for v in (True, False)]
      + [Case(lambda p, x: wb.cond(p, lambda: wb.dropout(x, 0.5), lambda: x), (np.array(True), normal(r, 4, 5)), fresh=True)],
})  # fmt: skip

ZERO_BY_DEFINITION = {"stop_gradient"}  # the gradient is zero whatever finite differences say

CASES = [
    (name, i, case) for name, make in GRADIENT_CASES.items() for i, case in enumerate(make(np.random.default_rng(0)))
]


def _id(name, i):
    return f"{name}-{i}"


# -- the checker ----------------------------------------------------------------------


def weighted_sum(outputs, shapes=None):
    """``sum(output * fixed random weights)`` over ``outputs``: a scalar to differentiate.

    ``shapes`` gives the run-time shapes of outputs with unknown dimensions.
    """
    rng = np.random.default_rng(1)
    total = None
    for out, shape in zip(outputs, shapes or [o.shape for o in outputs]):
        term = wb.sum(out * wb.constant(rng.standard_normal(shape), dtype=out.dtype))
        total = term if total is None else total + term
    return total


def static_shapes(case):
    """The output shapes of ``case`` with every input shape known."""
    with wb.Graph().as_default():
        tensors, _ = make_inputs(case._replace(dynamic=False))
        return [out.shape for out in as_tuple(case.fn(*tensors))]


def as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def make_inputs(case):
    """Placeholders for the float64 arrays (with their feeds), constants for the rest."""
    tensors, feeds = [], {}
    for k, value in enumerate(case.inputs):
        value = np.asarray(value)
        if value.dtype == np.float64:
            shape = ((None,) + value.shape[1:]) if case.dynamic and value.ndim else value.shape
            t = wb.placeholder(f"in{k}", shape=shape, dtype="float64")
            feeds[t] = value
        else:
            t = wb.constant(value)
        tensors.append(t)
    return tensors, feeds


class Checked(NamedTuple):
    graph: wb.Graph
    y: wb.Tensor
    grads: list
    feeds: dict


def build(case, order=1):
    """The graph of ``sum(weights * case.fn(...))`` and its gradients; order 2 differentiates the gradient again."""
    g = wb.Graph(name="check")
    with g.as_default():
        tensors, feeds = make_inputs(case)
        xs = list(feeds)
        y = weighted_sum(as_tuple(case.fn(*tensors)), static_shapes(case) if case.dynamic else None)
        for _ in range(order - 1):
            pairs = [(d, feeds[x].shape) for x, d in zip(xs, wb.gradients(y, xs)) if d is not None]
            y = weighted_sum([d for d, _ in pairs], [shape for _, shape in pairs])
        grads = wb.gradients(y, xs)
    return Checked(g, y, grads, feeds)


def runner(checked, case):
    """``run(fetches, feeds)``; with ``case.fresh`` each call gets a new session, so
    a random op draws the same values every time (they depend on the run count)."""
    session = wb.Session(checked.graph)
    if case.fresh:
        return lambda fetches, feeds: wb.Session(checked.graph).run(fetches, feeds)
    return session.run


def numeric_gradient(run, checked, x, eps):
    feeds = dict(checked.feeds)
    base = feeds[x]
    out = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        values = []
        for step in (eps, -eps):
            moved = base.copy()
            moved[idx] += step
            feeds[x] = moved
            values.append(run(checked.y, feeds))
        out[idx] = (values[0] - values[1]) / (2 * eps)
    return out


def check_gradients(case, order=1, zero=False):
    checked = build(case, order)
    run = runner(checked, case)
    analytic = iter(run([d for d in checked.grads if d is not None], checked.feeds))
    for x, d in zip(checked.feeds, checked.grads):
        got = np.zeros_like(checked.feeds[x]) if d is None else next(analytic)
        expected = np.zeros_like(got) if zero else numeric_gradient(run, checked, x, case.eps)
        assert got.shape == checked.feeds[x].shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, err_msg=f"gradient with respect to {x.name}")
    return checked.graph


# -- the tests ------------------------------------------------------------------------


def test_every_differentiable_op_has_a_gradient_check():
    differentiable = {name for name, opdef in REGISTRY.items() if opdef.differentiable}
    assert sorted(differentiable - set(GRADIENT_CASES)) == []
    assert sorted(set(GRADIENT_CASES) - differentiable) == []


NON_DIFFERENTIABLE_FLOAT_OPS = {
    "argmax": lambda x: wb.argmax(x, axis=1),
    "less": lambda x: wb.less(x, 0.0), "less_equal": lambda x: wb.less_equal(x, 0.0),
    "greater": lambda x: wb.greater(x, 0.0), "greater_equal": lambda x: wb.greater_equal(x, 0.0),
    "equal": lambda x: wb.equal(x, 0.0), "not_equal": lambda x: wb.not_equal(x, 0.0),
    "isfinite": wb.isfinite,
}  # fmt: skip


def test_every_op_taking_floats_without_a_gradient_rule_has_a_check():
    float_nondiff = {"argmax", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "isfinite"}
    declared = {name for name, opdef in REGISTRY.items() if not opdef.differentiable}
    assert float_nondiff <= declared
    assert float_nondiff <= set(NON_DIFFERENTIABLE_FLOAT_OPS)


@pytest.mark.parametrize("name", sorted(NON_DIFFERENTIABLE_FLOAT_OPS))
def test_a_non_differentiable_op_cuts_the_gradient_path(name):
    """Only the direct path x -> sum(x) carries a gradient; the path through the op adds nothing."""
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(3, 4), dtype="float64")
        through = NON_DIFFERENTIABLE_FLOAT_OPS[name](x)
        assert through.op.type == name
        y = wb.sum(x) + wb.sum(wb.cast(through, "float64"))
        (dx,) = wb.gradients(y, [x])
    value = wb.Session(g).run(dx, {x: np.random.default_rng(0).standard_normal((3, 4))})
    np.testing.assert_array_equal(value, np.ones((3, 4)))


@pytest.mark.parametrize("name, i, case", CASES, ids=[_id(n, i) for n, i, _ in CASES])
def test_gradient_matches_finite_differences(name, i, case):
    graph = check_gradients(case, zero=name in ZERO_BY_DEFINITION)
    assert name in {op.type for op in graph.operations}, f"case {_id(name, i)} does not use {name}"


SECOND_ORDER = (
    "add", "subtract", "multiply", "divide", "pow", "maximum", "minimum", "negative", "exp", "log", "sqrt", "tanh",
    "sigmoid", "relu", "relu_grad", "abs", "where", "cast", "identity", "matmul", "sum", "mean", "max", "unreduce",
    "reduce_to_like", "broadcast_like", "softmax", "log_softmax", "reshape", "transpose", "expand_dims", "stack",
    "getitem", "getitem_grad", "gather", "gather_grad", "conv2d", "conv2d_input_grad", "conv2d_filter_grad",
)  # fmt: skip
SECOND_ORDER += ("erf", "rsqrt", "square", "clip", "moments", "avg_pool2d", "avg_pool2d_grad", "pad", "pad_grad",
                 "cumsum", "scatter_add", "scan", "cond")  # fmt: skip
SECOND_CASES = [
    (n, i, c) for n, i, c in CASES if (n in SECOND_ORDER and not c.fresh) or (n == "concat" and not c.dynamic)
]


@pytest.mark.parametrize("name, i, case", SECOND_CASES, ids=[_id(n, i) for n, i, _ in SECOND_CASES])
def test_second_order_gradient_matches_finite_differences(name, i, case):
    check_gradients(case, order=2)


@pytest.mark.parametrize(
    "fn, helper",
    [
        (lambda x: wb.max_pool2d(x, 2), "max_pool2d_grad"),
        (
            lambda x: wb.softmax_cross_entropy(wb.reshape(x, (2, 8)), wb.constant(indices(1, 2))),
            "softmax_cross_entropy_grad",
        ),
    ],
)
def test_second_order_of_an_op_without_one_names_the_helper(fn, helper):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(1, 1, 4, 4), dtype="float64")
        (dx,) = wb.gradients(wb.sum(fn(x)), [x])
        with pytest.raises(wb.GradientError, match=f"gradient of '{helper}' with respect to input 0 is not defined"):
            wb.gradients(wb.sum(dx * dx), [x])


@pytest.mark.parametrize("shape", [(6, 7), (None, 7)])  # masks drawn per run, or per run and row of the batch
def test_dropout_gradient_is_the_upstream_gradient_times_the_mask_of_the_same_run(shape):
    x_value = np.random.default_rng(0).standard_normal((6, 7))
    weights = np.random.default_rng(1).standard_normal((6, 7))
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=shape, dtype="float64")
        y = wb.dropout(x, 0.25, seed=5)
        mask = y.op.outputs[1]
        (dx,) = wb.gradients(wb.sum(y * wb.constant(weights)), [x])
    sess = wb.Session(g, seed=0)
    for _ in range(3):  # a new mask each run; gradient and output always use that run's mask
        y_value, m, d = sess.run([y, mask, dx], {x: x_value})
        assert set(np.unique(m)) == {0.0, 1 / 0.75}
        np.testing.assert_allclose(y_value, x_value * m)
        np.testing.assert_allclose(d, weights * m)


def test_second_order_gradient_through_dropout_uses_the_same_mask():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(4, 5), dtype="float64")
        y = wb.dropout(x * x, 0.5, training=True)
        (gx,) = wb.gradients(wb.sum(y), [x])
        (ggx,) = wb.gradients(wb.sum(gx * gx), [x])  # the gradient reaches the dropout only through its mask
    X = np.arange(1.0, 21.0).reshape(4, 5)
    out, first, second = wb.Session(g, seed=0).run([y, gx, ggx], {x: X})
    mask = (out != 0) * 2.0  # kept entries scaled by 1 / (1 - rate)
    assert 0 < np.count_nonzero(mask) < mask.size
    np.testing.assert_allclose(first, mask * 2 * X, rtol=1e-12)
    np.testing.assert_allclose(second, 2 * (mask * 2) ** 2 * X, rtol=1e-12)  # d/dx sum((2 m x)^2)
