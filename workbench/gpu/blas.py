"""Matrix products that a CUDA graph can record: cuBLAS through its C interface.

CuPy refuses every cuBLAS call while a stream captures: its ``setStream``, which
each of its cuBLAS wrappers (``cupy.matmul`` and the low-level
``cupy_backends.cuda.libs.cublas`` functions alike) calls first, raises
``NotImplementedError`` on a capturing stream. cuBLAS itself supports capture
when the handle has a preallocated workspace (``cublasSetWorkspace``: nothing is
allocated while capturing) and scalars in host memory, as NVIDIA documents for
CUDA graphs. :class:`CapturableMatmul` calls the cuBLAS library that CuPy loaded,
with ctypes, on a handle of its own set up that way; while a plan's run is
captured it stands in for the namespace's ``matmul``
(:class:`workbench.gpu.graphs.CudaCapture`). Plain runs keep CuPy's matmul.

It takes 2-D float16, float32 and float64 operands that are C- or F-contiguous
(a transposed operand is an F-contiguous view); anything else goes to the
namespace's own matmul, which then refuses the capture, and the plan runs plainly
with that reason in an event.
"""

from __future__ import annotations

import ctypes
import ctypes.util

OP_N, OP_T = 0, 1
GEMM_DEFAULT = -1
#: dtype -> (cudaDataType of the operands, cublasComputeType_t, C type of alpha and beta)
TYPES = {
    "float16": (2, 68, ctypes.c_float),  # CUDA_R_16F, CUBLAS_COMPUTE_32F
    "float32": (0, 68, ctypes.c_float),  # CUDA_R_32F, CUBLAS_COMPUTE_32F (no TF32, as CuPy's default)
    "float64": (1, 70, ctypes.c_double),  # CUDA_R_64F, CUBLAS_COMPUTE_64F
}
WORKSPACE = 32 << 20  # bytes: what cuBLAS recommends for Hopper


def load_cublas(cupy):
    """The cuBLAS library CuPy uses (already loaded: found by its soname), via ctypes."""
    cupy.cuda.device.get_cublas_handle()  # CuPy loads cuBLAS lazily: have it loaded, wherever it lives
    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    names = [f"libcublas.so.{major}", ctypes.util.find_library("cublas")]
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError(f"cuBLAS not found (tried {', '.join(filter(None, names))})")


class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than CUBLAS_STATUS_SUCCESS."""


def _check(status: int, call: str) -> None:
    if status != 0:
        raise CublasError(f"{call} returned cuBLAS status {status}")


class CapturableMatmul:
    """``matmul(a, b)`` with cuBLAS on its own handle, workspace and stream.

    Parameters
    ----------
    cupy : the CuPy module (or a stand-in with ``empty``, ``ndarray`` and ``uint8``)
    fallback : the matmul for operands this one does not take
    library : cuBLAS as a ctypes library (default: :func:`load_cublas`)
    pointer : device address of an array (default ``array.data.ptr``)
    """

    def __init__(self, cupy, fallback, library=None, pointer=None, workspace: int = WORKSPACE):
        self.cupy, self.fallback = cupy, fallback
        self.lib = library if library is not None else load_cublas(cupy)
        self.pointer = pointer or (lambda a: a.data.ptr)
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cupy.empty(workspace, cupy.uint8)  # lives as long as this object, and so the graphs
        _check(
            self.lib.cublasSetWorkspace_v2(
                self.handle, ctypes.c_void_p(self.pointer(self.workspace)), ctypes.c_size_t(workspace)
            ),
            "cublasSetWorkspace",
        )
        self.calls = self.fallbacks = 0

    def bind(self, stream_ptr: int) -> None:
        """Queue later products on ``stream_ptr`` (set before capture begins: setting it is not captured)."""
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")

    def __call__(self, a, b, /):
        layout = gemm_layout(a, b)
        if layout is None:
            self.fallbacks += 1
            return self.fallback(a, b)
        (op_b, ld_b), (op_a, ld_a), (m, n, k) = layout
        data_type, compute, scalar = TYPES[a.dtype.name]
        out = self.cupy.empty((m, n), a.dtype)
        alpha, beta = scalar(1.0), scalar(0.0)
        # row-major out = a @ b is column-major out^T = b^T @ a^T: cuBLAS sees each C-contiguous
        # array as its transpose already, and an F-contiguous one as itself (then op T)
        status = self.lib.cublasGemmEx(
            self.handle,
            op_b,
            op_a,
            n,
            m,
            k,
            ctypes.byref(alpha),
            ctypes.c_void_p(self.pointer(b)),
            data_type,
            ld_b,
            ctypes.c_void_p(self.pointer(a)),
            data_type,
            ld_a,
            ctypes.byref(beta),
            ctypes.c_void_p(self.pointer(out)),
            data_type,
            n,
            compute,
            GEMM_DEFAULT,
        )
        _check(status, f"cublasGemmEx({a.shape} @ {b.shape}, {a.dtype})")
        self.calls += 1
        return out

    def close(self) -> None:
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()


def gemm_layout(a, b) -> tuple | None:
    """``((op_b, ld_b), (op_a, ld_a), (m, n, k))`` of ``a @ b`` for cublasGemmEx, or None."""
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype or a.dtype.name not in TYPES:
        return None
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2 or 0 in (m, n, k):
        return None
    found = []
    for x in (b, a):
        if x.flags.c_contiguous:
            found.append((OP_N, max(1, x.shape[1])))
        elif x.flags.f_contiguous:
            found.append((OP_T, max(1, x.shape[0])))
        else:
            return None
    return found[0], found[1], (m, n, k)
