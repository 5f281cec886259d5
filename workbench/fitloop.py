"""The one training loop, and the step-engine seam it drives.

``Session.fit`` checks its arguments, builds a :class:`FitRequest` (plain values:
names, host arrays, the device) and hands a :class:`FitLoop` a **step engine**
that the request's strategy makes:

- :class:`LocalSteps` runs the session's compiled plan on its device, one batch
  a step;
- cluster engines (:mod:`workbench.cluster.engines`) run the steps on a Dask
  cluster: ``"allreduce"`` (the default) all-reduces gradients worker to worker
  (:mod:`workbench.cluster.collective.allreduce`), ``"parameter_server"`` is the task-graph
  path of :mod:`workbench.cluster.parameter_server.synchronous`.

The loop owns what every engine shares: resuming from the newest checkpoint,
the records of :class:`~workbench.training.History`, the typed events
(:class:`~workbench.events.FitStarted`, :class:`~workbench.events.Step`, and one
of :class:`~workbench.events.FitFinished`, :class:`~workbench.events.FitInterrupted`
or :class:`~workbench.events.FitFailed` at the end), the callback, the checkpoint
cadence and ending early: a stop request (:func:`request_stop`) or a
``KeyboardInterrupt`` ends the fit at a step boundary, with that step's
variables (:meth:`StepEngine.settle`). An engine takes variable values in (host
NumPy dicts) and hands them back; it never reads or writes a session's private state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from workbench import checkpoint
from workbench.events import (
    EventStream,
    FitFailed,
    FitFinished,
    FitInterrupted,
    FitStarted,
    Step,
    Validated,
    current_study,
)
from workbench.training import History, batch_indices


@dataclass(frozen=True)
class StepOutcome:
    """What an engine reports for one finished step.

    Attributes
    ----------
    step : int
        1-based step number.
    fetches : mapping
        The request's fetches by label, as host values (floats for scalars).
    metrics : mapping
        What the engine measured (cluster engines: ``replicas``, ``compute_seconds``,
        ``reduce_seconds``, ``update_seconds``, ``workers``, ``bytes_moved``, ``dropped``).
    seconds : float, optional
        The step's own duration when the engine knows it; else the loop takes the
        time since the previous outcome (steps in flight overlap on a cluster).
    stats : mapping
        The request's ``stats`` by label, on the steps where they are due (else empty).
    elapsed : float, optional
        Seconds since the fit started when the step ended, where the engine keeps its own clock (the
        simulation's virtual one); else the loop measures it.
    """

    step: int
    fetches: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    stats: Mapping[str, float] = field(default_factory=dict)
    elapsed: float | None = None


@runtime_checkable
class StepEngine(Protocol):
    """Runs training steps; the :class:`FitLoop` drives it.

    ``strategy`` names it in :class:`~workbench.events.FitStarted`; ``replicas`` and
    ``workers`` (None locally) too; ``restarts`` counts recoveries from lost work.

    Optional: ``settle(step) -> (variables, step)``, called when the fit ends early
    (a stop request, ``KeyboardInterrupt``) after the outcome of ``step``, before
    :meth:`close`: the variables of that step (the engine fetches them if they are not
    home yet), or the latest host copy and its step when they are lost. Without it the
    loop keeps :meth:`variables`.

    Optional: ``state_specs() -> {name: (shape, dtype)}`` and ``checkpoint_state() -> {name: array}``,
    state beyond the graph's variables that checkpoints hold (the simulation's per-replica
    variables and slots): written with the variables, handed back to :meth:`start` on resume.
    """

    strategy: str
    replicas: int | None
    workers: int | None
    restarts: int

    def start(self, variables: dict[str, np.ndarray], step: int) -> None:
        """Take the variables' values (host arrays) as they are after ``step`` (0: none done)."""

    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        """Run steps ``first..last``; yield one outcome per step, in order. When the outcome
        of a step where ``sync_at(step)`` is yielded, :meth:`variables` holds that step."""

    def variables(self) -> tuple[dict[str, np.ndarray], int]:
        """The latest host copy of the variables, and the step it belongs to."""

    def close(self) -> None:
        """Release what :meth:`start` took (futures, scattered data); what is in flight is cancelled."""


@dataclass(frozen=True)
class FitRequest:
    """One ``fit`` as plain values: what a strategy needs to make its engine.

    Attributes
    ----------
    graph : Graph
    train : str
        The update operation.
    data : dict
        Placeholder name to all examples (NumPy arrays of the placeholder's dtype, or dask arrays).
    batch_size, steps : int
        The global batch and the last step.
    fetches : dict
        Label to tensor name.
    batch_seed : tuple
        Seeds the batch order (:func:`~workbench.training.batch_indices`).
    seed : int
        The session's seed (initializers, random ops).
    device : Device
        The session's device; cluster engines open one of its ``kind`` on each worker.
    check_numerics : bool
    stats : dict
        Label (``"<op>/<stat>"``) to the scalar tensor of a statistic
        (:mod:`workbench.graph.probes`), fetched with the step every ``stats_every`` steps.
    stats_every : int
        0: no statistics.
    feeds : dict
        Placeholder name to a host array fed at every training step (``fit(feed_dict=...)``),
        not to validation.
    profile_every : int
        ``fit(profile=k)``: every k-th step times each op (``metrics["profile"]``); 0: none.
    stragglers : Stragglers, optional
        ``fit(stragglers=...)`` (:mod:`workbench.stragglers`): the delays every engine with replicas
        injects after a replica computes and before it hands its gradient in.
    """

    graph: Any
    train: str
    data: dict
    batch_size: int
    steps: int
    fetches: dict
    batch_seed: tuple
    seed: int
    device: Any
    check_numerics: bool = False
    stats: dict = field(default_factory=dict)
    stats_every: int = 0
    feeds: dict = field(default_factory=dict)
    profile_every: int = 0
    stragglers: Any = None

    def stats_due(self, step: int) -> bool:
        """Whether step ``step`` (1-based) also fetches :attr:`stats`."""
        return bool(self.stats) and self.stats_every > 0 and step % self.stats_every == 0


#: The running loop of each session (by its event token), for :func:`request_stop`.
_RUNNING: dict[str, FitLoop] = {}


def request_stop(session: str) -> bool:
    """Ask the fit running for the session whose token is ``session`` to end after its current step.

    Thread-safe (a widget's button, a timer, another thread); the fit returns the steps done
    and the session keeps that step's variables. Returns whether a fit was running.
    """
    loop = _RUNNING.get(session)
    if loop is None:
        return False
    loop.request_stop()
    return True


class FitLoop:
    """Records, events, callback, checkpoints and resume of one ``fit``, whatever the engine.

    Parameters
    ----------
    request : FitRequest
    events : EventStream
        The session's stream (its tags name the session and graph).
    callback : callable, optional
        Called with each step's record.
    checkpoint_dir : path, optional
        Resume from the newest checkpoint there, and write one every
        ``checkpoint_every`` steps and at the last step.
    validation : Validation, optional
        Evaluates the fetches on held-out data every ``validation.every`` steps, from the
        engine's variables of that step (see :mod:`workbench.validation`); the loop adds
        ``val_<label>`` to that step's record and emits :class:`~workbench.events.Validated`.
    """

    def __init__(
        self,
        request: FitRequest,
        events: EventStream,
        callback: Callable[[dict], Any] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        validation=None,
    ):
        self.request, self.events, self.callback = request, events, callback
        self.checkpoint_dir = checkpoint_dir
        self.every = checkpoint_every or request.steps
        self.validation = validation
        self.history = History()
        self.stop_requested = threading.Event()
        self.step = 0  # the last step taken
        self.final: dict[str, np.ndarray] | None = None  # the variables at the end
        self.stopped_at: int | None = None  # the step an early end kept

    def sync_at(self, step: int) -> bool:
        """Whether the loop writes a checkpoint after ``step`` (so the engine brings it home)."""
        return self.checkpoint_dir is not None and (step % self.every == 0 or step == self.request.steps)

    def host_at(self, step: int) -> bool:
        """Whether the engine brings ``step``'s variables home: to checkpoint or to validate them."""
        return self.sync_at(step) or (self.validation is not None and step % self.validation.every == 0)

    def resume(self, variables: dict[str, np.ndarray], extra: dict | None = None) -> tuple[dict[str, np.ndarray], int]:
        """``variables`` updated from the newest checkpoint (if any), and its step (else 0).

        ``extra``: name to (shape, dtype) of what an engine saves beyond the graph's variables
        (``engine.state_specs()``: the replicas' own state in the simulation), taken too when there.
        """
        expected = {**checkpoint.specs(self.request.graph.variables), **(extra or {})}
        resumed = checkpoint.latest(self.checkpoint_dir, expected)
        if resumed is None:
            return variables, 0
        saved, step = resumed
        kept = {k: v for k, v in saved.items() if k in variables or k in (extra or {})}
        return {**variables, **kept}, min(step, self.request.steps)

    def request_stop(self) -> None:
        """End the fit after the step in progress (thread-safe): ``run`` returns that step's results."""
        self.stop_requested.set()

    def run(self, engine: StepEngine, variables: dict[str, np.ndarray]) -> tuple[History, dict[str, np.ndarray]]:
        """Train from ``variables`` (the session's, or a checkpoint's when resuming) to the last step.

        Returns the history and the variables' final values: those of the last step, or of the
        step where a stop request ended the fit (then :attr:`stopped_at` is that step). On
        ``KeyboardInterrupt`` :attr:`final` holds the last completed step's values, the
        exception's ``history`` attribute the steps done, and the interrupt is raised again.
        """
        req = self.request
        self.started_at = time.perf_counter()
        specs = getattr(engine, "state_specs", None)
        variables, start = self.resume(variables, specs() if specs is not None else None)
        self.step = start
        token = self.events.tags.get("session", "")
        _RUNNING[token] = self
        try:
            try:
                self._start(engine, variables, start)
                self._emit_started(engine, start)
                self._steps(engine, start)
                if self.stop_requested.is_set() and self.step < req.steps:
                    self._end_early(engine, "stopped")
                else:
                    self.final, _ = engine.variables()
                    self.events.emit(FitFinished, steps=req.steps, restarts=engine.restarts)
            except KeyboardInterrupt as e:
                self._end_early(engine, "interrupted")
                with contextlib.suppress(AttributeError, TypeError):
                    e.history = self.history
                raise
            except Exception as e:
                self._keep_after_failure(engine)
                self.events.emit(FitFailed, step=self.step, error=f"{type(e).__name__}: {e}")
                raise
            finally:
                engine.close()
        finally:
            if _RUNNING.get(token) is self:
                del _RUNNING[token]
        return self.history, self.final

    @staticmethod
    def _start(engine: StepEngine, variables: dict[str, np.ndarray], start: int) -> None:
        """``engine.start``, the first SIGINT held back until it returns: an interrupt while a cluster
        engine places its data (the scatters) ends the fit once everything placed has a future, which
        ``close`` then drops (a scatter cut short would leave its copy on the workers for good)."""
        with interrupts_at_step_boundaries() as pending:
            engine.start(variables, start)
        if pending():
            raise KeyboardInterrupt

    def _emit_started(self, engine: StepEngine, start: int) -> None:
        req = self.request
        self.events.emit(
            FitStarted,
            steps=req.steps,
            batch_size=req.batch_size,
            fetches=tuple(req.fetches),
            start=start,
            strategy=engine.strategy,
            reason=getattr(engine, "reason", ""),
            replicas=engine.replicas,
            workers=engine.workers,
            graph_name=req.graph.name,
            scheduler=getattr(engine, "scheduler", None),
            study=current_study.get(),
        )

    def _steps(self, engine: StepEngine, start: int) -> None:
        """Take the engine's outcomes until the last step or a stop request."""
        outcomes = engine.run(start + 1, self.request.steps, self.host_at)
        try:
            last = time.perf_counter()
            for outcome in outcomes:
                now = time.perf_counter()
                seconds = outcome.seconds if outcome.seconds is not None else now - last
                last = now
                self.step = outcome.step  # done, whatever the callback does
                self._record(outcome, seconds, engine)
                if self.sync_at(outcome.step):
                    self._checkpoint(engine, outcome.step)
                if self.stop_requested.is_set():
                    break
        finally:
            close = getattr(outcomes, "close", None)
            if close is not None:
                close()

    def _keep_after_failure(self, engine: StepEngine) -> None:
        """After a failure, :attr:`final` holds the engine's newest variables that it can still give (a
        cluster's last host copy: the steps it trained are not lost), and the history ends at their step."""
        try:
            self.final, at = engine.variables()
        except Exception:  # noqa: BLE001 - nothing left to keep: the session keeps its own
            self.final = None
            return
        self.stopped_at = at
        if at < self.step:
            self.history.records[:] = [r for r in self.history.records if r["step"] <= at]
            self.step = at

    def _end_early(self, engine: StepEngine, reason: str) -> None:
        """The variables of the last step taken (:meth:`StepEngine.settle`) and a FitInterrupted."""
        settle = getattr(engine, "settle", None)
        self.final, at = settle(self.step) if settle is not None else engine.variables()
        if at > self.step:  # its copy is of steps it took and had not handed over yet (an interrupt came between)
            self._record_unreported(engine, at)
        self.stopped_at = at
        if at < self.step:  # the engine kept an earlier step (its last host copy): the history ends there too
            self.history.records[:] = [r for r in self.history.records if r["step"] <= at]
            self.step = at
        self.events.emit(FitInterrupted, step=at, steps=self.request.steps, reason=reason)

    def _record_unreported(self, engine: StepEngine, at: int) -> None:
        """The records of the steps up to ``at`` that the engine took but did not yield before the fit
        ended (``engine.unreported``): the history then ends where the variables are."""
        unreported = getattr(engine, "unreported", None)
        seconds = self.history.records[-1]["time"] if self.history.records else 0.0
        for outcome in unreported(self.step, at) if unreported is not None else ():
            if outcome.step != self.step + 1:
                break
            self.step = outcome.step
            self._record(outcome, outcome.seconds if outcome.seconds is not None else seconds, engine)

    def _record(self, outcome: StepOutcome, seconds: float, engine: StepEngine) -> None:
        rate = self.request.batch_size / seconds if seconds > 0 else float("inf")
        tags = self.events.tags
        event = Step(
            session=tags.get("session", ""),
            graph=tags.get("graph", ""),
            step=outcome.step,
            time=seconds,
            samples_per_s=rate,
            fetches=dict(outcome.fetches),
            metrics=dict(outcome.metrics),
            stats=dict(outcome.stats),
        )
        record = event.record()
        elapsed = outcome.elapsed if outcome.elapsed is not None else time.perf_counter() - self.started_at
        record["elapsed"] = float(elapsed)
        validated = None
        if self.validation is not None and outcome.step % self.validation.every == 0:
            validated = Validated(**tags, **self.validation.evaluate(engine, outcome.step))
            record.update(validated.record())
        self.history.append(record)
        if outcome.stats:
            self.history.stats[outcome.step] = dict(outcome.stats)
        self.events.emit(event)
        if validated is not None:
            self.events.emit(validated)
        if self.callback is not None:
            self.callback(record)

    def _checkpoint(self, engine: StepEngine, step: int) -> None:
        variables, at = engine.variables()
        if at != step:
            raise RuntimeError(f"step engine {engine.strategy!r} holds step {at}'s variables, not step {step}'s")
        extra = getattr(engine, "checkpoint_state", None)  # optional: state beyond the graph's variables
        checkpoint.save_step(self.checkpoint_dir, {**variables, **(extra() if extra is not None else {})}, step)


class LocalSteps:
    """The local step engine: the session's compiled plan on its device, one batch a step.

    ``session`` is used through its public API only (``run`` with ``step``,
    ``variables``, ``set_variables``).
    """

    strategy = "local"
    replicas = None
    workers = None
    restarts = 0

    def __init__(self, session, request: FitRequest):
        self.session, self.request = session, request
        self.train = request.graph.get(request.train)
        self.step = 0

    def start(self, variables: dict[str, np.ndarray], step: int) -> None:
        self.session.set_variables(variables)
        self.step = step

    def run(self, first: int, last: int, sync_at: Callable[[int], bool]) -> Iterator[StepOutcome]:
        req, run = self.request, self.session.run
        n = len(next(iter(req.data.values())))
        labels, names = list(req.fetches), [self.train, *req.fetches.values()]
        indices = batch_indices(n, req.batch_size, last, seed=req.batch_seed, start=first - 1)
        # updates are applied in place as a step runs: an interrupt waits for the step's end
        # (a second one does not), so the variables are always those of a whole step
        with interrupts_at_step_boundaries() as pending:
            for step, idx in enumerate(indices, start=first):
                if pending():
                    raise KeyboardInterrupt
                started = time.perf_counter()
                batch = {**req.feeds, **{name: a[idx] for name, a in req.data.items()}}
                probed = names + list(req.stats.values()) if req.stats_due(step) else names
                timed = req.profile_every > 0 and step % req.profile_every == 0
                values = run(probed, batch, check_numerics=req.check_numerics, step=step - 1, profile=timed)
                elapsed = time.perf_counter() - started
                self.step = step
                fetched, stats = values[1 : len(names)], values[len(names) :]
                yield StepOutcome(
                    step,
                    dict(zip(labels, map(_scalar, fetched))),
                    metrics={"profile": dict(self.session.last_profile)} if timed else {},
                    seconds=elapsed,
                    stats=dict(zip(req.stats, map(_scalar, stats))),
                )
            if pending():
                raise KeyboardInterrupt

    def variables(self) -> tuple[dict[str, np.ndarray], int]:
        return self.session.variables, self.step

    def settle(self, step: int) -> tuple[dict[str, np.ndarray], int]:
        return self.variables()

    def close(self) -> None:
        pass


@contextlib.contextmanager
def interrupts_at_step_boundaries():
    """While inside, the first SIGINT is held back: ``pending()`` says whether one came (the
    caller raises KeyboardInterrupt where it is safe); a second SIGINT interrupts at once.

    Only in the main thread, and only over Python's own SIGINT handler; elsewhere nothing changes.
    """
    received: list[int] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is not signal.default_int_handler:
        yield lambda: False
        return

    def hold(signum, frame):
        received.append(signum)
        if len(received) > 1:
            signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield lambda: bool(received)
    finally:
        signal.signal(signal.SIGINT, previous)


def _scalar(value):
    if value is None:
        return None
    array = np.asarray(value)
    return float(array) if array.ndim == 0 else array
