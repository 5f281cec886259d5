"""``fit(stats=k)`` on a cluster (the all-reduce engine, strategy functions): the global batch's
statistics from the replicas'.

On the steps that report statistics every replica runs the statistic ops
(:mod:`workbench.graph.probes`) on its shard; what it reports and how the client joins them:

- ``grad_norm``: each replica takes the norm of the all-reduced gradient (the gradient of the
  global batch's loss, the one the update applies), so every replica reports the same value;
- ``mean``: the op's mean over the shard, combined by how it reduces over the rows
  (:mod:`workbench.graph.batch_reduction`: a tensor with one slice per row gives shard means
  weighted by the shards' shares of the rows; a scalar mean loss the same; a sum adds up);
- ``std``: from each replica's mean and standard deviation of the same op,
  ``var = sum_r share_r * (std_r ** 2 + (mean_r - mean) ** 2)``, for a tensor with one slice per
  row (the op's ``mean`` is computed too for this); a tensor independent of the rows, or a scalar,
  has one value everywhere. Any other tensor (a non-scalar sum or maximum over the rows) reports
  rank 0's shard value.

The local fit on the same global batch gives the same statistics, up to the order of the sums.
A strategy function's replicas (:mod:`workbench.cluster.collective.strategy_replica`) report the same way; their
``grad_norm`` is of the sum over the replicas of ``r.weight * g`` (each replica's gradient at its own
variables, all-reduced on those steps alone), the all-reduced gradient of ``"allreduce"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.errors import ClusterError
from workbench.graph.batch_reduction import Reduction, combine, fetch_reduction
from workbench.graph.core import Graph, Operation
from workbench.graph.probes import SCOPE


@dataclass(frozen=True)
class StatRule:
    """How one statistic joins: ``kind`` is ``"first"`` (rank 0's value: all equal, or no exact rule),
    ``"reduce"`` (``reduction`` over the values) or ``"moments"`` (with the mean at ``mean_index``)."""

    kind: str
    reduction: Reduction | None = None
    mean_index: int = -1


def _target(name: str) -> tuple[str, str]:
    """``stats/<op>/<stat>`` -> (op, stat)."""
    op, _, stat = name.partition(":")[0][len(SCOPE) + 1 :].rpartition("/")
    return op, stat


def norm_variables(stats) -> list[str | None]:
    """For each of ``stats`` (statistic tensors): the variable whose gradient's norm it is, or None."""
    found = []
    for name in stats:
        op, stat = _target(name)
        found.append(op if stat == "grad_norm" else None)
    return found


def gradient_norm_indices(program) -> list[int]:
    """For each of ``program.stats``: the index of its variable's gradient (a ``grad_norm``), or -1."""
    variables = list(program.gradient_variables)
    return [variables.index(v) if v in variables else -1 for v in norm_variables(program.stats)]


def stat_rules(program) -> list[StatRule]:
    """How each of ``program.stats`` (a training program's) joins across replicas (see the module docstring)."""
    return graph_stat_rules(Graph.from_json(program.replica_json), program.feeds, program.stats)


def graph_stat_rules(graph: Graph, rows, stats) -> list[StatRule]:
    """How each of ``stats`` (statistic tensors of ``graph``, whose placeholders ``rows`` are fed
    the shard's rows) joins across replicas."""
    names = [name.partition(":")[0] for name in stats]
    rules = []
    for name in names:
        op, stat = _target(name)
        rules.append(_rule(graph, rows, names, op, stat, name))
    return rules


def _reduction(graph: Graph, name: str, rows) -> Reduction | None:
    """How the output of op (or tensor) ``name`` reduces over the rows; None when it mixes them."""
    if name not in graph:
        return None
    found = graph.get(name)
    try:
        return fetch_reduction(graph, found.outputs[0] if isinstance(found, Operation) else found, rows)
    except ClusterError:
        return None


def _rule(graph: Graph, rows, names: list[str], op: str, stat: str, name: str) -> StatRule:
    if stat == "grad_norm":
        return StatRule("first")
    if stat == "mean":
        found = _reduction(graph, name, rows)
        return StatRule("reduce", found) if found is not None else StatRule("first")
    source = _reduction(graph, op, rows)
    mean = f"{SCOPE}/{op}/mean"
    if source is not None and source.kind == "rows" and mean in names:
        return StatRule("moments", mean_index=names.index(mean))
    return StatRule("first")  # the same everywhere ("same", a scalar), or no exact rule


def combine_stats(rules: list[StatRule], reported: list[list[float]], shares: list[float]) -> list[float]:
    """The global batch's statistics from each replica's ``reported`` values (in rank order) and shares."""
    out = []
    for k, rule in enumerate(rules):
        values = [r[k] for r in reported]
        if rule.kind == "reduce":
            out.append(float(combine(rule.reduction, values, shares)))
        elif rule.kind == "moments":
            means = [r[rule.mean_index] for r in reported]
            mean = sum(s * m for s, m in zip(shares, means))
            var = sum(s * (v * v + (m - mean) ** 2) for s, v, m in zip(shares, values, means))
            out.append(math.sqrt(max(var, 0.0)))
        else:
            out.append(float(values[0]))
    return out
