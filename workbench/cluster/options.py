"""The cluster-only options of ``Session.fit``, grouped: what every cluster step engine reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.cluster.health import SCHEDULER_SECONDS, scheduler_workers
from workbench.errors import ClusterError


@dataclass(frozen=True)
class ClusterOptions:
    """How a ``fit`` uses the cluster (see :meth:`workbench.Session.fit`).

    Attributes
    ----------
    strategy : str, optional
        The step engine (a name in :data:`workbench.cluster.engines.STRATEGIES`; default
        :data:`~workbench.cluster.engines.DEFAULT_STRATEGY`, or ``parameter_server`` where that cannot train the fit).
    replicas : int, optional
        Data-parallel replicas (default: one per worker used).
    window : int
        Steps in flight at most (the all-reduce engines: at least two segments, see ``segment_steps``).
    sync_every : int
        Steps between host copies of the variables (a lost worker costs at most that many).
    workers : tuple of str, or one address, optional
        The worker addresses to use (default: all).
    backup_replicas : int
        Extra shard computations per step; the first ``replicas`` to finish are applied.
    step_timeout : float, optional
        Seconds without progress before the fit counts the steps in flight as lost: it
        restarts from the last sync, without the workers that stopped answering (a
        SIGSTOPped process, a stuck GPU). Default: from the measured step time (see
        :class:`workbench.cluster.health.StepDeadline`): 10 s for steps of milliseconds,
        ten times the slowest step for slow ones, 120 s for the first step (compilation).
    reason : str
        Why ``fit`` chose this strategy, when it chose one for a reason (shown in ``FitStarted``).
    resident : ResidentData, optional
        The session's NumPy data on the workers (:mod:`workbench.cluster.resident`): the all-reduce
        engines send an array to a worker only where it lacks it or it changed; None: at every fit.
    segment_steps : int
        The all-reduce engines: steps each worker runs in one task, their results streamed back step
        by step (:mod:`workbench.cluster.collective.segments`); 1: one task per worker and step.
    """

    strategy: str | None = None
    replicas: int | None = None
    window: int = 4
    sync_every: int = 20
    workers: tuple | None = None
    backup_replicas: int = 0
    step_timeout: float | None = None
    reason: str = ""
    resident: Any = field(default=None, compare=False, repr=False)
    segment_steps: int = 16

    def __post_init__(self) -> None:
        _count("window", self.window, 1)
        _count("segment_steps", self.segment_steps, 1)
        _count("sync_every", self.sync_every, 1)
        _count("backup_replicas", self.backup_replicas, 0)
        if self.replicas is not None:
            _count("replicas", self.replicas, 1)
        timeout = self.step_timeout
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
        ):
            raise ClusterError(f"step_timeout must be a positive number of seconds, got {timeout!r}")
        workers = self.workers
        if isinstance(workers, str):  # one address, not its characters
            object.__setattr__(self, "workers", (workers,))
        elif workers is not None:
            workers = tuple(workers)
            odd = [w for w in workers if not isinstance(w, str)]
            if odd or not workers:
                raise ClusterError(f"workers must be worker addresses (strings), got {list(workers)!r}")
            object.__setattr__(self, "workers", workers)

    def worker_count(self, client) -> int:
        """How many workers the fit uses."""
        return len(self.workers or scheduler_workers(client, self.step_timeout or SCHEDULER_SECONDS))

    def replicas_for(self, client) -> int:
        """The replicas asked for, or one per worker used."""
        return self.replicas or self.worker_count(client) or 1


def _count(name: str, value, least: int) -> None:
    """ClusterError unless ``value`` is an int of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        bound = "0 or more" if least == 0 else f"at least {least}"
        raise ClusterError(f"{name} must be {bound} (a whole number), got {value!r}")
