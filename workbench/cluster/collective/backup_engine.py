"""The all-reduce engine with backup replicas: ``fit(..., replicas=R, backup_replicas=b)``.

``R + b`` members each train on a shard of their own (a step draws ``batch_size + b * (batch_size //
R)`` rows, as the parameter-server path does); the first ``R`` gradients to arrive are applied, as
their mean over the rows used, by every member (:mod:`workbench.cluster.collective.backups`: rank 0's event loop
says who is in, those ``R`` reduce among themselves). The driver reports a step once the members whose gradients were used have finished it:
a late member's task goes on by itself (it catches up by applying the update it was left out of),
and the step's record waits for its arrival time only, never the training. Each record holds
``"dropped"`` (the replica ids not used), ``"delays"`` and ``"arrivals"`` (a dropped replica's
arrival is no earlier than the moment the step went on without it; None where its worker was lost).

A member that leaves the cluster costs nothing while ``R`` others remain and it is not rank 0 (the
one that decides): the driver tells the others (a step it was used in and not committed yet is
decided again without it), and its gradients are never among the first ``R`` again; a step it
finished before it died stands, its record without that member's result. A member that stops
answering (a stopped process: its heartbeats stop) is treated so once a step has waited a few
seconds on it, and left out of the fit. Otherwise the run restarts from its last host copy, as
without backups.

The run loop is the coordinated one (:mod:`workbench.cluster.coordinated`), as every engine of the
family's: a step leaves the window once its used members are done (``_gather``), and its record is
made whole, in order, once the late members' results are in (``_complete``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from workbench.cluster.collective.allreduce import AllReduceEngine, _outcome_fetches
from workbench.cluster.health import scheduler_workers, silence_threshold
from workbench.cluster.lower import allreduce_key, key_label, shards
from workbench.cluster.collective.replica import peers_gone
from workbench.cluster.collective.stat_combine import combine_stats, stat_rules
from workbench.errors import ClusterError, CollectiveError, WorkbenchError
from workbench.fitloop import StepOutcome
from workbench.stragglers import step_delays
from workbench.training import batch_indices


@dataclass
class _Late:
    """A step decided (its used members done) whose record waits for the late members' results."""

    step: int
    futures: list
    results: list


class BackupAllReduceEngine(AllReduceEngine):
    """:class:`~workbench.cluster.collective.allreduce.AllReduceEngine` over ``R + b`` members, applying ``R`` gradients a step."""

    @classmethod
    def for_fit(cls, request, client, options, events) -> BackupAllReduceEngine:
        engine = super().for_fit(request, client, options, events)
        engine.backups = options.backup_replicas
        engine.applied = options.replicas  # R (None: the workers used, less the backups)
        return engine

    #: Steps decided but not reported yet (waiting for a late member's arrival time) at most: a late
    #: member that catches up by applying the updates it was left out of is this far behind at worst.
    lag = 64

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._syncs: set[int] = set()  # the sync points submitted
        self._late: dict[int, list] = {}  # a decided step's futures, until its record is made
        self._outcomes: deque = deque()  # the coordinated loop's records not yielded yet (its run sets it)

    # -- members ----------------------------------------------------------------------------------
    def _choose_members(self) -> list[str]:
        candidates = self.membership.choose(None)
        applied = self.applied or max(1, len(candidates) - self.backups)
        members = candidates[: applied + self.backups]
        self.needed = min(applied, len(members))
        return members

    def _needed(self, members: int) -> int | None:
        return self.needed

    def _check_members(self, step: int, waited: float = 0.0) -> None:
        """A member that left costs nothing while ``R`` remain and rank 0 (which decides) is there; nor does
        one that stopped answering (its heartbeats stopped) while the step waited ``waited`` seconds."""
        gone = set(self.group.addresses) - set(scheduler_workers(self.client, self.deadline.seconds))
        stopped = self._stopped(waited)
        fresh, self.lost = (gone | stopped) - self.lost, self.lost | gone | stopped
        if fresh:
            self._tell_gone(fresh)
        if self.group.addresses[0] in self.lost or self.group.size - len(self.lost) < self.needed:
            why = [f"{a} {'stopped answering' if a in self.stopped else 'left the cluster'}" for a in sorted(self.lost)]
            raise CollectiveError(f"step {step}: worker {', '.join(why)}")

    #: Members left out of this run because their heartbeats stopped (address to seconds of silence).
    stopped: dict = {}
    _silence_asked = 0.0

    def _stopped(self, waited: float) -> set[str]:
        """Members whose heartbeats stopped while a step made no progress for ``waited`` seconds (a stopped
        process holds a step it was chosen for until the step deadline otherwise): asked of the scheduler
        at most once a second, from :func:`~workbench.cluster.health.silence_threshold` seconds on; left
        out of the fit from then on, as a restart would leave them out."""
        now = time.monotonic()
        if waited < silence_threshold(0.0) or now < self._silence_asked + 1.0:
            return set(self.stopped)
        self._silence_asked = now
        found = self.membership.silent([a for a in self.group.addresses if a not in self.lost], waited)
        if found:
            self.membership.leave_out(found, found)
            self.stopped = {**self.stopped, **found}
        return set(self.stopped)

    def _tell_gone(self, gone: set) -> None:
        """The members still there hear who left: a step that used a departed member's gradient and is
        not committed yet is decided again without it (see :mod:`workbench.cluster.collective.backups`)."""
        addresses = self.group.addresses
        ranks = sorted(addresses.index(a) for a in gone)
        members = [a for a in addresses if a not in gone and a not in self.left_out]
        if members:  # bounded: a member that stopped answering must not hold the driver
            with contextlib.suppress(TimeoutError, OSError):
                self.client.run(
                    peers_gone, self.group.token, ranks, workers=members, on_error="return", callback_timeout=5
                )

    # -- a step -----------------------------------------------------------------------------------
    def _calls(self, step: int, sync: bool) -> list:
        group, applied = self.group, self.needed
        size = self.batch_size + self.backups * (self.batch_size // applied)
        index = next(batch_indices(self.num_examples, size, step, self.batch_seed, start=step - 1))
        mean = self.program.loss_reduction == "mean"
        calls, offset = [], 0
        for i, part in enumerate(shards(index, group.size)):
            weight = float(len(part)) if mean else 1.0  # the arbiter scales the sum by 1 / rows used
            args = (group.token, step, part, offset, weight, None, len(part) / self.batch_size, sync and i == 0)
            calls.append((allreduce_key(self.name, step, i, group.token), (*args, self.started[i])))
            offset += len(part)
        return calls

    # -- the coordinated loop's hooks (workbench.cluster.coordinated) -----------------------------
    def _launch(self, members: list[str]) -> None:
        self.lost, self.stopped, self._last_decided = set(), {}, None  # of this generation
        super()._launch(members)

    def _submit(self, step: int, sync: bool) -> None:
        if sync:
            self._syncs.add(step)  # its decision waits for rank 0 too: its result brings the variables home
        super()._submit(step, sync)

    def _gather(self, step: int, futures: list) -> list:
        """The step leaves the window once the members whose gradients it used are done (and rank 0 at a sync)."""
        results = self._decided(step, futures, step in self._syncs)
        for old in [s for s in self._late if s < step]:  # redone steps are not recorded twice: let them go
            del self._late[old]
        self._late[step] = futures
        return results

    def _outcome(self, step: int, results: list):
        """Recorded now, made whole once the late members' arrival times are in (:meth:`_complete`)."""
        return _Late(step, self._late.pop(step), results)

    def _complete(self, outcomes: deque, final: bool) -> None:
        """Each late record in order, once its dropped members finished (their arrival times): at once while
        steps are in flight, waited for (bounded) when none are, at the end, or when the reports lag the
        training by more than :attr:`lag` steps."""
        for k, entry in enumerate(outcomes):
            if not isinstance(entry, _Late):
                continue
            late = sum(isinstance(o, _Late) for o in outcomes)
            if not self._trailing_done(entry):
                if self.flight and not final and late <= self.lag:
                    return  # in order: the next ones wait for this one
                with contextlib.suppress(*self._transient, WorkbenchError):  # a late member lost or broken:
                    self._wait_for(entry.step, entry.futures, lambda e=entry: self._trailing_done(e))
            outcomes[k] = self._outcome_of(entry)  # its record goes without what did not come

    def _relaunch(self, restart) -> None:
        """Before a new generation: the records decided in this one, with the late results that came."""
        for k, entry in enumerate(self._outcomes):
            if isinstance(entry, _Late):
                self._outcomes[k] = self._outcome_of(entry)
        super()._relaunch(restart)

    def _outcome_of(self, entry: _Late) -> StepOutcome:
        results = list(entry.results)
        for r, f in enumerate(entry.futures):
            if results[r] is None and f.status == "finished":
                with contextlib.suppress(*self._transient, WorkbenchError):
                    results[r] = self._result(entry.step, entry.futures, r)
        return self._step_outcome(entry.step, results)

    def _failed(self, step: int, future) -> BaseException:
        error = future.exception()
        if isinstance(error, (self._transient, WorkbenchError)):
            return error
        return ClusterError(f"step {step} failed in {key_label(future.key)}: {type(error).__name__}: {error}")

    def _wait_for(self, step: int, futures: list, ready: Callable[[], bool]) -> None:
        """Until ``ready()``: a used member's failure raises, a lost member is tolerated (see :meth:`_check_members`)."""
        changed = threading.Event()
        for f in futures:
            f.add_done_callback(lambda _: changed.set())
        waited = time.monotonic()
        deadline = waited + self.deadline.seconds
        while not ready():
            changed.clear()
            for rank, f in enumerate(futures):
                if f.status in ("error", "cancelled") and self.group.addresses[rank] not in self.lost:
                    self._check_members(step)  # a member that died: its tasks fail, the step goes on
                if self.group.addresses[rank] in self.lost:
                    continue
                if f.status == "error":
                    raise self._failed(step, f)
                if f.status == "cancelled":
                    raise concurrent.futures.CancelledError(f"step {step}: task {key_label(f.key)} was cancelled")
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step} made no progress for {self.deadline.seconds:g} s")
            if not changed.wait(self.poll):
                self._check_members(step, time.monotonic() - waited)
        self.deadline.progressed(time.monotonic() - waited)

    def _decided(self, step: int, futures: list, sync: bool) -> list:
        """The results of the members whose gradients ``step`` used (and rank 0's at a sync); None for the rest."""
        gone_with: set[int] = set()  # members that finished, then died: their results went with them
        finished = lambda: [r for r, f in enumerate(futures) if f.status == "finished" and r not in gone_with]  # noqa: E731
        decided = None
        while decided is None:  # any member's result says who was used
            self._wait_for(step, futures, lambda: bool(finished()))
            for r in finished():
                decided = self._result(step, futures, r)
                if decided is not None:
                    break
                gone_with.add(r)
        wanted = sorted(set(decided["used"]) | ({0} if sync else set()))
        # a used member may die once its gradient is in: the step stands, its record goes without it
        here = lambda r: futures[r].status == "finished" or self.group.addresses[r] in self.lost  # noqa: E731
        self._wait_for(step, futures, lambda: all(here(r) for r in wanted))
        results = [None] * len(futures)
        for r in wanted:
            if futures[r].status == "finished":
                results[r] = self._result(step, futures, r)
        return results

    def _result(self, step: int, futures: list, rank: int) -> dict | None:
        """Member ``rank``'s result of a finished task; None where its worker died or stopped since (the
        result went with it, and Dask cancels the future; or it cannot be fetched): the step stands
        without that record. Bounded by the step deadline."""
        began = time.monotonic()
        while True:
            try:
                return futures[rank].result(timeout=max(self.poll, 1.0))
            except TimeoutError:
                waited = time.monotonic() - began
                if waited > self.deadline.seconds:
                    raise TimeoutError(f"step {step}: no result from member {rank} for {waited:.0f} s") from None
                self._check_members(step, waited)  # a stopped worker's result never comes
            except Exception:
                self._check_members(step)  # the scheduler forgets a result when it removes its worker
                if self.group.addresses[rank] not in self.lost:
                    raise
            if self.group.addresses[rank] in self.lost:
                return None

    def _trailing_done(self, entry: _Late) -> bool:
        """Every member of ``entry``'s step has a result in, a finished task, or left."""
        return all(
            entry.results[r] is not None or f.status != "pending" or self.group.addresses[r] in self.lost
            for r, f in enumerate(entry.futures)
        )

    def _step_outcome(self, step: int, results: list) -> StepOutcome:
        decided = next(r for r in results if r is not None and "used" in r)
        used = decided["used"]
        applied = [results[r] for r in used if results[r] is not None]
        fetches = _outcome_fetches(self.program, self.labels, applied, rescale=self._rescale(applied))
        compute = {r["worker"]: r["compute_seconds"] for r in applied}
        begun = min(r["start_wall"] for r in applied)
        arrivals = []
        for rank, r in enumerate(results):
            if r is None:
                arrivals.append(None)  # its worker was lost
            elif rank in used:
                arrivals.append(r["ready_wall"] - begun)
            else:  # it was not in when the step went on
                arrivals.append(max(r["ready_wall"], decided["decided_wall"]) - begun)
        delays = step_delays(self.stragglers, step, len(results))
        metrics = {
            "replicas": len(used),
            "compute_seconds": max(compute.values()),
            "reduce_seconds": max(r["allreduce_wait_seconds"] for r in applied),
            "update_seconds": max(r["update_seconds"] for r in applied),
            "workers": compute,
            "bytes_moved": sum(r["bytes_received"] for r in results if r is not None),
            "bytes_received": max(r["bytes_received"] for r in results if r is not None),  # the busiest member
            "bytes_sent": max(r["bytes_sent"] for r in applied),
            "dropped": [rank for rank in range(len(results)) if rank not in used],
            "restarts": self.restarts,
            "tasks": len(results),
            "delays": delays,
            "arrivals": arrivals,
        }
        seconds = decided["decided_wall"] - self._last_decided if step > 1 and self._last_decided else None
        self._last_decided = decided["decided_wall"]
        return StepOutcome(step, fetches, metrics, seconds=seconds, stats=self._used_stats(results, used))

    def _used_stats(self, results: list, used: list) -> dict:
        """fit(stats=k): the statistics of the rows the step applied, joined from the used members'
        (:mod:`workbench.cluster.collective.stat_combine`, shares over the rows used); none where a used member's
        result was lost with its worker."""
        reported = [results[r] for r in used if results[r] is not None and "stats" in results[r]]
        if not reported or len(reported) < len(used):
            return {}
        if self._stat_rules is None:
            self._stat_rules = stat_rules(self.program)
        total = sum(r["stats_share"] for r in reported)
        joined = combine_stats(
            self._stat_rules, [r["stats"] for r in reported], [r["stats_share"] / total for r in reported]
        )
        return dict(zip(self.stats_labels, joined, strict=True))

    _last_decided: float | None = None
    lost: frozenset = frozenset()  # members that left the cluster during this run

    def _rescale(self, applied: list) -> float:
        """Mean fetches came weighted by shard rows / batch_size: to the mean over the rows used."""
        used_share = sum(r["share"] for r in applied)
        return 1.0 / used_share if used_share else 1.0
