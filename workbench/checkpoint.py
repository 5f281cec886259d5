"""Checkpoint files: variable values in .npz, written atomically, read without unpickling.

A training run with ``checkpoint_dir`` keeps its latest checkpoints there as
``step-00000120.npz``; a new session (after a kernel restart, say) resumes from
the newest one that reads back cleanly.

Variables are stored as ``variables/<name>.npy`` members, apart from the file's own
marks (``__workbench_checkpoint__``, ``__step__``), so any variable name saves and
restores. Reading checks every member's header (name, dtype, shape, size) before it
reads any data, so a crafted file cannot make it allocate more than it declares or
more than the graph's variables need.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import tempfile
import threading
import time
import zipfile

import numpy as np

from workbench.errors import FileError, FormatError, PathError
from workbench.ops import rules

MARK = "__workbench_checkpoint__"
STEP = "__step__"
VARIABLES = "variables/"  # prefix of the variables' members (format 2)
FORMAT = 2
_STEP_FILE = re.compile(r"^step-(\d{8})\.npz$")
# temporaries of write(): ".tmp-<host>-<pid>-<random>.npz" (".tmp-<random>.npz" before hosts were named)
_TEMP_FILE = re.compile(r"^\.tmp-(?:(?P<host>[A-Za-z0-9.-]+)-(?P<pid>\d+)-)?[a-z0-9_]+\.npz$")
STALE_SECONDS = 3600  # a temporary left this long by another host (or an unnamed one) is abandoned
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def write(path: str | os.PathLike, arrays: dict, step: int | None = None, private: bool = False) -> str:
    """Write ``arrays`` to ``path`` atomically: readers see the old file or the new one, never half.

    The file gets the permissions of any new file (the umask decides), or owner-only
    ones with ``private=True``. A directory at ``path``, a missing directory or an
    invalid path raise :class:`~workbench.errors.FileError`.
    """
    marks = {MARK: np.array(FORMAT)} if step is None else {MARK: np.array(FORMAT), STEP: np.array(int(step))}
    members = {**marks, **{VARIABLES + name: value for name, value in arrays.items()}}
    return write_atomically(path, lambda f: write_npz(f, members), private=private)


def write_atomically(path: str | os.PathLike, write_to, private: bool = False, what: str = "checkpoint") -> str:
    """Call ``write_to(file)`` on a temporary next to ``path``, then put it in ``path``'s place
    (fsynced, ``os.replace``): readers see the old file or the new one. ``what`` names the file in
    errors (:class:`~workbench.errors.FileError`); permissions as for :func:`write`."""
    path = check_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise FileError(errno.EISDIR, f"cannot write a {what} to {path!r}: it is a directory; give a file name", path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{_HOST}-{os.getpid()}-", suffix=".npz", dir=directory)
    except OSError as e:
        missing = isinstance(e, FileNotFoundError)
        state = "does not exist" if missing else f"cannot be written ({e.strerror})"
        raise FileError(e.errno, f"cannot write {what} {path!r}: directory {directory!r} {state}", path) from e
    try:
        with os.fdopen(fd, "wb") as f:
            write_to(f)
            f.flush()
            os.fsync(f.fileno())
        if not private:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise FileError(e.errno, f"cannot write {what} {path!r}: {e.strerror or e}", path) from e
        raise
    return path


def check_path(path) -> str:
    """``path`` as a string, or PathError when no file can have it."""
    path = os.fspath(path)
    if "\0" in path:
        raise PathError(errno.EINVAL, f"checkpoint path {path!r} contains a NUL byte")
    return path


_umask_lock = threading.Lock()


def _umask() -> int:
    with _umask_lock:  # the umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


#: Checkpoint members of a replicated fit's per-replica state (``replicas/<rank>/<variable>``): what its
#: engine resumes from; a session restoring the graph's variables leaves them out.
REPLICA_STATE = "replicas/"


def read(
    path: str | os.PathLike, expected: dict | None = None, strict: bool = False, skip: tuple[str, ...] = ()
) -> tuple[dict[str, np.ndarray], int | None]:
    """The arrays of a checkpoint and its step (None if it has none), or FormatError.

    Parameters
    ----------
    expected : dict, optional
        Variable name to ``(shape, dtype)``. Members of other names, shapes or dtypes
        are refused from their headers, before any data is read.
    strict : bool
        With ``expected``: every expected variable must be in the file.
    skip : tuple of str
        Name prefixes of members left out (unless expected): neither checked nor read.
    """
    path = check_path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            headers = member_headers(archive)
            if MARK not in headers:
                raise FormatError(f"{path!r} is not a workbench checkpoint")
            step = int(read_member(archive, headers[STEP])) if STEP in headers else None
            legacy = int(read_member(archive, headers[MARK])) < FORMAT
            members = _variable_members(headers, legacy)
            if skip:
                members = {n: m for n, m in members.items() if not n.startswith(skip) or (expected and n in expected)}
            if expected is not None:
                found = {name: headers[member][1:] for name, member in members.items()}
                check_members(f"checkpoint {path!r}", found, expected, strict)
            return {name: read_member(archive, headers[member]) for name, member in members.items()}, step
    except FormatError:
        raise
    except FileNotFoundError:
        raise FormatError(f"no checkpoint at {path!r}") from None
    except Exception as e:  # zipfile, pickle refusal, truncated data, bad headers
        raise FormatError(f"cannot read checkpoint {path!r}: {type(e).__name__}: {e}") from None


def member_headers(archive: zipfile.ZipFile) -> dict[str, tuple]:
    """Member name (without ``.npy``) to (ZipInfo, shape, dtype), from headers alone; ValueError for a
    member that is not a plain ``.npy`` array (Python objects, a size other than its header declares)."""
    out = {}
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            raise ValueError(f"unexpected member {info.filename!r}")
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f"member {info.filename!r} has .npy version {version}")
            offset = member.tell()
        if dtype.hasobject:
            raise ValueError(f"member {info.filename!r} holds Python objects")
        rules.check_elements(shape)  # a ShapeError, reported as unreadable
        size = offset + int(np.prod(shape, dtype=object)) * dtype.itemsize
        if info.file_size != size:  # what is inflated is what the header declares, and no more
            raise ValueError(f"member {info.filename!r} holds {info.file_size} bytes; its header declares {size}")
        out[info.filename[: -len(".npy")]] = (info, tuple(shape), dtype.name)
    return out


def _variable_members(headers: dict, legacy: bool) -> dict[str, str]:
    """Variable name to member name; files of format 1 stored variables unprefixed."""
    if legacy:
        return {name: name for name in headers if name not in (MARK, STEP)}
    unknown = [name for name in headers if name not in (MARK, STEP) and not name.startswith(VARIABLES)]
    if unknown:
        raise FormatError(f"unexpected members {', '.join(map(repr, unknown))}")
    return {name[len(VARIABLES) :]: name for name in headers if name.startswith(VARIABLES)}


def read_member(archive: zipfile.ZipFile, header: tuple) -> np.ndarray:
    with archive.open(header[0]) as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def check_members(where: str, found: dict, expected: dict, strict: bool = False, label: str = "checkpoint") -> None:
    """FormatError unless ``found`` (name to (shape, dtype)) fits the variables ``expected``;
    with ``strict`` every expected variable must be there. ``where`` names the source of
    the values in the messages (``"checkpoint 'path'"``), ``label`` starts the shape message."""
    unknown = sorted(set(found) - set(expected))
    if unknown:
        raise FormatError(f"{where} has variables this graph lacks: {', '.join(unknown)}")
    missing = sorted(set(expected) - set(found))
    if strict and missing:
        raise FormatError(f"{where} lacks variables: {', '.join(missing)}")
    for name, (shape, dtype) in found.items():
        want_shape, want_dtype = expected[name]
        if tuple(shape) != tuple(want_shape) or dtype != want_dtype:
            raise FormatError(
                f"{label} value of {name!r} is {dtype} {rules.fmt(shape)}, "
                f"the variable is {want_dtype} {rules.fmt(want_shape)}"
            )


def restore(path: str | os.PathLike, variables, strict: bool = True) -> dict[str, np.ndarray]:
    """The values in checkpoint ``path`` of ``variables`` (a graph's Variable tensors), all checked
    against them before any data is read; with ``strict`` every variable must be in the file.

    ``path`` is a checkpoint file or a fit's checkpoint directory (its newest step). A replicated
    fit's per-replica state (:data:`REPLICA_STATE`) is left out: the graph's variables are the
    fit's shared values."""
    path = check_path(path)
    if os.path.isdir(path):
        try:
            names = _step_files(os.fspath(path))
        except OSError as e:
            raise FileError(e.errno, f"cannot read checkpoint directory {path!r}: {e.strerror or e}", path) from e
        if not names:
            raise FormatError(f"checkpoint directory {path!r} holds no step-<n>.npz checkpoint")
        path = os.path.join(os.fspath(path), names[-1])
    return read(path, specs(variables), strict, skip=(REPLICA_STATE,))[0]


def specs(variables) -> dict[str, tuple]:
    """Variable name to (shape, dtype): what :func:`read` expects of a graph's variables."""
    return {v.name: (v.shape, v.dtype) for v in variables}


def write_npz(file, arrays: dict) -> None:
    """``np.savez`` for any names (as keywords they could clash with its own parameters)."""
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def save_step(directory: str | os.PathLike, variables: dict, step: int, keep: int = 2) -> str:
    """Write the checkpoint of ``step`` into ``directory`` and drop all but the newest ``keep``."""
    directory = check_path(directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise FileError(
            e.errno, f"cannot create checkpoint directory {directory!r}: {e.strerror or e}", directory
        ) from e
    clean_temporaries(directory)
    path = write(os.path.join(directory, f"step-{step:08d}.npz"), variables, step=step)
    for old in _step_files(directory)[:-keep]:
        try:
            os.unlink(os.path.join(directory, old))
        except FileNotFoundError:
            pass  # another fit writing here dropped it first
    return path


def latest(
    directory: str | os.PathLike | None, expected: dict | None = None
) -> tuple[dict[str, np.ndarray], int] | None:
    """The newest readable checkpoint of ``directory`` as (variables, step), or None.

    ``expected`` is as for :func:`read`.
    """
    if directory is None or not os.path.isdir(check_path(directory)):
        return None
    directory = os.fspath(directory)
    try:
        clean_temporaries(directory)
        names = _step_files(directory)
    except OSError as e:
        raise FileError(e.errno, f"cannot read checkpoint directory {directory!r}: {e.strerror or e}", directory) from e
    for name in reversed(names):
        path = os.path.join(directory, name)
        try:
            arrays, step = read(path, expected)
        except FormatError as e:
            if expected is not None and _readable(path):
                raise FormatError(
                    f"checkpoint directory {directory!r} holds checkpoints of another model ({name}: {e}); "
                    "fit into a directory of its own (its files are left as they are)"
                ) from None
            continue  # a damaged file: fall back to the one before
        if step is not None:
            return arrays, step
    return None


def _readable(path: str) -> bool:
    """Whether ``path`` is a whole checkpoint (of whatever variables)."""
    try:
        read(path)
    except FormatError:
        return False
    return True


def clean_temporaries(directory: str) -> list[str]:
    """Delete the temporaries that interrupted writes left in ``directory``; returns their names.

    A temporary is abandoned when the process that wrote it (on this host) is gone, or
    when nothing wrote to it for :data:`STALE_SECONDS` (temporaries of other hosts, and
    older ones without a writer's name). Other files are never touched.
    """
    removed = []
    for name in os.listdir(directory):
        found = _TEMP_FILE.match(name)
        if found is None:
            continue
        path = os.path.join(directory, name)
        try:
            ours = found["host"] == _HOST and found["pid"] is not None
            if (ours and not _alive(int(found["pid"]))) or time.time() - os.stat(path).st_mtime > STALE_SECONDS:
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue  # removed meanwhile by another process
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _step_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if _STEP_FILE.match(n))
