"""Spans of a replicated step: what each replica did when, recorded as marks, laid out as spans.

A replica's step records a few wall-clock marks (:class:`Marks`): when it began, each phase it went
through (``compute``, the wait at a ``collective``, ``update``) and, for every collective, when this
rank handed its part in (its *arrival*), with the offset from its process's clock to the one clock
all lanes share (on a cluster the scheduler's, Dask's own estimate; see
:mod:`workbench.cluster.spans`).

:class:`Lanes` turns one step's marks into spans (see :mod:`workbench.timeline`): the time a rank spent
at a collective before the last of its peers arrived is ``wait``, with ``waiting_for`` that peer's
worker; the rest of it is ``communicate`` (moving and summing bytes); the gap since the worker's
previous task is ``idle``. A barrier makes every worker's step equally long; only the arrivals tell
who was late, and they are what the waits are blamed on.
"""

from __future__ import annotations

import time

__all__ = ["Lanes", "Marks", "new_marks", "set_tracing", "span", "tracing"]

_TRACING = [True]  # on by default: a few clock reads per step (bench/timeline_overhead.py measures it)


def set_tracing(on: bool) -> None:
    """Record spans in this process's replicas (``client.run(set_tracing, False)`` turns them off on the
    workers; the timeline is then empty)."""
    _TRACING[0] = bool(on)


class Marks:
    """One task's marks, in this process's wall clock; :meth:`as_dict` is what the task returns."""

    __slots__ = ("offset", "begin", "phases", "arrivals")

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.begin = time.time()
        self.phases: list = []  # [phase, start, end] or ["collective", start, end, key]
        self.arrivals: dict = {}  # collective key -> when this rank handed its part in

    def phase(self, name: str, start: float, end: float, key: str | None = None) -> None:
        self.phases.append([name, start, end] if key is None else [name, start, end, key])

    def arrived(self, key: str, at: float | None = None) -> None:
        self.arrivals[key] = time.time() if at is None else at

    def as_dict(self) -> dict:
        return {"offset": self.offset, "begin": self.begin, "phases": self.phases, "arrivals": self.arrivals}


class _NoMarks:
    """What a replica records with tracing off: nothing."""

    __slots__ = ()

    def phase(self, name, start, end, key=None) -> None:
        pass

    def arrived(self, key, at=None) -> None:
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

    def offset(self, worker: str, reported: float) -> float:
        """The clock offset used for ``worker``: the first it reported, so that its lane keeps its own
        clock's order (each heartbeat's estimate moves by a round trip's jitter); a new estimate
        further than ``REANCHOR`` seconds from it (the machine's clock was set) replaces it."""
        held = self.offsets.get(worker)
        if held is None or abs(reported - held) > REANCHOR:
            self.offsets[worker] = held = reported
        return held

    def step(self, step: int, results: list[dict]) -> list[dict]:
        """The spans of ``step`` from its replicas' results (each with ``worker``, ``rank``, ``marks``)."""
        marked = [r for r in results if r.get("marks")]
        latest: dict = {}  # collective key -> the two latest arrivals [(time, worker)], latest first
        for r in marked:
            shift = self.offset(r["worker"], r["marks"]["offset"]) - self.origin
            for key, t in r["marks"]["arrivals"].items():
                top = latest.setdefault(key, [])
                top.append((t + shift, r["worker"]))
                if len(top) > 2:
                    top.sort(reverse=True)
                    del top[2:]
        for top in latest.values():
            top.sort(reverse=True)
        spans: list[dict] = []
        for r in marked:
            spans.extend(self._lane(step, r, latest))
        return spans

    def _lane(self, step: int, result: dict, latest: dict) -> list[dict]:
        marks, worker, rank = result["marks"], result["worker"], result.get("rank", 0)
        shift = self.offset(worker, marks["offset"]) - self.origin
        out: list[dict] = []

        def add(phase, start, end, **extra):
            if end <= start:
                return
            last = out[-1] if out else None
            if last is not None and not extra and last["phase"] == phase and len(last) == 6 and last["end"] >= start:
                last["end"] = end  # one span for back-to-back stretches of one phase
            else:
                out.append(span(worker, rank, step, phase, start, end, **extra))

        begin = marks["begin"] + shift
        previous = self.ends.get(worker)
        if previous is not None:  # a task that began while the last step still ran (a window) waited its turn
            add("idle", previous, begin)
            begin = max(begin, previous)
        cursor = begin
        moved = int(result.get("bytes_sent", 0)) + int(result.get("bytes_received", 0))
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
