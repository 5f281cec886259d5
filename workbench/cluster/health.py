"""How long a cluster step may take, and which workers stopped answering.

Shared by the cluster step engines: :class:`StepDeadline` says how long to wait
for progress before a step counts as lost, and :func:`silent_workers` names the
workers whose heartbeats stopped (a SIGSTOPped process, a stuck GPU, a paused
VM), so that the fit can go on without them.
"""

from __future__ import annotations

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
    except (OSError, TimeoutError):
        raise  # the scheduler itself is gone or silent
    except Exception:  # noqa: BLE001 - a scheduler that runs no pickled code: its reports, on our clock
        from time import time

        workers = client.scheduler_info().get("workers", {})
        ages = {a: time() - float(w.get("last_seen", time())) for a, w in workers.items() if a in candidates}
    return {a: age for a, age in ages.items() if age > seconds}


def silence_threshold(deadline: float) -> float:
    """How long a worker must have been silent, after ``deadline`` seconds without progress,
    to count as unresponsive (heartbeats come every second or so; allow for a busy machine)."""
    return max(3.0, 0.5 * deadline)
