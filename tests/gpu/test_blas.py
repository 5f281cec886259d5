"""Capturable matrix products (cuBLAS through ctypes) and the capture around them, on NumPy.

A stand-in cuBLAS library does what ``cublasGemmEx`` does on column-major
memory at the addresses it is given, so the row-major/column-major bookkeeping
of :class:`CapturableMatmul` is checked for real.
"""

import contextlib
import ctypes
import types

import numpy as np
import pytest

from workbench.gpu.blas import OP_N, OP_T, CapturableMatmul, CublasError, gemm_layout
from workbench.gpu.graphs import CudaCapture

DTYPES = {0: np.float32, 1: np.float64, 2: np.float16}


class FakeCublas:
    """The five cuBLAS entry points CapturableMatmul calls, on host memory."""

    def __init__(self, fail=False):
        self.calls, self.workspace, self.streams, self.fail = [], None, [], fail

    def cublasCreate_v2(self, ref):
        ref._obj.value = 0x1234
        return 0

    def cublasDestroy_v2(self, handle):
        return 0

    def cublasSetWorkspace_v2(self, handle, pointer, size):
        self.workspace = (pointer.value, size.value)
        return 0

    def cublasSetStream_v2(self, handle, stream):
        self.streams.append(stream.value or 0)  # c_void_p(0).value is None
        return 0

    def cublasGemmEx(
        self, handle, op_a, op_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c, c_type, ldc, compute, algo
    ):
        self.calls.append((op_a, op_b, m, n, k, lda, ldb, ldc))
        if self.fail:
            return 13  # CUBLAS_STATUS_EXECUTION_FAILED
        dtype = np.dtype(DTYPES[a_type])
        first = _column_major(a, *((m, k) if op_a == OP_N else (k, m)), lda, dtype)
        second = _column_major(b, *((k, n) if op_b == OP_N else (n, k)), ldb, dtype)
        out = _column_major(c, m, n, ldc, dtype)
        first, second = (first if op_a == OP_N else first.T), (second if op_b == OP_N else second.T)
        product = alpha._obj.value * (first.astype(np.float64) @ second)
        out[...] = product if beta._obj.value == 0 else product + beta._obj.value * out  # beta 0: C is not read
        return 0


def _column_major(pointer, rows, cols, ld, dtype):
    """The ``rows x cols`` column-major matrix with leading dimension ``ld`` at ``pointer``."""
    size = (ld * (cols - 1) + rows) * dtype.itemsize
    flat = np.frombuffer((ctypes.c_char * size).from_address(pointer.value), dtype)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (dtype.itemsize, ld * dtype.itemsize))


HOST_CUPY = types.SimpleNamespace(empty=np.empty, uint8=np.uint8, ndarray=np.ndarray)


def _matmul(fail=False):
    lib = FakeCublas(fail)
    return CapturableMatmul(HOST_CUPY, np.matmul, library=lib, pointer=lambda a: a.ctypes.data, workspace=1 << 10), lib


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_products_of_c_and_f_contiguous_operands(ta, tb, dtype):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 6) if ta else (6, 4)).astype(dtype)
    b = rng.normal(size=(5, 4) if tb else (4, 5)).astype(dtype)
    a, b = (a.T if ta else a), (b.T if tb else b)  # transposes are F-contiguous views
    matmul, lib = _matmul()
    out = matmul(a, b)
    assert out.shape == (6, 5) and out.dtype == a.dtype
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=2e-3 if dtype == "float16" else 1e-6)
    assert lib.calls[0][:2] == (OP_T if tb else OP_N, OP_T if ta else OP_N) and matmul.calls == 1


def test_other_operands_go_to_the_namespaces_matmul():
    matmul, lib = _matmul()
    batched = np.ones((2, 3, 4), np.float32)
    np.testing.assert_array_equal(matmul(batched, np.ones((4, 5), np.float32)), np.full((2, 3, 5), 4.0))
    assert gemm_layout(np.ones((3, 4)), np.ones((4, 5), np.float32)) is None  # mixed dtypes
    assert gemm_layout(np.ones((3, 8))[:, ::2], np.ones((4, 5))) is None  # strided
    assert gemm_layout(np.ones((3, 4), np.int64), np.ones((4, 5), np.int64)) is None
    assert matmul.fallbacks == 1 and lib.calls == []
    assert gemm_layout(np.ones((3, 4)), np.ones((4, 5))) == ((OP_N, 5), (OP_N, 4), (3, 5, 4))


def test_workspace_stream_and_errors():
    matmul, lib = _matmul(fail=True)
    assert lib.workspace == (matmul.workspace.ctypes.data, 1 << 10)
    matmul.bind(77)
    assert lib.streams == [77]
    with pytest.raises(CublasError, match=r"cublasGemmEx\(\(2, 3\) @ \(3, 2\), float32\) returned cuBLAS status 13"):
        matmul(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))


class FakeStream:
    def __init__(self, log, ptr):
        self.log, self.ptr, self.capturing = log, ptr, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        self.log.append("begin")
        self.capturing = True

    def end_capture(self):
        self.log.append("end")
        self.capturing = False
        return "graph"


def _fake_cupy(log):
    streams = [FakeStream(log, 0), FakeStream(log, 99)]
    cuda = types.SimpleNamespace(
        Stream=lambda non_blocking: streams[1],
        get_current_stream=lambda: streams[0],
        MemoryPool=lambda: types.SimpleNamespace(malloc=None),
        using_allocator=lambda malloc: contextlib.nullcontext(),
    )
    return types.SimpleNamespace(cuda=cuda, empty=np.empty, uint8=np.uint8), streams[1]


def test_capture_and_warm_up_use_the_capturable_matmul_on_their_streams():
    log = []
    cupy, stream = _fake_cupy(log)
    xp = types.SimpleNamespace(matmul=np.matmul)
    matmul, lib = _matmul()
    capture = CudaCapture(cupy, xp, matmul=matmul)
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)

    def step():
        log.append(("matmul", xp.matmul is matmul, stream.capturing))
        return [xp.matmul(a, b)]

    np.testing.assert_array_equal(capture.warm(step)[0], np.full((2, 4), 3.0))
    graph, outputs, _ = capture.capture(step)
    assert graph == "graph" and xp.matmul is np.matmul and matmul.calls == 2
    assert log == [("matmul", True, False), "begin", ("matmul", True, True), "end"]
    assert lib.streams == [0, 99]  # the warm-up on the current stream, the capture on the side stream

    def host_sync():
        raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="not permitted"):
        capture.capture(host_sync)
    assert log[-2:] == ["begin", "end"] and xp.matmul is np.matmul and not stream.capturing
