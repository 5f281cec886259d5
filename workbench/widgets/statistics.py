"""The model's statistics over training steps, as a GraphView colours its nodes by them.

``Session.fit(..., stats=k)`` sends every k-th :class:`~workbench.events.Step` with
``stats``: ``{"<op>/<stat>": value}`` (see :mod:`workbench.graph.probes`). A
:class:`StepStats` keeps them (at most ``max_steps`` steps: when full, every other
step is dropped) and answers what a view draws: one value per visible node at a
step (a folded scope shows its own aggregate: the sum of its gradient norms, its largest
std, its mean of largest magnitude) and the colour scale of a statistic over all kept steps
(of those aggregates too), so a step where a layer blew up stands out.

>>> s = StepStats()
>>> s.add(10, {"layer1/w/grad_norm": 0.5, "layer2/w/grad_norm": 0.25})
>>> s.add(20, {"layer1/w/grad_norm": 40.0, "layer2/w/grad_norm": 0.5})
>>> s.add(30, {"layer2/w/grad_norm": 0.5, "layer2/b/grad_norm": 0.25})
>>> s.node_values("grad_norm", 30, collapsed={"layer2"})
{'layer2': 0.75}
>>> s.scale("grad_norm")
{'stat': 'grad_norm', 'lo': 0.25, 'hi': 40.0, 'log': True, 'signed': False}
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from workbench.widgets.layout import visible_node


def _largest(values: list[float]) -> float:
    """The value of largest magnitude (NaN and Inf first: they are what a view must show)."""
    return max(values, key=_magnitude)


def _total(values: list[float]) -> float:
    return math.fsum(values) if all(math.isfinite(v) for v in values) else _largest(values)


#: How a folded scope combines its members' values of each statistic.
AGGREGATES = {"grad_norm": _total, "std": _largest, "mean": _largest, "time": _total}

#: How each statistic is described in the view.
TITLES = {"grad_norm": "gradient norm", "mean": "activation mean", "std": "activation std", "time": "seconds per step"}


def profile_stats(profile: dict[str, float]) -> dict[str, float]:
    """``fit(profile=k)``'s ``{op: seconds}`` as statistics (``"<op>/time"``), what a view colours by.

    >>> profile_stats({"dense/matmul": 0.25})
    {'dense/matmul/time': 0.25}
    """
    return {f"{op}/time": float(seconds) for op, seconds in profile.items()}


class StepStats:
    """Statistics by step and label, thinned to at most ``max_steps`` steps."""

    def __init__(self, max_steps: int = 200):
        self.max_steps = max_steps
        self.steps: list[int] = []
        self.values: dict[int, dict[str, float]] = {}

    def add(self, step: int, stats: dict[str, Any]) -> None:
        """Keep ``stats`` (label to number) of ``step``; non-finite numbers are kept as given."""
        step = int(step)
        if step not in self.values:
            bisect.insort(self.steps, step)
        self.values[step] = {k: float(v) for k, v in stats.items() if _number(v)}
        if len(self.steps) > self.max_steps:  # keep the newest, then every other one
            kept = self.steps[::-1][::2][::-1]
            self.values = {s: self.values[s] for s in kept}
            self.steps = kept

    def clear(self) -> None:
        self.steps, self.values = [], {}

    def kinds(self) -> list[str]:
        """The statistics present (``grad_norm``, ``mean``, ``std``), in that order."""
        found = {label.rsplit("/", 1)[-1] for v in self.values.values() for label in v}
        return [k for k in TITLES if k in found]

    def nearest(self, step: int) -> int:
        """The kept step nearest ``step`` (the later one on a tie); 0 when none is kept."""
        if not self.steps:
            return 0
        i = bisect.bisect_left(self.steps, step)
        near = self.steps[max(i - 1, 0) : i + 1]
        return min(near, key=lambda s: (abs(s - step), -s))

    def node_values(self, stat: str, step: int, collapsed=()) -> dict[str, float]:
        """``stat`` at ``step`` by visible node: an op's own, or for a folded scope its aggregate
        (:data:`AGGREGATES`: the sum of its gradient norms, its largest std, its mean of largest magnitude)."""
        collapsed = set(collapsed)
        members: dict[str, list[float]] = {}
        for label, value in self.values.get(step, {}).items():
            op, _, kind = label.rpartition("/")
            if kind == stat:
                members.setdefault(visible_node(op, collapsed), []).append(value)
        combine = AGGREGATES.get(stat, _largest)
        return {node: values[0] if len(values) == 1 else combine(values) for node, values in members.items()}

    def scale(self, stat: str, collapsed=()) -> dict[str, Any]:
        """The colour scale of ``stat`` over every kept step, as the visible nodes show it (folded
        scopes by their aggregate): ``lo``/``hi`` (of the magnitudes), ``log`` (positive values
        spanning more than 10x) and ``signed`` (some value below 0)."""
        values = [
            v for step in self.values for v in self.node_values(stat, step, collapsed).values() if math.isfinite(v)
        ]
        if not values:
            return {"stat": stat, "lo": 0.0, "hi": 0.0, "log": False, "signed": False}
        signed = min(values) < 0
        sizes = [abs(v) for v in values]
        lo, hi = min(sizes), max(sizes)
        return {"stat": stat, "lo": lo, "hi": hi, "log": not signed and lo > 0 and hi > 10 * lo, "signed": signed}


def stat_fill(value: float, scale: dict) -> str:
    """The fill of a node whose statistic is ``value`` (as static/graph_view.js's ``statColor``):
    light to red with its size (on a log scale when ``scale["log"]``), blue below 0 for a signed
    statistic, dark red for NaN or Inf.

    >>> stat_fill(1.0, {"lo": 1.0, "hi": 100.0, "log": True}), stat_fill(float("nan"), {})
    ('hsl(40, 70%, 95%)', '#a40e26')
    """
    if not math.isfinite(value):
        return "#a40e26"
    lo, hi = scale.get("lo", 0.0), scale.get("hi", 0.0)
    if scale.get("signed"):
        t = abs(value) / hi if hi > 0 else 0.0
    elif scale.get("log"):
        t = (math.log10(max(value, lo)) - math.log10(lo)) / max(math.log10(hi) - math.log10(lo), 1e-12)
    else:
        t = (value - lo) / (hi - lo) if hi > lo else 0.5
    t = min(max(t, 0.0), 1.0)
    hue = 212 if scale.get("signed") and value < 0 else 40 - 38 * t
    return f"hsl({hue:.0f}, {70 + 20 * t:.0f}%, {95 - 50 * t:.0f}%)"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _magnitude(value: float) -> float:
    return abs(value) if math.isfinite(value) else math.inf
