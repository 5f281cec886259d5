"""The built-in strategies, written with the public API only: read them as examples.

Each is a few lines of graph a replica builds (see :mod:`workbench.strategies.context`):

- ``"allreduce"``: synchronous data parallelism; every replica applies the global batch's gradient;
- :func:`local_sgd`: local steps, the parameters averaged every ``every`` steps;
- :func:`diloco`: local steps with the fit's optimizer, and every ``every`` steps an outer
  Nesterov-momentum step on the averaged pseudo-gradient (DiLoCo, Douillard et al. 2023);
- :func:`compressed`: the all-reduce of gradients cast to a narrower dtype and back (like DDP's
  fp16 compression hook).
"""

from __future__ import annotations

from workbench import ops
from workbench.strategies.registry import Strategy, register_builtin


def allreduce(r):
    """Every replica applies the sum over replicas of ``r.weight * g``: the global batch's gradient."""
    r.apply({v: ops.all_reduce(g * r.weight) for v, g in r.gradients.items()})


def local_sgd(every: int = 8) -> Strategy:
    """Local SGD: each replica steps on its own shard; every ``every`` steps the replicas average
    their parameters (``every=1`` is synchronous SGD with the parameters averaged instead of the
    gradients)."""

    def local_sgd(r):
        r.apply(r.gradients)  # a local step, no communication
        with r.every(every):
            r.assign({v: ops.all_reduce(v, op="mean") for v in r.variables})

    return Strategy("local_sgd", local_sgd, (("every", every),))


def diloco(every: int = 8, outer_lr: float = 0.7, outer_momentum: float = 0.9) -> Strategy:
    """DiLoCo: inner steps with the fit's optimizer; every ``every`` steps the pseudo-gradient
    ``anchor - v``, averaged over replicas, takes an outer Nesterov-momentum step from the anchor
    (``outer_lr=1, outer_momentum=0`` is :func:`local_sgd` with the same ``every``)."""

    def diloco(r):
        anchor = {v: r.slot(v, "anchor") for v in r.variables}  # the parameters at the last outer step
        momentum = {v: r.slot(v, "outer_momentum", init=0.0) for v in r.variables}
        r.apply(r.gradients)
        with r.every(every):
            new = {}
            for v in r.variables:
                delta = ops.all_reduce(anchor[v] - v, op="mean")  # the outer (pseudo-)gradient
                m = outer_momentum * momentum[v] + delta
                value = anchor[v] - outer_lr * (delta + outer_momentum * m)  # Nesterov
                new.update({v: value, anchor[v]: value, momentum[v]: m})
            r.assign(new)

    return Strategy("diloco", diloco, (("every", every), ("outer_lr", outer_lr), ("outer_momentum", outer_momentum)))


def compressed(dtype: str = "float16") -> Strategy:
    """All-reduce of the weighted gradients cast to ``dtype`` (half the bytes for float16), cast back."""

    def compressed(r):
        r.apply({v: ops.cast(ops.all_reduce(ops.cast(g * r.weight, dtype)), g.dtype) for v, g in r.gradients.items()})

    return Strategy("compressed", compressed, (("dtype", dtype),))


register_builtin(Strategy("allreduce", allreduce))
register_builtin(local_sgd())
register_builtin(diloco())
register_builtin(compressed())
