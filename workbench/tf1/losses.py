"""``tf.losses``: the mean losses of TensorFlow 1.x, as graph ops (no loss collection to remember).

Each returns the mean over the batch of the per-example loss (TensorFlow's default reduction,
``SUM_BY_NONZERO_WEIGHTS`` with weights 1); ``weights`` may be a scalar. The value is the loss to
minimize: ``tf.train.AdamOptimizer(1e-3).minimize(tf.losses.softmax_cross_entropy(y, logits))``.
"""

from __future__ import annotations

import numbers

import workbench as wb
from workbench.errors import ArgumentError
from workbench.tf1 import nn
from workbench.tf1._common import unsupported


def _weighted_mean(per_example, weights, what: str):
    if not isinstance(weights, numbers.Number):
        raise ArgumentError(f"tf.losses.{what}: weights must be a number (per-example weights are not supported)")
    loss = wb.mean(per_example)
    return loss if weights == 1 else wb.multiply(loss, float(weights))


def softmax_cross_entropy(onehot_labels, logits, weights=1.0, label_smoothing=0, scope=None, **kwargs):
    """The mean softmax cross-entropy of ``logits`` against one-hot (or probability) labels."""
    if label_smoothing:
        classes = logits.shape[-1]
        onehot_labels = onehot_labels * (1.0 - label_smoothing) + label_smoothing / classes
    with wb.name_scope(scope or "softmax_cross_entropy_loss"):
        per_example = nn.softmax_cross_entropy_with_logits(labels=onehot_labels, logits=logits)
        return _weighted_mean(per_example, weights, "softmax_cross_entropy")


def sparse_softmax_cross_entropy(labels, logits, weights=1.0, scope=None, **kwargs):
    """The mean softmax cross-entropy of ``logits`` against integer class labels."""
    with wb.name_scope(scope or "sparse_softmax_cross_entropy_loss"):
        per_example = nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return _weighted_mean(per_example, weights, "sparse_softmax_cross_entropy")


def sigmoid_cross_entropy(multi_class_labels, logits, weights=1.0, label_smoothing=0, scope=None, **kwargs):
    """The mean sigmoid cross-entropy of ``logits`` against 0/1 labels."""
    if label_smoothing:
        multi_class_labels = multi_class_labels * (1.0 - label_smoothing) + 0.5 * label_smoothing
    with wb.name_scope(scope or "sigmoid_cross_entropy_loss"):
        per_element = nn.sigmoid_cross_entropy_with_logits(labels=multi_class_labels, logits=logits)
        return _weighted_mean(per_element, weights, "sigmoid_cross_entropy")


def mean_squared_error(labels, predictions, weights=1.0, scope=None, **kwargs):
    """The mean of ``(labels - predictions) ** 2``."""
    with wb.name_scope(scope or "mean_squared_error"):
        return _weighted_mean(wb.square(wb.subtract(predictions, labels)), weights, "mean_squared_error")


def absolute_difference(labels, predictions, weights=1.0, scope=None, **kwargs):
    """The mean of ``|labels - predictions|``."""
    with wb.name_scope(scope or "absolute_difference"):
        return _weighted_mean(wb.abs(wb.subtract(predictions, labels)), weights, "absolute_difference")


_NO_COLLECTION = (
    "losses are not collected in the graph: add the terms yourself (tf.add_n([loss, reg])) and minimize the sum"
)
get_total_loss = unsupported("losses.get_total_loss", _NO_COLLECTION)
add_loss = unsupported("losses.add_loss", _NO_COLLECTION)
get_regularization_loss = unsupported("losses.get_regularization_loss", _NO_COLLECTION)
