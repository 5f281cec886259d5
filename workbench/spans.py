"""Spans of a replicated step: what each replica did when, recorded as marks, laid out as spans.

A replica's step records a few wall-clock marks (:class:`Marks`): when it began, each phase it went
through (``compute``, the wait at a ``collective``, ``update``), when its plan's backward pass began
(:attr:`workbench.graph.plan.Plan.backward_began`) and, for every collective, when this rank handed
its part in (its *arrival*), with the offset from its process's clock to the one clock all lanes
share (on a cluster the scheduler's, Dask's own estimate; see :mod:`workbench.cluster.spans`).

:class:`Lanes` turns one step's marks into spans (see :mod:`workbench.timeline`): the time a rank spent
at a collective before the last of its peers arrived is ``wait``, with ``waiting_for`` that peer's
worker; the rest of it is ``communicate`` (moving and summing bytes); the gap since the worker's
previous task is ``idle``; ``compute`` is split where the backward pass began into ``"part":
"forward"`` and ``"part": "backward"``. A barrier makes every worker's step equally long; only the
arrivals tell who was late, and they are what the waits are blamed on.

Laying a step out costs a few microseconds a span, more than recording its marks: :meth:`Lanes.record`
keeps the marks and returns a :class:`StepSpans` that lays them out when first read (by
:meth:`workbench.History.timeline`, a :class:`~workbench.widgets.TimelineView`, the dashboard), so a
fit that nobody watches pays for the marks only (``bench/timeline_overhead.py`` measures both).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

__all__ = ["Lanes", "Marks", "StepSpans", "new_marks", "set_tracing", "span", "tracing"]

_TRACING = [True]  # on by default: a few clock reads per step (bench/timeline_overhead.py measures it)


def set_tracing(on: bool) -> None:
    """Record spans in this process's replicas (``client.run(set_tracing, False)`` turns them off on the
    workers; the timeline is then empty)."""
    _TRACING[0] = bool(on)


class Marks:
    """One task's marks, in this process's wall clock; :meth:`as_dict` is what the task returns."""

    __slots__ = ("offset", "begin", "phases", "arrivals", "backward")

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.begin = time.time()
        self.phases: list = []  # [phase, start, end] or ["collective", start, end, key]
        self.arrivals: dict = {}  # collective key -> when this rank handed its part in
        self.backward: float | None = None  # when the plan's backward pass began (None: no split)

    def phase(self, name: str, start: float, end: float, key: str | None = None) -> None:
        self.phases.append([name, start, end] if key is None else [name, start, end, key])

    def arrived(self, key: str, at: float | None = None) -> None:
        self.arrivals[key] = time.time() if at is None else at

    def backward_began(self, at: float | None) -> None:
        """When the step's backward pass began (``Plan.backward_began`` after the run; None: the plan has
        none): its compute is laid out as a ``forward`` and a ``backward`` part, split there."""
        self.backward = at

    def as_dict(self) -> dict:
        return {
            "offset": self.offset,
            "begin": self.begin,
            "phases": self.phases,
            "arrivals": self.arrivals,
            "backward": self.backward,
        }


class _NoMarks:
    """What a replica records with tracing off: nothing."""

    __slots__ = ()

    def phase(self, name, start, end, key=None) -> None:
        pass

    def arrived(self, key, at=None) -> None:
        pass

    def backward_began(self, at) -> None:
        pass

    def as_dict(self) -> None:
        return None


_NO_MARKS = _NoMarks()


def tracing() -> bool:
    """Whether this process records spans (see :func:`set_tracing`)."""
    return _TRACING[0]


def new_marks(offset: float = 0.0) -> Marks | _NoMarks:
    """A task's marks (``offset``: seconds from this process's clock to the shared one); nothing to fill
    when tracing is off (see :func:`set_tracing`)."""
    return Marks(offset) if _TRACING[0] else _NO_MARKS


REANCHOR = 0.25  # seconds: a worker's clock offset that moved further than this was set anew


def span(worker, replica, step, phase, start, end, **extra) -> dict:
    return {"worker": worker, "replica": replica, "step": step, "phase": phase, "start": start, "end": end, **extra}


class StepSpans(Sequence):
    """One step's spans, laid out from its marks when first read (see :meth:`Lanes.record`).

    A read-only sequence of span dicts that compares equal to the list of them and is pickled or
    copied as that list.
    """

    __slots__ = ("_lanes", "step", "_marked", "_spans")

    def __init__(self, lanes: Lanes, step: int, marked: list) -> None:
        self._lanes, self.step, self._marked = lanes, step, marked
        self._spans: list[dict] | None = None

    def _laid_out(self) -> list[dict]:
        if self._spans is None:
            self._lanes._catch_up(self)
        return self._spans

    def __len__(self) -> int:
        return len(self._laid_out())

    def __getitem__(self, index):
        return self._laid_out()[index]

    def __iter__(self):
        return iter(self._laid_out())

    def __eq__(self, other) -> bool:
        if isinstance(other, StepSpans):
            other = other._laid_out()
        return self._laid_out() == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment] - a list's equality, a list's unhashability

    def __add__(self, other) -> list[dict]:
        return self._laid_out() + list(other)

    def __radd__(self, other) -> list[dict]:
        return list(other) + self._laid_out()

    def __reduce__(self):
        return list, (self._laid_out(),)

    def __repr__(self) -> str:
        return repr(self._laid_out())


class Lanes:
    """Turns each step's marks into spans, keeping where each worker's lane last ended (for ``idle``).

    Parameters
    ----------
    origin : float
        The scheduler's clock when the fit started (:func:`scheduler_now`); spans are seconds since.
    """

    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.ends: dict[str, float] = {}
        self.offsets: dict[str, float] = {}
        self._queue: deque[StepSpans] = deque()  # recorded steps not laid out yet, oldest first
        self._lock = threading.Lock()  # a timeline may be read in another thread while the fit runs

    def offset(self, worker: str, reported: float) -> float:
        """The clock offset used for ``worker``: the first it reported, so that its lane keeps its own
        clock's order (each heartbeat's estimate moves by a round trip's jitter); a new estimate
        further than ``REANCHOR`` seconds from it (the machine's clock was set) replaces it."""
        held = self.offsets.get(worker)
        if held is None or abs(reported - held) > REANCHOR:
            self.offsets[worker] = held = reported
        return held

    def step(self, step: int, results: list[dict]) -> list[dict]:
        """The spans of ``step`` from its replicas' results (each with ``worker``, ``rank``, ``marks``),
        laid out now (after any step :meth:`record` holds)."""
        with self._lock:
            self._lay_out_queue(None)
            return self._lay_out(step, _marked(results))

    def record(self, step: int, results: list[dict]) -> StepSpans:
        """The spans of ``step`` as :meth:`step` lays them out, but laid out when first read: until then
        only each replica's marks are kept (and the bytes it moved). Steps are laid out in the order
        they were recorded, whichever is read first."""
        spans = StepSpans(self, step, _marked(results))
        with self._lock:
            self._queue.append(spans)
        return spans

    def _catch_up(self, spans: StepSpans) -> None:
        with self._lock:
            self._lay_out_queue(spans)

    def _lay_out_queue(self, until: StepSpans | None) -> None:
        """Lay out the recorded steps, oldest first, up to ``until`` (all of them: None)."""
        while self._queue and (until is None or until._spans is None):
            held = self._queue[0]  # left queued if its layout fails: the next read fails the same way
            held._spans, held._marked = self._lay_out(held.step, held._marked), None
            self._queue.popleft()

    def _lay_out(self, step: int, marked: list[tuple]) -> list[dict]:
        latest: dict = {}  # collective key -> the two latest arrivals [(time, worker)], latest first
        for worker, _, marks, _, _ in marked:
            shift = self.offset(worker, marks["offset"]) - self.origin
            for key, t in marks["arrivals"].items():
                top = latest.setdefault(key, [])
                top.append((t + shift, worker))
                if len(top) > 2:
                    top.sort(reverse=True)
                    del top[2:]
        for top in latest.values():
            top.sort(reverse=True)
        spans: list[dict] = []
        for worker, rank, marks, sent, received in marked:
            spans.extend(self._lane(step, worker, rank, marks, int(sent) + int(received), latest))
        return spans

    def _lane(self, step: int, worker: str, rank: int, marks: dict, moved: int, latest: dict) -> list[dict]:
        shift = self.offset(worker, marks["offset"]) - self.origin
        backward = marks.get("backward")
        backward = None if backward is None else backward + shift
        out: list[dict] = []

        def put(phase, start, end, extra):
            last = out[-1] if out else None
            if (
                last is not None
                and last["phase"] == phase
                and last["end"] >= start
                and (not extra or extra.keys() == {"part"})
                and len(last) == 6 + len(extra)
                and last.get("part") == extra.get("part")
            ):
                last["end"] = end  # one span for back-to-back stretches of one phase (and part)
            else:
                out.append(span(worker, rank, step, phase, start, end, **extra))

        def add(phase, start, end, **extra):
            if end <= start:
                return
            if phase == "compute" and backward is not None:  # forward until the backward pass began
                if start < backward < end:
                    put(phase, start, backward, {"part": "forward"})
                    start = backward
                extra["part"] = "forward" if end <= backward else "backward"
            put(phase, start, end, extra)

        begin = marks["begin"] + shift
        previous = self.ends.get(worker)
        if previous is not None:  # a task that began while the last step still ran (a window) waited its turn
            add("idle", previous, begin)
            begin = max(begin, previous)
        cursor = begin
        collectives = sum(1 for p in marks["phases"] if p[0] == "collective") or 1
        for phase in marks["phases"]:
            start, end = max(phase[1] + shift, cursor), max(phase[2] + shift, cursor)
            if start > cursor:  # between marked phases: waiting its turn, settling the last step's sends
                add("communicate", cursor, start, detail="settle")
            if phase[0] != "collective":
                add(phase[0], start, end)
            else:
                key = phase[3]
                own = marks["arrivals"].get(key)
                peer = next((a for a in latest.get(key, ()) if a[1] != worker), None)
                self._collective(add, start, end, None if own is None else own + shift, peer, moved // collectives)
            cursor = max(cursor, end)
        self.ends[worker] = cursor
        return out

    @staticmethod
    def _collective(add, start: float, end: float, arrived, peer, moved: int) -> None:
        """Time at a collective: late by its own doing until it handed in, then waiting for the last
        peer to arrive (``peer``: its arrival and worker), then communicating."""
        if arrived is not None and arrived > start:  # handed in after the phase began: still its own work
            add("compute", start, min(arrived, end))
            start = min(arrived, end)
        if peer is not None and peer[0] > start:
            add("wait", start, min(peer[0], end), waiting_for=peer[1])
            start = min(peer[0], end)
        add("communicate", start, end, bytes=moved)


def _marked(results: list[dict]) -> list[tuple]:
    """``(worker, rank, marks, bytes sent, bytes received)`` of each result that has marks: all a lane is
    laid out from (kept as they are: the layout does the arithmetic)."""
    return [
        (r["worker"], r.get("rank", 0), r["marks"], r.get("bytes_sent", 0), r.get("bytes_received", 0))
        for r in results
        if r.get("marks")
    ]
