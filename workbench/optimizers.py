"""Optimizers as graph ops: slot variables and update operations live in the graph.

>>> import workbench as wb
>>> g = wb.Graph()
>>> with g.as_default():
...     w = wb.variable("w", shape=(2,), init=1.0)
...     train = wb.optimizers.SGD(0.25).minimize(wb.sum(w * w))
>>> sess = wb.Session(g)
>>> sess.run(train)
>>> sess.variables["w"].tolist()
[0.5, 0.5]
"""

from __future__ import annotations

import dataclasses

from workbench import ops
from workbench.errors import GradientError, GraphError
from workbench.graph import precision
from workbench.graph.core import Operation, Tensor, TrainingRecord, Variable, group
from workbench.graph.gradients import gradients
from workbench.graph.passes import needed_ops
from workbench.loss_scale import LossScale, ScaleState, all_finite

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "LossScale"]


class Optimizer:
    """Base class: gradients, optional weight decay and global-norm clipping, then :meth:`_apply`.

    Parameters
    ----------
    learning_rate : float or scalar Tensor
    weight_decay : float
        L2 penalty added to each gradient (decoupled from the gradient in Adam).
    clip_norm : float, optional
        Scale all gradients together so that their global norm is at most this.
    """

    def __init__(
        self, learning_rate, weight_decay: float = 0.0, clip_norm: float | None = None, name: str | None = None
    ):
        if not isinstance(learning_rate, Tensor) and float(learning_rate) <= 0:
            raise GraphError(f"learning_rate must be positive, got {learning_rate}")
        if clip_norm is not None and clip_norm <= 0:
            raise GraphError(f"clip_norm must be positive, got {clip_norm}")
        self.learning_rate = learning_rate
        self.weight_decay = float(weight_decay)
        self.clip_norm = clip_norm
        self.name = name or type(self).__name__
        self._finite = None  # while a dynamically scaled update is built: whether its gradients are finite

    def compute_gradients(self, loss: Tensor, var_list=None) -> list[tuple[Tensor, Variable]]:
        """``(gradient, variable)`` pairs for the trainable variables ``loss`` depends on."""
        if var_list is None:
            var_list = loss.graph.trainable_variables
        var_list = list(var_list)
        if not var_list:
            raise GraphError(f"graph {loss.graph.name!r} has no trainable variables to optimize")
        grads = gradients(loss, var_list)
        # a gradient that is one output of several (layer_norm_grad's) gets an op of its own, so that
        # distributed training can feed it to the update by itself
        pairs = [(_own_op(g), v) for g, v in zip(grads, var_list, strict=True) if g is not None]
        if not pairs:
            names = ", ".join(v.name for v in var_list)
            raise GradientError(f"loss {loss.name!r} does not depend on any of the variables {names}")
        return pairs

    def apply_gradients(self, grads_and_vars, name: str | None = None) -> Operation:
        """The operation that updates every variable from its gradient."""
        return self._apply_gradients(list(grads_and_vars), name, None)

    def _apply_gradients(self, grads_and_vars, name, scaling: ScaleState | None, extra=()) -> Operation:
        graph = grads_and_vars[0][1].graph
        scope = _unused_scope(graph, self.name)
        raw = tuple((g.name, v.name) for g, v in grads_and_vars)
        with graph.name_scope(scope), precision.suspended():
            dynamic = scaling is not None and scaling.good_steps is not None
            self._finite = all_finite([g for g, _ in grads_and_vars]) if dynamic else None
            try:
                if self.clip_norm is not None:
                    grads_and_vars = _clip_by_global_norm(grads_and_vars, self.clip_norm)
                updates = self._apply(grads_and_vars)
                if dynamic:
                    updates += scaling.updates(self._finite)
            finally:
                self._finite = None
        update = group(*updates, *extra, name=name or f"{scope}/update")
        graph.training[update.name] = TrainingRecord(update.name, raw)
        return update

    def minimize(self, loss: Tensor, var_list=None, name: str | None = None, loss_scale=None) -> Operation:
        """Add gradients and updates for ``loss``; returns the update operation to run.

        The update also runs the state updates of the layers ``loss`` depends on (the moving
        statistics of :func:`workbench.layers.batch_norm`), so they need no collection.

        Parameters
        ----------
        loss : scalar float Tensor
        var_list : variables to train (default: every trainable variable ``loss`` depends on)
        name : name of the update operation
        loss_scale : None, ``"dynamic"``, a number or a :class:`LossScale`
            For float16 compute (see :func:`wb.mixed_precision`): differentiate
            ``loss * scale`` and divide the gradients by ``scale`` in the
            variables' dtype. A dynamic scale (a variable, ``loss_scale/scale``)
            leaves every variable as it was and halves the scale when a
            gradient is not finite, and doubles it after ``growth_interval``
            good steps. ``graph.training`` records the unscaled gradients, so
            distributed training reduces those; the scale's update belongs to
            the optimizer's update.
        """
        scaling = LossScale.of(loss_scale)
        moving = state_updates(loss)  # batch norm's moving statistics: part of the training op
        if scaling is None:
            update = self._apply_gradients(self.compute_gradients(loss, var_list), name, None, moving)
        else:
            with precision.suspended():
                state = scaling.build(loss.graph, _unused_scope(loss.graph, "loss_scale"))
                pairs = self.compute_gradients(state.scaled(loss), var_list)
                pairs = [(state.unscaled(g), v) for g, v in pairs]
            update = self._apply_gradients(pairs, name, state, moving)
        records = update.graph.training
        # with a dynamic scale, a cluster's replicas scale it by their share of the batch
        scale = state.scale.name if scaling is not None and state.good_steps is not None else ""
        records[update.name] = dataclasses.replace(records[update.name], loss=loss.name, loss_scale=scale)
        return update

    def _assign(self, v: Variable, value) -> Tensor:
        """``assign(v, value)``, or ``v`` unchanged when a dynamically scaled step has non-finite gradients."""
        return ops.assign(v, value if self._finite is None else ops.where(self._finite, value, v))

    def _assign_add(self, v: Variable, delta) -> Tensor:
        return ops.assign_add(v, self._gated(v, delta))

    def _assign_sub(self, v: Variable, delta) -> Tensor:
        return ops.assign_sub(v, self._gated(v, delta))

    def _gated(self, v: Variable, delta):
        if self._finite is None:
            return delta
        if not isinstance(delta, Tensor):
            delta = ops.constant(delta, dtype=v.dtype)
        return ops.where(self._finite, delta, 0.0)  # a select: a NaN in delta stays out

    def _apply(self, grads_and_vars) -> list:
        raise NotImplementedError

    def _decayed(self, g: Tensor, v: Variable) -> Tensor:
        return g + self.weight_decay * v if self.weight_decay else g

    def _slot(self, v: Variable, slot: str) -> Variable:
        return ops.variable(f"{v.name}/{slot}", shape=v.shape, init="zeros", dtype=v.dtype, trainable=False)


class SGD(Optimizer):
    """Plain stochastic gradient descent: ``v -= lr * g``."""

    def _apply(self, grads_and_vars):
        return [self._assign_sub(v, self.learning_rate * self._decayed(g, v)) for g, v in grads_and_vars]


class Momentum(Optimizer):
    """SGD with momentum: ``a = mu * a + g; v -= lr * a`` (Nesterov: ``v -= lr * (g + mu * a)``)."""

    def __init__(self, learning_rate, momentum: float = 0.9, nesterov: bool = False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _apply(self, grads_and_vars):
        updates = []
        for g, v in grads_and_vars:
            g = self._decayed(g, v)
            acc = self._slot(v, "momentum")
            new_acc = self._assign(acc, self.momentum * acc + g)
            step = g + self.momentum * new_acc if self.nesterov else new_acc
            updates.append(self._assign_sub(v, self.learning_rate * step))
        return updates


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``weight_decay`` is decoupled, as in AdamW."""

    def __init__(self, learning_rate=0.001, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _apply(self, grads_and_vars):
        dtype = grads_and_vars[0][1].dtype
        step = ops.variable("step", shape=(), init="zeros", dtype=dtype, trainable=False)
        t = self._assign_add(step, 1.0)
        corrected = ops.sqrt(1.0 - ops.pow(self.beta2, t)) / (1.0 - ops.pow(self.beta1, t))
        updates = []
        for g, v in grads_and_vars:
            m, s = self._slot(v, "m"), self._slot(v, "v")
            new_m = self._assign(m, self.beta1 * m + (1.0 - self.beta1) * g)
            new_s = self._assign(s, self.beta2 * s + (1.0 - self.beta2) * (g * g))
            lr_t = self.learning_rate * (corrected if v.dtype == dtype else ops.cast(corrected, v.dtype))
            delta = lr_t * new_m / (ops.sqrt(new_s) + self.epsilon)
            if self.weight_decay:
                delta = delta + (self.learning_rate * self.weight_decay) * v
            updates.append(self._assign_sub(v, delta))
        return updates


def _own_op(gradient: Tensor) -> Tensor:
    if len(gradient.op.outputs) == 1:
        return gradient
    with gradient.graph.name_scope("gradients"):
        return ops.identity(gradient)


def state_updates(loss: Tensor) -> list[Operation]:
    """The state updates recorded in ``graph.updates`` (batch norm's moving statistics) whose
    tensor ``loss`` depends on: what ``minimize(loss)`` runs with its update."""
    graph = loss.graph
    if not graph.updates:
        return []
    needed = needed_ops(graph, [loss.op])
    return [graph.operation(u) for u, t in graph.updates.items() if graph.get(t).op in needed]


def _unused_scope(graph, base: str) -> str:
    """``base``, ``base_1`` ...: the first name scope (inside the current ones) no op uses yet,
    so that a second optimizer never collides with the first one's variables."""
    prefix = "/".join(graph._scopes + [""])
    used = {op.name[len(prefix) :].split("/")[0] for op in graph.operations if op.name.startswith(prefix)}
    used.update(a[len(prefix) :].split("/")[0] for a in graph.aliases if a.startswith(prefix))
    scope, i = base, 0
    while scope in used:
        i += 1
        scope = f"{base}_{i}"
    return scope


def _clip_by_global_norm(grads_and_vars, clip_norm: float):
    dtype = grads_and_vars[0][0].dtype
    squares = [ops.cast(ops.sum(g * g), dtype) for g, _ in grads_and_vars]
    total = squares[0]
    for s in squares[1:]:
        total = total + s
    norm = ops.sqrt(total)
    scale = clip_norm / ops.maximum(norm, clip_norm)
    return [(g * ops.cast(scale, g.dtype), v) for g, v in grads_and_vars]
