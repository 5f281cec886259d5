"""``Graph.summary()``: the parameters of a graph's variables, per top-level name scope and in total."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ScopeParameters:
    """The variables of one top-level name scope ("" for those outside any scope)."""

    scope: str
    variables: int
    parameters: int  # elements of its trainable variables
    other: int  # elements of its variables that are not trained (optimizer slots, counters, statistics)


def parameters_by_scope(graph) -> list[ScopeParameters]:
    """One row per top-level scope holding variables, in the order the graph made them."""
    rows: dict[str, list[int]] = {}
    for v in graph.variables:
        scope = v.name.split("/")[0] if "/" in v.name else ""
        row = rows.setdefault(scope, [0, 0, 0])
        size = math.prod(v.shape)
        row[0] += 1
        row[1 if v.trainable else 2] += size
    return [ScopeParameters(scope, *row) for scope, row in rows.items()]


def summary_text(graph) -> str:
    """A small table: scope, variables, trained parameters, other values; then the totals."""
    rows = parameters_by_scope(graph)
    lines = [
        f"graph {graph.name!r}: {len(graph.operations)} operations",
        f"{'scope':<24}{'variables':>10}{'parameters':>14}{'other':>12}",
    ]
    for r in rows:
        lines.append(f"{r.scope or '(top level)':<24}{r.variables:>10}{r.parameters:>14,}{r.other:>12,}")
    total = sum(r.parameters for r in rows)
    lines.append(f"{'total':<24}{sum(r.variables for r in rows):>10}{total:>14,}{sum(r.other for r in rows):>12,}")
    return "\n".join(lines)


def trainable_parameters(graph) -> int:
    return sum(math.prod(v.shape) for v in graph.trainable_variables)
