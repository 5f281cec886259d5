"""Collective ops: what a replica of a data-parallel fit exchanges with its peers, as graph.

``all_reduce(t, op)`` (``"sum" | "mean" | "max" | "min"``), ``all_gather(t)`` (a new
leading axis of length R, in rank order) and ``broadcast(t, root)``. Their kernels talk to
the run's **communicator**, an argument of :meth:`Plan.run <workbench.graph.plan.Plan.run>`:
:data:`SOLO` (R = 1) when a graph runs on its own, an in-process group in the one-process
simulation (:mod:`workbench.simulation`), the workers' communicator on a cluster. Outside a
replicated fit they act as R = 1: ``all_reduce`` and ``broadcast`` are the identity and
``all_gather`` adds an axis of length 1.

A communicator has ``rank``, ``size`` and ``start(kind, xp, value, **attrs) -> handle``;
``handle.wait()`` returns this rank's result (an array of its own). The plan calls ``start``
as soon as the input exists and ``wait`` at the first consumer (:mod:`workbench.graph.plan`),
so communication overlaps the rest of the run. A plan that buckets its all-reduces
(``compile_plan(..., bucket_bytes=...)``, :mod:`workbench.graph.schedule`) starts one flat array
for several ops, with two more attributes: ``members`` (how many collective ops it carries) and
``owned`` (the array is the plan's fresh copy: the communicator may reduce into it).

Sums are taken in the fixed pairwise order of the cluster's collective
(:func:`pairwise_sum`: ``(g0 + g1) + (g2 + g3) ...`` over the ranks), so every replica holds
the same bits and nothing depends on timing. The ops are not differentiable: a strategy
applies them to gradients, after the backward pass. ``cross_replica_sum(t)`` is the one that is:
what a layer sums inside the forward pass (batch norm's moments of the global batch), its gradient
an all-reduce weighted by the replicas' shares of the loss.
"""

from __future__ import annotations

import contextlib
import threading

from workbench.errors import ShapeError
from workbench.ops import rules
from workbench.ops.registry import TensorSpec, apply, defop

REDUCTIONS = ("sum", "mean", "max", "min")
_NONDIFF = "a collective: strategies apply it to gradients after the backward pass"
_local = threading.local()


@contextlib.contextmanager
def replicas(count: int):
    """Inside, collective ops are built for ``count`` replicas (what ``all_gather``'s shape needs);
    outside any such block they are built for one."""
    previous = getattr(_local, "replicas", 1)
    _local.replicas = int(count)
    try:
        yield
    finally:
        _local.replicas = previous


def replica_count() -> int:
    """The number of replicas collectives are built for now (1 outside :func:`replicas`)."""
    return getattr(_local, "replicas", 1)


def all_reduce(t, op="sum", name=None):
    """The ``op`` (``"sum"``, ``"mean"``, ``"max"`` or ``"min"``) of ``t`` over every replica.

    Sums (and means) are taken in a fixed pairwise order over the ranks, so every replica gets
    the same bits. Outside a replicated fit: ``t`` itself.
    """
    return apply("all_reduce", t, op=op, replicas=replica_count(), name=name)


def all_gather(t, name=None):
    """Every replica's ``t`` stacked along a new leading axis of length R, in rank order."""
    return apply("all_gather", t, replicas=replica_count(), name=name)


def broadcast(t, root=0, name=None):
    """Replica ``root``'s ``t``, on every replica."""
    return apply("broadcast", t, root=int(root), replicas=replica_count(), name=name)


def cross_replica_sum(t, name=None):
    """The sum of ``t`` over every replica, differentiable: its gradient is the sum of the replicas'
    upstream gradients (TF1's ``tpu.cross_replica_sum``).

    What a layer uses to compute a statistic of the *global* batch inside the replicas' forward pass
    (batch norm's moments: the sums of the shards' rows and their counts). The sum is in the same
    fixed pairwise order as ``all_reduce``; every replica gets the same bits, so the result does not
    depend on the rows of one replica (the data-parallel analysis treats it as the same on every
    replica). Outside a replicated fit: ``t`` itself.
    """
    return apply("cross_replica_sum", t, op="sum", name=name)


def _cross_sum_spec(x: TensorSpec, *, op, weighted=False) -> TensorSpec:
    _fixed_shape(x, "cross_replica_sum")
    return x


def _cross_sum_grad(op, g):
    # the replicas' upstream gradients weighted by their shares of the batch (r.weight) and divided by
    # this replica's again, so that weighting the replicas' gradients afterwards gives the gradient of
    # the global batch's loss exactly, with unequal shards too
    return (apply("cross_replica_sum", g, op="sum", weighted=True),)


def _fixed_shape(x: TensorSpec, what: str) -> None:
    if x.shape is None or any(d is None for d in x.shape):
        shape = "unknown" if x.shape is None else rules.fmt(x.shape)
        raise ShapeError(
            f"{what} needs the same shape on every replica; shape {shape} depends on the replica "
            "(its shard's rows): reduce over the batch axis first"
        )


def _reduce_spec(x: TensorSpec, *, op, replicas) -> TensorSpec:
    if op not in REDUCTIONS:
        raise ShapeError(f"unknown reduction {op!r}; use one of {', '.join(map(repr, REDUCTIONS))}")
    _fixed_shape(x, "all_reduce")
    if op == "mean" and not x.dtype.startswith("float"):
        raise ShapeError(f"all_reduce(op='mean') needs a float tensor, got {x.dtype}")
    return x


def _gather_spec(x: TensorSpec, *, replicas) -> TensorSpec:
    _fixed_shape(x, "all_gather")
    return TensorSpec((replicas, *x.shape), x.dtype)


def _broadcast_spec(x: TensorSpec, *, root, replicas) -> TensorSpec:
    _fixed_shape(x, "broadcast")
    if not 0 <= root < replicas:
        raise ShapeError(f"broadcast root {root} is not a replica of {replicas} (ranks 0..{replicas - 1})")
    return x


def _collective_kernel(kind: str):
    def kernel(xp, x, comm=None, **attrs):
        return (comm if comm is not None else SOLO).start(kind, xp, x, **attrs).wait()

    kernel.__name__ = f"{kind}_kernel"
    return kernel


defop("all_reduce", infer=_reduce_spec, kernel=_collective_kernel("all_reduce"), nondiff=_NONDIFF, collective=True)
defop("all_gather", infer=_gather_spec, kernel=_collective_kernel("all_gather"), nondiff=_NONDIFF, collective=True)
defop("broadcast", infer=_broadcast_spec, kernel=_collective_kernel("broadcast"), nondiff=_NONDIFF, collective=True)
# an all_reduce sum with a gradient (its communicator kind is "all_reduce")
defop(
    "cross_replica_sum",
    infer=_cross_sum_spec,
    kernel=_collective_kernel("all_reduce"),
    grad=_cross_sum_grad,
    collective="all_reduce",
)

# -- what every communicator shares ----------------------------------------------------------


def pairwise_sum(parts: list):
    """``(p0 + p1) + (p2 + p3) ...``, pairwise over ``parts`` in rank order (a new array).

    The order of the cluster's collective and of the parameter server's reduction tree,
    so the simulation, the task graph and the workers sum in the same bits.
    """
    level = list(parts)
    while len(level) > 1:
        nxt = [level[j] + level[j + 1] for j in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0] + 0 if len(parts) == 1 else level[0]


def combine(kind: str, xp, parts: list, attrs: dict):
    """The result of collective ``kind`` over every rank's value (``parts``, in rank order)."""
    if kind == "all_gather":
        return xp.stack(parts)
    if kind == "broadcast":
        return xp.asarray(parts[attrs["root"]], copy=True)
    op = attrs["op"]
    if op in ("sum", "mean"):
        total = pairwise_sum(parts)
        if op == "mean" and len(parts) > 1:
            total = xp.multiply(total, total.dtype.type(1.0 / len(parts)), dtype=total.dtype)
        return total
    reduce = xp.maximum if op == "max" else xp.minimum
    result = parts[0]
    for part in parts[1:]:
        result = reduce(result, part)
    return xp.asarray(result, copy=True)


def chunk_length(n: int, size: int, rank: int) -> int:
    """The length of chunk ``rank`` when ``n`` elements are cut into ``size`` near-equal chunks."""
    q, extra = divmod(n, size)
    return q + (rank < extra)


def bytes_sent(kind: str, nbytes: int, itemsize: int, size: int, rank: int, attrs: dict) -> int:
    """Payload bytes rank ``rank`` of ``size`` sends for one collective of an ``nbytes`` array:
    what the cluster's direct algorithms move (reduce-scatter then all-gather for a reduction,
    ``2 (R - 1) / R`` of the array; every peer a copy for a gather; the root R - 1 copies)."""
    if size == 1:
        return 0
    if kind == "all_gather":
        return (size - 1) * nbytes
    if kind == "broadcast":
        return (size - 1) * nbytes if rank == attrs["root"] else 0
    n = nbytes // itemsize
    return itemsize * (n + (size - 2) * chunk_length(n, size, rank))


class Done:
    """A collective that finished when it started (one replica): :meth:`wait` gives its result."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def done(self) -> bool:
        return True

    def wait(self, timeout: float | None = None):
        return self.value


class Solo:
    """The communicator of one replica (R = 1): every collective is its own result (a copy)."""

    rank, size = 0, 1

    def start(self, kind: str, xp, value, **attrs) -> Done:
        if attrs.get("replicas", 1) != 1:
            raise ValueError(f"{kind} was built for {attrs['replicas']} replicas and runs without a group (1 replica)")
        return Done(combine(kind, xp, [value], attrs))


#: What plans run with when no communicator is given.
SOLO = Solo()
