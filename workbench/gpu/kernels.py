"""Fused programs as CuPy elementwise kernels, generated once and cached.

:class:`FusedKernels` is the program compiler the GPU device registers with
:mod:`workbench.ops.fused`: for CuPy arrays it returns one
``cupy.ElementwiseKernel`` per (program, input dtypes). Shapes need no key of
their own: the kernel broadcasts its inputs at each call, and CuPy caches the
compiled binary per dtype signature.
"""

from __future__ import annotations

from workbench.gpu.codegen import kernel_name, kernel_source


class FusedKernels:
    """Compiles fused programs for the arrays of one CuPy module."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.array_type = cupy.ndarray
        # (id(program), dtypes) -> (program, kernel or None); holding the program keeps its id unique
        self.cache: dict[tuple, tuple] = {}
        self.compiled = 0

    def __call__(self, xp, program, arrays):
        if not arrays or arrays[0].__class__ is not self.array_type:
            return None
        key = (id(program), tuple(a.dtype.char for a in arrays))
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = (program, self.build(program, [a.dtype.name for a in arrays]))
        return hit[1]

    def build(self, program, dtypes):
        source = kernel_source(program, dtypes)
        if source is None:
            return None
        params, out, body = source
        self.compiled += 1
        return self.cupy.ElementwiseKernel(params, out, body, name=kernel_name(body))
