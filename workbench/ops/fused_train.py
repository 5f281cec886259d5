"""Fused training-step ops: a parameter group's optimizer update, cross-entropy with its gradient.

Passes over the graphs that plans run (:mod:`workbench.graph.step_fusion`) make
these ops after differentiation, so they declare no gradient. Their kernels here
compose the ops' own kernels and are right on every array namespace; a device
registers faster ones with :func:`register_device_kernel` (the GPU layer
generates one CUDA kernel per op, see :mod:`workbench.gpu.train_kernels`).
``register_device_kernel`` and ``DEVICE_KERNELS`` live in :mod:`workbench.ops.fused`.

``fused_update(*inputs, program, stores, lanes, width)``
    ``lanes`` parameters updated by one elementwise ``program`` (the steps of
    :mod:`workbench.ops.fused`). Lane ``l`` sees inputs ``l * width`` to
    ``(l + 1) * width - 1`` as program inputs ``0 .. width - 1``, then the shared
    inputs after the lanes' (one-element arrays: a learning rate, a loss scale's
    finiteness flag). A lane's first ``len(stores)`` inputs are variables (a
    weight and its optimizer slots); variable ``k`` gets the value of program
    step ``stores[k]``. Outputs: the new values, lane after lane, written into
    the variables (:attr:`OpDef.writes`), like ``assign``'s output.

``softmax_cross_entropy_with_grad(logits, labels, upstream, axis, keepdims, mean)``
    ``softmax_cross_entropy(logits, labels)`` and the gradient of the loss with
    respect to the logits when the loss's gradient is ``unreduce(upstream, loss,
    axis, keepdims, mean)`` (a ``sum`` or ``mean`` of the per-example losses):
    outputs ``(loss, dlogits)``; the softmax is never stored.
"""

from __future__ import annotations

from workbench.errors import DTypeError, ShapeError
from workbench.ops import rules
from workbench.ops.fused import (
    DEVICE_KERNELS,
    device_kernel,
    infer_step,
    program_values,
    register_device_kernel,
    step_values,
)
from workbench.ops.reduce import _unreduce_kernel, _unreduce_spec
from workbench.ops.nn import _sce_grad_kernel, _sce_kernel, _sce_spec
from workbench.ops.array import check_indices
from workbench.ops.registry import TensorSpec, defop
from workbench.ops.state import _assign_into

FUSED_UPDATE = "fused_update"
SCE_WITH_GRAD = "softmax_cross_entropy_with_grad"
_PASS = "made by a pass over plans' graphs, which runs after differentiation"

# -- fused_update -----------------------------------------------------------------------


def update_writes(attrs: dict, n_inputs: int) -> tuple[int, ...]:
    """Input position of the variable each output of a ``fused_update`` is written into."""
    width, stores = attrs["width"], attrs["stores"]
    return tuple(lane * width + k for lane in range(attrs["lanes"]) for k in range(len(stores)))


def lane_inputs(values, lane: int, width: int, lanes: int) -> list:
    """What lane ``lane``'s program sees: its own inputs, then the shared ones."""
    return [*values[lane * width : (lane + 1) * width], *values[lanes * width :]]


def _update_spec(*specs: TensorSpec, program, stores, lanes, width) -> tuple:
    if lanes < 1 or width < len(stores) or not stores or len(specs) < lanes * width:
        raise ShapeError(f"{len(specs)} inputs do not make {lanes} lanes of {width} with {len(stores)} variables each")
    out = []
    for lane in range(lanes):
        values = step_values(program, lane_inputs(specs, lane, width, lanes), infer_step)
        for k, ref in enumerate(stores):
            var, value = values[k], values[ref]
            if value.dtype != var.dtype:
                raise DTypeError(f"lane {lane}: a {value.dtype} value cannot update {var.dtype} variable {k}")
            if rules.broadcast(var.shape, value.shape) != tuple(var.shape):
                raise ShapeError(
                    f"lane {lane}: a value of shape {rules.fmt(value.shape)} cannot update "
                    f"variable {k} of shape {rules.fmt(var.shape)}"
                )
            out.append(var)
    return tuple(out)


def lane_values(xp, arrays, lane, program, stores, lanes, width) -> list:
    """The new values of lane ``lane``'s variables, computed with each op's own kernel."""
    inputs = lane_inputs(arrays, lane, width, lanes)
    values = program_values(xp, program, inputs)
    # a value that is an input may be a variable this op also writes: copy it first
    return [xp.asarray(values[r], copy=True) if r < len(inputs) else values[r] for r in stores]


def _update_kernel(xp, *arrays, program, stores, lanes, width):
    attrs = {"program": program, "stores": stores, "lanes": lanes, "width": width}
    writes = update_writes(attrs, len(arrays))
    fast = device_kernel(FUSED_UPDATE, xp, arrays, attrs)
    if fast is not None:
        outs = [xp.empty_like(arrays[w]) for w in writes]
        fast(arrays, outs)
        return tuple(outs)
    values = [v for lane in range(lanes) for v in lane_values(xp, arrays, lane, program, stores, lanes, width)]
    return tuple(xp.asarray(xp.broadcast_to(v, arrays[w].shape), copy=True) for v, w in zip(values, writes))


def _update_into(xp, _out, *arrays, program, stores, lanes, width):
    """The new values written into the variables' arrays (inputs at ``update_writes``)."""
    attrs = {"program": program, "stores": stores, "lanes": lanes, "width": width}
    writes = update_writes(attrs, len(arrays))
    outs = [arrays[w] for w in writes]
    fast = device_kernel(FUSED_UPDATE, xp, arrays, attrs)
    if fast is not None:
        fast(arrays, outs)  # each element's inputs are read before its outputs are written
        return tuple(outs)
    n = len(stores)
    for lane in range(lanes):  # all of a lane's values first: they read the variables' old values
        values = lane_values(xp, arrays, lane, program, stores, lanes, width)
        for out, value in zip(outs[lane * n : (lane + 1) * n], values):
            _assign_into(xp, out, out, value)
    return tuple(outs)


defop(
    FUSED_UPDATE,
    infer=_update_spec,
    kernel=_update_kernel,
    inplace=_update_into,
    writes=update_writes,
    stateful=True,
    variadic=True,
    nondiff=_PASS,
)


# -- softmax_cross_entropy_with_grad ---------------------------------------------------------


def _sce_with_grad_spec(logits: TensorSpec, labels: TensorSpec, upstream: TensorSpec, *, axis, keepdims, mean):
    loss, _ = _sce_spec(logits, labels)
    g = _unreduce_spec(upstream, loss, axis=axis, keepdims=keepdims, mean=mean)
    if g.dtype != logits.dtype:
        raise DTypeError(f"the loss's gradient is {g.dtype}, the logits {logits.dtype}")
    return loss, logits


def _sce_with_grad_kernel(xp, logits, labels, upstream, *, axis, keepdims, mean):
    fast = device_kernel(
        SCE_WITH_GRAD, xp, (logits, labels, upstream), {"axis": axis, "keepdims": keepdims, "mean": mean}
    )
    if fast is not None:
        check_indices(xp, labels, logits.shape[-1], "label")  # the generated kernel would read any row
        return fast(logits, labels, upstream)
    loss, probs = _sce_kernel(xp, logits, labels)
    g = _unreduce_kernel(xp, upstream, loss, axis=axis, keepdims=keepdims, mean=mean)
    return loss, _sce_grad_kernel(xp, probs, labels, g)


defop(
    SCE_WITH_GRAD,
    infer=_sce_with_grad_spec,
    kernel=_sce_with_grad_kernel,
    num_outputs=2,
    nondiff=_PASS,
    checks_values=True,
)


__all__ = [
    "DEVICE_KERNELS",
    "FUSED_UPDATE",
    "SCE_WITH_GRAD",
    "lane_inputs",
    "lane_values",
    "register_device_kernel",
    "update_writes",
]
