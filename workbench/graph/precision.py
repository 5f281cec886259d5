"""Mixed precision as graph: casts that op functions insert while a model is built.

Inside ``with wb.mixed_precision("float16"):`` each op function casts its float
inputs before it adds its op, by three rules:

- ``matmul`` and ``conv2d`` (the compute) run in the compute dtype: float32
  variables (the master weights) and placeholders stay float32 and are read
  through a cast, made once per tensor and block;
- ``softmax``, ``log_softmax``, ``softmax_cross_entropy``, ``sum`` and ``mean``
  (the loss), ``layer_norm`` and ``moments`` run in float32, for range and accuracy:
  float16 inputs are cast up;
- any other op whose float inputs differ in dtype casts them all to the compute
  dtype, so a bias add after a float16 matmul stays float16.

Nothing happens at run time that the graph does not show, so the model runs the
same on NumPy, CuPy and a cluster, and its JSON file holds the casts. Variable
updates are left alone, and :func:`~workbench.graph.gradients.gradients` builds
outside the rules: the backward pass follows the forward pass's dtypes, and the
gradient of a cast casts back, so each variable's gradient has its dtype. Pair it
with loss scaling (``optimizer.minimize(loss, loss_scale="dynamic")``), which
keeps small float16 gradients from flushing to zero.

>>> import workbench as wb
>>> g = wb.Graph()
>>> with g.as_default(), wb.mixed_precision("float16"):
...     x = wb.placeholder("x", shape=(None, 4))
...     w = wb.variable("w", shape=(4, 3))
...     logits = wb.matmul(x, w)
...     loss = wb.mean(wb.softmax_cross_entropy(logits, wb.constant([0, 2])))
>>> w.dtype, logits.dtype, loss.dtype
('float32', 'float16', 'float32')
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from workbench import ops
from workbench.errors import DTypeError
from workbench.ops.registry import as_dtype, get_op, is_float

#: Ops that run in the compute dtype.
COMPUTE_OPS = frozenset({"matmul", "conv2d"})
#: Ops that run in float32 whatever dtype their inputs have.
FLOAT32_OPS = frozenset({"softmax", "log_softmax", "softmax_cross_entropy", "sum", "mean", "layer_norm", "moments"})
#: Compute dtypes the registry knows (bfloat16 would go here; NumPy has no bfloat16).
COMPUTE_DTYPES = ("float16",)


class _Policy:
    """The compute dtype of one ``mixed_precision`` block and the casts it has made."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.casts: dict = {}  # (tensor, dtype) -> its cast, so a weight is cast once per block

    def cast(self, t, dtype: str):
        if t.dtype == dtype or not is_float(t.dtype):
            return t
        key = (t, dtype)
        if key not in self.casts:
            self.casts[key] = ops.cast(t, dtype)
        return self.casts[key]

    def inputs(self, op_type: str, tensors: tuple) -> tuple:
        """``tensors`` cast as the rules in the module docstring say."""
        if not tensors or get_op(op_type).stateful or op_type == "cast" or get_op(op_type).bodies:
            return tensors  # control flow: the body's own ops were cast as they were built
        if op_type in COMPUTE_OPS:
            return tuple(self.cast(t, self.dtype) for t in tensors)
        if op_type in FLOAT32_OPS:
            return tuple(self.cast(t, "float32") if t.dtype == self.dtype else t for t in tensors)
        if len({t.dtype for t in tensors if is_float(t.dtype)}) > 1:
            return tuple(self.cast(t, self.dtype) for t in tensors)
        return tensors


_local = threading.local()


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


@contextlib.contextmanager
def mixed_precision(dtype: str = "float16") -> Iterator[str]:
    """Build the ops inside in ``dtype`` (float16), the loss in float32, the variables as they are.

    See :mod:`workbench.graph.precision` for the rules. ``"float32"`` turns an
    outer block off. Train with loss scaling, for example
    ``wb.optimizers.Adam(1e-3).minimize(loss, loss_scale="dynamic")``.

    >>> import workbench as wb
    >>> with wb.Graph().as_default(), wb.mixed_precision():
    ...     h = wb.tanh(wb.matmul(wb.placeholder("x", (None, 2)), wb.variable("w", (2, 2))))
    >>> h.dtype
    'float16'
    """
    name = as_dtype(dtype)
    if name not in COMPUTE_DTYPES + ("float32",):
        raise DTypeError(
            f"mixed precision computes in {' or '.join(COMPUTE_DTYPES)} (or float32 for none), got {dtype!r}"
        )
    _stack().append(None if name == "float32" else _Policy(name))
    try:
        yield name
    finally:
        _stack().pop()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No mixed-precision rules inside (gradients are built this way)."""
    _stack().append(None)
    try:
        yield
    finally:
        _stack().pop()


def cast_inputs(op_type: str, tensors: tuple) -> tuple:
    """The inputs of an op about to be added, cast by the innermost ``mixed_precision`` block."""
    stack = _stack()
    policy = stack[-1] if stack else None
    return tensors if policy is None else policy.inputs(op_type, tensors)
