"""Which workers a cluster fit may use: one object shared by every cluster step engine.

A fit asks for some workers (``fit(workers=[...])``) or for all of them. A worker that dies leaves
the scheduler's list by itself; a hung one (a stopped process, a stuck GPU) stays in it, so a fit
that waited too long for progress asks the scheduler which of its members went silent and leaves
those out for the rest of the fit. :class:`Membership` holds that: the workers asked for, those left
out (with how long each had been silent), and the questions an engine asks the scheduler about
them, each bounded (:func:`~workbench.cluster.health.scheduler_workers`). Nothing is retired: a
shared cluster keeps its workers.
"""

from __future__ import annotations

import time

from workbench.cluster.health import StepDeadline, scheduler_workers, silence_threshold, silent_workers
from workbench.errors import ClusterError


class Membership:
    """The workers of one cluster fit.

    Parameters
    ----------
    client : distributed.Client
    asked : sequence of str, optional
        The workers the fit asked for (default: every worker the scheduler knows).
    deadline : StepDeadline, optional
        How long the engine waits for progress: bounds the questions to the scheduler.

    Attributes
    ----------
    left_out : dict
        Address -> seconds it had been silent when the fit left it out.
    """

    def __init__(self, client, asked=None, deadline: StepDeadline | None = None):
        self.client = client
        self.asked = list(asked) if asked else None
        self.deadline = deadline if deadline is not None else StepDeadline()
        self.left_out: dict[str, float] = {}

    def known(self, seconds: float | None = None) -> list[str]:
        """Every worker the scheduler lists now (bounded by ``seconds``, default the deadline's)."""
        return sorted(scheduler_workers(self.client, self.deadline.seconds if seconds is None else seconds))

    def workers(self, listed: bool = True) -> list[str]:
        """The workers asked for (or every known one), less those left out; with ``listed``, only those
        the scheduler lists now (a dead worker is gone from its list)."""
        known = self.known() if listed or self.asked is None else None
        chosen = self.asked or known
        return [w for w in chosen if w not in self.left_out and (known is None or w in known)]

    def choose(self, count: int | None) -> list[str]:
        """The first ``count`` (default: all) of :meth:`workers`: the members of a new attempt."""
        candidates = self.workers()
        count = len(candidates) if count is None else min(count, len(candidates))
        if count < 1:
            if self.left_out:
                named = ", ".join(sorted(self.left_out))
                raise ClusterError(
                    f"no progress for {self.deadline.seconds:g} s and no worker is left: {named} "
                    "stopped answering (stopped or hung processes); restart them, or add workers"
                )
            raise ClusterError(f"no workers left to train on (asked for {self.asked or 'any'})")
        return candidates[:count]

    def placement(self) -> tuple | None:
        """Where data and tasks may go: None (anywhere, or the workers asked for) until a worker is
        left out, then the workers left, strictly (the scheduler still lists a stopped worker)."""
        if not self.left_out:
            return tuple(self.asked) if self.asked else None
        left = tuple(self.workers(listed=False))
        if not left:
            raise ClusterError(f"no worker is left: {', '.join(sorted(self.left_out))} stopped answering")
        return left

    def silent(self, addresses, waited: float) -> dict[str, float]:
        """The workers among ``addresses`` (not left out yet) the scheduler has not heard from since well
        before the ``waited`` seconds without progress (:func:`~workbench.cluster.health.silence_threshold`),
        with their silence."""
        addresses = [a for a in addresses if a not in self.left_out]
        return silent_workers(self.client, addresses, silence_threshold(waited)) if addresses else {}

    def leave_out_silent(self, addresses, waited: float) -> dict[str, float]:
        """:meth:`silent`, left out for the rest of the fit; those it left out."""
        found = self.silent(addresses, waited)
        self.left_out.update(found)
        return found

    def leave_out(self, workers, silent: dict | None = None) -> None:
        """Leave out ``workers`` for the rest of the fit (``silent``: how long each had been silent)."""
        self.left_out.update({w: (silent or {}).get(w, 0.0) for w in workers})

    def departed(self, addresses, seconds: float | None = None) -> set[str]:
        """Those of ``addresses`` the scheduler no longer lists (they left the cluster)."""
        return set(addresses) - set(self.known(seconds))

    def wait_for_departures(self, addresses, seconds: float = 5.0) -> bool:
        """Give the scheduler up to ``seconds`` to notice that one of ``addresses`` died (its nanny says
        so at once), so that a new attempt does not count on it; a hung member stays. Whether one left."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.departed(addresses):
                return True
            time.sleep(0.1)
        return False
