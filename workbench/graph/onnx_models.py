"""ONNX converters of the models' ops: special functions, layer norm and moments, average
pooling, padding, running sums, top-k, scatter-add and attention.

Where the opset has an operator it is used (``Gelu`` from opset 20, ``LayerNormalization``
from 17 over trailing axes); otherwise the op is built from primitives, as attention always is
(two ``MatMul``, the scale, the mask as a ``Where`` to ``-inf``, ``Softmax``).
"""

from __future__ import annotations

import math

import numpy as np

from workbench.errors import GraphError
from workbench.graph.onnx_builder import converts, source_line, tensor_type
from workbench.graph.onnx_ops import _window_attrs
from workbench.ops import rules


def _scalar(b, value, like, base: str) -> str:
    """A scalar constant of ``like``'s dtype (a tensor of the graph)."""
    return b.constant(np.array(value, dtype=like.dtype), base)


# -- special functions --------------------------------------------------------------------


@converts("rsqrt")
def _rsqrt(b, op, ins):
    return [b.one("Reciprocal", [b.one("Sqrt", ins, op.name + "/sqrt")], op.name)]


@converts("square")
def _square(b, op, ins):
    return [b.one("Mul", [ins[0], ins[0]], op.name)]


@converts("erf")
def _erf(b, op, ins):
    return [b.one("Erf", ins, op.name)]


@converts("clip")
def _clip(b, op, ins):
    x, lo, hi = ins  # Min(Max(x, lo), hi) as the kernel, with broadcasting bounds (ONNX's Clip takes scalars)
    return [b.one("Min", [b.one("Max", [x, lo], op.name + "/max"), hi], op.name)]


@converts("gelu")
def _gelu(b, op, ins):
    approximate = op.attrs["approximate"]
    if b.opset >= 20:
        return [b.one("Gelu", ins, op.name, approximate=approximate)]
    x, t = op.inputs[0], ins[0]
    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.one("Mul", [t, b.one("Mul", [t, t], op.name + "/x2")], op.name + "/x3")
        inner = b.one(
            "Add", [t, b.one("Mul", [cube, _scalar(b, 0.044715, x, op.name + "/a")], op.name + "/ax3")], op.name + "/u"
        )
        scaled = b.one("Mul", [inner, _scalar(b, math.sqrt(2.0 / math.pi), x, op.name + "/c")], op.name + "/cu")
        phi = b.one("Tanh", [scaled], op.name + "/tanh")
    else:  # 0.5 x (1 + erf(x / sqrt 2))
        phi = b.one(
            "Erf",
            [b.one("Mul", [t, _scalar(b, 1.0 / math.sqrt(2.0), x, op.name + "/r2")], op.name + "/z")],
            op.name + "/erf",
        )
    one_plus = b.one("Add", [phi, _scalar(b, 1.0, x, op.name + "/one")], op.name + "/1p")
    half_x = b.one("Mul", [t, _scalar(b, 0.5, x, op.name + "/half")], op.name + "/hx")
    return [b.one("Mul", [half_x, one_plus], op.name)]


# -- normalization --------------------------------------------------------------------------


@converts("layer_norm")
def _layer_norm(b, op, ins):
    x = op.inputs[0]
    axes = list(rules.axes_tuple(op.attrs["axis"], x.ndim))
    epsilon = op.attrs["epsilon"]
    trailing = axes == list(range(x.ndim - len(axes), x.ndim))
    stats_used = any(t in b.consumed for t in op.outputs[1:])
    if b.opset >= 17 and trailing and not stats_used:
        return [b.one("LayerNormalization", ins, op.name, axis=axes[0], epsilon=epsilon)]
    mean = b.reduce("ReduceMean", ins[0], axes, True, op.name + "/mean")
    centred = b.one("Sub", [ins[0], mean], op.name + "/centred")
    var = b.reduce("ReduceMean", b.one("Mul", [centred, centred], op.name + "/sq"), axes, True, op.name + "/var")
    shifted = b.one("Add", [var, _scalar(b, epsilon, x, op.name + "/eps")], op.name + "/var_eps")
    rstd = b.one("Reciprocal", [b.one("Sqrt", [shifted], op.name + "/std")], op.name + "/rstd")
    scale, offset = (_along(b, op, name, axes, x.ndim) for name in ins[1:])
    normed = b.one("Mul", [b.one("Mul", [centred, rstd], op.name + "/normed"), scale], op.name + "/scaled")
    return [b.one("Add", [normed, offset], op.name), mean, rstd]


def _along(b, op, name: str, axes: list[int], ndim: int) -> str:
    """A parameter shaped like x on ``axes``, reshaped to broadcast against x (trailing axes already do)."""
    if axes == list(range(ndim - len(axes), ndim)):
        return name
    shape = [1] * ndim
    for a, d in zip(axes, op.inputs[1].shape, strict=True):
        shape[a] = d
    return b.one("Reshape", [name, b.ints(shape, f"{name}/shape")], f"{name}/along")


@converts("moments")
def _moments(b, op, ins):
    x, keepdims = op.inputs[0], op.attrs["keepdims"]
    axes = list(rules.axes_tuple(op.attrs["axis"], x.ndim))
    mean_kept = b.reduce("ReduceMean", ins[0], axes, True, op.name + "/mean_kept")
    centred = b.one("Sub", [ins[0], mean_kept], op.name + "/centred")
    var = b.reduce("ReduceMean", b.one("Mul", [centred, centred], op.name + "/sq"), axes, keepdims, op.name + ":1")
    mean = mean_kept if keepdims else b.reduce("ReduceMean", ins[0], axes, False, op.name)
    return [mean, var]


# -- pooling, padding, running sums ---------------------------------------------------------


@converts("avg_pool2d")
def _avg_pool2d(b, op, ins):
    attrs = _window_attrs(op, op.inputs[0], op.attrs["size"], op.attrs["stride"], op.attrs["padding"])
    return [b.one("AveragePool", ins, op.name, count_include_pad=0, **attrs)]  # the padding never counts


@converts("pad")
def _pad(b, op, ins):
    pairs = op.attrs["paddings"]
    pads = b.ints([p[0] for p in pairs] + [p[1] for p in pairs], op.name + "/pads")
    if op.attrs["mode"] == "reflect":
        return [b.one("Pad", [ins[0], pads], op.name, mode="reflect")]
    value = _scalar(b, op.attrs["value"], op.inputs[0], op.name + "/value")
    return [b.one("Pad", [ins[0], pads, value], op.name, mode="constant")]


@converts("cumsum")
def _cumsum(b, op, ins):
    axis = b.constant(np.array(rules.axis_index(op.attrs["axis"], op.inputs[0].ndim), np.int64), op.name + "/axis")
    flags = {"exclusive": int(op.attrs["exclusive"]), "reverse": int(op.attrs["reverse"])}
    return [b.one("CumSum", [ins[0], axis], op.name, **flags)]


@converts("top_k")
def _top_k(b, op, ins):
    k = b.ints([op.attrs["k"]], op.name + "/k")  # ties: the lower index first, as workbench's kernel
    return b.node("TopK", [ins[0], k], op.name, outputs=2, axis=-1, largest=1, sorted=1)


@converts("scatter_add")
def _scatter_add(b, op, ins):
    if b.opset < 16:
        raise GraphError(
            f"op {op.name!r} (scatter_add) needs opset 16 or newer (ScatterND's reduction){source_line(op)}"
        )
    indices = ins[1]
    if op.inputs[1].dtype != "int64":  # ScatterND takes int64 indices only
        indices = b.one("Cast", [indices], op.name + "/indices", to=tensor_type("int64"))
    at = b.one("Unsqueeze", [indices, b.ints([-1], op.name + "/axes")], op.name + "/at")
    return [b.one("ScatterND", [ins[0], at, ins[2]], op.name, reduction="add")]


# -- attention, from primitives ------------------------------------------------------------


@converts("scaled_dot_product_attention")
def _attention(b, op, ins):
    q, k, v = ins[:3]
    depth = op.inputs[0].shape[3]
    scale = op.attrs["scale"]
    if scale is None and depth is None:
        raise GraphError(f"op {op.name!r}: attention's default scale needs the depth of q to be known{source_line(op)}")
    scale = math.sqrt(1.0 / depth) if scale is None else scale
    keys_t = b.one("Transpose", [k], op.name + "/k_t", perm=[0, 1, 3, 2])
    scores = b.one("MatMul", [q, keys_t], op.name + "/scores")
    scores = b.one("Mul", [scores, _scalar(b, scale, op.inputs[0], op.name + "/scale")], op.name + "/scaled")
    allowed = ins[3] if len(ins) == 4 else None
    if op.attrs["causal"]:
        tri = _causal(b, op, q, k)
        allowed = tri if allowed is None else b.one("And", [allowed, tri], op.name + "/allowed")
    if allowed is not None:
        minus_inf = _scalar(b, -np.inf, op.inputs[0], op.name + "/minus_inf")
        scores = b.one("Where", [allowed, scores, minus_inf], op.name + "/masked")
    weights = b.one("Softmax", [scores], op.name + ":1", axis=3)
    return [b.one("MatMul", [weights, v], op.name), weights]


def _causal(b, op, q: str, k: str) -> str:
    """(Lq, Lk) bool: query i sees keys j <= i; from the static lengths, else from the run-time shapes."""
    lq, lk = op.inputs[0].shape[2], op.inputs[1].shape[2]
    if lq is not None and lk is not None:
        return b.constant(np.arange(lq)[:, None] >= np.arange(lk)[None, :], op.name + "/causal")
    ranges = []
    for name, tensor in (("q", q), ("k", k)):
        length = b.one(
            "Gather",
            [
                b.one("Shape", [tensor], f"{op.name}/{name}_shape"),
                b.constant(np.array(2, np.int64), f"{op.name}/{name}_at"),
            ],
            f"{op.name}/{name}_len",
            axis=0,
        )
        start, step = (
            b.constant(np.array(0, np.int64), f"{op.name}/{name}_0"),
            b.constant(np.array(1, np.int64), f"{op.name}/{name}_1"),
        )
        ranges.append(b.one("Range", [start, length, step], f"{op.name}/{name}_range"))
    rows = b.one("Unsqueeze", [ranges[0], b.ints([1], op.name + "/rows_axes")], op.name + "/rows")
    cols = b.one("Unsqueeze", [ranges[1], b.ints([0], op.name + "/cols_axes")], op.name + "/cols")
    return b.one("GreaterOrEqual", [rows, cols], op.name + "/causal")
