"""Model files: an inference graph, its signature and its trained values in one ``.npz``.

A model file is a zip of ``.npy`` members, as ``numpy.load(path, allow_pickle=False)``
reads it: ``model.npy`` holds the manifest (UTF-8 JSON as bytes), each
``values/<variable>.npy`` a trained value. The manifest::

    {"format": "workbench-model", "version": 1, "workbench": "0.1.0",
     "signature": {"inputs": [{"name", "tensor", "dtype", "shape"}...], "outputs": [...]},
     "graph": {... the graph file of workbench.graph.serialize, variables without values ...}}

Files are written atomically (like checkpoints). Reading is data only: every member's
header is checked before anything is read (no Python objects, no size other than the
header declares, no shape past the element limit), the graph is rebuilt through the
checked path of graph files (shape rules run again), the signature is checked against
it and the values against its variables. Any problem is a
:class:`~workbench.errors.FormatError`; nothing is imported, evaluated or unpickled.
"""

from __future__ import annotations

import errno
import json
import os
import zipfile

import numpy as np

from workbench import checkpoint
from workbench.errors import FileError, FormatError
from workbench.graph.core import Graph
from workbench.graph.export import Signature
from workbench.graph.passes import rebuild
from workbench.version import __version__

FORMAT = "workbench-model"
VERSION = 1
MANIFEST = "model"
VALUES = "values/"
MAX_MANIFEST_BYTES = 1 << 28  # 256 MiB of JSON (constants are inline; trained values are members)


def write(path: str | os.PathLike, graph: Graph, signature: Signature, private: bool = False) -> str:
    """Write ``graph`` (an inference graph whose variables hold their trained values) and its
    ``signature`` to ``path`` atomically; returns the path."""
    values = {v.name: np.asarray(v.init) for v in graph.variables}
    shell = rebuild(graph, replace=_without_values)[0]  # the values go in members of their own
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "workbench": __version__,
        "signature": signature.to_dict(),
        "graph": json.loads(shell.to_json()),
    }
    text = np.frombuffer(json.dumps(manifest).encode("utf-8"), dtype=np.uint8)
    members = {MANIFEST: text, **{VALUES + name: value for name, value in values.items()}}
    return checkpoint.write_atomically(path, lambda f: checkpoint.write_npz(f, members), private, what="model file")


def _without_values(op, inputs):
    if op.type == "variable":
        return "variable", (), {**op.attrs, "init": "zeros"}
    return None


def read(path: str | os.PathLike) -> tuple[Graph, Signature, str]:
    """The inference graph (variables holding the file's values), signature and writer's version
    of the model file at ``path``; FormatError for anything that is not a sound model file."""
    path = checkpoint.check_path(path)
    if not os.path.exists(path):
        raise FileError(errno.ENOENT, f"no model file at {path!r}", path)
    try:
        with zipfile.ZipFile(path) as archive:
            headers = checkpoint.member_headers(archive)
            manifest = _manifest(archive, headers, path)
            graph = Graph.from_json(json.dumps(manifest["graph"]))
            signature = Signature.from_dict(manifest["signature"], graph)
            _check_ops(graph)
            found = {name[len(VALUES) :]: header[1:] for name, header in headers.items() if name.startswith(VALUES)}
            checkpoint.check_members(f"model file {path!r}", found, checkpoint.specs(graph.variables), True, "stored")
            values = {name: checkpoint.read_member(archive, headers[VALUES + name]) for name in found}
    except FormatError as e:
        raise FormatError(f"model file {path!r}: {e}" if repr(path) not in str(e) else str(e)) from None
    except Exception as e:  # zipfile, truncated data, refused headers, CRC errors
        raise FormatError(f"cannot read model file {path!r}: {type(e).__name__}: {e}") from None
    return _with_values(graph, values), signature, manifest["workbench"]


def _manifest(archive: zipfile.ZipFile, headers: dict, path: str) -> dict:
    if MANIFEST not in headers:
        raise FormatError(f"{path!r} is not a workbench model file (it has no {MANIFEST}.npy)")
    unknown = sorted(n for n in headers if n != MANIFEST and not n.startswith(VALUES))
    if unknown:
        raise FormatError(f"unexpected members {', '.join(map(repr, unknown))}")
    _, shape, dtype = headers[MANIFEST]
    if dtype != "uint8" or len(shape) != 1 or shape[0] > MAX_MANIFEST_BYTES:
        raise FormatError(f"the manifest must be at most {MAX_MANIFEST_BYTES} bytes (uint8), got {dtype} {shape}")
    raw = checkpoint.read_member(archive, headers[MANIFEST]).tobytes()
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise FormatError(f"the manifest is not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f'not a workbench model file: the manifest needs "format": "{FORMAT}"')
    version, writer = manifest.get("version"), manifest.get("workbench")
    if not isinstance(writer, str):
        raise FormatError('the manifest needs the "workbench" version that wrote it')
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FormatError(f"format version {version!r} is not a version")
    if version > VERSION:
        raise FormatError(
            f"format version {version} (written by workbench {writer}) is newer than this workbench "
            f"{__version__} reads (up to {VERSION}); upgrade workbench to load it"
        )
    if set(manifest) != {"format", "version", "workbench", "signature", "graph"}:
        raise FormatError(f"the manifest has keys {sorted(manifest)}")
    return manifest


def _check_ops(graph: Graph) -> None:
    """FormatError for an op that updates state or draws random numbers, in the graph or a control-flow body."""
    for op in graph.operations:
        if (op.opdef.stateful and op.type != "variable") or op.opdef.random:
            raise FormatError(f"op {op.name!r} ({op.type}) has no place in an inference graph")
        for attr in getattr(op.opdef, "bodies", ()):
            _check_ops(op.attrs[attr].graph)


def _with_values(graph: Graph, values: dict) -> Graph:
    def replace(op, inputs):
        if op.type != "variable":
            return None
        value = values[op.name]
        value.setflags(write=False)
        return "variable", (), {**op.attrs, "init": value}

    return rebuild(graph, replace=replace)[0]
