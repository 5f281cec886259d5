"""Spans of cluster steps: worker clocks put on the scheduler's, and the parameter-server engine's tasks.

The replicas of the all-reduce and strategy engines record :class:`~workbench.spans.Marks` with
:func:`worker_marks`: the worker's clock offset to the scheduler comes with them (Dask's own
estimate, ``Worker.scheduler_delay``, kept up to date by the heartbeats), so the client puts every
worker on the scheduler's clock instead of assuming the machines agree. The parameter-server
engine's tasks record a :func:`task_mark` each, passed down the reduction tree; :func:`task_spans`
lays them out.
"""

from __future__ import annotations

import time

from workbench.spans import Lanes, new_marks, span, tracing


__all__ = ["Lanes", "clock_offset", "scheduler_now", "task_mark", "task_spans", "worker_marks"]


def clock_offset() -> float:
    """Seconds to add to this process's ``time.time()`` to read the scheduler's clock (0 outside a worker)."""
    try:
        from distributed import get_worker

        return float(get_worker().scheduler_delay)
    except (ImportError, ValueError, AttributeError):
        return 0.0


def scheduler_now(client) -> float:
    """The scheduler's clock now, read once from the client (half the round trip added)."""
    before = time.time()
    try:
        remote = float(client.run_on_scheduler(time.time))
    except Exception:  # an older or locked-down scheduler: the client's clock stands in
        return time.time()
    return remote + (time.time() - before) / 2


def worker_marks():
    """A replica task's marks, with this worker's clock offset to the scheduler's (nothing with tracing off)."""
    return new_marks(clock_offset()) if tracing() else new_marks()


# -- a delay for tests: one rank made late every step, to check that the waits are blamed on it ------

_DELAYS: dict[int, float] = {}


def delay_rank(rank: int, seconds: float) -> None:
    """Make replica ``rank`` of every all-reduce fit on this worker process sleep ``seconds`` before each
    step's compute (run it on the workers with ``client.run``; ``seconds=0`` undoes it). For tests."""
    if seconds:
        _DELAYS[int(rank)] = float(seconds)
    else:
        _DELAYS.pop(int(rank), None)


def injected_delay(rank: int) -> float:
    """What :func:`delay_rank` asked of ``rank`` (0.0 when nothing)."""
    return _DELAYS.get(rank, 0.0) if _DELAYS else 0.0


# -- the parameter-server engine: one task per replica, a reduction tree and an update, per step ---------


def task_mark(worker: str, phase: str, started: float, inputs=()) -> list:
    """A finished task's mark: ``[worker, phase, start, end, offset, inputs]`` in the worker's clock with its
    offset to the scheduler's; ``inputs`` are the marks of the tasks whose results it took (their worker
    and end tell who it waited for)."""
    return [worker, phase, started, time.time(), clock_offset(), [[m[0], m[3], m[4]] for m in inputs]]


def task_spans(lanes: Lanes, step: int, marks: list) -> list[dict]:
    """The spans of one parameter-server step from its tasks' marks (replica tasks first, in replica order).

    A task that took another worker's result waited, from where its lane last ended until that result
    was made, for that worker (the input made last); from then until it started, the result travelled
    (``communicate``); other gaps in a lane are ``idle``.
    """
    spans: list[dict] = []
    ranks: dict[str, int] = {}
    for m in marks:
        if m[1] == "compute":
            ranks.setdefault(m[0], len(ranks))

    def clock(worker, t, offset):
        return t + lanes.offset(worker, offset) - lanes.origin

    placed = sorted(
        (clock(w, start, off), clock(w, end, off), w, phase, inputs) for w, phase, start, end, off, inputs in marks
    )
    for start, end, worker, phase, inputs in placed:
        rank = ranks.get(worker, -1)
        cursor = lanes.ends.get(worker, start)
        start, end = max(start, cursor), max(end, cursor)
        remote = [(clock(who, made, off), who) for who, made, off in inputs if who != worker]
        if remote:
            made, who = max(remote)
            if made > cursor:
                spans.append(span(worker, rank, step, "wait", cursor, min(made, start), waiting_for=who))
                cursor = min(made, start)
            if start > cursor:
                spans.append(span(worker, rank, step, "communicate", cursor, start, detail="transfer"))
        elif start > cursor:
            spans.append(span(worker, rank, step, "idle", cursor, start))
        if end > start:
            spans.append(span(worker, rank, step, phase, start, end))
        lanes.ends[worker] = max(end, lanes.ends.get(worker, end))
    return [s for s in spans if s["end"] > s["start"]]
