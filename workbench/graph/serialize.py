"""Graph files: versioned JSON, with arrays (constants, initial values) as base64 data.

Loading is data only: op types must be registered ops, every attribute is
decoded from plain JSON, and each operation is rebuilt through the same checked
path as in user code, so its shape rule runs again. Nothing is imported,
evaluated or unpickled; any problem raises :class:`~workbench.errors.FormatError`.
"""

from __future__ import annotations

import base64
import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.errors import FormatError, WorkbenchError, brief
from workbench.graph.records import Source, TrainingRecord
from workbench.ops.registry import DTYPES, REGISTRY
from workbench.ops.state import INITIALIZERS

if TYPE_CHECKING:  # the graph module imports this one: the class is handed in, not imported
    from workbench.graph.core import Graph

#: Attribute values stored as ``{kind: doc}`` objects, decoded by ``DECODERS[kind](doc)``: the
#: bodies of control-flow ops (``"body"``, registered by :mod:`workbench.graph.control`). Encoded
#: from any value with a ``to_doc()`` method.
DECODERS: dict[str, Any] = {}

FORMAT = "workbench-graph"
VERSION = 1
MAX_ELEMENTS = 1 << 31


def graph_to_json(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(graph_to_doc(graph), indent=indent)


def graph_to_doc(graph: Graph) -> dict:
    """The graph as a JSON-ready dict (what :func:`graph_to_json` writes)."""
    operations = []
    for op in graph.operations:
        record = {
            "name": op.name,
            "type": op.type,
            "inputs": [t.name for t in op.inputs],
            "attrs": {k: _encode(v) for k, v in op.attrs.items()},
            "outputs": [{"shape": None if t.shape is None else list(t.shape), "dtype": t.dtype} for t in op.outputs],
        }
        if op.control_inputs:
            record["control_inputs"] = [c.name for c in op.control_inputs]
        if op.source is not None:
            record["source"] = {"filename": op.source.filename, "lineno": op.source.lineno, "code": op.source.code}
        operations.append(record)
    doc = {"format": FORMAT, "version": VERSION, "name": graph.name, "operations": operations}
    if graph.aliases:
        doc["aliases"] = dict(graph.aliases)
    if graph.training:
        doc["training"] = {name: record.to_dict() for name, record in graph.training.items()}
    if graph.updates:
        doc["updates"] = dict(graph.updates)
    return doc


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value).tobytes()
        return {
            "ndarray": {"dtype": value.dtype.name, "shape": list(value.shape), "data": base64.b64encode(data).decode()}
        }
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if hasattr(value, "to_doc"):  # a control-flow body: its sub-graph, as data (see workbench.graph.control)
        return {"body": value.to_doc()}
    return value


def graph_from_json(text: str | bytes, graph_cls: type[Graph]) -> Graph:
    """A new ``graph_cls`` built from ``text`` (see :meth:`Graph.from_json`)."""
    try:
        doc = json.loads(text)
    except (ValueError, TypeError, RecursionError) as e:
        raise FormatError(f"not a graph file: invalid JSON ({e})") from None
    return graph_from_doc(doc, graph_cls)


def graph_from_doc(doc, graph_cls: type[Graph]) -> Graph:
    """A new ``graph_cls`` built from a dict that :func:`graph_to_doc` made (checked as a file is)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FormatError(f'not a graph file: expected a JSON object with "format": "{FORMAT}"')
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
        raise FormatError(
            f"unsupported graph file version {brief(version)}; this workbench reads versions 1 to {VERSION}"
        )
    name = doc.get("name", "graph")
    operations = doc.get("operations")
    if not isinstance(name, str) or not isinstance(operations, list):
        raise FormatError('graph file needs a string "name" and a list of "operations"')
    graph = graph_cls(name=name)
    for i, record in enumerate(operations):
        try:
            _add(graph, record)
        except FormatError as e:
            raise FormatError(f"operation {i} of the graph file: {e}") from None
        except (
            WorkbenchError,
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            OverflowError,
            RecursionError,
        ) as e:
            label = record.get("name") if isinstance(record, dict) else None
            raise FormatError(
                f"operation {i} ({label!r}) of the graph file is invalid: {type(e).__name__}: {e}"
            ) from None
    aliases = doc.get("aliases", {})
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v in graph and k not in graph for k, v in aliases.items()
    ):  # an alias names a removed op and points to a kept one; it never shadows an op
        raise FormatError('graph file has invalid "aliases"')
    graph.set_aliases(aliases)
    graph.training = _training(doc.get("training", {}), graph)
    updates = doc.get("updates", {})
    if not isinstance(updates, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k in graph and v.partition(":")[0] in graph
        for k, v in updates.items()
    ):
        raise FormatError('graph file has invalid "updates": each names an update op and a tensor of the graph')
    graph.updates = dict(updates)
    return graph


def _training(value, graph: Graph) -> dict:
    """Validated optimizer records: every name must be in the graph."""
    if not isinstance(value, dict):
        raise FormatError('graph file has invalid "training" records')
    out = {}
    for update, record in value.items():
        ok = isinstance(record, dict) and update in graph and isinstance(record.get("gradients"), list)
        loss = record.get("loss") if ok else None
        pairs = record.get("gradients") if ok else []
        ok = ok and (loss is None or (isinstance(loss, str) and loss.partition(":")[0] in graph))
        ok = ok and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) and n.partition(":")[0] in graph for n in p)
            for p in pairs
        )
        scale = record.get("loss_scale") if ok else None  # the variable of a dynamic loss scale
        ok = ok and (scale is None or (isinstance(scale, str) and scale in graph))
        if not ok:
            raise FormatError(f'graph file has an invalid "training" record for {brief(update)}')
        out[update] = TrainingRecord(update, tuple(tuple(p) for p in pairs), loss, scale or "")
    return out


def _add(graph: Graph, record) -> None:
    if not isinstance(record, dict):
        raise FormatError("is not a JSON object")
    name, kind = record.get("name"), record.get("type")
    if not isinstance(name, str) or not isinstance(kind, str):
        raise FormatError('needs a string "name" and "type"')
    if kind not in REGISTRY:
        raise FormatError(f"{brief(name)} has unknown op type {brief(kind)}")
    if name in graph:
        raise FormatError(f"the name {brief(name)} is used twice")
    inputs = [_tensor(graph, n, name) for n in _strings(record.get("inputs", []), "inputs")]
    control = [graph.operation(n) for n in _strings(record.get("control_inputs", []), "control_inputs")]
    attrs = record.get("attrs", {})
    if not isinstance(attrs, dict):
        raise FormatError(f'{brief(name)} has "attrs" that are not an object')
    attrs = {str(k): _decode(v) for k, v in attrs.items()}
    _check_attrs(kind, name, attrs)
    op = graph.add_op(kind, inputs, attrs, name=name, control_inputs=control, source=_source(record.get("source")))
    stored = record.get("outputs")
    if stored is not None:
        expected = [{"shape": None if t.shape is None else list(t.shape), "dtype": t.dtype} for t in op.outputs]
        if stored != expected:
            raise FormatError(f"{brief(name)} records outputs {stored}, but its inputs and attributes give {expected}")


def _check_attrs(kind: str, name: str, attrs: dict) -> None:
    """What the op functions check before a rule sees them (rules trust their callers)."""
    if "dtype" in attrs and attrs["dtype"] not in DTYPES:
        raise FormatError(f"{brief(name)} has dtype {brief(attrs['dtype'])}, not one of {', '.join(DTYPES)}")
    if kind in ("placeholder", "variable") and "shape" in attrs:
        shape = attrs["shape"]
        dims_ok = isinstance(shape, tuple) and all(
            (d is None and kind == "placeholder") or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
            for d in shape
        )
        if not dims_ok and not (shape is None and kind == "placeholder"):
            raise FormatError(f"{brief(name)} has shape {brief(shape)}, not a list of sizes")
    if kind == "variable":
        init = attrs.get("init")
        if not (isinstance(init, (np.ndarray, float)) or init in INITIALIZERS) or isinstance(init, bool):
            raise FormatError(
                f"{name!r} has initializer {init!r}; expected one of {', '.join(INITIALIZERS)}, a number or an array"
            )
        if not isinstance(attrs.get("trainable"), bool):
            raise FormatError(f'{brief(name)} has "trainable" {brief(attrs.get("trainable"))}, not true or false')


def _strings(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FormatError(f'"{what}" must be a list of names')
    return value


def _tensor(graph: Graph, name: str, user: str):
    if name.partition(":")[0] not in graph:
        raise FormatError(f"{brief(user)} uses {brief(name)}, which is not defined before it")
    found = graph.get(name)
    if not hasattr(found, "op"):
        raise FormatError(f"{brief(user)} uses {brief(name)}, an operation without outputs")
    return found


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in DECODERS:
        ((kind, doc),) = value.items()
        return DECODERS[kind](doc)
    if isinstance(value, dict):
        if set(value) != {"ndarray"} or not isinstance(value["ndarray"], dict):
            raise FormatError(f"unexpected object in attributes: keys {sorted(value)}")
        return _decode_array(value["ndarray"])
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise FormatError(f"unexpected attribute value {brief(value)}")


def _decode_array(spec: dict) -> np.ndarray:
    dtype, shape, data = spec.get("dtype"), spec.get("shape"), spec.get("data")
    if dtype not in DTYPES:
        raise FormatError(f"array dtype {brief(dtype)} is not one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise FormatError(f"array shape {brief(shape)} is not a list of non-negative ints")
    count = math.prod(shape)  # Python ints: no overflow
    if count > MAX_ELEMENTS or not isinstance(data, str):
        raise FormatError('array is too large or has no base64 "data"')
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise FormatError(f"array data is not valid base64 ({e})") from None
    itemsize = np.dtype(dtype).itemsize
    if len(raw) != count * itemsize:
        raise FormatError(
            f"array data holds {len(raw)} bytes; shape {tuple(shape)} of {dtype} needs {count * itemsize}"
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    array.setflags(write=False)
    return array


def _source(value) -> Source | None:
    if not isinstance(value, dict):
        return None
    filename, lineno, code = value.get("filename"), value.get("lineno"), value.get("code", "")
    if isinstance(filename, str) and isinstance(lineno, int) and isinstance(code, str):
        return Source(filename, lineno, code)
    return None
