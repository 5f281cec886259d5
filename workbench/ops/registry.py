"""The op registry: one entry per op, with its shape rule, kernel and gradient side by side.

An op is registered once with :func:`defop`:

- ``infer(*specs, **attrs)`` returns the output :class:`TensorSpec` (or a tuple of
  them) and raises :class:`~workbench.errors.ShapeError` or
  :class:`~workbench.errors.DTypeError` for inputs that do not fit;
- ``kernel(xp, *arrays, **attrs)`` computes the outputs with the array namespace
  ``xp`` (NumPy, CuPy, any array-API namespace), so one kernel serves every device;
- ``grad(op, *output_grads)`` returns one gradient tensor (or ``None``) per input,
  built from the same op functions, so the backward pass is ordinary graph.
- ``inplace(xp, out, *arrays, **attrs)``, optional, computes what ``kernel`` does
  but writes the result into ``out``, an input the executor owns and no longer
  needs (or, for variable updates, the variable's current value); the executor
  only calls it when ``out`` has the result's shape and dtype.
- ``checks_values=True`` marks a kernel that reads values on the host to check them
  (indices in range): on a GPU that is a device-to-host sync, and such a plan is never
  captured as a CUDA graph (a replay would skip the check).
- ``collective=True`` marks an op whose kernel talks to the run's communicator
  (:mod:`workbench.ops.collective`): ``kernel(xp, x, comm=..., **attrs)``.
- ``writes(attrs, n_inputs)``, optional, for a stateful op that updates several
  variables at once: the input position of the variable each output is written
  into (a plain update writes its input 0).
- ``bodies``, optional, names the attributes that hold sub-graphs (the bodies of
  ``cond`` and ``scan``, see :mod:`workbench.graph.control`): a plan compiles each
  into a sub-plan once and passes them to the kernel as ``plans=``.

Ops without a gradient say why with ``nondiff="..."``; forgetting both is an error
at import time. The registry knows nothing of graphs: op functions reach the graph
layer through :func:`apply`, which the graph binds when it is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple
from collections.abc import Callable

import numpy as np

from workbench.errors import DTypeError, FeedError

Shape = tuple  # of int | None


class TensorSpec(NamedTuple):
    """Static description of a tensor: a shape (``None`` for unknown dimensions) and a dtype name."""

    shape: Shape
    dtype: str


@dataclass(frozen=True, slots=True)
class OpDef:
    name: str
    infer: Callable[..., Any]
    kernel: Callable[..., Any] | None
    grad: Callable[..., Any] | None = None
    nondiff: str | None = None  # why the op has no gradient
    num_outputs: int = 1
    stateful: bool = False  # reads or writes session state; never folded or merged
    random: bool = False  # the kernel takes a ``rng`` keyword
    elementwise: bool = False  # output[i] depends only on inputs[i] (after broadcasting)
    variadic: bool = False  # takes any number of inputs (concat, stack, group)
    inplace: Callable[..., Any] | None = None  # inplace(xp, out, *arrays, **attrs): kernel's result written into out
    checks_values: bool = False  # the kernel reads its inputs' values on the host (index checks)
    # an update of several variables: writes(attrs, n_inputs) gives the input position of the variable
    # each output is written into; kernel returns the new values, inplace(xp, None, ...) writes them there
    writes: Callable[..., tuple] | None = None
    # attributes holding sub-graphs (control-flow bodies): the plan compiler compiles each once into a
    # sub-plan and passes them to the kernel as ``plans=`` (a tuple, in this order)
    bodies: tuple[str, ...] = ()
    # a collective (ops/collective.py): the plan starts it with the run's communicator when its input
    # exists and waits for it at its first consumer; never folded, merged or captured. A string names
    # the communicator's kind when it is not the op's type (cross_replica_sum is an "all_reduce")
    collective: bool | str = False

    @property
    def differentiable(self) -> bool:
        return self.grad is not None


REGISTRY: dict[str, OpDef] = {}


def defop(name: str, **fields: Any) -> OpDef:
    """Register an op; see the module docstring for the fields."""
    if name in REGISTRY:
        raise ValueError(f"op {name!r} is registered twice")
    opdef = OpDef(name=name, **fields)
    if opdef.grad is None and opdef.nondiff is None:
        raise ValueError(f"op {name!r} needs a gradient rule or a nondiff reason")
    REGISTRY[name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op type {name!r}") from None


# -- the link to the graph layer ------------------------------------------------

_builder: Callable[..., Any] | None = None


def bind_builder(builder: Callable[..., Any]) -> None:
    """Called once by the graph layer: ``builder(op_type, inputs, attrs, name)`` adds an op."""
    global _builder
    _builder = builder


def apply(op_type: str, *inputs: Any, name: str | None = None, **attrs: Any) -> Any:
    """Add an op of ``op_type`` to the graph of its inputs (or the default graph)."""
    if _builder is None:  # pragma: no cover - the package binds it on import
        raise RuntimeError("workbench.graph is not imported")
    return _builder(op_type, inputs, attrs, name)


# -- dtypes ---------------------------------------------------------------------

DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "float16",
    "float32",
    "float64",
)
FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")


def as_dtype(dtype: Any) -> str:
    """The canonical name of ``dtype`` (a name, a NumPy dtype or a type), or DTypeError."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise DTypeError(f"unsupported dtype {dtype!r}; workbench supports {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def _ints_fit(array, target: np.dtype) -> bool:
    """Every integer of ``array`` is in ``target``'s range, told by one maximum where the signs allow.

    Unsigned values need only their maximum. Signed values cast to an unsigned type are seen as
    unsigned of their own width: a negative one becomes larger than any non-negative value of the
    source, so one maximum against the smaller of the two types' largest values finds both ends.
    Only a signed source narrowed to a signed target needs its minimum too.
    """
    info, source = np.iinfo(target), array.dtype
    if source.kind == "u":
        return int(array.max()) <= info.max
    if target.kind == "u":
        unsigned = array.view(source.str.replace("i", "u"))
        return int(unsigned.max()) <= min(info.max, np.iinfo(source).max)
    return info.min <= int(array.min()) and int(array.max()) <= info.max


def cast_exactly(array, dtype: str, what: str):
    """``array`` (NumPy or CuPy) cast to ``dtype``, or FeedError naming ``what`` if a value would change.

    Integers must fit the target's range (int64 ``2**40`` would wrap to 0 in int32,
    uint64 ``2**63`` would turn negative in int64); finite numbers must stay finite
    (``1e300`` is inf in float32). Rounding a number to a narrower float is not a change:
    float64 feeds of float32 placeholders stay accepted.
    """
    target, source = np.dtype(dtype), array.dtype
    if np.can_cast(source, target, "safe"):  # a widening cast changes no value: nothing to look at
        return array.astype(target)
    if target.kind in "iu" and source.kind in "iu" and array.size and not _ints_fit(array, target):
        info = np.iinfo(target)
        for value in (array.min(), array.max()):  # the exact look, for the message
            if not info.min <= int(value) <= info.max:
                raise FeedError(
                    f"{what} expects {dtype} values, got {source} value {int(value)} that {dtype} cannot hold"
                )
    # an overflow is reported below, with the placeholder's name. A finite sum means every
    # value is finite (one reduction, no temporary): only a non-finite sum (an overflow, or
    # an inf or NaN fed as such) needs the exact look
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(target)
        if target.kind != "f" or not array.size or bool(abs(converted.sum()) < np.inf):
            return converted
    # array methods and operators only: the same code for NumPy and CuPy arrays
    overflow = (abs(converted) == np.inf) & ~(abs(array) == np.inf)
    if bool(overflow.any()):
        value = array[overflow][0]
        raise FeedError(f"{what} expects {dtype} values, got {array.dtype} value {value} that overflows {dtype}")
    return converted
