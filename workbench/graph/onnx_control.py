"""ONNX converters of control flow: ``cond`` as ``If``, ``scan`` as ``Loop``.

A body becomes a subgraph whose nodes are converted by the same converters; the tensors
it captured are the enclosing graph's values, named from the subgraph (ONNX's outer
scope). ``scan`` is a ``Loop``: the trip count is the sequences' length (or ``length``),
each step gathers its slice of every sequence by the iteration number (counted down for
``reverse``), and the per-step outputs are stacked by the loop (and flipped back in order
for ``reverse``). The carries at the start of every step, a hidden output for gradients,
are not exported.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import GraphError
from workbench.graph.onnx_builder import INT64_MAX, INT64_MIN, Builder, converts, source_line, tensor_type


def _subgraph(b: Builder, body, bound: dict[str, str], name: str, formal=(), leading=(), prelude=()):
    """The GraphProto of ``body`` with its placeholders named by ``bound`` (placeholder name to ONNX
    value); ``formal`` are the subgraph's own inputs (value infos), ``leading`` output names that
    come before the body's outputs (a Loop's condition), ``prelude`` nodes that come first."""
    graph = body.graph
    outputs = [graph.get(n) for n in body.outputs]
    consumed = {t for op in graph.operations for t in op.inputs} | set(outputs)
    sub = b.child(consumed)
    sub.nodes.extend(prelude)
    for op in graph.operations:
        if op.type == "placeholder":
            sub.names[op.outputs[0]] = bound[op.name]
    for op in graph.operations:
        sub.convert(op)
    onnx = b.onnx
    out_infos = [onnx.helper.make_tensor_value_info(n, tensor_type("bool"), []) for n in leading]
    for t in outputs:
        named = sub.one("Identity", [sub.names[t]], f"{name}/out")
        out_infos.append(onnx.helper.make_tensor_value_info(named, tensor_type(t.dtype), None))
    return onnx.helper.make_graph(sub.nodes, b.fresh(name), list(formal), out_infos, initializer=sub.initializers)


@converts("cond")
def _cond(b, op, ins):
    operands = ins[1:]
    branches = []
    for key in ("true_body", "false_body"):
        body = op.attrs[key]
        bound = dict(zip(body.inputs, operands, strict=True))
        branches.append(_subgraph(b, body, bound, f"{op.name}/{key}"))
    count = len(op.attrs["true_body"].outputs)
    return b.node("If", [ins[0]], op.name, outputs=count, then_branch=branches[0], else_branch=branches[1])


@converts("scan")
def _scan(b, op, ins):
    attrs, body = op.attrs, op.attrs["body"]
    nc, ns = attrs["carries"], attrs["sequences"]
    ny = len(body.outputs) - nc
    if any(t in b.consumed for t in op.outputs[nc + ny :]):
        raise GraphError(f"op {op.name!r}: scan's per-step carries (for gradients) have no ONNX form{source_line(op)}")
    init, xs, captured = ins[:nc], ins[nc : nc + ns], ins[nc + ns :]
    trips = _trip_count(b, op, xs)
    onnx = b.onnx
    step, cond_in = b.fresh(f"{op.name}/step"), b.fresh(f"{op.name}/cond_in")
    carries = [b.fresh(f"{op.name}/carry{i}") for i in range(nc)]
    formal = [
        onnx.helper.make_tensor_value_info(step, tensor_type("int64"), []),
        onnx.helper.make_tensor_value_info(cond_in, tensor_type("bool"), []),
        *(
            onnx.helper.make_tensor_value_info(c, tensor_type(t.dtype), None)
            for c, t in zip(carries, op.inputs[:nc], strict=True)
        ),
    ]
    gather = _StepSlices(b, op, xs, step, trips)
    placeholders = list(body.inputs)
    bound = dict(zip(placeholders[:nc], carries, strict=True))
    bound.update(zip(placeholders[nc + ns :], captured, strict=True))
    bound.update(zip(placeholders[nc : nc + ns], gather.names, strict=True))
    cond_out = b.fresh(f"{op.name}/cond_out")
    keep_going = onnx.helper.make_node("Identity", [cond_in], [cond_out], name=b.fresh(f"{op.name}/cond#node"))
    prelude = [keep_going, *gather.nodes]
    graph = _subgraph(b, body, bound, f"{op.name}/body", formal, leading=[cond_out], prelude=prelude)
    true = b.constant(np.array(True), f"{op.name}/true")
    names = b.node("Loop", [trips, true, *init], op.name, outputs=nc + ny, body=graph)
    if attrs["reverse"]:  # the loop stacked the steps as they ran: last first
        names[nc:] = [_flip(b, op, y) for y in names[nc:]]
    return names


def _trip_count(b, op, xs) -> str:
    length = op.attrs["length"]
    if length is not None:
        return b.constant(np.array(length, np.int64), f"{op.name}/trips")
    steps = op.inputs[op.attrs["carries"]].shape[0]
    if steps is not None:
        return b.constant(np.array(steps, np.int64), f"{op.name}/trips")
    shape = b.one("Shape", [xs[0]], f"{op.name}/xs_shape")
    return b.one("Gather", [shape, b.constant(np.array(0, np.int64), f"{op.name}/zero")], f"{op.name}/trips", axis=0)


class _StepSlices:
    """The nodes, inside the loop body, that take step ``t``'s slice of each sequence (``t`` counted
    down from the end for ``reverse``)."""

    def __init__(self, b: Builder, op, xs, step: str, trips: str):
        helper = b.onnx.helper
        self.nodes, self.names = [], []
        index = step
        if op.attrs["reverse"]:
            last = b.fresh(f"{op.name}/last")
            one = b.onnx.numpy_helper.from_array(np.array(1, np.int64), last + "_one")
            self.nodes.append(helper.make_node("Constant", [], [last + "_one"], name=b.fresh(last + "#one"), value=one))
            self.nodes.append(helper.make_node("Sub", [trips, last + "_one"], [last], name=b.fresh(last + "#node")))
            index = b.fresh(f"{op.name}/index")
            self.nodes.append(helper.make_node("Sub", [last, step], [index], name=b.fresh(index + "#node")))
        for i, x in enumerate(xs):
            name = b.fresh(f"{op.name}/x{i}_t")
            self.nodes.append(helper.make_node("Gather", [x, index], [name], name=b.fresh(name + "#node"), axis=0))
            self.names.append(name)


def _flip(b, op, y: str) -> str:
    ints = lambda v, what: b.ints([v], f"{op.name}/{what}")  # noqa: E731
    args = [ints(INT64_MAX, "flip_start"), ints(INT64_MIN, "flip_end"), ints(0, "flip_axes"), ints(-1, "flip_steps")]
    return b.one("Slice", [y, *args], f"{op.name}/ys_in_order")
