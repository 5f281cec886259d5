"""The new ops against PyTorch autograd, in float64: values to 1e-10, gradients to 1e-9.

Each case builds the op in a graph and in PyTorch from the same inputs, weights every
output element with a fixed random number, and compares the outputs and the gradients
of the weighted sum with respect to every float input. TensorFlow's "same" padding of
average pooling is written out in PyTorch (pad, sum, divide by the count of real pixels).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import workbench as wb

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(0)


def normal(*shape):
    return RNG.standard_normal(shape)


def distinct(*shape):
    n = math.prod(shape)
    return (RNG.permutation(n) * 0.1 - 0.05 * n + RNG.uniform(0, 0.01, n)).reshape(shape)


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def run_workbench(fn, inputs, weights):
    g = wb.Graph()
    with g.as_default():
        tensors, feeds, wrt = [], {}, []
        for k, value in enumerate(inputs):
            if value.dtype == np.float64:
                t = wb.placeholder(f"in{k}", shape=value.shape, dtype="float64")
                feeds[t] = value
                wrt.append(t)
            else:
                t = wb.constant(value)
            tensors.append(t)
        outs = as_tuple(fn(*tensors))
        floats = [o for o in outs if o.dtype == "float64"]
        loss = sum(wb.sum(o * wb.constant(w)) for o, w in zip(floats, weights))
        grads = wb.gradients(loss, wrt)
    values = wb.Session(g).run(list(outs) + grads, feeds)
    return values[: len(outs)], values[len(outs) :]


def run_torch(fn, inputs, weights):
    tensors = [torch.tensor(v, requires_grad=v.dtype == np.float64) for v in inputs]
    outs = as_tuple(fn(*tensors))
    floats = [o for o in outs if o.dtype == torch.float64]
    loss = sum((o * torch.tensor(w)).sum() for o, w in zip(floats, weights))
    wrt = [t for t in tensors if t.requires_grad]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [torch.zeros_like(t) if d is None else d for t, d in zip(wrt, grads)]
    return [o.detach().numpy() for o in outs], [d.numpy() for d in grads]


def check(wb_fn, torch_fn, *inputs):
    inputs = [np.asarray(v) for v in inputs]
    expected, expected_grads = run_torch(torch_fn, inputs, [np.ones(1)] * 8)  # shapes only
    weights = [RNG.standard_normal(e.shape) for e in expected if e.dtype == np.float64]
    expected, expected_grads = run_torch(torch_fn, inputs, weights)
    got, got_grads = run_workbench(wb_fn, inputs, weights)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e.dtype == np.float64:
            np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10)
        else:
            np.testing.assert_array_equal(g, e)
    assert len(got_grads) == len(expected_grads)
    for g, e in zip(got_grads, expected_grads):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9)


# -- TensorFlow's padding rules, written in PyTorch -------------------------------------------


def tf_same_pads(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def tf_avg_pool(x, size, stride, padding):
    """``tf.nn.avg_pool2d`` on NCHW: "same" pads zeros (the extra one at the end) and divides
    each window's sum by the number of real pixels in it."""
    if padding == "valid":
        return F.avg_pool2d(x, size, stride)
    (t, b), (left, right) = (tf_same_pads(x.shape[2 + i], size[i], stride[i]) for i in (0, 1))
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype)
    sums = F.avg_pool2d(F.pad(x, (left, right, t, b)), size, stride, divisor_override=1)
    counts = F.avg_pool2d(F.pad(ones, (left, right, t, b)), size, stride, divisor_override=1)
    return sums / counts


def test_tf_same_padding_in_torch_counts_only_real_pixels():
    x = torch.arange(9.0, dtype=torch.float64).reshape(1, 1, 3, 3)
    got = tf_avg_pool(x, (2, 2), (2, 2), "same")  # windows [0,1,3,4], [2,5], [6,7], [8]
    assert got[0, 0].tolist() == [[2.0, 3.5], [6.5, 8.0]]


# -- the cases --------------------------------------------------------------------------------

UNARY = [
    ("rsqrt", wb.rsqrt, torch.rsqrt, lambda: RNG.uniform(0.3, 3.0, (3, 4))),
    ("erf", wb.erf, torch.erf, lambda: normal(3, 4) * 2),
    ("square", wb.square, torch.square, lambda: normal(3, 4)),
    ("gelu", wb.gelu, F.gelu, lambda: normal(3, 4) * 3),
    (
        "gelu-tanh",
        lambda x: wb.gelu(x, approximate="tanh"),
        lambda x: F.gelu(x, approximate="tanh"),
        lambda: normal(3, 4) * 3,
    ),
]


@pytest.mark.parametrize("name, ours, theirs, make", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_match_torch(name, ours, theirs, make):
    check(ours, theirs, make())


def test_erf_matches_torch_far_out():
    check(wb.erf, torch.erf, np.array([-30.0, -6.5, -5.9, -3.2, -1e-8, 0.0, 1e-8, 0.7, 2.9, 4.4, 5.99, 6.1, 40.0]))


def test_clip_matches_torch_clamp():
    x = normal(3, 4) * 2
    lo, hi = -0.5 + 0.01 * normal(4), 0.6 + 0.01 * normal(3, 1)
    check(wb.clip, lambda x, lo, hi: torch.clamp(x, lo, hi), x, lo, hi)
    check(lambda x: wb.clip(x, -1.0, 1.0), lambda x: torch.clamp(x, -1.0, 1.0), x)


@pytest.mark.parametrize("shape, axis", [((4, 6), -1), ((2, 3, 4), (1, 2)), ((2, 5, 3), (-1,))])
def test_layer_norm_matches_torch(shape, axis):
    axes = (axis,) if isinstance(axis, int) else axis
    pshape = tuple(shape[a] for a in axes)
    x, s, o = normal(*shape) * 2 + 0.5, normal(*pshape), normal(*pshape)
    check(
        lambda x, s, o: wb.layer_norm(x, s, o, axis=axis, epsilon=1e-5),
        lambda x, s, o: F.layer_norm(x, pshape, s, o, eps=1e-5),
        x,
        s,
        o,
    )


def test_layer_norm_over_a_middle_axis_matches_torch_after_a_transpose():
    x, s, o = normal(2, 5, 3), normal(5), normal(5)

    def theirs(x, s, o):
        return F.layer_norm(x.transpose(1, 2), (5,), s, o, eps=1e-3).transpose(1, 2)

    check(lambda x, s, o: wb.layer_norm(x, s, o, axis=1, epsilon=1e-3), theirs, x, s, o)


@pytest.mark.parametrize("axes, keepdims", [((0,), False), ((0, 2), True), ((1,), False)])
def test_moments_match_torch(axes, keepdims):
    def theirs(x):
        return x.mean(dim=axes, keepdim=keepdims), x.var(dim=axes, unbiased=False, keepdim=keepdims)

    check(lambda x: wb.moments(x, axes, keepdims=keepdims), theirs, normal(2, 3, 4))


POOLS = [((2, 2), (2, 2), "valid"), ((3, 3), (2, 2), "same"), ((2, 2), (1, 1), "same"), ((3, 2), (2, 3), "same"),
         ((2, 3), (1, 2), "valid"), ((3, 3), (1, 1), "same")]  # fmt: skip


@pytest.mark.parametrize("size, stride, padding", POOLS)
def test_avg_pool_matches_torch_with_tf_padding(size, stride, padding):
    x = normal(2, 3, 7, 6)
    check(lambda x: wb.avg_pool2d(x, size, stride, padding), lambda x: tf_avg_pool(x, size, stride, padding), x)


def test_pad_matches_torch():
    x = normal(3, 4)
    check(lambda x: wb.pad(x, [(1, 2), (0, 3)], value=-1.25), lambda x: F.pad(x, (0, 3, 1, 2), value=-1.25), x)
    x = normal(4, 5)
    check(
        lambda x: wb.pad(x, [(2, 1), (3, 4)], mode="reflect"),
        lambda x: F.pad(x[None], (3, 4, 2, 1), mode="reflect")[0],
        x,
    )
    x = normal(2, 3, 5)
    check(
        lambda x: wb.pad(x, [(0, 0), (1, 2), (4, 0)], mode="reflect"),
        lambda x: F.pad(x, (4, 0, 1, 2), mode="reflect"),
        x,
    )


@pytest.mark.parametrize(
    "axis, exclusive, reverse", [(0, False, False), (1, True, False), (-1, False, True), (0, True, True)]
)
def test_cumsum_matches_torch(axis, exclusive, reverse):
    def theirs(x):
        y = torch.flip(x, (axis,)) if reverse else x
        out = torch.cumsum(y, axis)
        out = out - y if exclusive else out
        return torch.flip(out, (axis,)) if reverse else out

    check(lambda x: wb.cumsum(x, axis, exclusive=exclusive, reverse=reverse), theirs, normal(3, 4))


def test_top_k_matches_torch():
    check(lambda x: wb.top_k(x, 3), lambda x: torch.topk(x, 3), distinct(2, 3, 7))


def test_scatter_add_matches_torch_index_put_with_accumulate():
    base, idx, upd = normal(5, 3), np.array([4, 0, 4, 4, 2]), normal(5, 3)
    check(wb.scatter_add, lambda b, i, u: b.index_put((i,), u, accumulate=True), base, idx, upd)
    base, idx, upd = normal(6), np.array([[1, 5], [1, 1]]), normal(2, 2)
    check(wb.scatter_add, lambda b, i, u: b.index_put((i,), u, accumulate=True), base, idx, upd)


def attention_inputs(lq=4, lk=6):
    return normal(2, 3, lq, 5), normal(2, 3, lk, 5), normal(2, 3, lk, 4)


def test_attention_matches_torch():
    sdpa = wb.scaled_dot_product_attention
    check(sdpa, F.scaled_dot_product_attention, *attention_inputs())
    check(
        lambda q, k, v: sdpa(q, k, v, causal=True),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        *attention_inputs(5, 5),
    )
    check(
        lambda q, k, v: sdpa(q, k, v, scale=0.7),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.7),
        *attention_inputs(3, 7),
    )


def test_attention_with_a_mask_matches_torch():
    mask = RNG.random((2, 1, 4, 6)) < 0.6
    mask[..., 0] = True
    tril = np.tril(np.ones((4, 6), bool))
    sdpa = wb.scaled_dot_product_attention
    check(
        lambda q, k, v, m: sdpa(q, k, v, mask=m),
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        *attention_inputs(),
        mask,
    )
    check(
        lambda q, k, v, m: sdpa(q, k, v, mask=m, causal=True),
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m & torch.tensor(tril)),
        *attention_inputs(),
        mask,
    )
