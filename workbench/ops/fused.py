"""``fused_elementwise``: several elementwise ops run as one kernel call.

The fusion pass (:mod:`workbench.graph.fusion`) replaces a tree of elementwise
ops by one ``fused_elementwise`` op whose ``program`` attribute is plain data,
so a fused graph still saves to JSON and loading it runs no code. A program is
a tuple of steps ``(op_type, refs, attrs, dtype)``:

- ``refs`` index into the values seen so far: first the op's inputs, then the
  result of each earlier step; the last step's result is the op's output;
- ``attrs`` is a tuple of ``(name, value)`` pairs, the step op's attributes;
- ``op_type`` ``"constant"`` is a scalar written into the program
  (``attrs == (("value", number),)``, no refs), so scalars cost no kernel argument.

The kernel here runs the steps one after another with each op's own kernel,
which is right on every array namespace. A device may bring *compilers* that
turn a program into one kernel for its arrays (the GPU layer generates a CUDA
elementwise kernel); a plan passes its device's compilers to the kernel as the
``compilers`` keyword. The ops layer knows nothing of devices.

Fusion runs on the graphs that plans execute, after differentiation, so the op
declares no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from workbench.errors import ShapeError
from workbench.ops.registry import REGISTRY, TensorSpec, defop

FUSED = "fused_elementwise"

#: op type -> functions ``compiler(xp, arrays, attrs)`` returning a faster callable for these
#: arrays, or None (another namespace, an unsupported dtype or layout); tried in order. Ops whose
#: kernels ask :func:`device_kernel` first (the fused training-step ops, convolutions) use them.
DEVICE_KERNELS: dict[str, list[Callable]] = {}


def register_device_kernel(op_type: str, compiler: Callable) -> None:
    """Add a device kernel compiler for ``op_type`` (once; the same function again does nothing)."""
    found = DEVICE_KERNELS.setdefault(op_type, [])
    if compiler not in found:
        found.append(compiler)


def device_kernel(op_type: str, xp, arrays, attrs: dict):
    """The first registered device kernel that takes ``arrays``, or None."""
    for compiler in DEVICE_KERNELS.get(op_type, ()):
        found = compiler(xp, arrays, attrs)
        if found is not None:
            return found
    return None


def step_values(program, input_specs, infer) -> list:
    """Walk ``program`` with ``infer(op_type, arg_values, attrs, dtype)``; returns every value."""
    values = list(input_specs)
    for i, step in enumerate(program):
        if not isinstance(step, tuple) or len(step) != 4:
            raise ShapeError(f"program step {i} is not (op_type, refs, attrs, dtype): {step!r}")
        kind, refs, attrs, dtype = step
        if kind != "constant" and (kind not in REGISTRY or kind == FUSED):
            raise ShapeError(f"program step {i} uses unknown op {kind!r}")
        if any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < len(values) for r in refs):
            raise ShapeError(f"program step {i} refers to {refs!r}; only 0..{len(values) - 1} exist")
        values.append(infer(kind, [values[r] for r in refs], dict(attrs), dtype))
    return values


def infer_step(kind, args, attrs, dtype):
    if kind == "constant":
        return TensorSpec((), dtype)
    spec = REGISTRY[kind].infer(*args, **attrs)
    if not isinstance(spec, TensorSpec):
        raise ShapeError(f"program step {kind!r} must have one output")
    return spec


def _fused_spec(*specs: TensorSpec, program) -> TensorSpec:
    if not program:
        raise ShapeError("a fused program needs at least one step")
    return step_values(program, specs, infer_step)[-1]


def program_values(xp, program, arrays) -> list:
    """Every value of ``program`` run step by step with each op's registered kernel: inputs, then steps."""
    values = list(arrays)
    for kind, refs, attrs, dtype in program:
        if kind == "constant":
            values.append(xp.asarray(attrs[0][1], dtype=getattr(xp, dtype)))
        else:
            values.append(REGISTRY[kind].kernel(xp, *[values[r] for r in refs], **dict(attrs)))
    return values


def run_program(xp, program, arrays):
    """Compute ``program`` step by step with each op's registered kernel."""
    return program_values(xp, program, arrays)[-1]


def _fused_kernel(xp, *arrays, program, compilers: Sequence[Callable] = ()):
    """``program`` on ``arrays``: by the first of ``compilers`` (functions
    ``compiler(xp, program, arrays)`` returning a callable, or None when they
    cannot: another namespace, an unsupported dtype) that can, else step by step."""
    for compiler in compilers:
        compiled = compiler(xp, program, arrays)
        if compiled is not None:
            return compiled(*arrays)
    return run_program(xp, program, arrays)


defop(
    FUSED,
    infer=_fused_spec,
    kernel=_fused_kernel,
    variadic=True,
    nondiff="made by the fusion pass, which runs after differentiation",
)
