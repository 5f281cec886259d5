"""The operations a drawing shows: a graph's, with each control-flow op opened into a scope.

A ``scan`` or ``cond`` op named ``rnn`` is drawn as the scope ``rnn``: folded, one node
standing for the loop; unfolded, the op itself (``rnn/scan``) and its body's operations
(``rnn/body/...``; ``rnn/true/...`` and ``rnn/false/...`` for a cond), each body input
drawn as a placeholder fed by the outer tensor it stands for. Bodies inside bodies open
the same way. Everything else is drawn as it is.
"""

from __future__ import annotations

from typing import NamedTuple

from workbench.graph.control import bodies_of
from workbench.graph.core import Graph

LABELS = {"body": "body", "true_body": "true", "false_body": "false"}


class DrawnTensor(NamedTuple):
    op: DrawnOp
    index: int
    shape: tuple | None
    dtype: str

    @property
    def name(self) -> str:
        return self.op.name if self.index == 0 else f"{self.op.name}:{self.index}"


class DrawnOp:
    """An operation as drawn: what :func:`~workbench.widgets.layout.op_info` and the layout read."""

    __slots__ = ("name", "type", "inputs", "control_inputs", "outputs", "source", "attrs", "control")

    def __init__(self, name, op, inputs, control_inputs, control=""):
        self.name, self.type, self.source, self.attrs = name, op.type, op.source, op.attrs
        self.inputs, self.control_inputs = tuple(inputs), tuple(control_inputs)
        self.outputs = tuple(DrawnTensor(self, i, t.shape, t.dtype) for i, t in enumerate(op.outputs))
        self.control = control  # the scope this control-flow op opens into ("" for other ops)


def drawn_operations(graph: Graph) -> list[DrawnOp]:
    """Every operation to draw, in an order where inputs come first."""
    out: list[DrawnOp] = []
    _add(graph, "", {}, out)
    return out


def control_scopes(graph: Graph) -> dict[str, str]:
    """The scopes that control-flow ops open into, with each op's type (``{"rnn": "scan"}``)."""
    return {d.control: d.type for d in drawn_operations(graph) if d.control}


def _add(graph: Graph, prefix: str, outer: dict, out: list) -> None:
    """Add ``graph``'s ops under ``prefix``; ``outer`` maps body placeholder names to drawn outer tensors."""
    tensors: dict = {}
    ops_: dict = {}
    for op in graph.operations:
        inputs = [tensors[t] for t in op.inputs]
        control = [ops_[c] for c in op.control_inputs if c in ops_]
        name = prefix + op.name
        if op.type == "placeholder" and op.name in outer:
            inputs = [outer[op.name]]
        bodies = bodies_of(op)
        if bodies:
            drawn = DrawnOp(f"{name}/{op.type}", op, inputs, control, control=name)
            for key, body in bodies:
                offset = 1 if op.type == "cond" else 0  # a cond's first input is its predicate
                fed = {p: inputs[offset + i] for i, p in enumerate(body.inputs) if offset + i < len(inputs)}
                _add(body.graph, f"{name}/{LABELS.get(key, key)}/", fed, out)
        else:
            drawn = DrawnOp(name, op, inputs, control)
        out.append(drawn)
        ops_[op] = drawn
        tensors.update(zip(op.outputs, drawn.outputs))
