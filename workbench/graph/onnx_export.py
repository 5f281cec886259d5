"""ONNX export: an inference graph (:mod:`workbench.graph.export`) as an ``onnx.ModelProto``.

Every op of an inference graph maps to ONNX nodes by one converter in :data:`CONVERTERS`
(``converter(b, op, inputs) -> output names``, registered with
:func:`workbench.graph.onnx_builder.converts` in :mod:`~workbench.graph.onnx_ops` and
:mod:`~workbench.graph.onnx_models`; layer norm, GELU and attention built from primitives
where the opset has no operator for them); the ops
that never reach an inference graph (gradients, updates, ops made by device passes) are
listed in :data:`NOT_EXPORTED` with the reason, so every op of the registry is accounted
for. Inputs get a symbolic batch axis (``"batch"``); variables and constants become
initializers. Convolutions and pooling with ``padding="same"`` get TensorFlow's padding
exactly: the pads computed from the static sizes (the extra row and column at the end),
or ``auto_pad="SAME_UPPER"`` where a size is known only at run time.

``onnx`` is imported only when a model is exported (``pip install "workbench[onnx]"``).
"""

from __future__ import annotations

import numpy as np

from workbench.errors import GraphError
from workbench.graph import onnx_models, onnx_ops  # noqa: F401 - they register the converters
from workbench.graph.core import Graph, Operation
from workbench.graph.export import Signature
from workbench.graph.onnx_builder import BATCH, CONVERTERS, Builder, import_onnx, source_line, tensor_type
from workbench.version import __version__

__all__ = ["CONVERTERS", "DEFAULT_OPSET", "MIN_OPSET", "NOT_EXPORTED", "SOURCES", "to_onnx"]

DEFAULT_OPSET = 17
MIN_OPSET = 13  # Softmax over one axis, ReduceSum's axes as an input, Unsqueeze's axes as an input
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


def to_onnx(graph: Graph, signature: Signature, opset: int | None = None):
    """The ONNX model of the inference graph ``graph`` with ``signature``, checked by ``onnx.checker``."""
    onnx = import_onnx()
    opset = DEFAULT_OPSET if opset is None else opset
    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or isinstance(opset, bool) or not MIN_OPSET <= opset <= newest:
        raise GraphError(f"opset must be an int from {MIN_OPSET} to {newest} (this onnx's newest), got {opset!r}")
    reserved = {i.name for i in signature.inputs + signature.outputs}
    consumed = {t for op in graph.operations for t in op.inputs} | {graph.get(o.tensor) for o in signature.outputs}
    b = Builder(onnx, opset, reserved, consumed)
    inputs = {graph.get(i.tensor): i.name for i in signature.inputs}
    for op in graph.operations:
        _convert(b, op, inputs)
    outputs = []
    for info in signature.outputs:
        value = b.names[graph.get(info.tensor)]
        b.nodes.append(onnx.helper.make_node("Identity", [value], [info.name], name=b.fresh(info.name + "#output")))
        outputs.append(_value_info(onnx, info.name, info.dtype, info.shape))
    graph_inputs = [_value_info(onnx, i.name, i.dtype, i.shape) for i in signature.inputs]
    proto = onnx.helper.make_graph(b.nodes, graph.name, graph_inputs, outputs, initializer=b.initializers)
    opsets = [onnx.helper.make_opsetid("", opset)]
    model = onnx.helper.make_model(
        proto,
        opset_imports=opsets,
        producer_name="workbench",
        producer_version=__version__,
        ir_version=onnx.helper.find_min_ir_version_for(opsets),
    )
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 - onnx raises ValidationError or InferenceError
        raise GraphError(f"the ONNX model of graph {graph.name!r} fails onnx.checker: {e}") from e
    return model


def _value_info(onnx, name: str, dtype: str, shape: tuple):
    dims = [BATCH if i == 0 and d is None else d for i, d in enumerate(shape)]
    return onnx.helper.make_tensor_value_info(name, tensor_type(dtype), dims)


def _convert(b: Builder, op: Operation, inputs: dict) -> None:
    if op.type == "placeholder":
        if op.outputs[0] not in inputs:
            raise GraphError(f"placeholder {op.name!r} is not an input of the signature{source_line(op)}")
        b.names[op.outputs[0]] = inputs[op.outputs[0]]
        return
    if op.type in ("variable", "constant"):
        value = op.attrs["init"] if op.type == "variable" else op.attrs["value"]
        b.names[op.outputs[0]] = b.constant(np.asarray(value, dtype=op.outputs[0].dtype), op.name)
        return
    converter = CONVERTERS.get(op.type)
    if converter is None:
        why = NOT_EXPORTED.get(op.type, "no converter is registered for it")
        raise GraphError(f"op {op.name!r} ({op.type}) has no ONNX form: {why}{source_line(op)}")
    ins = []
    for t in op.inputs:
        if t not in b.names:
            raise GraphError(f"op {op.name!r} ({op.type}) needs {t.name!r}, which has no ONNX form{source_line(op)}")
        ins.append(b.names[t])
    names = converter(b, op, ins)
    b.names.update(zip(op.outputs, names, strict=False))  # converters may leave unused outputs out
