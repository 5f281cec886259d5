"""Fused programs as CuPy kernels, generated once and cached.

:class:`FusedKernels` is the program compiler the GPU device registers with
:mod:`workbench.ops.fused`: for CuPy arrays it returns one callable per
(program, input dtypes), which picks a kernel at each call:

- float32 programs whose inputs are C-contiguous arrays of one shape (plus any
  one-element arrays, read as scalars) with 16-byte aligned data run as a
  ``cupy.RawKernel`` that loads and stores 4 floats at a time
  (:func:`workbench.gpu.codegen.vector_kernel_source`); its launch is also
  cheaper on the host than an elementwise kernel's;
- everything else runs as a ``cupy.ElementwiseKernel``, which broadcasts its
  inputs and which CuPy caches per dtype signature. When every input is
  C-contiguous and of one shape it runs on flat 1-D views (CuPy's indexing is
  then a plain ``i``, with no N-d index arithmetic).

Both kernels come from the same C expression of each op (:mod:`workbench.gpu.codegen`).
"""

from __future__ import annotations

import numpy as np

from workbench.gpu.codegen import VECTOR_BLOCK, kernel_name, kernel_source, vector_grid, vector_kernel_source

FLOAT32 = np.dtype("float32")


class FusedKernels:
    """Compiles fused programs for the arrays of one CuPy module.

    ``pointer(array)`` gives an array's device address (``array.data.ptr`` for
    CuPy); stand-ins in tests pass their own, as they may ``multiprocessors``.
    """

    def __init__(self, cupy, pointer=None, multiprocessors: int | None = None):
        self.cupy = cupy
        self.array_type = cupy.ndarray
        self.pointer = pointer or _device_pointer
        self.vectorize = getattr(cupy, "RawKernel", None) is not None
        self.multiprocessors = multiprocessors or (_multiprocessors(cupy) if self.vectorize else 1)
        # (id(program), dtype chars) -> (program, callable or None); holding the program keeps its id unique
        self.cache: dict[tuple, tuple] = {}
        self.last: dict[int, tuple] = {}  # id(program) -> (program, dtypes, callable): no key tuple per call
        self.compiled = 0
        self.vector_calls = 0  # calls that ran a vectorized kernel

    def __call__(self, xp, program, arrays):
        if not arrays or arrays[0].__class__ is not self.array_type:
            return None
        last = self.last.get(id(program))
        if last is not None and last[0] is program and last[1] == [a.dtype for a in arrays]:
            return last[2]
        key = (id(program), tuple(a.dtype.char for a in arrays))
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = (program, self.build(program, [a.dtype.name for a in arrays]))
        self.last[id(program)] = (program, [a.dtype for a in arrays], hit[1])
        return hit[1]

    def build(self, program, dtypes):
        """The callable for ``program`` on inputs of ``dtypes`` (None if the generator cannot)."""
        source = kernel_source(program, dtypes)
        if source is None:
            return None
        params, out, body = source
        self.compiled += 1
        call = flat_when_possible(self.cupy.ElementwiseKernel(params, out, body, name=kernel_name(body)))
        if self.vectorize and all(d == "float32" for d in dtypes) and out == "float32 out0":
            return VectorOrElementwise(self, program, len(dtypes), call)
        return call


class VectorOrElementwise:
    """A float32 program: the vectorized kernel where :func:`vector_layout` allows, else ``elementwise``."""

    __slots__ = ("owner", "program", "n_inputs", "elementwise", "kernels", "kernel")

    def __init__(self, owner: FusedKernels, program, n_inputs: int, elementwise):
        self.owner, self.program, self.n_inputs = owner, program, n_inputs
        self.elementwise = self.kernel = elementwise
        self.kernels: dict[tuple, tuple] = {}  # scalar positions -> (name, RawKernel)

    def __call__(self, *arrays):
        owner = self.owner
        layout = vector_layout(arrays, owner.pointer)
        if layout is None:
            return self.elementwise(*arrays)
        shape, size, scalars = layout
        found = self.kernels.get(scalars)
        if found is None:
            found = self.kernels[scalars] = self.compile(scalars)
        out = owner.cupy.empty(shape, FLOAT32)
        found((vector_grid(size, owner.multiprocessors),), (VECTOR_BLOCK,), (*arrays, out, np.int64(size)))
        owner.vector_calls += 1
        return out

    def compile(self, scalars):
        name, source = vector_kernel_source(self.program, self.n_inputs, scalars)
        self.owner.compiled += 1
        return self.owner.cupy.RawKernel(source, name)


def vector_layout(arrays, pointer) -> tuple | None:
    """``(shape, size, scalar positions)`` when the vectorized kernel may run on ``arrays``, else None.

    It may when every array of more than one element is C-contiguous, of one
    shape and 16-byte aligned, one-element arrays (the scalars) have no more
    dimensions than that shape, and the shape is not empty.
    """
    shape, size, scalars = None, 0, ()
    for i, a in enumerate(arrays):
        if a.size == 1:
            scalars += (i,)
            continue
        if shape is None:
            shape, size = a.shape, a.size
        elif a.shape != shape:
            return None
        if not a.flags.c_contiguous or pointer(a) % 16:
            return None
    if shape is None or size == 0:
        return None
    ndim = len(shape)
    for i in scalars:
        if arrays[i].ndim > ndim:
            return None
    return shape, size, scalars


def flat_when_possible(kernel):
    """``kernel`` called on 1-D views when its inputs are C-contiguous N-d arrays of one shape."""

    def call(*arrays):
        shape = arrays[0].shape
        if len(shape) > 1 and all(a.shape == shape and a.flags.c_contiguous for a in arrays):
            return kernel(*[a.ravel() for a in arrays]).reshape(shape)  # views: no copies
        return kernel(*arrays)

    call.kernel = kernel
    return call


def _device_pointer(a) -> int:
    return a.data.ptr


def _multiprocessors(cupy) -> int:
    """SM count of the current device (the vectorized grid is a few blocks per SM)."""
    try:
        device = cupy.cuda.Device()
        return int(cupy.cuda.runtime.getDeviceProperties(device.id)["multiProcessorCount"])
    except Exception:  # noqa: BLE001 - a stand-in module without a runtime
        return 16
