"""The run loop of the engines whose replicas live on the workers, as a thin shell around the coordinator.

:class:`~workbench.cluster.sync.Coordinator` (plain code, tested without a cluster) decides what to
submit, record, bring home, leave out and redo; :class:`Coordinated` carries its instructions out
with an :class:`~workbench.cluster.collective.allreduce.AllReduceEngine`'s methods (``_submit``, ``_gather``,
``_launch``, ``_drop``) and feeds it what happened: a step's results, a failure (with the members the
scheduler stopped hearing from, :class:`~workbench.cluster.membership.Membership`). The coordinator
runs with ``hold_at_sync=False``: the step tasks of a sync point bring its variables home with their
results, so the window stays full across syncs.

It is the all-reduce engine's ``run`` (``class AllReduceEngine(Coordinated)``), so the built-in
engine, the strategy engine (:mod:`workbench.cluster.collective.strategy_engine`) and the backup engine
(:mod:`workbench.cluster.collective.backup_engine`: its steps leave the window once the members they
used are done, and are reported once the late members' arrival times are in, ``_complete``) restart,
choose members and keep their window in one place; the asynchronous engine
(:mod:`workbench.cluster.parameter_server.asynchronous`) runs on it too, its ``_next`` waiting for the
first gradient to arrive rather than the oldest step. The all-reduce engines hold submitted steps back
to run them as segments (:mod:`workbench.cluster.collective.segments`): the loop's
``_before_waiting_for`` sends them when it is about to wait for one of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from workbench.cluster.sync import Coordinator, Finish, LeaveOut, Record, Restart, Submit, Sync
from workbench.errors import ClusterError
from workbench.events import Restarted, Synced
from workbench.fitloop import StepOutcome


class Coordinated:
    """``run`` of :class:`~workbench.cluster.collective.allreduce.AllReduceEngine` and its subclasses, driven by the coordinator."""

    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        """Run steps ``first..last``; yields one outcome per step, in order, each step once. A step where
        ``sync_at(step)`` is true is yielded once its variables are home (see :meth:`variables`)."""
        if self.host is None:
            raise ClusterError("start(variables, step) comes before run()")
        self._last = last
        coordinator = Coordinator(
            first - 1,
            last,
            window=self.in_flight(),
            sync_every=self.sync_every,
            max_restarts=self.max_restarts,
            sync_at=sync_at,
            hold_at_sync=False,
        )
        coordinator.restarts = self.restarts
        self._results: tuple | None = None  # (step, the members' results) of the step just gathered
        self._silent, self._error = {}, None  # of the last failure
        todo, outcomes = deque(coordinator.start()), deque()
        self._outcomes = outcomes  # recorded, not yielded yet
        while True:
            finished = self._carry_out(todo, coordinator, outcomes)
            self._complete(outcomes, finished)
            while (
                outcomes
                and isinstance(outcomes[0], StepOutcome)
                and (not sync_at(outcomes[0].step) or self.host[1] >= outcomes[0].step)
            ):
                yield outcomes.popleft()
            if finished:
                return
            todo.extend(self._next(coordinator))

    def unreported(self, step: int, upto: int) -> list[StepOutcome]:
        """The outcomes after ``step`` up to ``upto`` that ``run`` recorded and had not yielded when the fit
        ended (an interrupt in the fit's loop, as a sync's variables came home with them), in order."""
        outcomes = []
        for outcome in getattr(self, "_outcomes", ()):
            if not isinstance(outcome, StepOutcome) or outcome.step > upto:
                break
            if outcome.step > step:
                outcomes.append(outcome)
        return outcomes

    def in_flight(self) -> int:
        """Steps the coordinator keeps in flight (the engine's window)."""
        return self.window

    def _before_waiting_for(self, step: int) -> None:
        """The hook called before the loop waits for ``step``, the oldest in flight (an engine that holds
        submitted steps back, to run them together, sends them now)."""

    def _gathered(self, step: int) -> None:
        """The hook called once ``step`` left the window."""

    def _complete(self, outcomes: deque, final: bool) -> None:
        """Turn what ``_outcome`` recorded into :class:`StepOutcome` objects where it was not one yet: the
        hook of an engine whose records wait for more than the step needed (the backup engine's late
        members' arrival times); ``final``: the run is over, wait for them. Outcomes are yielded in order,
        each once it is whole."""

    def _carry_out(self, todo: deque, coordinator: Coordinator, outcomes: deque) -> bool:
        """Carry out the coordinator's instructions; True once it says Finish."""
        while todo:
            instruction = todo.popleft()
            try:
                if isinstance(instruction, Submit):
                    self._submit(instruction.step, instruction.sync)
                elif isinstance(instruction, Record):
                    outcomes.append(self._outcome(instruction.step, self._results[1]))
                elif isinstance(instruction, Sync):
                    self._bring_home(instruction.step, self._results[1])
                    todo.extend(coordinator.synced(instruction.step))
                elif isinstance(instruction, LeaveOut):
                    self.membership.leave_out(instruction.workers, self._silent)
                elif isinstance(instruction, Restart):
                    self._relaunch(instruction)
                elif isinstance(instruction, Finish):
                    return True
            except self._transient as e:  # a relaunch that failed too (a second worker died meanwhile)
                todo.clear()
                todo.extend(self._lost(coordinator, getattr(instruction, "step", coordinator.done), e))
        return False

    def _next(self, coordinator: Coordinator) -> list:
        """Wait for the oldest step in flight; the coordinator's next instructions."""
        step, futures = self.flight[0]
        self._before_waiting_for(step)
        try:
            results = self._gather(step, futures)
        except self._transient as e:
            return self._lost(coordinator, step, e)
        self.flight.popleft()
        self._gathered(step)
        self._results = (step, results)
        return coordinator.step_done(step, None)

    def _lost(self, coordinator: Coordinator, step: int, error: BaseException) -> list:
        """Lost work: drop what is in flight, ask which members went silent, and let the coordinator say."""
        self._cancel()
        if getattr(self.client, "status", "running") != "running":
            raise error  # its scheduler lost, or closed: nothing to restart on (the engine's guard says which)
        self._error = error
        waited = min(self.deadline.seconds, self.timeout)
        addresses = self.group.addresses if self.group is not None else ()
        self._silent = self.membership.silent(addresses, waited)
        try:
            return coordinator.failed(step, error, self._silent)  # a ClusterError past max_restarts
        finally:
            self.restarts = coordinator.restarts

    def _relaunch(self, restart: Restart) -> None:
        """A new generation on the workers left, from the host copy of ``restart.step``."""
        addresses = self.group.addresses if self.group is not None else ()
        if addresses and not set(addresses) & set(self.membership.left_out):  # a dead member, if any,
            self.membership.wait_for_departures(addresses, min(5.0, self.timeout))  # is gone in a moment
        self.deadline.restarted()
        self._drop()
        if self.events is not None:
            self.events.emit(Restarted, step=self.host[1], attempt=self.restarts)
        try:
            members = self._choose_members()
        except ClusterError as e:
            raise e from self._error  # none left: say what made the fit give up on them
        self._launch(members)

    def _bring_home(self, step: int, results: list[dict]) -> None:
        """Step ``step``'s results hold its variables: the new host copy."""
        self.host = (results[0]["variables"], step)
        if self.events is not None:
            self.events.emit(Synced, step=step)
