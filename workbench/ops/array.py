"""Shape manipulation: reshape, transpose, concat, stack, indexing, gather, one_hot."""

from __future__ import annotations

import numpy as np

from workbench.errors import DTypeError, ShapeError
from workbench.ops import rules
from workbench.ops.registry import INTS, TensorSpec, apply, as_dtype, defop

# -- reshape, transpose, expand_dims ----------------------------------------------


def reshape(x, shape, name=None):
    """``x`` with a new shape; one dimension may be ``-1`` (inferred)."""
    return apply("reshape", x, shape=tuple(int(d) for d in shape), name=name)


def _reshape_spec(x: TensorSpec, *, shape) -> TensorSpec:
    if sum(d == -1 for d in shape) > 1 or any(d < -1 for d in shape):
        raise ShapeError(f"target shape {rules.fmt(shape)} may hold one -1 and no other negative size")
    total, known = rules.num_elements(x.shape), rules.num_elements([d for d in shape if d != -1])
    if -1 not in shape:
        if total is not None and total != known:
            raise ShapeError(f"cannot reshape {rules.fmt(x.shape)} ({total} elements) to {rules.fmt(shape)}")
        return TensorSpec(tuple(shape), x.dtype)
    if total is None:
        return TensorSpec(tuple(None if d == -1 else d for d in shape), x.dtype)
    if known == 0 or total % known:
        raise ShapeError(f"cannot reshape {rules.fmt(x.shape)} ({total} elements) to {rules.fmt(shape)}")
    return TensorSpec(tuple(total // known if d == -1 else d for d in shape), x.dtype)


def reshape_like(x, like, name=None):
    """``x`` reshaped to the (run-time) shape of ``like``."""
    return apply("reshape_like", x, like, name=name)


def _reshape_like_spec(x: TensorSpec, like: TensorSpec) -> TensorSpec:
    a, b = rules.num_elements(x.shape), rules.num_elements(like.shape)
    if a is not None and b is not None and a != b:
        raise ShapeError(f"cannot reshape {rules.fmt(x.shape)} to {rules.fmt(like.shape)}")
    return TensorSpec(like.shape, x.dtype)


defop(
    "reshape",
    infer=_reshape_spec,
    kernel=lambda xp, x, *, shape: xp.reshape(x, shape),
    grad=lambda op, g: (reshape_like(g, op.inputs[0]),),
)
defop(
    "reshape_like",
    infer=_reshape_like_spec,
    kernel=lambda xp, x, like: xp.reshape(x, like.shape),
    grad=lambda op, g: (reshape_like(g, op.inputs[0]), None),
)


def transpose(x, perm=None, name=None):
    """``x`` with its axes permuted (reversed when ``perm`` is None)."""
    return apply("transpose", x, perm=None if perm is None else tuple(int(p) for p in perm), name=name)


def _transpose_spec(x: TensorSpec, *, perm) -> TensorSpec:
    perm = _perm(perm, len(x.shape))
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"perm {perm} is not a permutation of the axes of {rules.fmt(x.shape)}")
    return TensorSpec(tuple(x.shape[p] for p in perm), x.dtype)


def _perm(perm, ndim):
    return tuple(range(ndim))[::-1] if perm is None else tuple(perm)


def _transpose_grad(op, g):
    perm = _perm(op.attrs["perm"], len(op.inputs[0].shape))
    return (transpose(g, tuple(int(i) for i in np.argsort(perm))),)


defop(
    "transpose",
    infer=_transpose_spec,
    kernel=lambda xp, x, *, perm: xp.permute_dims(x, _perm(perm, x.ndim)),
    grad=_transpose_grad,
)


def expand_dims(x, axis, name=None):
    """``x`` with a new axis of length 1 inserted at ``axis``."""
    return apply("expand_dims", x, axis=int(axis), name=name)


def _expand_dims_spec(x: TensorSpec, *, axis) -> TensorSpec:
    axis = rules.axis_index(axis, len(x.shape) + 1)
    return TensorSpec(x.shape[:axis] + (1,) + x.shape[axis:], x.dtype)


defop(
    "expand_dims",
    infer=_expand_dims_spec,
    kernel=lambda xp, x, *, axis: xp.expand_dims(x, axis=axis),
    grad=lambda op, g: (reshape_like(g, op.inputs[0]),),
)

# -- concat, stack ----------------------------------------------------------------


def concat(values, axis=0, name=None):
    """Join tensors along an existing axis."""
    return apply("concat", *values, axis=int(axis), name=name)


def _concat_spec(*specs: TensorSpec, axis) -> TensorSpec:
    if not specs:
        raise ShapeError("needs at least one tensor")
    dtype = rules.same_dtype(*specs)
    ndim = len(specs[0].shape)
    if any(len(s.shape) != ndim for s in specs):
        raise ShapeError(f"tensors differ in rank: {', '.join(rules.fmt(s.shape) for s in specs)}")
    axis = rules.axis_index(axis, ndim)
    out = []
    for i in range(ndim):
        dims = [s.shape[i] for s in specs]
        if i == axis:
            out.append(None if None in dims else int(np.sum(dims)))
            continue
        known = {d for d in dims if d is not None}
        if len(known) > 1:
            raise ShapeError(f"shapes {', '.join(rules.fmt(s.shape) for s in specs)} differ outside axis {axis}")
        out.append(known.pop() if known else None)
    return TensorSpec(tuple(out), dtype)


def _concat_grad(op, g):
    axis = rules.axis_index(op.attrs["axis"], len(g.shape))
    sizes = [x.shape[axis] for x in op.inputs]
    if None in sizes:
        return tuple(concat_part(g, *op.inputs, index=i, axis=axis) for i in range(len(sizes)))
    grads, start = [], 0
    for size in sizes:
        index = (slice(None),) * axis + (slice(start, start + size),)
        grads.append(g[index])
        start += size
    return tuple(grads)


defop(
    "concat",
    infer=_concat_spec,
    variadic=True,
    kernel=lambda xp, *xs, axis: xp.concat(xs, axis=axis),
    grad=_concat_grad,
)


def concat_part(g, *values, index, axis, name=None):
    """The part of ``g`` (a concatenation of ``values`` along ``axis``) that came from ``values[index]``."""
    return apply("concat_part", g, *values, index=int(index), axis=int(axis), name=name)


def _concat_part_kernel(xp, g, *values, index, axis):
    start = 0
    for v in values[:index]:
        start += v.shape[axis]
    return g[(slice(None),) * axis + (slice(start, start + values[index].shape[axis]), Ellipsis)]


defop(
    "concat_part",
    variadic=True,
    infer=lambda g, *values, index, axis: TensorSpec(values[index].shape, g.dtype),
    kernel=_concat_part_kernel,
    nondiff="gradient helper of concat for run-time sizes; second derivatives are not supported",
)


def stack(values, axis=0, name=None):
    """Join tensors of one shape along a new axis."""
    return apply("stack", *values, axis=int(axis), name=name)


def _stack_spec(*specs: TensorSpec, axis) -> TensorSpec:
    if not specs:
        raise ShapeError("needs at least one tensor")
    dtype = rules.same_dtype(*specs)
    ndim = len(specs[0].shape)
    shape = []
    for i in range(ndim):
        dims = {s.shape[i] for s in specs if len(s.shape) == ndim and s.shape[i] is not None}
        if len(dims) > 1 or any(len(s.shape) != ndim for s in specs):
            raise ShapeError(f"tensors differ in shape: {', '.join(rules.fmt(s.shape) for s in specs)}")
        shape.append(dims.pop() if dims else None)
    axis = rules.axis_index(axis, ndim + 1)
    return TensorSpec(tuple(shape[:axis]) + (len(specs),) + tuple(shape[axis:]), dtype)


def _stack_grad(op, g):
    axis = rules.axis_index(op.attrs["axis"], len(g.shape))
    return tuple(g[(slice(None),) * axis + (i,)] for i in range(len(op.inputs)))


defop("stack", infer=_stack_spec, variadic=True, kernel=lambda xp, *xs, axis: xp.stack(xs, axis=axis), grad=_stack_grad)

# -- indexing ---------------------------------------------------------------------


def getitem(x, index, name=None):
    """``x[index]`` for ints, slices (with steps), ``None`` and ``...``; ``t[i]`` calls this.

    A tensor index gathers along axis 0 (see :func:`gather`).
    """
    return apply("getitem", x, index=encode_index(index), name=name)


def encode_index(index) -> tuple:
    """A static index as JSON-friendly data: ``("int", i)``, ``("slice", a, b, c)``, ``("newaxis",)``, ``("ellipsis",)``."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for item in items:
        if isinstance(item, (bool, np.bool_)):
            raise ShapeError("boolean indices are not supported (the result's shape would depend on values)")
        if isinstance(item, (int, np.integer)):
            out.append(("int", int(item)))
        elif isinstance(item, slice):
            parts = [item.start, item.stop, item.step]
            if any(p is not None and not isinstance(p, (int, np.integer)) for p in parts):
                raise ShapeError(f"slice bounds must be ints or None, got {item}")
            if item.step == 0:
                raise ShapeError("slice step cannot be zero")
            out.append(("slice", *(None if p is None else int(p) for p in parts)))
        elif item is None:
            out.append(("newaxis",))
        elif item is Ellipsis:
            out.append(("ellipsis",))
        else:
            raise ShapeError(f"unsupported index {item!r}: use ints, slices, None, ... or gather()")
    if sum(1 for i in out if i[0] == "ellipsis") > 1:
        raise ShapeError("an index can hold one ellipsis")
    return tuple(out)


def decode_index(index) -> tuple:
    out = []
    for item in index:
        kind = item[0]
        if kind == "int":
            out.append(item[1])
        elif kind == "slice":
            out.append(slice(*item[1:]))
        elif kind == "newaxis":
            out.append(None)
        else:
            out.append(Ellipsis)
    if Ellipsis not in out:
        out.append(Ellipsis)  # the array API wants every axis indexed; NumPy means the same
    return tuple(out)


def _getitem_spec(x: TensorSpec, *, index) -> TensorSpec:
    items = list(index)
    consumed = sum(1 for i in items if i[0] in ("int", "slice"))
    if consumed > len(x.shape):
        raise ShapeError(f"too many indices for a tensor of shape {rules.fmt(x.shape)}")
    if ("ellipsis",) in items:
        at = items.index(("ellipsis",))
        items[at : at + 1] = [("slice", None, None, None)] * (len(x.shape) - consumed)
    else:
        items += [("slice", None, None, None)] * (len(x.shape) - consumed)
    shape, dim = [], 0
    for item in items:
        if item[0] == "newaxis":
            shape.append(1)
            continue
        size = x.shape[dim]
        if item[0] == "int":
            if size is not None and not -size <= item[1] < size:
                raise ShapeError(f"index {item[1]} is out of range for axis {dim} of size {size}")
        elif size is None:
            shape.append(None)
        else:
            shape.append(len(range(*slice(*item[1:]).indices(size))))
        dim += 1
    return TensorSpec(tuple(shape), x.dtype)


def getitem_grad(g, x, index, name=None):
    """Zeros shaped like ``x`` with ``g`` written at ``x[index]``: the gradient of indexing."""
    return apply("getitem_grad", g, x, index=tuple(index), name=name)


def _getitem_grad_kernel(xp, g, x, *, index):
    out = xp.zeros(x.shape, dtype=g.dtype)
    if ("newaxis",) in index:
        index, g = _without_newaxes(xp, index, g, x.ndim)
    out[decode_index(index)] = g
    return out


def _without_newaxes(xp, index, g, ndim):
    """The index without ``None`` items and ``g`` without the axes they added
    (the array API's ``__setitem__`` takes no ``None``)."""
    consumed = sum(1 for item in index if item[0] in ("int", "slice"))
    keys, shape, at = [], [], 0
    for item in index:
        kind = item[0]
        if kind == "newaxis":
            at += 1
            continue
        if kind == "slice":
            shape.append(g.shape[at])
            at += 1
        elif kind == "ellipsis":
            shape.extend(g.shape[at : at + ndim - consumed])
            at += ndim - consumed
        keys.append(item)
    shape.extend(g.shape[at:])
    return tuple(keys), xp.reshape(g, tuple(shape))


defop(
    "getitem",
    infer=_getitem_spec,
    kernel=lambda xp, x, *, index: x[decode_index(index)],
    grad=lambda op, g: (getitem_grad(g, op.inputs[0], op.attrs["index"]),),
)
defop(
    "getitem_grad",
    infer=lambda g, x, *, index: TensorSpec(x.shape, g.dtype),
    kernel=_getitem_grad_kernel,
    grad=lambda op, gg: (apply("getitem", gg, index=op.attrs["index"]), None),
)

# -- gather, one_hot ----------------------------------------------------------------


def gather(params, indices, axis=0, name=None):
    """Slices of ``params`` along ``axis`` picked by the integer tensor ``indices``."""
    return apply("gather", params, indices, axis=int(axis), name=name)


def _gather_spec(params: TensorSpec, indices: TensorSpec, *, axis) -> TensorSpec:
    if indices.dtype not in INTS:
        raise DTypeError(f"indices must be an integer tensor, got {indices.dtype}")
    axis = rules.axis_index(axis, len(params.shape))
    return TensorSpec(params.shape[:axis] + indices.shape + params.shape[axis + 1 :], params.dtype)


def check_indices(xp, indices, size: int, what: str = "index") -> None:
    """IndexError unless every value of ``indices`` is in ``[0, size)``.

    NumPy would wrap a negative index to the end and CuPy wraps any index, so a bad
    label would silently pick another class. On NumPy and CuPy arrays the check is one
    maximum of the indices seen as unsigned (a negative index becomes larger than any
    size) and one read: on a GPU, one device-to-host sync per call; the offending value is
    looked up only when there is one.
    """
    view = getattr(indices, "view", None)
    if view is not None and indices.dtype.kind in "iu":
        # one reduction, no temporary: seen as unsigned, a negative index is larger than any size
        if not indices.size or int(view(indices.dtype.str.replace("i", "u")).max()) < size:
            return
    bad = (indices < 0) | (indices >= size)
    if bool(xp.any(bad)):
        flat_bad = xp.reshape(bad, (-1,))
        first = int(xp.argmax(xp.astype(flat_bad, xp.int8)))
        value = int(xp.reshape(indices, (-1,))[first])
        count = int(xp.sum(xp.astype(flat_bad, xp.int64)))
        others = f" (and {count - 1} more)" if count > 1 else ""
        raise IndexError(f"{what} {value} at position {first} is out of range [0, {size}){others}")


def _gather_kernel(xp, params, indices, *, axis):
    axis = axis % params.ndim
    check_indices(xp, indices, params.shape[axis])
    flat = xp.take(params, xp.reshape(indices, (-1,)), axis=axis)
    return xp.reshape(flat, params.shape[:axis] + indices.shape + params.shape[axis + 1 :])


def gather_grad(g, params, indices, axis=0, name=None):
    """Zeros shaped like ``params`` with ``g`` added at the gathered positions (repeats add up)."""
    return apply("gather_grad", g, params, indices, axis=int(axis), name=name)


def _gather_grad_kernel(xp, g, params, indices, *, axis):
    axis = axis % params.ndim
    n, k = params.shape[axis], int(np.prod(indices.shape))
    rest = params.shape[:axis] + params.shape[axis + 1 :]
    # move the gathered axes to the front: (k, *rest)
    lead = tuple(range(axis, axis + indices.ndim))
    others = tuple(i for i in range(g.ndim) if i not in lead)
    values = xp.reshape(xp.permute_dims(g, lead + others), (k, -1))
    flat = xp.reshape(indices, (-1,))
    if xp.__name__ == "numpy":
        out = xp.zeros((n, values.shape[1]), dtype=g.dtype)
        xp.add.at(out, flat, values)
    else:  # array-API form: a one-hot matrix product
        hot = xp.astype(xp.expand_dims(flat, axis=0) == xp.reshape(xp.arange(n, dtype=flat.dtype), (n, 1)), g.dtype)
        out = xp.matmul(hot, values)
    out = xp.reshape(out, (n,) + rest)
    inverse = tuple(range(1, axis + 1)) + (0,) + tuple(range(axis + 1, params.ndim))
    return xp.permute_dims(out, inverse)


defop(
    "gather",
    infer=_gather_spec,
    kernel=_gather_kernel,
    checks_values=True,
    grad=lambda op, g: (gather_grad(g, *op.inputs, axis=op.attrs["axis"]), None),
)
defop(
    "gather_grad",
    infer=lambda g, params, indices, *, axis: TensorSpec(params.shape, g.dtype),
    kernel=_gather_grad_kernel,
    grad=lambda op, gg: (gather(gg, op.inputs[2], axis=op.attrs["axis"]), None, None),
)


def one_hot(indices, depth, dtype="float32", name=None):
    """``indices`` as one-hot vectors of length ``depth`` along a new last axis."""
    return apply("one_hot", indices, depth=int(depth), dtype=as_dtype(dtype), name=name)


def _one_hot_spec(indices: TensorSpec, *, depth, dtype) -> TensorSpec:
    if indices.dtype not in INTS:
        raise DTypeError(f"indices must be an integer tensor, got {indices.dtype}")
    if depth < 1:
        raise ShapeError(f"depth must be positive, got {depth}")
    return TensorSpec(indices.shape + (depth,), dtype)


def _one_hot_kernel(xp, indices, *, depth, dtype):
    check_indices(xp, indices, depth)
    hot = xp.expand_dims(indices, axis=-1) == xp.arange(depth, dtype=indices.dtype)
    return xp.astype(hot, getattr(xp, dtype))


defop("one_hot", infer=_one_hot_spec, kernel=_one_hot_kernel, nondiff="integer input", checks_values=True)
