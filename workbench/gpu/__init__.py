"""GPU execution: the CuPy array namespace for plans, transfers, fused kernels, memory pool.

Nothing here is imported until a session asks for ``device="gpu"``; CuPy itself
is imported only when a :class:`GPU` is opened, and a missing CuPy or CUDA
device raises :class:`~workbench.errors.DeviceError` saying which.

- :mod:`workbench.gpu.device`: :class:`GPU`, what a session runs with;
- :mod:`workbench.gpu.codegen`: CUDA C expressions of elementwise ops (no CuPy needed);
- :mod:`workbench.gpu.kernels`: fused programs as cached ``cupy.ElementwiseKernel`` objects;
- :mod:`workbench.gpu.train_codegen`, :mod:`workbench.gpu.train_kernels`: one kernel for each
  parameter group's optimizer update and for cross-entropy with its gradient;
- :mod:`workbench.gpu.conv_kernels`: convolutions as im2col/col2im kernels and one GEMM each;
- :mod:`workbench.gpu.graphs`, :mod:`workbench.gpu.blas`: whole plan runs captured as CUDA
  graphs, matmuls included (cuBLAS called directly, with its own workspace).

The ops keep one kernel each, written against the array namespace; this
package supplies the namespace, not a second copy of any op.
"""

from workbench.gpu.device import GPU, import_cupy

__all__ = ["GPU", "import_cupy"]
