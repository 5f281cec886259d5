"""How long a cluster step may take, and which workers stopped answering.

Shared by the cluster step engines: :class:`StepDeadline` says how long to wait
for progress before a step counts as lost, and :func:`silent_workers` names the
workers whose heartbeats stopped (a SIGSTOPped process, a stuck GPU, a paused
VM), so that the fit can go on without them.
"""

from __future__ import annotations

from workbench.errors import ClusterError

#: Seconds to wait for the scheduler's answer to a question about its workers, by default.
SCHEDULER_SECONDS = 30.0

#: Seconds allowed for the first step of an attempt (compiling plans, moving data) by default.
FIRST_STEP_SECONDS = 120.0
#: The default timeout of later steps: this many times the slowest step seen ...
STEP_FACTOR = 10.0
#: ... but never less than this many seconds (so, for steps of milliseconds, this).
FLOOR_SECONDS = 10.0


class StepDeadline:
    """Seconds to wait for the next step before counting it lost.

    With ``seconds`` (the user's ``step_timeout``) always that. By default the first step
    of each attempt gets :data:`FIRST_STEP_SECONDS`, later ones :data:`STEP_FACTOR` times
    the slowest interval between steps seen so far, at least :data:`FLOOR_SECONDS`.
    """

    def __init__(self, seconds: float | None = None):
        self.explicit = None if seconds is None else float(seconds)
        self.slowest = 0.0
        self.fresh = True  # the next step is an attempt's first

    def restarted(self) -> None:
        """A new attempt begins: its first step may compile and move data again."""
        self.fresh = True

    def progressed(self, seconds: float) -> None:
        """A step finished ``seconds`` after the previous progress."""
        if not self.fresh:
            self.slowest = max(self.slowest, seconds)
        self.fresh = False

    @property
    def seconds(self) -> float:
        if self.explicit is not None:
            return self.explicit
        if self.fresh:
            return FIRST_STEP_SECONDS
        return max(FLOOR_SECONDS, STEP_FACTOR * self.slowest)


def silent_workers(client, candidates, seconds: float, timeout: float = 10.0) -> dict[str, float]:
    """The workers among ``candidates`` the scheduler has not heard from for more than
    ``seconds`` (address to seconds of silence), from the scheduler's own clock and heartbeats."""

    def silence(dask_scheduler, addresses):  # runs on the scheduler
        from time import time

        now = time()
        return {a: now - ws.last_seen for a, ws in dask_scheduler.workers.items() if a in addresses}

    try:
        ages = client.run_on_scheduler(silence, addresses=list(candidates), callback_timeout=timeout)
    except TimeoutError as e:
        raise SchedulerSilent(_silent(client, timeout)) from e
    except OSError:
        raise  # the scheduler itself is gone
    except Exception:  # noqa: BLE001 - a scheduler that runs no pickled code: its reports, on our clock
        from time import time

        workers = scheduler_workers(client, timeout)
        ages = {a: time() - float(w.get("last_seen", time())) for a, w in workers.items() if a in candidates}
    return {a: age for a, age in ages.items() if age > seconds}


def silence_threshold(deadline: float) -> float:
    """How long a worker must have been silent, after ``deadline`` seconds without progress,
    to count as unresponsive (heartbeats come every second or so; allow for a busy machine)."""
    return max(3.0, 0.5 * deadline)


class SchedulerSilent(ClusterError):
    """The scheduler did not answer within the bound (a stopped or overloaded process, a network that hangs)."""


def scheduler_workers(client, timeout: float = SCHEDULER_SECONDS) -> dict:
    """The scheduler's workers (address to their info), asked with a bound.

    Raises
    ------
    SchedulerSilent
        When the scheduler does not answer within ``timeout`` seconds: a fit cannot go on without it.
    OSError
        When the connection to it is lost.
    """
    address = str(getattr(client.scheduler, "address", "its address"))
    try:
        identity = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)
    except TimeoutError as e:
        if client.status != "running" or not scheduler_listens(address):
            raise SchedulerLost(lost_scheduler(address)) from e
        raise SchedulerSilent(_silent(client, timeout)) from e
    return dict(identity.get("workers", {}))


class SchedulerLost(ClusterError):
    """The scheduler went away (its process died, or its machine or network)."""


def lost_scheduler(address: str, at: str = "") -> str:
    """What a fit that lost its scheduler tells the user (``at``: " after step k")."""
    return (
        f"lost the Dask scheduler at {address}{at}: it was stopped, or its machine or network went away; "
        "start the cluster again and fit again (with checkpoint_dir the fit resumes from its last checkpoint)"
    )


def scheduler_listens(address: str, timeout: float = 2.0) -> bool:
    """Whether anything accepts connections at a scheduler's ``address``: tells a client closed under a
    running fit (by the user) from one whose scheduler went away. True where it cannot tell (inproc, ucx)."""
    import socket

    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port

    try:
        protocol, location = parse_address(address)
        if protocol not in ("tcp", "tls"):
            return True
        with socket.create_connection(parse_host_port(location), timeout=timeout):
            return True
    except (OSError, ValueError, TypeError):
        return False


def _silent(client, timeout: float) -> str:
    return (
        f"the Dask scheduler at {client.scheduler.address} did not answer within {timeout:g} s (a stopped "
        "or overloaded process, or a network that hangs); the fit stops here: continue or restart the "
        "scheduler and fit again (with checkpoint_dir the fit resumes from its last checkpoint)"
    )
