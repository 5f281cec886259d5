"""Convolutions on the GPU as one generated gather kernel and one large matrix product.

The array-namespace kernels of :mod:`workbench.ops.nn` build columns from
``kh * kw`` shifted views (a padding copy, ``kh * kw`` slices, a stack) and
multiply per example (a batched product). Here each of the three convolution
ops is three kernel calls, whatever the kernel size:

- ``conv2d``: ``im2col`` (one generated kernel, padding included) to columns
  ``(C*kh*kw, N*Ho*Wo)``, one GEMM ``(O, C*kh*kw) @ columns``, one copy to NCHW;
- ``conv2d_filter_grad``: ``im2col``, the gradient to ``(O, N*Ho*Wo)`` (a copy),
  one GEMM with the columns transposed;
- ``conv2d_input_grad``: one GEMM to column gradients, then ``col2im`` (one
  generated kernel: each input element sums the columns it was copied to; no atomics).

The products go through the namespace's ``matmul``, so they are captured in
CUDA graphs like any other (:mod:`workbench.gpu.blas`).
"""

from __future__ import annotations

import numpy as np

from workbench.gpu.codegen import C_TYPES, HEADERS, STORAGE, load, store
from workbench.gpu.kernels import _multiprocessors
from workbench.gpu.train_codegen import BLOCK, grid
from workbench.ops.fused import register_device_kernel
from workbench.ops.nn import _geometry

DTYPES = ("float16", "float32", "float64")
GEOMETRY = (
    "long long n, long long c, long long h, long long w, long long kh, long long kw, long long sh, long long sw, "
    "long long pt, long long pl, long long ho, long long wo"
)


def _gather_source(name: str, dtype: str, src: str, dst: str, total: str, body: list[str]) -> tuple[str, str]:
    """A grid-stride loop over ``total`` elements ``e`` of ``dst``, reading ``src``, with the geometry."""
    s = STORAGE[dtype]
    lines = [
        *([HEADERS[dtype]] if dtype in HEADERS else []),
        f'extern "C" __global__ void {name}(const {s}* {src}, {s}* {dst}, {GEOMETRY}) {{',
        f"    const long long width = n * ho * wo, total = {total};",
        "    const long long stride = (long long)blockDim.x * gridDim.x;",
        "    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {",
        *(f"        {line}" for line in body),
        "    }",
        "}",
    ]
    return name, "\n".join(lines) + "\n"


def im2col_source(dtype: str) -> tuple[str, str]:
    """``(name, source)``: ``cols[(c*kh + i)*kw + j, (b*ho + oh)*wo + ow] = x[b, c, oh*sh - pt + i, ow*sw - pl + j]``."""
    zero = store(f"({C_TYPES[dtype]})0", dtype, "raw")
    return _gather_source(
        f"wb_im2col_{dtype}",
        dtype,
        "x",
        "cols",
        "c * kh * kw * width",
        [
            "const long long col = e % width, row = e / width;",
            "const long long ow = col % wo, oh = (col / wo) % ho, b = col / (wo * ho);",
            "const long long j = row % kw, i = (row / kw) % kh, ch = row / (kw * kh);",
            "const long long ih = oh * sh - pt + i, iw = ow * sw - pl + j;",
            "const bool inside = ih >= 0 && ih < h && iw >= 0 && iw < w;",
            f"cols[e] = inside ? x[((b * c + ch) * h + ih) * w + iw] : {zero};",
        ],
    )


def col2im_source(dtype: str) -> tuple[str, str]:
    """``(name, source)``: the adjoint of :func:`im2col_source`, one thread per input element."""
    return _gather_source(
        f"wb_col2im_{dtype}",
        dtype,
        "cols",
        "x",
        "n * c * h * w",
        [
            "const long long iw = e % w, ih = (e / w) % h, ch = (e / (w * h)) % c, b = e / (w * h * c);",
            f"{C_TYPES[dtype]} sum = 0;",
            "for (long long i = 0; i < kh; ++i) {",
            "    const long long rows = ih + pt - i;",
            "    if (rows < 0 || rows % sh != 0 || rows / sh >= ho) continue;",
            "    for (long long j = 0; j < kw; ++j) {",
            "        const long long cols_ = iw + pl - j;",
            "        if (cols_ < 0 || cols_ % sw != 0 || cols_ / sw >= wo) continue;",
            "        const long long col = (b * ho + rows / sh) * wo + cols_ / sw;",
            f"        sum += {load('cols[((ch * kh + i) * kw + j) * width + col]', dtype, 'raw')};",
            "    }",
            "}",
            f"x[e] = {store('sum', dtype, 'raw')};",
        ],
    )


class ConvKernels:
    """The three convolution ops on one CuPy module (or a stand-in with ``ndarray``, ``RawKernel``,
    ``empty`` and ``ascontiguousarray``); None for what they do not take (strided inputs, dtypes)."""

    def __init__(self, cupy, multiprocessors: int | None = None):
        self.cupy, self.array_type = cupy, cupy.ndarray
        self.multiprocessors = multiprocessors or _multiprocessors(cupy)
        self.kernels: dict[tuple, object] = {}
        self.calls = 0

    def _kernel(self, make, dtype):
        if (make, dtype) not in self.kernels:
            name, source = make(dtype)
            self.kernels[make, dtype] = self.cupy.RawKernel(source, name)
        return self.kernels[make, dtype]

    def _takes(self, arrays) -> bool:
        first = arrays[0]
        return (
            first.__class__ is self.array_type
            and first.dtype.name in DTYPES
            and all(a.dtype == first.dtype and a.flags.c_contiguous for a in arrays)
        )

    def _launch(self, make, src, dst, geometry):
        n = dst.size
        self._kernel(make, src.dtype.name)((grid(n, self.multiprocessors),), (BLOCK,), (src, dst, *geometry))
        self.calls += 1

    def _geometry(self, x, w, attrs):
        """The kernels' geometry arguments, and the output's height and width."""
        n, c, h, wd = x.shape
        kernel = w.shape[2:]
        ((pt, _), (pl, _)), ho, wo = _geometry(x.shape, kernel, attrs["stride"], attrs["padding"])
        return tuple(np.int64(v) for v in (n, c, h, wd, *kernel, *attrs["stride"], pt, pl, ho, wo)), ho, wo

    def _columns(self, x, w, attrs):
        """``(columns (C*kh*kw, N*Ho*Wo), Ho, Wo)`` of ``x`` for filters ``w``."""
        geometry, ho, wo = self._geometry(x, w, attrs)
        cols = self.cupy.empty((w[0].size, x.shape[0] * ho * wo), x.dtype)
        self._launch(im2col_source, x, cols, geometry)
        return cols, ho, wo

    def _by_filter(self, g):
        """``g`` (N, O, Ho, Wo) as ``(O, N*Ho*Wo)``, the layout of the products' columns."""
        return self.cupy.ascontiguousarray(g.transpose(1, 0, 2, 3)).reshape(g.shape[1], -1)

    def forward(self, xp, arrays, attrs):
        """``conv2d(x, w)``."""
        if not self._takes(arrays):
            return None

        def run(x, w):
            cols, ho, wo = self._columns(x, w, attrs)
            out = xp.matmul(xp.reshape(w, (w.shape[0], cols.shape[0])), cols)  # (O, N*Ho*Wo)
            return self.cupy.ascontiguousarray(xp.reshape(out, (w.shape[0], x.shape[0], ho, wo)).transpose(1, 0, 2, 3))

        return run

    def filter_grad(self, xp, arrays, attrs):
        """``conv2d_filter_grad(x, g, w)``."""
        if not self._takes(arrays):
            return None

        def run(x, g, w):
            cols, _, _ = self._columns(x, w, attrs)
            return xp.reshape(xp.matmul(self._by_filter(g), xp.matrix_transpose(cols)), w.shape)

        return run

    def input_grad(self, xp, arrays, attrs):
        """``conv2d_input_grad(g, x, w)``."""
        if not self._takes(arrays):
            return None

        def run(g, x, w):
            geometry, _, _ = self._geometry(x, w, attrs)
            filters = xp.reshape(w, (w.shape[0], w[0].size))
            cols = xp.matmul(xp.matrix_transpose(filters), self._by_filter(g))  # (C*kh*kw, N*Ho*Wo)
            dx = self.cupy.empty(x.shape, g.dtype)
            self._launch(col2im_source, self.cupy.ascontiguousarray(cols), dx, geometry)
            return dx

        return run


def register(cupy, multiprocessors: int | None = None) -> ConvKernels:
    """Run the convolution ops with ``cupy`` through these kernels from now on."""
    kernels = ConvKernels(cupy, multiprocessors)
    register_device_kernel("conv2d", kernels.forward)
    register_device_kernel("conv2d_filter_grad", kernels.filter_grad)
    register_device_kernel("conv2d_input_grad", kernels.input_grad)
    return kernels
