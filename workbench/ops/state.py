"""Graph inputs and state: placeholders, constants, variables and their updates."""

from __future__ import annotations

import zlib

import numpy as np

from workbench.errors import DTypeError, ShapeError
from workbench.ops import rules
from workbench.ops.registry import TensorSpec, apply, as_dtype, defop, is_float

_INPUT = "a graph input: it has no inputs to differentiate"


def placeholder(name, shape=None, dtype="float32", default=None):
    """An input fed at run time; ``None`` in ``shape`` is a dimension of any size.

    ``shape=None`` accepts any rank. With ``default`` (a value of that dtype whose
    shape fits ``shape``) the placeholder need not be fed: a run that does not
    feed it uses the default (e.g. ``placeholder("training", (), "bool",
    default=False)``, fed ``True`` by ``fit(feed_dict={"training": True})``).
    The default is part of the graph and saved with it.
    """
    shape = None if shape is None else tuple(None if d is None else int(d) for d in shape)
    dtype = as_dtype(dtype)
    if default is None:
        return apply("placeholder", shape=shape, dtype=dtype, name=name)
    try:
        value = constant_array(default, dtype)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"placeholder {name!r}: default {default!r} is not a {dtype} value: {e}") from None
    return apply("placeholder", shape=shape, dtype=dtype, default=value, name=name)


def _placeholder_spec(*, shape, dtype, default=None) -> TensorSpec:
    if shape is not None and any(d is not None and d < 0 for d in shape):
        raise ShapeError(f"placeholder shape {rules.fmt(shape)} has a negative size")
    if default is not None:
        if not isinstance(default, np.ndarray) or default.dtype.name != dtype:
            kind = default.dtype.name if isinstance(default, np.ndarray) else type(default).__name__
            raise DTypeError(f"placeholder default must be a {dtype} array, got {kind}")
        fits = shape is None or (
            len(shape) == default.ndim and all(d is None or d == s for d, s in zip(shape, default.shape, strict=True))
        )
        if not fits:
            raise ShapeError(
                f"default of shape {rules.fmt(default.shape)} does not fit placeholder shape {rules.fmt(shape)}"
            )
    return TensorSpec(shape, dtype)


defop("placeholder", infer=_placeholder_spec, kernel=None, nondiff=_INPUT)


def constant(value, dtype=None, name=None):
    """A constant array; Python floats default to float32 and ints to int64."""
    return apply("constant", value=constant_array(value, dtype), name=name)


def constant_array(value, dtype=None) -> np.ndarray:
    if dtype is None:
        array = np.asarray(value)
        if array.dtype == np.float64 and not isinstance(value, np.ndarray) and not isinstance(value, np.generic):
            array = array.astype(np.float32)  # Python floats and lists of them
        dtype = array.dtype
    array = np.array(value, dtype=as_dtype(dtype))
    array.setflags(write=False)
    return array


defop(
    "constant",
    infer=lambda *, value: TensorSpec(value.shape, value.dtype.name),
    kernel=lambda xp, *, value: xp.asarray(value),
    nondiff=_INPUT,
)

# -- variables ------------------------------------------------------------------------

INITIALIZERS = ("zeros", "ones", "glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "normal", "uniform")


def variable(name, shape=None, init="glorot_uniform", dtype="float32", trainable=True):
    """A named variable that keeps its value between runs of a session.

    ``init`` is an initializer name (``"zeros"``, ``"ones"``, ``"glorot_uniform"``,
    ``"glorot_normal"``, ``"he_uniform"``, ``"he_normal"``, ``"normal"``,
    ``"uniform"``), a scalar, or an array (then ``shape`` may be left out).
    """
    if isinstance(init, (np.ndarray, list, tuple)):
        init = np.array(init, dtype=as_dtype(dtype))
        init.setflags(write=False)
        if shape is None:
            shape = init.shape
    elif isinstance(init, (int, float, np.number)) and not isinstance(init, bool):
        init = float(init)
    elif init not in INITIALIZERS:
        raise ShapeError(f"variable {name!r}: unknown initializer {init!r}; use one of {', '.join(INITIALIZERS)}")
    if shape is None:
        raise ShapeError(f"variable {name!r} needs a shape")
    shape = tuple(int(d) for d in shape)
    return apply("variable", shape=shape, dtype=as_dtype(dtype), init=init, trainable=bool(trainable), name=name)


def _variable_spec(*, shape, dtype, init, trainable) -> TensorSpec:
    if any(d is None or d < 0 for d in shape):
        raise ShapeError(f"a variable needs a fully known, non-negative shape, got {rules.fmt(shape)}")
    if isinstance(init, np.ndarray) and init.shape != tuple(shape):
        raise ShapeError(f"initial value of shape {rules.fmt(init.shape)} does not match shape {rules.fmt(shape)}")
    if isinstance(init, str) and init != "zeros" and init != "ones" and not is_float(dtype):
        raise DTypeError(f"initializer {init!r} needs a float dtype, got {dtype}")
    return TensorSpec(tuple(shape), dtype)


defop("variable", infer=_variable_spec, kernel=None, nondiff=_INPUT, stateful=True)


def initial_value(name: str, attrs: dict, seed: int) -> np.ndarray:
    """The initial value of variable ``name``: random initializers draw from a generator
    seeded by the session seed and the variable's name, so adding a variable never
    changes the others."""
    shape, dtype, init = tuple(attrs["shape"]), attrs["dtype"], attrs["init"]
    if isinstance(init, np.ndarray):
        return np.array(init, dtype=dtype)
    if isinstance(init, float):
        return np.full(shape, init, dtype=dtype)
    if init in ("zeros", "ones"):
        return (np.zeros if init == "zeros" else np.ones)(shape, dtype=dtype)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    fan_in, fan_out = _fans(shape)
    if init == "glorot_uniform":
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        value = rng.uniform(-limit, limit, shape)
    elif init == "glorot_normal":
        value = rng.normal(0.0, np.sqrt(2.0 / (fan_in + fan_out)), shape)
    elif init == "he_uniform":
        limit = np.sqrt(6.0 / fan_in)
        value = rng.uniform(-limit, limit, shape)
    elif init == "he_normal":
        value = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
    elif init == "normal":
        value = rng.normal(0.0, 0.05, shape)
    else:
        value = rng.uniform(-0.05, 0.05, shape)
    return value.astype(dtype)


def _fans(shape):
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    if len(shape) > 2:  # convolution filters (out, in, kh, kw)
        return shape[1] * receptive, shape[0] * receptive
    return shape[0], shape[1]


# -- updates ---------------------------------------------------------------------------


def assign(var, value, name=None):
    """Set ``var`` to ``value``; the op's output is the new value."""
    return apply("assign", var, value, name=name)


def assign_add(var, delta, name=None):
    """Add ``delta`` to ``var``; the op's output is the new value."""
    return apply("assign_add", var, delta, name=name)


def assign_sub(var, delta, name=None):
    """Subtract ``delta`` from ``var``; the op's output is the new value."""
    return apply("assign_sub", var, delta, name=name)


def _assign_spec(var: TensorSpec, value: TensorSpec) -> TensorSpec:
    rules.same_dtype(var, value)
    if rules.broadcast(var.shape, value.shape) != tuple(var.shape):
        raise ShapeError(
            f"cannot assign a value of shape {rules.fmt(value.shape)} to a variable of shape {rules.fmt(var.shape)}"
        )
    return var


def _assign_kernel(xp, current, value):
    # always a new array: the variable must not share memory with a fed array or another variable
    return xp.asarray(xp.broadcast_to(value, current.shape), copy=True)


_UPDATE = "updates a variable"


def _add_into(xp, out, current, delta):
    out += delta
    return out


def _subtract_into(xp, out, current, delta):
    out -= delta
    return out


def _assign_into(xp, out, current, value):
    # a copy into the variable's own array: still shares memory with nothing. CuPy's
    # out[...] = value parses an index and launches a copy kernel; its copyto is a memcpy
    if xp is np or not hasattr(xp, "copyto"):
        out[...] = value
    else:
        xp.copyto(out, value)
    return out


defop("assign", infer=_assign_spec, stateful=True, nondiff=_UPDATE, kernel=_assign_kernel, inplace=_assign_into)
defop(
    "assign_add",
    infer=_assign_spec,
    stateful=True,
    nondiff=_UPDATE,
    kernel=lambda xp, current, delta: current + delta,
    inplace=_add_into,
)
defop(
    "assign_sub",
    infer=_assign_spec,
    stateful=True,
    nondiff=_UPDATE,
    kernel=lambda xp, current, delta: current - delta,
    inplace=_subtract_into,
)
defop("no_op", infer=lambda: (), kernel=None, nondiff="does nothing", num_outputs=0)
