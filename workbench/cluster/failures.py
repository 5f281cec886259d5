"""What a failed cluster fit tells its user: one translation shared by every cluster step engine.

:func:`cluster_error` turns whatever escaped a cluster engine (an ``OSError`` from a
lost scheduler, an ``AttributeError`` from a client closed under it, a
``KilledWorker``, a ``CommClosedError`` after the nanny restarted a worker that ran
out of memory, ...) into a :class:`~workbench.errors.ClusterError` that says what
happened and what to do, with the original exception as its cause.
:func:`guard` wraps an engine so that every method goes through it;
:func:`workbench.cluster.engines.make_engine` guards every engine it makes, so a
new strategy gets this for free. :func:`check_memory` refuses data that cannot fit
a worker before anything is sent. :func:`restartable` is the one list of errors an
engine recovers from (a new attempt from the last host copy) rather than raises.
"""

from __future__ import annotations

import contextlib
from typing import Any
from collections.abc import Callable, Iterator

import dask.config
import numpy as np

from workbench.cluster.health import lost_scheduler, scheduler_listens
from workbench.errors import ClusterError, WorkbenchError
from workbench.training import is_dask_array

DASK_ARRAY_ADVICE = (
    "pass a dask array instead (dask.array.from_array(x, chunks=...)), so that each worker holds only its chunks"
)


def cluster_error(
    error: BaseException, client=None, *, step: int | None = None, data_bytes: int = 0, address: str | None = None
) -> WorkbenchError:
    """The error the user sees for ``error`` raised by a cluster fit (``error`` is its ``__cause__``).

    A :class:`~workbench.errors.WorkbenchError` is returned as it is (it already says what
    was wrong); anything else becomes a :class:`ClusterError` with a sentence of advice.
    ``step`` is the last step finished, ``data_bytes`` what the fit sends to each worker whole,
    ``address`` the scheduler's (a closed client no longer knows it).
    """
    status = getattr(client, "status", "running")
    if isinstance(error, ClusterError) and status != "running" and _wraps_outside_error(error):
        error = error.__cause__  # an engine's "step N failed" over what the closed client raised: say why
    elif isinstance(error, WorkbenchError):
        return error
    at = f" after step {step}" if step else ""
    what = f"{type(error).__name__}: {error}"
    address = address or _scheduler_address(client)
    closed = status in ("closing", "closed")
    if _scheduler_lost(error) or status in ("connecting", "failed") or closed and not scheduler_listens(address):
        message = f"{lost_scheduler(address, at)} ({what})"
    elif closed:
        message = (
            f"the Dask client was closed while the fit ran{at} (client.close() or session.close(), "
            f"perhaps from another thread); create a new Session to train again ({what})"
        )
    elif _worker_died(error) and data_bytes and data_bytes > memory_target(client):
        message = (
            f"the training data ({_mb(data_bytes)}) does not fit a worker's memory "
            f"(its limit is {_mb(memory_limit(client))}): the worker ran out of memory and was "
            f"restarted{at}; {DASK_ARRAY_ADVICE} ({what})"
        )
    elif _worker_died(error):
        message = (
            f"the workers running a task of the fit died{at} (out of memory, or a crash: see the "
            f"workers' logs); the fit could not recover ({what})"
        )
    elif isinstance(error, TimeoutError):
        message = (
            f"the fit made no progress{at} within its step_timeout and could not recover; check the "
            f"workers (the dashboard shows what they do) or raise step_timeout ({what})"
        )
    else:
        message = f"the fit failed on the cluster{at}: {what}; see the workers' logs"
    translated = ClusterError(message)
    translated.__cause__ = error
    return translated


def _wraps_outside_error(error: BaseException) -> bool:
    cause = error.__cause__
    return cause is not None and not isinstance(cause, WorkbenchError)


class ClientStopped(RuntimeError):
    """The client stopped running under a fit (its scheduler lost, or closed): no engine recovers from
    this; :func:`cluster_error` says which, by the client's status."""


def check_client(client) -> None:
    """Raise :class:`ClientStopped` at once when ``client`` no longer runs: a fit waiting for its
    step would otherwise notice only when the step's deadline passes."""
    status = getattr(client, "status", "running")
    if status != "running":
        raise ClientStopped(f"the Dask client is {status}")


def drop(client, futures) -> None:
    """Cancel ``futures``, never waiting on a client that is being closed.

    ``Client.cancel`` waits for the client's event loop, which a ``close()`` from another thread
    stops, so that wait would never end; a client that is not running only has its references
    released (the scheduler forgets what no client wants).
    """
    futures = [f for f in futures if f is not None]
    if not futures:
        return
    if getattr(client, "status", None) == "running":
        try:
            client.cancel(futures)
            return
        except RuntimeError:  # its loop closed meanwhile
            pass
    for future in futures:
        with contextlib.suppress(Exception):
            future.release()


def check_memory(client, data: dict) -> None:
    """ClusterError when the NumPy data a fit sends whole to each worker would not fit its memory
    (more than Dask's ``distributed.worker.memory.target`` fraction of the smallest limit)."""
    whole = int(sum(np.asarray(v).nbytes for v in data.values() if not is_dask_array(v)))
    if whole and whole > memory_target(client):
        raise ClusterError(
            f"the training data ({_mb(whole)}) does not fit the workers' memory (the smallest limit is "
            f"{_mb(memory_limit(client))}; each worker holds the data whole); {DASK_ARRAY_ADVICE}"
        )


def memory_limit(client) -> int:
    """The smallest memory limit among the cluster's workers, in bytes (0: none set, or unknown)."""
    try:
        limits = [int(w.get("memory_limit") or 0) for w in client.scheduler_info().get("workers", {}).values()]
    except Exception:  # noqa: BLE001 - a gone scheduler: no limit known
        return 0
    limits = [m for m in limits if m > 0]
    return min(limits) if limits else 0


def memory_target(client) -> float:
    """Bytes a worker may hold before Dask starts moving data out (infinite without a limit)."""
    limit = memory_limit(client)
    fraction = dask.config.get("distributed.worker.memory.target", 0.6) or 0.6
    return limit * float(fraction) if limit else float("inf")


def guard(engine, client, data: dict):
    """``engine`` with every failure of its methods translated by :func:`cluster_error`."""
    return GuardedEngine(engine, client, data)


class GuardedEngine:
    """A cluster step engine whose failures reach the user as :class:`ClusterError` (see :func:`guard`).

    Everything else (``strategy``, ``replicas``, ``restarts``, ``settle``, ...) is the engine's own.
    """

    def __init__(self, engine, client, data: dict):
        self.engine, self.client = engine, client
        self.address = _scheduler_address(client)  # kept: a client closed under the fit forgets it
        self.data_bytes = int(sum(np.asarray(v).nbytes for v in data.values() if not is_dask_array(v)))
        self.step = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    @contextlib.contextmanager
    def translated(self) -> Iterator[None]:
        """Raise what escapes as :func:`cluster_error` says (KeyboardInterrupt passes as it is)."""
        try:
            yield
        except Exception as e:
            error = cluster_error(e, self.client, step=self.step, data_bytes=self.data_bytes, address=self.address)
            if error is e:
                raise
            raise error from e

    def start(self, variables: dict, step: int) -> None:
        self.step = step
        with self.translated():
            self.engine.start(variables, step)

    def run(self, first: int, last: int, sync_at: Callable[[int], bool]):
        outcomes = self.engine.run(first, last, sync_at)
        try:
            with self.translated():
                for outcome in outcomes:
                    self.step = outcome.step
                    yield outcome
        finally:
            close = getattr(outcomes, "close", None)
            if close is not None:
                close()

    def variables(self):
        with self.translated():
            return self.engine.variables()

    def settle(self, step: int):
        settle = getattr(self.engine, "settle", None)
        with self.translated():
            return settle(step) if settle is not None else self.engine.variables()

    def close(self) -> None:
        with self.translated():
            self.engine.close()


def _scheduler_address(client) -> str:
    with contextlib.suppress(Exception):
        return str(client.scheduler.address)
    return "its address"


def restartable() -> tuple:
    """The errors a cluster engine recovers from by starting again from its last host copy: a lost
    or cancelled task (a worker died, or was restarted), a collective whose peer died or hung, a
    connection that broke, a step that made no progress in time. Every engine uses this tuple."""
    import concurrent.futures

    from distributed import KilledWorker
    from distributed.client import FutureCancelledError

    from workbench.errors import CollectiveError

    return (
        CollectiveError,
        KilledWorker,
        FutureCancelledError,
        concurrent.futures.CancelledError,
        OSError,
        TimeoutError,
    )


def _scheduler_lost(error: BaseException) -> bool:
    text = str(error)
    return "scheduler-connection-lost" in text or "lost the connection to the scheduler" in text


def _worker_died(error: BaseException) -> bool:
    from distributed import KilledWorker
    from distributed.comm.core import CommClosedError

    return isinstance(error, (KilledWorker, CommClosedError))


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n else "unknown"
