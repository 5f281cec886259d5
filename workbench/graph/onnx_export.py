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


from workbench.errors import GraphError
from workbench.graph import onnx_control, onnx_models, onnx_ops  # noqa: F401 - they register the converters
from workbench.graph.core import Graph
from workbench.graph.export import Signature
from workbench.graph.onnx_builder import BATCH, CONVERTERS, NOT_EXPORTED, SOURCES, Builder, import_onnx, tensor_type
from workbench.version import __version__

__all__ = ["CONVERTERS", "DEFAULT_OPSET", "MIN_OPSET", "NOT_EXPORTED", "SOURCES", "to_onnx"]

DEFAULT_OPSET = 17
MIN_OPSET = 13  # Softmax over one axis, ReduceSum's axes as an input, Unsqueeze's axes as an input


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
    b.names.update({graph.get(i.tensor): i.name for i in signature.inputs})
    for op in graph.operations:
        b.convert(op)
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
