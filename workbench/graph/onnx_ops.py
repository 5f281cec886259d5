"""ONNX converters of the core ops: elementwise, matmul, reductions, shapes, softmax, conv2d, max_pool2d."""

from __future__ import annotations

import numpy as np

from workbench.errors import GraphError
from workbench.graph.core import Tensor
from workbench.graph.onnx_builder import INT64_MAX, INT64_MIN, converts, source_line, tensor_type
from workbench.ops import rules
from workbench.ops.array import _perm
from workbench.ops.nn import _out_size

# -- elementwise -------------------------------------------------------------------------

_ELEMENTWISE = {
    "add": "Add",
    "subtract": "Sub",
    "multiply": "Mul",
    "divide": "Div",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
    "less": "Less",
    "less_equal": "LessOrEqual",
    "greater": "Greater",
    "greater_equal": "GreaterOrEqual",
    "equal": "Equal",
    "negative": "Neg",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
    "abs": "Abs",
    "sign": "Sign",
    "where": "Where",
    "identity": "Identity",
    "stop_gradient": "Identity",
    "cross_replica_sum": "Identity",  # a model file runs on its own: one replica
}


@converts(*_ELEMENTWISE)
def _elementwise(b, op, ins):
    return [b.one(_ELEMENTWISE[op.type], ins, op.name)]


@converts("not_equal")
def _not_equal(b, op, ins):
    return [b.one("Not", [b.one("Equal", ins, op.name + "/equal")], op.name)]


@converts("isfinite")
def _isfinite(b, op, ins):
    special = b.one(
        "Or", [b.one("IsNaN", ins, op.name + "/nan"), b.one("IsInf", ins, op.name + "/inf")], op.name + "/or"
    )
    return [b.one("Not", [special], op.name)]


@converts("cast")
def _cast(b, op, ins):
    return [b.one("Cast", ins, op.name, to=tensor_type(op.attrs["dtype"]))]


@converts("zeros_like", "ones_like")
def _filled_like(b, op, ins):
    fill = np.array([0 if op.type == "zeros_like" else 1], dtype=op.outputs[0].dtype)
    value = b.onnx.numpy_helper.from_array(fill, "value")
    return [b.one("ConstantOfShape", [b.one("Shape", ins, op.name + "/shape")], op.name, value=value)]


@converts("broadcast_like")
def _broadcast_like(b, op, ins):
    return [b.one("Expand", [ins[0], b.one("Shape", [ins[1]], op.name + "/shape")], op.name)]


# -- matmul and reductions ---------------------------------------------------------------------


@converts("matmul")
def _matmul(b, op, ins):
    a, c = ins
    if op.attrs["transpose_a"]:
        a = b.one("Transpose", [a], op.name + "/a_t", perm=_swap_last(op.inputs[0].ndim))
    if op.attrs["transpose_b"]:
        c = b.one("Transpose", [c], op.name + "/b_t", perm=_swap_last(op.inputs[1].ndim))
    return [b.one("MatMul", [a, c], op.name)]


def _swap_last(ndim: int) -> list[int]:
    return [*range(ndim - 2), ndim - 1, ndim - 2]


def _axes(op) -> list[int] | None:
    axis = op.attrs["axis"]
    return None if axis is None else list(rules.axes_tuple(axis, op.inputs[0].ndim))


@converts("sum", "mean", "max", "min", "prod")
def _reduction(b, op, ins):
    kind = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd"}[
        op.type
    ]
    since = 13 if op.type == "sum" else 18
    return [b.reduce(kind, ins[0], _axes(op), op.attrs["keepdims"], op.name, since)]


@converts("all")
def _all(b, op, ins):
    as_int = b.one("Cast", ins, op.name + "/int", to=tensor_type("int32"))
    smallest = b.reduce("ReduceMin", as_int, _axes(op), op.attrs["keepdims"], op.name + "/min")
    return [b.one("Cast", [smallest], op.name, to=tensor_type("bool"))]


@converts("argmax")
def _argmax(b, op, ins):
    axis, keepdims, ndim = op.attrs["axis"], op.attrs["keepdims"], op.inputs[0].ndim
    if axis is not None:
        return [b.one("ArgMax", ins, op.name, axis=rules.axis_index(axis, ndim), keepdims=int(keepdims))]
    flat = b.one("Reshape", [ins[0], b.ints([-1], op.name + "/flat_shape")], op.name + "/flat")
    index = b.one("ArgMax", [flat], op.name + "/index" if keepdims else op.name, axis=0, keepdims=0)
    if not keepdims:
        return [index]
    return [b.one("Reshape", [index, b.ints([1] * ndim, op.name + "/ones")], op.name)]


# -- shapes ------------------------------------------------------------------------------


@converts("reshape")
def _reshape(b, op, ins):
    shape = op.attrs["shape"]
    attrs = {}
    if 0 in shape:  # a size of 0, not ONNX's "copy this axis"
        if b.opset < 14:
            raise GraphError(f"op {op.name!r} reshapes to a size of 0, which needs opset 14 or newer{source_line(op)}")
        attrs["allowzero"] = 1
    return [b.one("Reshape", [ins[0], b.ints(shape, op.name + "/shape")], op.name, **attrs)]


@converts("reshape_like")
def _reshape_like(b, op, ins):
    return [b.one("Reshape", [ins[0], b.one("Shape", [ins[1]], op.name + "/shape")], op.name)]


@converts("transpose")
def _transpose(b, op, ins):
    return [b.one("Transpose", ins, op.name, perm=list(_perm(op.attrs["perm"], op.inputs[0].ndim)))]


@converts("expand_dims")
def _expand_dims(b, op, ins):
    axis = rules.axis_index(op.attrs["axis"], op.inputs[0].ndim + 1)
    return [b.one("Unsqueeze", [ins[0], b.ints([axis], op.name + "/axes")], op.name)]


@converts("concat")
def _concat(b, op, ins):
    return [b.one("Concat", ins, op.name, axis=rules.axis_index(op.attrs["axis"], op.inputs[0].ndim))]


@converts("stack")
def _stack(b, op, ins):
    axis = rules.axis_index(op.attrs["axis"], op.inputs[0].ndim + 1)
    axes = b.ints([axis], op.name + "/axes")
    parts = [b.one("Unsqueeze", [x, axes], f"{op.name}/part{i}") for i, x in enumerate(ins)]
    return [b.one("Concat", parts, op.name, axis=axis)]


@converts("getitem")
def _getitem(b, op, ins):
    """Slices first (one Slice node), then int indices (Gather of a scalar, last axis first), then new axes."""
    items = _expanded_index(op.attrs["index"], op.inputs[0].ndim)
    x, slices, picks, new_axes, out_dim, dim = ins[0], [], [], [], 0, 0
    for item in items:
        if item[0] == "newaxis":
            new_axes.append(out_dim)
            out_dim += 1
            continue
        if item[0] == "int":
            picks.append((dim, item[1]))
        else:
            start, stop, step = item[1:]
            if (start, stop, step) != (None, None, None):
                slices.append((dim, start, stop, step))
            out_dim += 1
        dim += 1
    if slices:
        x = _slice(b, op, x, slices)
    for axis, index in sorted(picks, reverse=True):
        x = b.one(
            "Gather",
            [x, b.constant(np.array(index, dtype=np.int64), f"{op.name}/at{axis}")],
            f"{op.name}/pick{axis}",
            axis=axis,
        )
    if new_axes:
        x = b.one("Unsqueeze", [x, b.ints(new_axes, op.name + "/new_axes")], op.name + "/unsqueeze")
    return [b.one("Identity", [x], op.name)]


def _expanded_index(index, ndim: int) -> list:
    """The index with the ellipsis (or the missing trailing axes) spelled out as full slices."""
    items = list(index)
    consumed = sum(1 for i in items if i[0] in ("int", "slice"))
    full = [("slice", None, None, None)] * (ndim - consumed)
    if ("ellipsis",) in items:
        at = items.index(("ellipsis",))
        return items[:at] + full + items[at + 1 :]
    return items + full


def _slice(b, op, x, slices):
    starts, ends, steps = [], [], []
    for _, start, stop, step in slices:
        step = 1 if step is None else step
        starts.append((0 if step > 0 else INT64_MAX) if start is None else start)
        ends.append((INT64_MAX if step > 0 else INT64_MIN) if stop is None else stop)
        steps.append(step)
    axes = [s[0] for s in slices]
    args = [
        b.ints(v, f"{op.name}/{what}")
        for v, what in ((starts, "starts"), (ends, "ends"), (axes, "axes"), (steps, "steps"))
    ]
    return b.one("Slice", [x, *args], op.name + "/slice")


def _int64(b, op, x: str, tensor: Tensor) -> str:
    """Indices as ONNX takes them (int32 or int64)."""
    if tensor.dtype in ("int32", "int64"):
        return x
    return b.one("Cast", [x], op.name + "/indices", to=tensor_type("int64"))


@converts("gather")
def _gather(b, op, ins):
    axis = rules.axis_index(op.attrs["axis"], op.inputs[0].ndim)
    return [b.one("Gather", [ins[0], _int64(b, op, ins[1], op.inputs[1])], op.name, axis=axis)]


@converts("one_hot")
def _one_hot(b, op, ins):
    indices = op.inputs[0]
    classes = b.constant(np.arange(op.attrs["depth"], dtype=indices.dtype), op.name + "/classes")
    column = b.one("Unsqueeze", [ins[0], b.ints([-1], op.name + "/axes")], op.name + "/column")
    hot = b.one("Equal", [column, classes], op.name + "/hot")
    return [b.one("Cast", [hot], op.name, to=tensor_type(op.attrs["dtype"]))]


# -- neural-network ops -----------------------------------------------------------------------


@converts("softmax", "log_softmax")
def _softmax(b, op, ins):
    axis = rules.axis_index(op.attrs["axis"], op.inputs[0].ndim)
    return [b.one("Softmax" if op.type == "softmax" else "LogSoftmax", ins, op.name, axis=axis)]


@converts("softmax_cross_entropy")
def _softmax_cross_entropy(b, op, ins):
    logits, labels = ins
    last = op.inputs[0].ndim - 1
    log_probs = b.one("LogSoftmax", [logits], op.name + "/log_softmax", axis=last)
    axes = b.ints([-1], op.name + "/axes")
    at = b.one(
        "Unsqueeze", [b.one("Cast", [labels], op.name + "/labels", to=tensor_type("int64")), axes], op.name + "/at"
    )
    picked = b.one("GatherElements", [log_probs, at], op.name + "/picked", axis=last)
    loss = b.one("Neg", [b.one("Squeeze", [picked, axes], op.name + "/squeezed")], op.name)
    if op.outputs[1] not in b.consumed:
        return [loss]
    return [loss, b.one("Softmax", [logits], op.name + ":1", axis=last)]


def _window_attrs(op, x: Tensor, kernel, stride, padding) -> dict:
    """Conv/MaxPool attributes for workbench's padding: TensorFlow's "same" (the extra pad at the end)."""
    attrs = {"kernel_shape": list(kernel), "strides": list(stride)}
    if padding == "valid":
        attrs["pads"] = [0, 0, 0, 0]
    elif None in x.shape[2:]:
        attrs["auto_pad"] = "SAME_UPPER"  # ONNX's name for TensorFlow's "same"
    else:
        (top, bottom, _), (left, right, _) = (_out_size(x.shape[2 + i], kernel[i], stride[i], "same") for i in (0, 1))
        attrs["pads"] = [top, left, bottom, right]
    return attrs


@converts("conv2d")
def _conv2d(b, op, ins):
    x, w = op.inputs
    return [b.one("Conv", ins, op.name, **_window_attrs(op, x, w.shape[2:], op.attrs["stride"], op.attrs["padding"]))]


@converts("max_pool2d")
def _max_pool2d(b, op, ins):
    attrs = _window_attrs(op, op.inputs[0], op.attrs["size"], op.attrs["stride"], op.attrs["padding"])
    return [b.one("MaxPool", ins, op.name, **attrs)]
