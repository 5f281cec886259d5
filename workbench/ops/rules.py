"""Shape and dtype rules shared by several ops.

Rules see :class:`TensorSpec` values, where ``None`` is a dimension not known
until the graph runs. They raise ShapeError or DTypeError with the shapes in
the message; the graph layer adds the op's name and the user's source line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workbench.errors import DTypeError, ShapeError
from workbench.ops.registry import TensorSpec, is_float


# The most elements one tensor may have (about 8.6 GB of float32): larger shapes are refused
# when the graph is built or loaded, not met as a MemoryError on the first run.
MAX_ELEMENTS = 2**31


def fmt(shape: Sequence) -> str:
    """``(None, 64)`` for a shape, the way users write it."""
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def broadcast(*shapes: Sequence) -> tuple:
    """NumPy broadcasting of static shapes; ``None`` broadcasts with anything."""
    ndim = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError(f"shapes {', '.join(fmt(s) for s in shapes)} do not broadcast")
        if known:
            out.append(known.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def same_dtype(*specs: TensorSpec) -> str:
    dtypes = {s.dtype for s in specs}
    if len(dtypes) > 1:
        raise DTypeError(f"dtypes differ: {', '.join(s.dtype for s in specs)}; cast one of them")
    return specs[0].dtype


def need_float(spec: TensorSpec, what: str = "input") -> None:
    if not is_float(spec.dtype):
        raise DTypeError(f"{what} must be a float tensor, got {spec.dtype}")


def axis_index(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def axes_tuple(axis: int | Iterable[int] | None, ndim: int) -> tuple[int, ...]:
    """Normalized, sorted axes; ``None`` means all of them."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = tuple(sorted({axis_index(a, ndim) for a in axes}))
    if len(out) != len(axes):
        raise ShapeError(f"axis {axis} repeats an axis")
    return out


def reduced_shape(shape: Sequence, axis, keepdims: bool) -> tuple:
    axes = axes_tuple(axis, len(shape))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def dims_match(a, b) -> bool:
    return a is None or b is None or a == b


def num_elements(shape: Sequence | None) -> int | None:
    """The number of elements, or None when a size (or the rank: ``shape=None``) is unknown."""
    if shape is None:
        return None
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= d
    return n


def check_elements(shape: Sequence | None) -> None:
    """ShapeError if ``shape`` has more than :data:`MAX_ELEMENTS` elements with each unknown
    dimension at 1 (any tensor of that shape with a row in it would be too large)."""
    if shape is None:
        return
    count = 1
    for d in shape:
        count *= 1 if d is None else d
    if count > MAX_ELEMENTS:
        raise ShapeError(f"shape {fmt(shape)} has {count:,} elements, more than the limit of {MAX_ELEMENTS:,} (2**31)")
