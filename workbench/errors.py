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
