"""How a fit's loss splits over the global batch: what ``r.weight`` is.

A replica computes its loss and gradients on its shard of the global batch. The sum over
replicas of ``r.weight * g`` is the gradient of the global batch's loss when

- the loss is a **mean** over the batch (plus terms that do not depend on it, regularizers):
  a replica's weight is its share of the rows, ``len(shard) / len(batch)``;
- the loss is a **sum** over the batch: every weight is 1.

The analysis is the graph layer's (:func:`workbench.graph.batch_reduction.loss_reduction`, the
one the cluster engines use); a loss it cannot split is refused here as a
:class:`~workbench.errors.StrategyError` naming the op and its line.
"""

from __future__ import annotations

from workbench.errors import ClusterError, StrategyError
from workbench.graph.batch_reduction import loss_reduction
from workbench.graph.core import Graph


def batch_reduction(graph: Graph, loss: str) -> str:
    """``"mean"`` or ``"sum"``: how the loss named ``loss`` reduces the batch; StrategyError when neither."""
    try:
        return loss_reduction(graph, loss)
    except ClusterError as e:
        raise StrategyError(f"r.weight: {e}") from None


def weight(kind: str, rows: int, total: int) -> float:
    """A replica's ``r.weight`` for a loss of ``kind`` (see :func:`batch_reduction`) and a shard of ``rows``."""
    return rows / total if kind == "mean" else 1.0
