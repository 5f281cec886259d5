"""Where each worker's time went: the spans of a fit's steps, and what they add up to.

Every step engine reports, with each step, the spans of its workers (``metrics["spans"]``):
one dict per stretch of one worker's time, with

- ``worker``: the worker's address (a replica's name in the one-process simulation);
- ``replica``: the replica's rank;
- ``step``: the 1-based step;
- ``phase``: ``"compute"`` (forward and backward: with ``part`` ``"forward"`` or ``"backward"`` where
  the engine's plan tells them apart), ``"communicate"`` (bytes on the wire, with
  ``bytes``), ``"wait"`` (blocked on peers, with ``waiting_for``: the worker that arrived last),
  ``"update"`` (the optimizer) or ``"idle"`` (between the worker's tasks);
- ``start`` and ``end``: seconds since the fit started, every worker on one clock.

:meth:`workbench.History.timeline` gathers them into a :class:`Timeline`.

Examples
--------
>>> tl = Timeline([
...     {"worker": "a", "replica": 0, "step": 1, "phase": "compute", "start": 0.0, "end": 0.25},
...     {"worker": "a", "replica": 0, "step": 1, "phase": "wait", "start": 0.25, "end": 0.5, "waiting_for": "b"},
...     {"worker": "b", "replica": 1, "step": 1, "phase": "compute", "start": 0.0, "end": 0.5},
... ])
>>> tl.stragglers()
[('b', 0.25), ('a', 0.0)]
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

PHASES = ("compute", "communicate", "wait", "update", "idle")


class Timeline:
    """The spans of a fit, per worker and step (see the module's docstring for a span's fields).

    Parameters
    ----------
    spans : iterable of dict
        The spans, in any order; kept sorted by worker, then start.
    """

    def __init__(self, spans=()) -> None:
        self.spans: list[dict] = sorted((dict(s) for s in spans), key=lambda s: (str(s["worker"]), s["start"]))

    # -- what is in it ----------------------------------------------------------------------------
    @property
    def workers(self) -> list[str]:
        """The workers, by replica rank (then address)."""
        ranks: dict[str, int] = {}
        for s in self.spans:
            ranks.setdefault(s["worker"], s.get("replica", 0))
        return sorted(ranks, key=lambda w: (ranks[w], str(w)))

    @property
    def steps(self) -> list[int]:
        """The steps that have spans, in order."""
        return sorted({s["step"] for s in self.spans})

    def step(self, step: int) -> Timeline:
        """The spans of one step."""
        return Timeline(s for s in self.spans if s["step"] == step)

    def window(self, first: int, last: int) -> Timeline:
        """The spans of steps ``first..last``."""
        return Timeline(s for s in self.spans if first <= s["step"] <= last)

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        if not self.spans:
            return "<Timeline: no spans>"
        steps = self.steps
        return f"<Timeline: {len(self.workers)} workers, steps {steps[0]}..{steps[-1]}, {len(self.spans)} spans>"

    # -- what it adds up to -----------------------------------------------------------------------
    def _per_step(self) -> dict:
        """worker -> phase -> step -> seconds."""
        table: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
        for s in self.spans:
            table[s["worker"]][s["phase"]][s["step"]] += s["end"] - s["start"]
        return table

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """Seconds per phase per worker: ``{worker: {phase: {"total", "median", "spread"}}}``.

        ``median`` is the median over the steps of the seconds one step spent in the phase (a step
        without the phase counts as 0), ``spread`` the distance between the 10th and 90th percentiles
        of the same numbers, ``total`` their sum over the fit.
        """
        steps = self.steps
        out: dict = {}
        for worker, phases in self._per_step().items():
            out[worker] = {}
            for phase in [p for p in PHASES if p in phases] + sorted(set(phases) - set(PHASES)):
                seconds = np.asarray([phases[phase].get(k, 0.0) for k in steps], dtype=np.float64)
                low, high = np.percentile(seconds, [10, 90])
                out[worker][phase] = {
                    "total": float(seconds.sum()),
                    "median": float(np.median(seconds)),
                    "spread": float(high - low),
                }
        return {w: out[w] for w in self.workers if w in out}

    def stragglers(self) -> list[tuple[str, float]]:
        """``(worker, seconds_per_step)`` for every worker, most first: the wait it caused the others.

        A step's wait caused by a worker is the longest that any other worker spent waiting for it
        in that step (its ``wait`` spans whose ``waiting_for`` is that worker): how long it held the
        step back. The figure is its mean over the steps of the timeline.
        """
        held: dict = defaultdict(float)  # (culprit, waiter, step) -> seconds
        for s in self.spans:
            if s["phase"] == "wait" and s.get("waiting_for") is not None:
                held[s["waiting_for"], s["worker"], s["step"]] += s["end"] - s["start"]
        longest: dict = defaultdict(float)  # (culprit, step) -> seconds
        for (culprit, _, step), seconds in held.items():
            longest[culprit, step] = max(longest[culprit, step], seconds)
        caused = dict.fromkeys(self.workers, 0.0)
        for (culprit, _), seconds in longest.items():
            caused[culprit] = caused.get(culprit, 0.0) + seconds
        steps = max(len(self.steps), 1)
        ranked = sorted(caused.items(), key=lambda item: (-item[1], str(item[0])))
        return [(worker, seconds / steps) for worker, seconds in ranked]

    def waits(self, worker: str, on: str | None = None) -> float:
        """Seconds per step ``worker`` waited (for ``on`` only, if given)."""
        total = sum(
            s["end"] - s["start"]
            for s in self.spans
            if s["worker"] == worker and s["phase"] == "wait" and (on is None or s.get("waiting_for") == on)
        )
        return total / max(len(self.steps), 1)

    def to_pandas(self):
        """The spans as a :class:`pandas.DataFrame`, one row each (pandas must be installed)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Timeline.to_pandas() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.spans)

    # -- export -----------------------------------------------------------------------------------
    def chrome_trace(self) -> dict:
        """The spans as Chrome Trace Event data (what :meth:`to_chrome_trace` writes)."""
        pids = {w: i + 1 for i, w in enumerate(self.workers)}
        events: list[dict] = []
        for worker, pid in pids.items():
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": str(worker)}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for s in self.spans:
            args = {"step": s["step"], "replica": s.get("replica", 0)}
            args.update({k: v for k, v in s.items() if k not in ("worker", "replica", "step", "phase", "start", "end")})
            events.append(
                {
                    "name": s.get("op") or s.get("part") or s["phase"],
                    "cat": s["phase"],
                    "ph": "X",
                    "pid": pids[s["worker"]],
                    "tid": 0,
                    "ts": round(s["start"] * 1e6, 3),
                    "dur": round((s["end"] - s["start"]) * 1e6, 3),
                    "args": _plain(args),
                }
            )
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def to_chrome_trace(self, path) -> str:
        """Write the spans as Chrome Trace Event JSON (Perfetto and ``chrome://tracing`` open it): one
        ``"ph": "X"`` event per span, named by its phase (or op, or a compute span's part: ``forward``,
        ``backward``), one ``pid`` per worker with the worker's address as the process name. Returns
        the path."""
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)
        return path


def _plain(values: dict) -> dict:
    """JSON-ready: NumPy numbers as Python ones."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in values.items()}


def median_profile(profiles: list[dict]) -> dict[str, float]:
    """``{op: median seconds}`` over per-step ``{op: seconds}`` tables (an op missing from a step counts 0),
    slowest first."""
    if not profiles:
        return {}
    ops = dict.fromkeys(op for p in profiles for op in p)
    medians = {op: float(np.median([p.get(op, 0.0) for p in profiles])) for op in ops}
    return dict(sorted(medians.items(), key=lambda item: -item[1]))
