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

from workbench.errors import DeviceError
from workbench.graph.core import Operation, Tensor

BATCH = "batch"
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min

#: op type -> ``converter(b, op, inputs) -> list of output names`` (see :func:`converts`).
CONVERTERS: dict[str, Callable] = {}


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
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
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
