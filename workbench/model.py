"""Trained models outside their notebook: :func:`load_model` gives a :class:`Model`, and
:func:`export_onnx` writes a session's or a model's inference graph as ONNX.

``Session.export(path, inputs=..., outputs=...)`` writes the model file
(:mod:`workbench.modelfile`); ``wb.load_model(path)`` reads it back without running any
of its content. ``Model.predict`` runs the inference graph on NumPy, on a GPU, or chunk
by chunk over dask arrays on a cluster (the sharded inference of sessions).
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench import checkpoint, modelfile
from workbench.errors import FeedError, GraphError
from workbench.graph.core import Graph
from workbench.graph.export import Signature, TensorInfo, inference_graph
from workbench.graph.passes import optimize
from workbench.session import Session
from workbench.training import is_dask_array


ONNX_LIMIT = 2**31  # protobuf's limit on one message: larger models need ONNX's external data


class Model:
    """An inference graph with its trained values and signature, as :func:`load_model` reads it.

    Attributes
    ----------
    inputs, outputs : mapping of str to TensorInfo
        The signature: name to dtype, shape (``None`` for the batch axis) and graph tensor.
    graph : Graph
        The inference graph; its variables hold the trained values (so ``Session(model.graph)``
        runs it too).
    version : str
        The workbench version that wrote the file.

    Examples
    --------
    >>> import workbench as wb, numpy as np, tempfile, os
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(None, 2))
    ...     w = wb.variable("w", init=[[1.0], [2.0]])
    ...     y = wb.matmul(x, w)
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.wbmodel")
    >>> _ = wb.Session(g).export(path, inputs={"x": x}, outputs={"y": y})
    >>> model = wb.load_model(path)
    >>> model.inputs["x"], model.predict({"x": np.array([[3.0, 4.0]], "float32")})["y"].tolist()
    (<x: float32 (None, 2)>, [[11.0]])
    """

    def __init__(self, graph: Graph, signature: Signature, version: str = ""):
        self.graph = graph
        self.signature = signature
        self.version = version
        self.inputs = types.MappingProxyType({i.name: i for i in signature.inputs})
        self.outputs = types.MappingProxyType({o.name: o for o in signature.outputs})
        self._sessions: dict[tuple, Session] = {}

    @property
    def variables(self) -> dict[str, np.ndarray]:
        """Variable name to its trained value (read-only arrays)."""
        return {v.name: v.init for v in self.graph.variables}

    def predict(self, feeds, device: str = "cpu", **device_options) -> dict[str, Any]:
        """The outputs for ``feeds`` (input name to an array; one array for a model of one input).

        Parameters
        ----------
        feeds : dict or array
            Values of every input; dask arrays (split along the first axis) run chunk by chunk
            on whatever computes them (a cluster's client), and give dask arrays.
        device : {"cpu", "gpu", "gpu:<index>"}
            Where the graph runs: this process's device for arrays; each worker's for dask arrays.
        **device_options
            As for :class:`~workbench.session.Session` (``emulate=True`` runs the GPU path on NumPy).

        Returns
        -------
        dict
            Output name to a NumPy array (a dask array for dask feeds).
        """
        feeds = self._check_names(feeds)
        fetches = {name: info.tensor for name, info in self.outputs.items()}
        if any(is_dask_array(v) for v in feeds.values()):
            return self._predict_sharded(feeds, fetches, str(device), device_options)
        key = (str(device), tuple(sorted(device_options.items())))
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = Session(self.graph, cluster=False, device=device, **device_options)
        return session.run(fetches, feed_dict={self.inputs[n].tensor: v for n, v in feeds.items()})

    def _check_names(self, feeds) -> dict:
        if not isinstance(feeds, Mapping):
            if len(self.inputs) != 1:
                raise FeedError(f"the model has inputs {', '.join(map(repr, self.inputs))}: give a dict of them")
            feeds = {next(iter(self.inputs)): feeds}
        unknown = sorted(str(k) for k in feeds if k not in self.inputs)
        missing = [n for n in self.inputs if n not in feeds]
        if unknown or missing:
            said = f"unknown inputs {', '.join(map(repr, unknown))}" if unknown else ""
            said += ("; " if said else "") + (f"missing {', '.join(map(repr, missing))}" if missing else "")
            raise FeedError(f"predict: {said}; the model's inputs are {', '.join(map(repr, self.inputs))}")
        return dict(feeds)

    def _predict_sharded(self, feeds: dict, fetches: dict, device: str, options: dict) -> dict:
        from workbench.cluster.infer import run_sharded

        checked = {self.inputs[n].tensor: _dask_feed(self.inputs[n], v) for n, v in feeds.items()}
        graph = optimize(self.graph, list(fetches.values()), fed=list(checked))
        tensors = [self.graph.get(t) for t in fetches.values()]
        arrays = run_sharded(graph, tensors, checked, self.variables, seed=0, device=(device, options))
        return dict(zip(fetches, arrays, strict=True))

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self.inputs.values()))
        outs = ", ".join(map(repr, self.outputs.values()))
        return f"<Model {self.graph.name!r} ({ins}) -> ({outs})>"


def _dask_feed(info: TensorInfo, value):
    """A dask array of the input's dtype, its shape checked (FeedError)."""
    if not is_dask_array(value):
        value = np.asarray(value)
    shape, dtype = tuple(value.shape), np.dtype(value.dtype)
    if len(shape) != len(info.shape) or not all(
        d is None or d == s for d, s in zip(info.shape[1:], shape[1:], strict=True)
    ):
        raise FeedError(f"input {info.name!r} expects shape {_fmt(info.shape)}, got {_fmt(shape)}")
    if dtype == object or not np.can_cast(dtype, info.dtype, "same_kind"):
        raise FeedError(f"input {info.name!r} expects {info.dtype} values, got {dtype}")
    return value.astype(info.dtype)


def _fmt(shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def load_model(path: str | os.PathLike) -> Model:
    """The model in the file that ``Session.export`` wrote at ``path``.

    Loading is data only: nothing in the file is imported, evaluated or unpickled. A
    truncated, tampered, oversized or foreign file raises :class:`~workbench.errors.FormatError`,
    and so does a file of a newer format version (saying which workbench wrote it).
    """
    graph, signature, version = modelfile.read(path)
    return Model(graph, signature, version)


def export_onnx(source, path: str | os.PathLike, inputs=None, outputs=None, opset: int | None = None, feed_dict=None):
    """Write the inference graph of ``source`` (a Session or a Model) to ``path`` as ONNX.

    Parameters
    ----------
    source : Session or Model
    path : str or PathLike
        Written atomically.
    inputs, outputs : dict, optional
        Signature name to tensor (or name), as for ``Session.export``; a Model's own
        signature when left out.
    opset : int, optional
        The ONNX opset (default :data:`workbench.graph.onnx_export.DEFAULT_OPSET`).
    feed_dict : dict, optional
        Placeholders that are not inputs, frozen to these values.

    Returns
    -------
    str
        The path. The model has a symbolic batch axis (``"batch"``) on every input and is
        checked with ``onnx.checker.check_model`` before it is written. An op without an
        ONNX form raises a ``GraphError`` naming it and the line that made it.
    """
    from workbench.graph.onnx_export import to_onnx

    graph, signature = _inference_of(source, inputs, outputs, feed_dict)
    proto = to_onnx(graph, signature, opset=opset)
    size = proto.ByteSize()
    if size >= ONNX_LIMIT:
        raise GraphError(f"the ONNX model of {graph.name!r} takes {size:,} bytes; one ONNX file holds less than 2 GiB")
    data = proto.SerializeToString()
    return checkpoint.write_atomically(path, lambda f: f.write(data), what="ONNX file")


def _inference_of(source, inputs, outputs, feed_dict) -> tuple[Graph, Signature]:
    if isinstance(source, Model):
        inputs = inputs if inputs is not None else {n: i.tensor for n, i in source.inputs.items()}
        outputs = outputs if outputs is not None else {n: o.tensor for n, o in source.outputs.items()}
        return inference_graph(source.graph, inputs, outputs, feed_dict=feed_dict)
    if isinstance(source, Session):
        if inputs is None or outputs is None:
            raise GraphError("export_onnx(session, ...) needs inputs= and outputs= (dicts of names to tensors)")
        return inference_graph(source.graph, inputs, outputs, source.variables, feed_dict)
    raise GraphError(f"export_onnx takes a Session or a Model, got {type(source).__name__}")
