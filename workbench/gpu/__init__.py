"""GPU execution: the CuPy array namespace for plans, transfers, fused kernels, memory pool.

Nothing here is imported until a session asks for ``device="gpu"``; CuPy itself
is imported only when a :class:`GPU` is opened, and a missing CuPy or CUDA
device raises :class:`~workbench.errors.DeviceError` saying which.

- :mod:`workbench.gpu.device`: :class:`GPU`, what a session runs with;
- :mod:`workbench.gpu.codegen`: CUDA C expressions of elementwise ops (no CuPy needed);
- :mod:`workbench.gpu.kernels`: fused programs as cached ``cupy.ElementwiseKernel`` objects.

The ops keep one kernel each, written against the array namespace; this
package supplies the namespace, not a second copy of any op.
"""

from workbench.gpu.device import GPU, import_cupy

__all__ = ["GPU", "import_cupy"]
