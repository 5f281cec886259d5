"""Scaled dot-product attention on (batch, heads, length, depth), one forward and one backward op.

The forward op keeps the attention weights as a second output for the backward op.
Scores are scaled, masked and normalized in place: two matrix products and one
(length x length) array per call, however many steps the softmax takes.
"""

from __future__ import annotations

import math

from workbench.errors import DTypeError, GradientError, ShapeError
from workbench.ops import rules
from workbench.ops.registry import TensorSpec, apply, defop


def scaled_dot_product_attention(q, k, v, mask=None, causal=False, scale=None, name=None):
    """``softmax(q @ k^T * scale + masking) @ v`` over the last two axes.

    Parameters
    ----------
    q : Tensor
        Queries, (batch, heads, Lq, depth).
    k, v : Tensor
        Keys (batch, heads, Lk, depth) and values (batch, heads, Lk, depth_v).
    mask : Tensor, optional
        A bool tensor broadcasting to (batch, heads, Lq, Lk): ``True`` where a query may
        attend to a key (as in ``torch.nn.functional.scaled_dot_product_attention``).
    causal : bool
        Query ``i`` attends to keys ``j <= i`` only (the lower triangle, from the top left).
    scale : float, optional
        Default ``1 / sqrt(depth)``.

    Returns
    -------
    Tensor
        (batch, heads, Lq, depth_v). A query with every key masked gives NaN, as in PyTorch.
    """
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    scale = None if scale is None else float(scale)
    out, _weights = apply("scaled_dot_product_attention", *inputs, causal=bool(causal), scale=scale, name=name)
    return out


def _attention_spec(q: TensorSpec, k: TensorSpec, v: TensorSpec, mask: TensorSpec | None = None, *, causal, scale):
    rules.need_float(q, "q")
    dtype = rules.same_dtype(q, k, v)
    if not (len(q.shape) == len(k.shape) == len(v.shape) == 4):
        raise ShapeError(
            f"needs q, k and v of shape (batch, heads, length, depth), got {rules.fmt(q.shape)}, "
            f"{rules.fmt(k.shape)} and {rules.fmt(v.shape)}"
        )
    if not all(rules.dims_match(a, b) for t in (k, v) for a, b in zip(q.shape[:2], t.shape[:2])):
        raise ShapeError(
            f"q {rules.fmt(q.shape)}, k {rules.fmt(k.shape)} and v {rules.fmt(v.shape)} differ in batch or heads"
        )
    lead = tuple(next((d for d in dims if d is not None), None) for dims in zip(q.shape[:2], k.shape[:2], v.shape[:2]))
    if not rules.dims_match(q.shape[3], k.shape[3]):
        raise ShapeError(f"q {rules.fmt(q.shape)} and k {rules.fmt(k.shape)} have different depths")
    if not rules.dims_match(k.shape[2], v.shape[2]):
        raise ShapeError(f"k {rules.fmt(k.shape)} and v {rules.fmt(v.shape)} have different lengths")
    scores = lead + (q.shape[2], k.shape[2])
    if mask is not None:
        if mask.dtype != "bool":
            raise DTypeError(f"mask must be a bool tensor (True where attention is allowed), got {mask.dtype}")
        if len(mask.shape) > 4 or rules.broadcast(mask.shape, scores) != tuple(scores):
            raise ShapeError(f"mask {rules.fmt(mask.shape)} does not broadcast to the scores {rules.fmt(scores)}")
    return TensorSpec(lead + (q.shape[2], v.shape[3]), dtype), TensorSpec(scores, dtype)


def _exp_into(xp, s):
    fn = xp.exp
    return fn(s, out=s) if hasattr(fn, "nin") and getattr(s, "ndim", 0) > 0 else fn(s)


def _weights(xp, q, k, mask, causal, scale):
    """The attention weights: softmax of the scaled, masked scores, computed in one array."""
    s = xp.matmul(q, xp.matrix_transpose(k))
    s *= math.sqrt(1.0 / q.shape[-1]) if scale is None else scale
    lq, lk = s.shape[-2:]
    allowed = mask
    if causal:
        tri = xp.reshape(xp.arange(lq), (lq, 1)) >= xp.reshape(xp.arange(lk), (1, lk))
        allowed = tri if allowed is None else (allowed & tri)
    if allowed is not None:
        s = xp.where(allowed, s, -math.inf)
    s -= xp.max(s, axis=-1, keepdims=True)
    s = _exp_into(xp, s)
    s /= xp.sum(s, axis=-1, keepdims=True)
    return s


def _attention_kernel(xp, q, k, v, mask=None, *, causal, scale):
    p = _weights(xp, q, k, mask, causal, scale)
    return xp.matmul(p, v), p


def attention_grad(g, q, k, v, weights, scale=None, name=None):
    """Gradients of :func:`scaled_dot_product_attention` with respect to ``q``, ``k`` and ``v``."""
    return apply("scaled_dot_product_attention_grad", g, q, k, v, weights, scale=scale, name=name)


def _attention_grad_kernel(xp, g, q, k, v, p, *, scale):
    scale = math.sqrt(1.0 / q.shape[-1]) if scale is None else scale
    dv = xp.matmul(xp.matrix_transpose(p), g)
    ds = xp.matmul(g, xp.matrix_transpose(v))  # d weights, then d scores in place
    ds -= xp.sum(ds * p, axis=-1, keepdims=True)
    ds *= p
    ds *= scale
    dq = xp.matmul(ds, k)
    dk = xp.matmul(xp.matrix_transpose(ds), q)
    return dq, dk, dv


def _attention_grad(op, g, g_weights):
    if g_weights is not None:
        raise GradientError(
            "gradient of 'scaled_dot_product_attention' with respect to its weights output is not defined"
        )
    q, k, v = op.inputs[:3]
    dq, dk, dv = attention_grad(g, q, k, v, op.outputs[1], scale=op.attrs["scale"])
    return (dq, dk, dv) + ((None,) if len(op.inputs) == 4 else ())


def _attention_grad_spec(g, q, k, v, p, *, scale):
    return TensorSpec(q.shape, g.dtype), TensorSpec(k.shape, g.dtype), TensorSpec(v.shape, g.dtype)


defop(
    "scaled_dot_product_attention", infer=_attention_spec, kernel=_attention_kernel, grad=_attention_grad, num_outputs=2
)
defop(
    "scaled_dot_product_attention_grad",
    infer=_attention_grad_spec,
    kernel=_attention_grad_kernel,
    num_outputs=3,
    nondiff="gradient of attention; second derivatives are not supported",
)
