"""Metrics built as graph ops, so they are computed where the model runs (locally or on a cluster).

>>> import workbench as wb
>>> g = wb.Graph()
>>> with g.as_default():
...     logits = wb.constant([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5]])
...     acc = wb.metrics.accuracy(logits, wb.constant([0, 1, 1]))
>>> round(float(wb.Session(g).run(acc)), 4)
0.6667
"""

from __future__ import annotations

from workbench import ops
from workbench.errors import DTypeError, ShapeError
from workbench.graph.core import Tensor
from workbench.ops.registry import INTS, is_float

__all__ = ["accuracy"]


def accuracy(logits, labels, name: str = "accuracy"):
    """The fraction of rows whose largest logit is at the label's index (a float32 scalar).

    Parameters
    ----------
    logits : Tensor
        Scores of shape ``(batch, classes)``: logits or probabilities, only their argmax counts.
    labels : Tensor
        Integer class indices of shape ``(batch,)`` (sparse labels, as ``softmax_cross_entropy`` takes).
    name : str
        The name of the result (``"accuracy"``), under which ``fit`` records it when fetched in a list.
    """
    logits = logits if isinstance(logits, Tensor) else ops.constant(logits)
    labels = labels if isinstance(labels, Tensor) else ops.constant(labels)
    if logits.shape is not None and len(logits.shape) != 2:
        raise ShapeError(f"accuracy needs logits of shape (batch, classes), got {logits.shape}")
    if labels.dtype not in INTS:
        raise DTypeError(f"accuracy needs integer class labels, got {labels.dtype} (sparse labels: class indices)")
    if not is_float(logits.dtype):
        raise DTypeError(f"accuracy needs float logits, got {logits.dtype}")
    predicted = ops.argmax(logits, axis=1)
    if labels.dtype != "int64":
        labels = ops.cast(labels, "int64")
    return ops.mean(ops.cast(ops.equal(predicted, labels), "float32"), name=name)
