"""The pieces ONNX converters are written with: :class:`Builder`, the converter registry, dtypes.

A converter ``converter(b, op, inputs) -> output names`` turns one workbench op into ONNX
nodes with ``b.node``/``b.one`` (``inputs`` are the ONNX names of the op's inputs); it is
registered for its op types with :func:`converts` (core ops in :mod:`workbench.graph.onnx_ops`,
the models' ops in :mod:`workbench.graph.onnx_models`). ``onnx`` is imported only when a
model is built.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from workbench.errors import DeviceError, GraphError
from workbench.graph.core import Operation, Tensor

BATCH = "batch"
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min

#: op type -> ``converter(b, op, inputs) -> list of output names`` (see :func:`converts`).
CONVERTERS: dict[str, Callable] = {}
#: Ops an inference graph holds as graph inputs and initializers, not as nodes.
SOURCES = ("placeholder", "variable", "constant")
_GRADIENT = "a gradient op: inference graphs have none"
_PASS = "made by a device's pass over the graphs plans run; never in an inference graph"
#: op type -> why it has no ONNX form.
NOT_EXPORTED = {
    "assign": "updates a variable",
    "assign_add": "updates a variable",
    "assign_sub": "updates a variable",
    "no_op": "runs for its control inputs only; inference graphs have no control edges",
    "dropout": "random; an inference graph holds its inference form (the identity) instead",
    "fused_elementwise": _PASS,
    "fused_update": _PASS,
    "softmax_cross_entropy_with_grad": _PASS,
    "relu_grad": _GRADIENT,
    "unreduce": _GRADIENT,
    "reduce_to_like": _GRADIENT,
    "concat_part": _GRADIENT,
    "getitem_grad": _GRADIENT,
    "gather_grad": _GRADIENT,
    "softmax_cross_entropy_grad": _GRADIENT,
    "conv2d_input_grad": _GRADIENT,
    "conv2d_filter_grad": _GRADIENT,
    "max_pool2d_grad": _GRADIENT,
    "avg_pool2d_grad": _GRADIENT,
    "gelu_grad": _GRADIENT,
    "layer_norm_grad": _GRADIENT,
    "pad_grad": _GRADIENT,
    "top_k_grad": _GRADIENT,
    "scaled_dot_product_attention_grad": _GRADIENT,
}


def converts(*op_types: str):
    """Register a converter for ``op_types``: ``converter(b, op, inputs)`` adds nodes with
    ``b.node(...)`` and returns the ONNX names of the op's outputs (the first ones at least)."""

    def register(fn: Callable) -> Callable:
        for op_type in op_types:
            CONVERTERS[op_type] = fn
        return fn

    return register


def import_onnx():
    """The ``onnx`` module, or a DeviceError saying how to install it."""
    try:
        import onnx
    except ImportError as e:
        raise DeviceError('ONNX export needs the onnx package: pip install "workbench[onnx]"') from e
    return onnx


class Builder:
    """The nodes, initializers and value names of the model being built."""

    def __init__(self, onnx, opset: int, reserved: set[str], consumed: set[Tensor] = frozenset()):
        self.onnx, self.opset = onnx, opset
        self.consumed = consumed  # tensors some op or output uses: the outputs a converter must make
        self.nodes: list = []
        self.initializers: list = []
        self.names: dict[Tensor, str] = {}
        self._taken: set[str] = set(reserved)
        self.inline = False  # constants as Constant nodes (in a subgraph) rather than initializers

    def convert(self, op: Operation) -> None:
        """Add the nodes of ``op`` (placeholders must be in :attr:`names` already)."""
        if op.type == "placeholder":
            if op.outputs[0] not in self.names:
                raise GraphError(f"placeholder {op.name!r} is not an input of the signature{source_line(op)}")
            return
        if op.type in ("variable", "constant"):
            value = op.attrs["init"] if op.type == "variable" else op.attrs["value"]
            self.names[op.outputs[0]] = self.constant(np.asarray(value, dtype=op.outputs[0].dtype), op.name)
            return
        converter = CONVERTERS.get(op.type)
        if converter is None:
            why = NOT_EXPORTED.get(op.type, "no converter is registered for it")
            raise GraphError(f"op {op.name!r} ({op.type}) has no ONNX form: {why}{source_line(op)}")
        ins = []
        for t in op.inputs:
            if t not in self.names:
                raise GraphError(
                    f"op {op.name!r} ({op.type}) needs {t.name!r}, which has no ONNX form{source_line(op)}"
                )
            ins.append(self.names[t])
        names = converter(self, op, ins)
        self.names.update(zip(op.outputs, names, strict=False))  # converters may leave unused outputs out

    def child(self, consumed: set[Tensor]) -> Builder:
        """A builder for a subgraph (a control-flow body): value names unique across the model,
        constants as Constant nodes."""
        sub = Builder(self.onnx, self.opset, set(), consumed)
        sub._taken = self._taken
        sub.inline = True
        return sub

    def fresh(self, base: str) -> str:
        """A value name not used yet, from ``base``."""
        name, i = base, 1
        while name in self._taken:
            name, i = f"{base}_{i}", i + 1
        self._taken.add(name)
        return name

    def node(self, op_type: str, inputs, base: str, outputs: int = 1, **attrs) -> list[str]:
        names = [self.fresh(base if outputs == 1 else f"{base}:{i}") for i in range(outputs)]
        self.nodes.append(
            self.onnx.helper.make_node(op_type, list(inputs), names, name=self.fresh(base + "#node"), **attrs)
        )
        return names

    def one(self, op_type: str, inputs, base: str, **attrs) -> str:
        return self.node(op_type, inputs, base, **attrs)[0]

    def constant(self, value, base: str) -> str:
        name = self.fresh(base)
        tensor = self.onnx.numpy_helper.from_array(np.asarray(value), name)
        if self.inline:
            self.nodes.append(
                self.onnx.helper.make_node("Constant", [], [name], name=self.fresh(base + "#node"), value=tensor)
            )
        else:
            self.initializers.append(tensor)
        return name

    def ints(self, values, base: str) -> str:
        return self.constant(np.array(list(values), dtype=np.int64), base)

    def reduce(self, op_type: str, x: str, axes, keepdims: bool, base: str, since: int = 18) -> str:
        """A Reduce* node: axes an attribute before opset ``since`` (13 for ReduceSum), an input from it."""
        attrs = {"keepdims": int(keepdims)}
        if axes is None:
            return self.one(op_type, [x], base, **attrs)
        if self.opset >= since:
            return self.one(op_type, [x, self.ints(axes, base + "/axes")], base, **attrs)
        return self.one(op_type, [x], base, axes=list(axes), **attrs)


def tensor_type(dtype: str) -> int:
    return import_onnx().helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def source_line(op: Operation) -> str:
    """The user's line that made ``op``, for messages."""
    return f"\n  {op.source}" if op.source else ""
