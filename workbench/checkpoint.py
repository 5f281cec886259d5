"""Checkpoint files: variable values in .npz, written atomically, read without unpickling.

A training run with ``checkpoint_dir`` keeps its latest checkpoints there as
``step-00000120.npz``; a new session (after a kernel restart, say) resumes from
the newest one that reads back cleanly.
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile

import numpy as np

from workbench.errors import FormatError

MARK = "__workbench_checkpoint__"
STEP = "__step__"
_STEP_FILE = re.compile(r"^step-(\d{8})\.npz$")


def write(path: str | os.PathLike, arrays: dict, step: int | None = None) -> str:
    """Write ``arrays`` to ``path`` atomically: readers see the old file or the new one, never half."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
    extra = {MARK: np.array(1)} if step is None else {MARK: np.array(1), STEP: np.array(int(step))}
    try:
        with os.fdopen(fd, "wb") as f:
            _write_npz(f, {**extra, **arrays})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], int | None]:
    """The arrays of a checkpoint and its step (None if it has none), or FormatError."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            if MARK not in archive.files:
                raise FormatError(f"{path!r} is not a workbench checkpoint")
            arrays = {name: archive[name] for name in archive.files if name not in (MARK, STEP)}
            step = int(archive[STEP]) if STEP in archive.files else None
            return arrays, step
    except FormatError:
        raise
    except FileNotFoundError:
        raise FormatError(f"no checkpoint at {path!r}") from None
    except Exception as e:  # zipfile, pickle refusal, truncated data, bad headers
        raise FormatError(f"cannot read checkpoint {path!r}: {type(e).__name__}: {e}") from None


def _write_npz(file, arrays: dict) -> None:
    """``np.savez`` for any names (as keywords they could clash with its own parameters)."""
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def save_step(directory: str | os.PathLike, variables: dict, step: int, keep: int = 2) -> str:
    """Write the checkpoint of ``step`` into ``directory`` and drop all but the newest ``keep``."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    path = write(os.path.join(directory, f"step-{step:08d}.npz"), variables, step=step)
    for old in _step_files(directory)[:-keep]:
        os.unlink(os.path.join(directory, old))
    return path


def latest(directory: str | os.PathLike | None) -> tuple[dict[str, np.ndarray], int] | None:
    """The newest readable checkpoint of ``directory`` as (variables, step), or None."""
    if directory is None or not os.path.isdir(directory):
        return None
    for name in reversed(_step_files(os.fspath(directory))):
        try:
            arrays, step = read(os.path.join(directory, name))
        except FormatError:
            continue  # a damaged file: fall back to the one before
        if step is not None:
            return arrays, step
    return None


def _step_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if _STEP_FILE.match(n))
