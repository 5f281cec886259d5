"""Inference graphs: what a trained model's outputs need, in inference mode, with a signature.

:func:`inference_graph` is what ``Session.export`` and ``wb.export_onnx`` build on. From a
training graph it keeps only the ops the named outputs depend on through their inputs
(control edges to updates, gradients, optimizer slots and statistic ops fall away), and
puts every op in inference mode:

- an op with an inference rule (:func:`inference_rule`) is replaced by its inference form:
  ``dropout`` becomes the identity;
- a placeholder that is not an input of the signature becomes a constant: the value given
  in ``feed_dict``, else its ``default`` (a placeholder made with one), and a scalar bool
  placeholder named ``training`` or ``is_training`` (a training switch) is ``False``;
- a ``where`` whose condition is then known picks its branch, so the branch not taken
  (batch statistics, say) is pruned with everything only it needed;
- the inputs' first (batch) axis becomes of any size;
- variables carry the trained values as their initial values.

The :class:`Signature` names the inputs and outputs (dtype, shape with the batch axis
unknown) and the graph tensors they stand for.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from workbench.errors import ArgumentError, DTypeError, FeedError, FormatError, GraphError, ShapeError
from workbench.graph.core import Graph, Operation, Tensor
from workbench.graph.passes import fold_constants, optimize, rebuild
from workbench.ops import rules
from workbench.ops.registry import DTYPES, cast_exactly

#: Names of scalar bool placeholders taken as a training switch: ``False`` in an inference graph.
TRAINING_SWITCHES = ("training", "is_training")
MAX_NAME = 256

#: op type -> ``rule(op, inputs) -> (type, inputs, attrs)``: the op's inference form (see :func:`inference_rule`).
INFERENCE_RULES: dict[str, Callable] = {}


def inference_rule(op_type: str):
    """Register the inference form of ``op_type``: ``rule(op, inputs)`` returns ``(type, inputs, attrs)``
    for the op that replaces it (``inputs`` are the new graph's tensors of ``op.inputs``), or None
    to keep it. Only the replacement's first output stands for the op's first output. A layer
    whose op behaves differently in training (a batch norm op with its own statistics, say)
    registers its inference form here (from the graph layer or above: where the layer is built).
    """

    def register(rule: Callable) -> Callable:
        INFERENCE_RULES[op_type] = rule
        return rule

    return register


@inference_rule("dropout")
def _dropout_inference(op, inputs):
    return "identity", inputs[:1], {}  # the mask output is only used by the gradient


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a signature: its name, the graph tensor it stands for, its dtype and
    shape (``None`` for the batch axis and any other size known only at run time)."""

    name: str
    tensor: str
    dtype: str
    shape: tuple

    def to_dict(self) -> dict:
        return {"name": self.name, "tensor": self.tensor, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, value) -> TensorInfo:
        """The record of :meth:`to_dict`, checked (FormatError)."""
        if not isinstance(value, dict) or set(value) != {"name", "tensor", "dtype", "shape"}:
            raise FormatError(f"a signature entry must have name, tensor, dtype and shape, got {value!r}")
        name, tensor, dtype, shape = value["name"], value["tensor"], value["dtype"], value["shape"]
        if not (isinstance(name, str) and isinstance(tensor, str) and dtype in DTYPES and isinstance(shape, list)):
            raise FormatError(f"signature entry {value!r} is not a name, a tensor, a dtype and a shape")
        if not all(d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0) for d in shape):
            raise FormatError(f"signature entry {name!r} has shape {shape!r}, not a list of sizes")
        return cls(name, tensor, dtype, tuple(shape))

    def __repr__(self) -> str:
        return f"<{self.name}: {self.dtype} {rules.fmt(self.shape)}>"


@dataclass(frozen=True)
class Signature:
    """The named inputs and outputs of an inference graph, in order."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    def to_dict(self) -> dict:
        return {"inputs": [i.to_dict() for i in self.inputs], "outputs": [o.to_dict() for o in self.outputs]}

    @classmethod
    def from_dict(cls, value, graph: Graph) -> Signature:
        """The record of :meth:`to_dict`, checked against ``graph`` (FormatError)."""
        if not isinstance(value, dict) or set(value) != {"inputs", "outputs"}:
            raise FormatError('a signature needs "inputs" and "outputs"')
        parts = []
        for key in ("inputs", "outputs"):
            if not isinstance(value[key], list) or not value[key]:
                raise FormatError(f"signature {key} must be a non-empty list")
            parts.append(tuple(TensorInfo.from_dict(v) for v in value[key]))
        signature = cls(*parts)
        try:
            check_names(signature)
        except ArgumentError as e:
            raise FormatError(f"signature: {e}") from None
        for info in signature.inputs + signature.outputs:
            _check_entry(info, graph, info in signature.inputs)
        return signature


def _check_entry(info: TensorInfo, graph: Graph, is_input: bool) -> None:
    if info.tensor.partition(":")[0] not in graph:
        raise FormatError(f"signature entry {info.name!r} names {info.tensor!r}, which the graph lacks")
    tensor = graph.get(info.tensor)
    if not isinstance(tensor, Tensor) or (is_input and tensor.op.type != "placeholder"):
        raise FormatError(
            f"signature entry {info.name!r}: {info.tensor!r} is not a {'placeholder' if is_input else 'tensor'}"
        )
    if tensor.shape is None or (tensor.dtype, tuple(tensor.shape)) != (info.dtype, info.shape):
        raise FormatError(
            f"signature entry {info.name!r} says {info.dtype} {rules.fmt(info.shape)}, "
            f"the graph's {info.tensor!r} is {tensor.dtype} {rules.fmt(tensor.shape or ())}"
        )


def check_names(signature: Signature) -> None:
    """ArgumentError unless every name is a non-empty string without NUL, and no two are the same."""
    names = [i.name for i in signature.inputs + signature.outputs]
    for name in names:
        if not isinstance(name, str) or not name or "\0" in name or len(name) > MAX_NAME:
            raise ArgumentError(f"signature name {name!r} must be a non-empty string without NUL (at most {MAX_NAME})")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ArgumentError(f"signature names must differ (inputs and outputs alike): {', '.join(map(repr, twice))}")


def inference_graph(
    graph: Graph,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    values: Mapping[str, np.ndarray] | None = None,
    feed_dict: Mapping | None = None,
) -> tuple[Graph, Signature]:
    """The inference graph of ``graph`` computing ``outputs`` from ``inputs``, and its signature.

    Parameters
    ----------
    graph : Graph
    inputs, outputs : dict
        Signature name to a tensor of ``graph`` (or its name): placeholders for the inputs.
    values : dict, optional
        Variable name to its trained value (a session's ``variables``); left out, variables keep
        their initial values.
    feed_dict : dict, optional
        Values of placeholders that are not inputs, frozen into the graph as constants.

    Examples
    --------
    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(8, 3))
    ...     w = wb.variable("w", init=[[1.0], [2.0], [3.0]])
    ...     y = wb.dropout(wb.matmul(x, w), 0.5)
    >>> infer, signature = inference_graph(g, {"x": x}, {"y": y})
    >>> signature.inputs, sorted({op.type for op in infer.operations})
    ((<x: float32 (None, 3)>,), ['identity', 'matmul', 'placeholder', 'variable'])
    """
    ins = _named(graph, inputs, "inputs")
    outs = _named(graph, outputs, "outputs")
    placeholders = {t.op.name for t in ins.values()}
    bad = [f"{n!r} ({t.name!r}, a {t.op.type})" for n, t in ins.items() if t.op.type != "placeholder"]
    if bad:
        raise GraphError(f"inputs must be placeholders: {', '.join(bad)}")
    check_names(Signature(_infos(ins), _infos(outs)))
    fixed = _fixed_values(graph, feed_dict or {}, placeholders)
    fetches = [t.name for t in outs.values()]
    needed = _data_needed(graph, fetches, placeholders)
    replace = _inference_replace(placeholders, fixed, dict(values or {}))
    try:
        new = rebuild(graph, keep=needed.__contains__, replace=replace)[0]
    except (ShapeError, DTypeError) as e:
        raise GraphError(f"the inference graph needs the inputs' batch size to be fixed: {e}") from None
    new = _settle(new, fetches, placeholders)
    _check_unfed(new, placeholders)
    _check_inference(new)
    inputs_out = tuple(_info(name, new.get(t.name)) for name, t in ins.items())
    outputs_out = tuple(_info(name, new.get(t.name)) for name, t in outs.items())
    return new, Signature(inputs_out, outputs_out)


def _named(graph: Graph, given, what: str) -> dict[str, Tensor]:
    """Signature name to tensor of ``graph``; a list names each entry by its tensor."""
    if isinstance(given, (list, tuple)):
        given = {getattr(t, "name", t).partition(":")[0]: t for t in given}
    if not isinstance(given, Mapping) or not given:
        raise ArgumentError(f"{what} must be a dict of names to tensors, got {given!r}")
    out = {}
    for name, value in given.items():
        if isinstance(value, (Tensor, Operation)) and value.graph is not graph:
            raise GraphError(graph.foreign(f"{what[:-1]} {name!r}", value.graph))
        found = graph.get(value) if isinstance(value, str) else value
        if not isinstance(found, Tensor):
            raise GraphError(f"{what[:-1]} {name!r} must be a tensor, got {found!r}")
        out[name] = found
    return out


def _infos(tensors: dict[str, Tensor]) -> tuple[TensorInfo, ...]:
    return tuple(TensorInfo(n, t.name, t.dtype, tuple(t.shape or ())) for n, t in tensors.items())


def _info(name: str, tensor: Tensor) -> TensorInfo:
    if tensor.shape is None:
        raise GraphError(f"{name!r} ({tensor.name!r}) has no static rank; an inference graph needs one")
    return TensorInfo(name, tensor.name, tensor.dtype, tuple(tensor.shape))


def _fixed_values(graph: Graph, feed_dict: Mapping, inputs: set[str]) -> dict[str, np.ndarray]:
    """Placeholder name to the checked value it is frozen to."""
    out = {}
    for key, value in feed_dict.items():
        ph = graph.get(key) if isinstance(key, str) else key
        if not isinstance(ph, Tensor) or ph.graph is not graph or ph.op.type != "placeholder":
            raise FeedError(f"feed_dict keys must be placeholders of graph {graph.name!r}, got {key!r}")
        if ph.op.name in inputs:
            raise FeedError(f"placeholder {ph.name!r} is an input; it cannot also be fixed in feed_dict")
        out[ph.op.name] = _as_value(ph, value)
    return out


def _as_value(ph: Tensor, value) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == object or not np.can_cast(array.dtype, ph.dtype, "same_kind"):
        raise FeedError(f"placeholder {ph.name!r} expects {ph.dtype} values, got {array.dtype}")
    array = cast_exactly(array, ph.dtype, f"placeholder {ph.name!r}")
    if ph.shape is not None and (
        array.ndim != len(ph.shape) or not all(d is None or d == s for d, s in zip(ph.shape, array.shape, strict=True))
    ):
        raise FeedError(f"placeholder {ph.name!r} expects shape {rules.fmt(ph.shape)}, got {rules.fmt(array.shape)}")
    array = np.array(array)
    array.setflags(write=False)
    return array


def _data_needed(graph: Graph, fetches: list[str], stop: set[str]) -> set[Operation]:
    """The ops ``fetches`` need through inputs alone (not control inputs), stopping at ``stop``."""
    needed: set[Operation] = set()
    stack = [graph.get(name).op for name in fetches]
    while stack:
        op = stack.pop()
        if op in needed:
            continue
        needed.add(op)
        if op.name not in stop:
            stack.extend(t.op for t in op.inputs)
    return needed


def _inference_replace(inputs: set[str], fixed: dict, values: dict):
    def replace(op: Operation, new_inputs):
        if op.type == "placeholder":
            if op.name in inputs:
                return "placeholder", (), {**op.attrs, "shape": _batch_any(op)}
            value = _frozen(op, fixed)
            return None if value is None else ("constant", (), {"value": value})
        if op.type == "variable" and op.name in values:
            value = np.array(values[op.name], dtype=op.attrs["dtype"])
            value.setflags(write=False)
            return "variable", (), {**op.attrs, "init": value}
        rule = INFERENCE_RULES.get(op.type)
        return None if rule is None else rule(op, new_inputs)

    return replace


def _batch_any(op: Operation) -> tuple:
    shape = op.attrs["shape"]
    if shape is None or len(shape) == 0:
        raise GraphError(
            f"input {op.name!r} has shape {'any' if shape is None else '()'}; an inference input needs a "
            f"batch axis first and known rank, e.g. placeholder({op.name!r}, shape=(None, ...)){_where(op)}"
        )
    return (None, *shape[1:])


def _frozen(op: Operation, fixed: dict) -> np.ndarray | None:
    """The value a placeholder that is not an input is frozen to, or None (an error if still needed later)."""
    if op.name in fixed:
        return fixed[op.name]
    tensor = op.outputs[0]
    if tensor.dtype == "bool" and tensor.shape == () and op.name.rpartition("/")[2] in TRAINING_SWITCHES:
        return _as_value(tensor, False)
    if op.attrs.get("default") is not None:
        return _as_value(tensor, op.attrs["default"])
    return None


def _check_unfed(graph: Graph, inputs: set[str]) -> None:
    """GraphError for a placeholder the inference graph still needs that is neither an input nor frozen."""
    for op in graph.operations:
        if op.type == "placeholder" and op.name not in inputs:
            raise GraphError(
                f"the outputs need placeholder {op.name!r}, which is not an input: add it to inputs, or give "
                f"its value in feed_dict{_where(op)}"
            )


def _where(op: Operation) -> str:
    return f"\n  {op.source}" if op.source else ""


def _settle(graph: Graph, fetches: list[str], inputs: set[str]) -> Graph:
    """Fold what frozen placeholders made known, take the branch of each known ``where``, prune."""
    for _ in range(8):  # each round can make further conditions known
        folded = fold_constants(graph)
        picked, changed = _pick_branches(folded)
        graph = picked
        if not changed:
            break
    return optimize(graph, fetches, fed=sorted(inputs))


def _pick_branches(graph: Graph) -> tuple[Graph, bool]:
    changed = []

    def replace(op: Operation, inputs):
        if op.type != "where" or inputs[0].op.type != "constant":
            return None
        condition = inputs[0].op.attrs["value"]
        if not (condition.all() or not condition.any()):
            return None
        branch = inputs[1] if condition.all() else inputs[2]
        if branch.shape != op.outputs[0].shape or branch.dtype != op.outputs[0].dtype:
            return None
        changed.append(op.name)
        return "identity", (branch,), {}

    new = rebuild(graph, replace=replace)[0]
    return new, bool(changed)


def _check_inference(graph: Graph) -> None:
    """GraphError if an op left would update state (an output that needs a variable's update)."""
    for op in graph.operations:
        if op.opdef.stateful and op.type != "variable":
            raise GraphError(
                f"the outputs need {op.name!r} ({op.type}), which updates a variable; an inference graph "
                f"cannot{_where(op)}"
            )
        if op.opdef.random:
            raise GraphError(
                f"{op.name!r} ({op.type}) draws random numbers and has no inference form; register one with "
                f"workbench.graph.export.inference_rule{_where(op)}"
            )
