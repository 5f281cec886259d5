"""Fused programs as CuPy elementwise kernels, generated once and cached.

:class:`FusedKernels` is the program compiler the GPU device registers with
:mod:`workbench.ops.fused`: for CuPy arrays it returns one
``cupy.ElementwiseKernel`` per (program, input dtypes). Shapes need no key of
their own: the kernel broadcasts its inputs at each call, and CuPy caches the
compiled binary per dtype signature.

When every input is C-contiguous and of one shape (no broadcasting), the
kernel runs on flat 1-D views and the result is reshaped back: CuPy's indexing
is then a plain ``i``, with no per-element N-d index arithmetic.
"""

from __future__ import annotations

from workbench.gpu.codegen import kernel_name, kernel_source


class FusedKernels:
    """Compiles fused programs for the arrays of one CuPy module."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.array_type = cupy.ndarray
        # (id(program), dtypes) -> (program, callable or None); holding the program keeps its id unique
        self.cache: dict[tuple, tuple] = {}
        self.compiled = 0

    def __call__(self, xp, program, arrays):
        if not arrays or arrays[0].__class__ is not self.array_type:
            return None
        key = (id(program), tuple(a.dtype.char for a in arrays))
        hit = self.cache.get(key)
        if hit is None:
            kernel = self.build(program, [a.dtype.name for a in arrays])
            hit = self.cache[key] = (program, None if kernel is None else flat_when_possible(kernel))
        return hit[1]

    def build(self, program, dtypes):
        source = kernel_source(program, dtypes)
        if source is None:
            return None
        params, out, body = source
        self.compiled += 1
        return self.cupy.ElementwiseKernel(params, out, body, name=kernel_name(body))


def flat_when_possible(kernel):
    """``kernel`` called on 1-D views when its inputs are C-contiguous N-d arrays of one shape."""

    def call(*arrays):
        shape = arrays[0].shape
        if len(shape) > 1 and all(a.shape == shape and a.flags.c_contiguous for a in arrays):
            return kernel(*[a.ravel() for a in arrays]).reshape(shape)  # views: no copies
        return kernel(*arrays)

    call.kernel = kernel
    return call
