"""Loss scaling for float16 training, built as graph ops.

Float16 gradients smaller than about 6e-8 flush to zero. Multiplying the loss by
a large scale before differentiating lifts them into range; dividing the
gradients by the same scale (in the variables' float32) gives the true gradients.
With a *dynamic* scale, a step whose gradients are not all finite (the scale was
too large and something overflowed) changes no variable and halves the scale;
after ``growth_interval`` good steps in a row the scale doubles.

The scale and the count of good steps are non-trainable variables in the
``loss_scale`` name scope, so checkpoints, graph files and clusters carry them
like any other state. On a cluster the replicas read the scale (they scale the
loss and unscale their gradients) and the update task checks the reduced
gradients and updates the scale, as the optimizer's update.

>>> import workbench as wb
>>> g = wb.Graph()
>>> with g.as_default():
...     w = wb.variable("w", shape=(2,), init=1.0)
...     train = wb.optimizers.SGD(0.25).minimize(wb.sum(w * w), loss_scale=wb.optimizers.LossScale(initial=3e38))
>>> sess = wb.Session(g)
>>> import numpy as np
>>> with np.errstate(over="ignore"):  # 2 * 3e38 overflows float32: the step changes nothing, halves the scale
...     sess.run(train)
>>> sess.variables["w"].tolist(), f"{sess.variables['loss_scale/scale']:.2g}"
([1.0, 1.0], '1.5e+38')
>>> sess.run(train)
>>> sess.variables["w"].tolist(), int(sess.variables["loss_scale/good_steps"])
([0.5, 0.5], 1)
"""

from __future__ import annotations

from workbench import ops
from workbench.errors import GraphError
from workbench.graph.core import Tensor


class LossScale:
    """How :meth:`Optimizer.minimize` scales the loss: ``minimize(loss, loss_scale=...)``.

    ``loss_scale="dynamic"`` is ``LossScale()``; a number is a fixed scale
    (``LossScale(initial=number, dynamic=False)``), which never skips a step.

    Parameters
    ----------
    initial : float
        The first scale (2**15 by default: float16 tops out at 65504).
    dynamic : bool
        Halve the scale and skip the step when a gradient is not finite, grow it
        after ``growth_interval`` good steps.
    growth_interval : int
        Good steps in a row before the scale grows.
    factor : float
        What the scale is multiplied (grown) or divided (cut) by.
    minimum : float
        The scale never drops below this.
    """

    def __init__(
        self,
        initial: float = 2.0**15,
        dynamic: bool = True,
        growth_interval: int = 2000,
        factor: float = 2.0,
        minimum: float = 1.0,
    ):
        if not initial > 0 or not factor > 1 or not minimum > 0 or int(growth_interval) < 1:
            raise GraphError(
                f"loss scale needs initial > 0, factor > 1, minimum > 0 and growth_interval >= 1; got initial={initial}, "
                f"factor={factor}, minimum={minimum}, growth_interval={growth_interval}"
            )
        self.initial, self.dynamic, self.growth_interval = float(initial), bool(dynamic), int(growth_interval)
        self.factor, self.minimum = float(factor), float(minimum)

    @classmethod
    def of(cls, value) -> LossScale | None:
        """``None``, ``"dynamic"``, a number or a LossScale, as a LossScale (or None)."""
        if value is None or isinstance(value, LossScale):
            return value
        if value == "dynamic":
            return cls()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls(initial=float(value), dynamic=False)
        raise GraphError(f"loss_scale must be None, 'dynamic', a positive number or a LossScale, got {value!r}")

    def __repr__(self) -> str:
        kind = f"dynamic, growth_interval={self.growth_interval}" if self.dynamic else "fixed"
        return f"LossScale({self.initial:g}, {kind})"

    def build(self, graph, scope: str) -> ScaleState:
        """The scale as graph: variables in ``scope`` when dynamic, a constant when fixed."""
        with graph.as_default(), graph.name_scope(scope):
            if not self.dynamic:
                return ScaleState(self, ops.constant(self.initial, dtype="float32"), None)
            scale = ops.variable("scale", shape=(), init=self.initial, dtype="float32", trainable=False)
            good = ops.variable("good_steps", shape=(), init="zeros", dtype="int64", trainable=False)
            return ScaleState(self, scale, good)


class ScaleState:
    """The scale of one ``minimize`` call: a float32 scalar tensor and, when dynamic, the good-step counter."""

    def __init__(self, config: LossScale, scale: Tensor, good_steps: Tensor | None):
        self.config, self.scale, self.good_steps = config, scale, good_steps

    def scaled(self, loss: Tensor) -> Tensor:
        return loss * self._scale_as(loss.dtype)

    def unscaled(self, grad: Tensor) -> Tensor:
        return grad / self._scale_as(grad.dtype)

    def _scale_as(self, dtype: str) -> Tensor:
        return self.scale if dtype == self.scale.dtype else ops.cast(self.scale, dtype)

    def updates(self, finite: Tensor) -> list:
        """Ops that halve the scale after a bad step and grow it after enough good ones."""
        c = self.config
        good = ops.where(finite, self.good_steps + 1, 0)
        grow = ops.greater_equal(good, c.growth_interval)
        kept = ops.where(grow, self.scale * c.factor, self.scale)
        cut = ops.maximum(self.scale / c.factor, c.minimum)
        return [
            ops.assign(self.scale, ops.where(finite, kept, cut)),
            ops.assign(self.good_steps, ops.where(grow, 0, good)),
        ]


def all_finite(tensors) -> Tensor:
    """A bool scalar: whether every element of every tensor is finite."""
    checks = [ops.all(ops.isfinite(t)) for t in tensors]
    return checks[0] if len(checks) == 1 else ops.all(ops.stack(checks))
