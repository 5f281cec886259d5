"""Typed execution events and the small publish/subscribe stream that carries them.

The execution layer emits events (a plan compiled, a run started, a training
step finished, ...); widgets, training histories and scaling studies subscribe.
Nothing that emits knows who listens.

Every event is a small frozen dataclass that says where it comes from:
``session`` is the token of the session (or scaling study) that emitted it and
``graph`` the token of the graph it concerns (:attr:`workbench.Graph.token`).
Tokens are random strings, never reused the way ``id()`` is. Consumers
dispatch on the event's type; a user's fetch may be called anything, since
fetched values live in :attr:`Step.fetches`, apart from the engine's numbers.

For code written against the earlier dict events, an event also reads like a
mapping (``event["kind"]``, ``event["step"]``, ``event.get("loss")``), and
``stream.emit("step", step=1, ...)`` builds the typed event of that kind.
"""

from __future__ import annotations

import contextvars

import uuid
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar
from collections.abc import Callable, Mapping


def new_token(prefix: str) -> str:
    """A fresh identity token such as ``"session-3f2a9c0d41be"``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, kw_only=True)
class Event:
    """What every event carries: who emitted it and which graph it concerns.

    Attributes
    ----------
    session : str
        Token of the emitting session (``Session.token``) or scaling study.
    graph : str
        Token of the graph (``Graph.token``), or "" when none applies.
    """

    kind: ClassVar[str] = "event"
    session: str = ""
    graph: str = ""

    def __getitem__(self, key: str) -> Any:
        if key == "kind":
            return self.kind
        if key in self._field_names():
            return getattr(self, key)
        raise KeyError(f"{self.kind} events have no field {key!r}")

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: str) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_fields(cls, **values: Any) -> Event:
        """The event from keyword fields (what ``stream.emit(kind, **fields)`` calls)."""
        return cls(**values)


_MISSING = object()


@dataclass(frozen=True, kw_only=True)
class PlanCompiled(Event):
    """A session compiled a plan: for ``fetches``, ``ops`` graph ops became ``steps`` kernel calls."""

    kind: ClassVar[str] = "plan_compiled"
    fetches: tuple = ()
    ops: int = 0
    steps: int = 0
    seconds: float = 0.0
    device: str = "cpu"


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    """A run of a plan started; ``ops`` are the graph's ops it runs, in order."""

    kind: ClassVar[str] = "run_started"
    ops: tuple = ()


@dataclass(frozen=True, kw_only=True)
class RunFinished(Event):
    kind: ClassVar[str] = "run_finished"


@dataclass(frozen=True, kw_only=True)
class RunFailed(Event):
    """A run failed at ``op`` (None when no single op is to blame) with ``error``."""

    kind: ClassVar[str] = "run_failed"
    op: str | None = None
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class FitStarted(Event):
    """``Session.fit`` started: ``steps`` in all, from ``start`` (a resumed checkpoint's step).

    ``fetches`` are the labels of the recorded fetches; ``strategy`` is the step
    engine (``"local"``, ``"allreduce"``, ``"parameter_server"``, ...) and ``reason``
    says why, when ``fit`` chose it for one (the default could not train this fit); ``replicas`` and
    ``workers`` are set on a cluster, and ``scheduler`` (its address) where the
    engine runs on one; ``graph_name`` is the graph's name, for displays.
    """

    kind: ClassVar[str] = "fit_started"
    steps: int = 0
    batch_size: int = 0
    fetches: tuple = ()
    start: int = 0
    strategy: str = "local"
    reason: str = ""
    replicas: int | None = None
    workers: int | None = None
    graph_name: str = ""
    scheduler: str | None = None
    study: str = ""  # the token of the scaling study this fit measures ("" for a fit of its own)


@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """One training step finished.

    Attributes
    ----------
    step : int
        1-based step number.
    time, samples_per_s : float
        Wall-clock seconds of the step as the loop saw it, and the throughput.
    fetches : mapping
        The user's fetches by label (any label: they never collide with the fields).
    metrics : mapping
        What the step engine measured. Cluster engines report ``replicas``,
        ``compute_seconds``, ``reduce_seconds``, ``update_seconds``, ``workers``
        (busy seconds per worker address), ``bytes_moved`` and ``dropped``; the
        ``allreduce`` engine also ``bytes_received`` and ``bytes_sent`` (counted, the
        most of one worker), ``tasks`` and ``restarts``.
    stats : mapping
        On the steps where ``fit(..., stats=k)`` fetched them: the model's statistics by
        ``"<op>/<stat>"`` (see :mod:`workbench.graph.probes`); empty on other steps. Not
        part of :meth:`record` (:attr:`workbench.History.stats` keeps them).
    """

    kind: ClassVar[str] = "step"
    step: int
    time: float = 0.0
    samples_per_s: float = 0.0
    fetches: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    stats: Mapping[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The flat record :class:`workbench.History` keeps for this step."""
        return {
            "step": self.step,
            "time": self.time,
            "samples_per_s": self.samples_per_s,
            **self.fetches,
            **self.metrics,
        }

    def __getitem__(self, key: str) -> Any:
        if key == "kind" or key in self._field_names():
            return super().__getitem__(key)
        if key in self.fetches:
            return self.fetches[key]
        if key in self.metrics:
            return self.metrics[key]
        raise KeyError(f"step events have no field or fetch {key!r}")

    @classmethod
    def from_fields(cls, **values: Any) -> Step:
        """Fields by name; any other keyword is taken as a fetch (the earlier dict events' layout)."""
        known = {k: values.pop(k) for k in cls._field_names() if k in values}
        fetches = dict(known.pop("fetches", {}))
        fetches.update(values)
        return cls(fetches=fetches, **known)


@dataclass(frozen=True, kw_only=True)
class Validated(Event):
    """``fit(..., validation=(data, k))`` evaluated the fetches on the held-out data after ``step``.

    ``fetches`` holds the values by the fetches' labels (``History`` records them as
    ``val_<label>``); ``examples`` is the size of the held-out data.
    """

    kind: ClassVar[str] = "validated"
    step: int = 0
    fetches: Mapping[str, Any] = field(default_factory=dict)
    examples: int = 0

    def record(self) -> dict[str, Any]:
        """The fields :class:`workbench.History` adds to the step's record: ``val_<label>``."""
        return {f"val_{label}": value for label, value in self.fetches.items()}


@dataclass(frozen=True, kw_only=True)
class Synced(Event):
    """A cluster fit brought step ``step``'s variables to the client (a recovery point)."""

    kind: ClassVar[str] = "synced"
    step: int = 0


@dataclass(frozen=True, kw_only=True)
class Restarted(Event):
    """A cluster fit lost work and continues from the host copy of ``step`` (try ``attempt``)."""

    kind: ClassVar[str] = "restarted"
    step: int = 0
    attempt: int = 0


@dataclass(frozen=True, kw_only=True)
class FitFinished(Event):
    kind: ClassVar[str] = "fit_finished"
    steps: int = 0
    restarts: int = 0


@dataclass(frozen=True, kw_only=True)
class FitInterrupted(Event):
    """A fit ended early, after ``step`` (the step whose variables the session now holds).

    ``reason`` is ``"stopped"`` (a stop request: the view's Stop button,
    ``Session.request_stop``; ``fit`` returns normally) or ``"interrupted"``
    (``KeyboardInterrupt``, the notebook's interrupt; ``fit`` re-raises it).
    """

    kind: ClassVar[str] = "fit_interrupted"
    step: int = 0
    steps: int = 0
    reason: str = "stopped"


@dataclass(frozen=True, kw_only=True)
class FitFailed(Event):
    """A fit failed after ``step`` (the last step recorded) with ``error`` (its message)."""

    kind: ClassVar[str] = "fit_failed"
    step: int = 0
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class NodeState(Event):
    """One op of ``graph`` changed state (``"waiting"``, ``"running"``, ``"done"``, ``"error"``)."""

    kind: ClassVar[str] = "node_state"
    op: str = ""
    state: str = "done"


@dataclass(frozen=True, kw_only=True)
class ScalingStarted(Event):
    """A scaling study started; ``session`` is the study's token."""

    kind: ClassVar[str] = "scaling_started"
    workers: tuple = ()
    batch_size: int = 0
    steps: int = 0


@dataclass(frozen=True, kw_only=True)
class ScalingPoint(Event):
    kind: ClassVar[str] = "scaling_point"
    workers: int = 0
    samples_per_s: float = 0.0
    speedup: float = 0.0
    efficiency: float = 0.0
    step_seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ScalingFinished(Event):
    """A scaling study ended: its measured ``rows``, and when it predicted, the ``predictions``
    (rows with a ``strategy``) and the ``assumptions`` they rest on, in words."""

    kind: ClassVar[str] = "scaling_finished"
    rows: tuple = ()
    predictions: tuple = ()
    assumptions: tuple = ()


@dataclass(frozen=True, kw_only=True)
class GraphCapture(Event):
    """A GPU device decided about replaying a plan as a CUDA graph: ``status`` is
    ``"captured"`` (for the feed ``signature``), ``"skipped"`` (with the ``reason``)
    or ``"dropped"`` (the variables' arrays changed; captured again later)."""

    kind: ClassVar[str] = "graph_capture"
    status: str = ""
    reason: str | None = None
    signature: tuple | None = None
    steps: int = 0


@dataclass(frozen=True, kw_only=True)
class ClusterClosed(Event):
    """This process closed its client of the cluster at ``scheduler`` (and the cluster, when it started it)."""

    kind: ClassVar[str] = "cluster_closed"
    scheduler: str = ""
    shut_down: bool = True  # False: only disconnected from (a cluster reached by address keeps running)


#: The scaling study whose fits run now (its token), in this context: their FitStarted say so.
current_study: contextvars.ContextVar[str] = contextvars.ContextVar("workbench_study", default="")


#: Every event class by its ``kind``.
KINDS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        PlanCompiled,
        RunStarted,
        RunFinished,
        RunFailed,
        FitStarted,
        Step,
        Validated,
        Synced,
        Restarted,
        FitFinished,
        FitInterrupted,
        FitFailed,
        NodeState,
        ScalingStarted,
        ScalingPoint,
        ScalingFinished,
        GraphCapture,
        ClusterClosed,
    )
}
Listener = Callable[[Event], None]


def make_event(kind: str | type[Event], **values: Any) -> Event:
    """The event of ``kind`` (a name from :data:`KINDS` or an event class) with ``values``."""
    cls = KINDS.get(kind) if isinstance(kind, str) else kind
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; kinds are {', '.join(sorted(KINDS))}")
    return cls.from_fields(**values)


def as_event(event: Event | Mapping[str, Any]) -> Event:
    """``event`` itself, or the typed event of a dict with a ``"kind"`` (the earlier layout)."""
    if isinstance(event, Event):
        return event
    values = dict(event)
    return make_event(values.pop("kind", None), **values)


class EventStream:
    """Listeners called in subscription order with one :class:`Event` each.

    ``tags`` (``session``, ``graph``) fill those fields of the events this
    stream builds; events given whole are passed on as they are.

    >>> stream = EventStream(session="s1")
    >>> seen = []
    >>> unsubscribe = stream.subscribe(seen.append)
    >>> stream.emit(Synced, step=1)
    >>> seen
    [Synced(session='s1', graph='', step=1)]
    >>> unsubscribe()
    >>> stream.emit(Synced, step=2)
    >>> len(seen)
    1
    """

    __slots__ = ("_listeners", "parent", "tags")

    def __init__(self, parent: EventStream | None = None, **tags: Any) -> None:
        self._listeners: list[Listener] = []
        self.parent = parent  # also receives every event
        self.tags = tags

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every later event; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, event: Event | type[Event] | str, /, **values: Any) -> None:
        """Send one event to every listener (and to the parent stream's).

        ``event`` is an :class:`Event`, or an event class or kind name built with
        this stream's tags and ``values`` (only when somebody listens).
        """
        if not self.wanted:
            return
        if not isinstance(event, Event):
            event = make_event(event, **{**self.tags, **values})
        for listener in list(self._listeners):
            listener(event)
        if self.parent is not None and self.parent.wanted:
            self.parent.emit(event)

    @property
    def wanted(self) -> bool:
        """Whether anybody listens, here or upstream: emitters can skip building costly events."""
        return bool(self._listeners) or (self.parent is not None and self.parent.wanted)


#: Every session's events also reach this stream. The notebook layer listens here
#: to show progress for any session.
ROOT = EventStream()
