"""The errors workbench raises on bad input.

Every one is a :class:`WorkbenchError` and also an instance of the matching
built-in exception, so ``except ValueError`` in user code keeps working.
"""


class WorkbenchError(Exception):
    """Base class of every error workbench raises on bad input."""


class ShapeError(WorkbenchError, ValueError):
    """Tensor shapes do not fit the op (raised when the graph is built)."""


class DTypeError(WorkbenchError, TypeError):
    """Tensor dtypes do not fit the op."""


class FeedError(WorkbenchError, ValueError):
    """A feed is missing, or has the wrong shape or dtype for its placeholder."""


class ArgumentError(WorkbenchError, ValueError):
    """An argument is out of range or not of its kind: ``fit(steps=-3)``, ``batch_size=2.5``."""


class GraphError(WorkbenchError, ValueError):
    """A graph is used wrongly: unknown names, tensors from another graph, bad fetches."""


class GradientError(WorkbenchError, ValueError):
    """A gradient was asked for that the op does not define."""


class ExecutionError(WorkbenchError, RuntimeError):
    """A kernel failed while a graph ran (an index out of range, say); names the op and its line."""

    def __init__(self, message: str, op: str | None = None):
        super().__init__(message)
        self.op = op


class NumericsError(WorkbenchError, ArithmeticError):
    """An op produced NaN or Inf while ``check_numerics`` was on."""


class FormatError(WorkbenchError, ValueError):
    """A graph file or checkpoint is malformed, truncated or not ours."""


class FileError(WorkbenchError, OSError):
    """A file cannot be written or read where asked: a directory in its place, a missing directory."""


class PathError(FileError, ValueError):
    """A path no file can have (a NUL byte in it)."""


class ClusterError(WorkbenchError, RuntimeError):
    """A cluster cannot be reached or failed in a way workbench cannot recover from."""


class DeviceError(WorkbenchError, RuntimeError):
    """A device (GPU) or the library it needs is not available."""


class CollectiveError(ClusterError):
    """A peer of a worker-to-worker collective died, hung or could not be reached (a run can restart without it)."""


class StrategyError(WorkbenchError, ValueError):
    """A distributed strategy function is unknown or builds something a replica cannot run; names the
    strategy and the line of the user's function."""


def _user_traceback(error: BaseException) -> list[str]:
    """``error``'s traceback without workbench's own frames: the user's lines, then the message.

    IPython shows this list for any exception that has ``_render_traceback_``, so a
    WorkbenchError raised from any notebook cell shows the cell's line, not the internals.
    """
    import os
    import traceback

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    shell = os.sep + os.path.join("IPython", "core") + os.sep  # the shell's own frame that runs the cell
    frames = [
        (frame, lineno)
        for frame, lineno in traceback.walk_tb(error.__traceback__)
        if not os.path.abspath(frame.f_code.co_filename).startswith(package) and shell not in frame.f_code.co_filename
    ]
    lines = ["Traceback (most recent call last, workbench's own frames left out):"] if frames else []
    for entry in traceback.StackSummary.extract(frames):
        lines.append(f'  File "{entry.filename}", line {entry.lineno}, in {entry.name}')
        if entry.line:
            lines.append(f"    {entry.line.strip()}")
    lines.extend(f"{type(error).__name__}: {error}".split("\n"))
    return lines


WorkbenchError._render_traceback_ = _user_traceback


def brief(value, limit: int = 200) -> str:
    """``repr(value)``, shortened in the middle past ``limit`` characters: what an error message may
    quote of a value that came from a file (a 50 MB string must not come back in the message).

    >>> brief("x" * 1000, limit=20)
    "'xxxxxxx ... (1002 characters) ... xxxxxxx'"
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    keep = max(limit // 2 - 2, 1)
    return f"{text[:keep]} ... ({len(text)} characters) ... {text[-keep:]}"
