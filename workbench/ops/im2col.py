"""The array work behind conv2d and max_pool2d: one strided copy and one GEMM per convolution.

A convolution of ``x`` (N, C, H, W) with ``w`` (O, C, kh, kw) is the GEMM
``w (O, C*kh*kw) @ cols (C*kh*kw, Ho*Wo*N)``, where ``cols`` is a single strided view
of the (padded) input copied once into a contiguous buffer: no per-window copies, no
stack, no batched matmul of N small products.

The memory layout is what makes that copy fast: activations are kept **channel, height,
width, batch** (CHWN) in memory, exposed as ordinary (N, C, H, W) arrays (views with
permuted strides). In CHWN, one window offset of one input row is a run of ``Wo * N``
contiguous numbers, so the copy moves long runs instead of rows of ``Wo``; the GEMM's
output ``(O, Ho*Wo*N)`` *is* the next CHWN activation, so no transpose is ever copied,
and the elementwise ops that follow keep that order. An input in another layout (the
data, NCHW) is put in CHWN once, together with its padding.

The backward pass keeps the layout: the input gradient is ``w.T @ g`` added back
window by window into one padded CHWN buffer (strided, in-place adds: no ``add.at``),
the filter gradient ``g (O, Ho*Wo*N) @ cols.T``.

Every function takes the array namespace ``xp`` of a strided library (NumPy, CuPy:
:func:`strided`); other array-API namespaces use the window-by-window kernels of
:mod:`workbench.ops.nn`.
"""

from __future__ import annotations

import math
import threading

import numpy as np

SCRATCH_LIMIT = 512 << 20  # bytes: a larger scratch array is allocated afresh each time
_scratch = threading.local()


def scratch(xp, role: str, shape: tuple, dtype):
    """An uninitialised array for a kernel's own temporary (the im2col matrix, the input
    gradient's window parts), taken from this thread's buffer for ``role``, kept between calls.

    A fresh array of tens of megabytes costs its page faults at every step (3-8 ms per 75 MB,
    as much as copying it); the buffer is reused instead, grown to the largest request up to
    :data:`SCRATCH_LIMIT`. NumPy only (CuPy has its memory pool). The caller must not return
    the array nor a view of it: the next call for the same role overwrites it."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if xp is not np or nbytes > SCRATCH_LIMIT:
        return xp.empty(shape, dtype=dtype)
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    buffer = buffers.get(role)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[role] = np.empty(nbytes, dtype=np.uint8)
    return buffer[:nbytes].view(dtype).reshape(shape)


def strided(xp) -> bool:
    """Whether ``xp`` has strided views (``lib.stride_tricks.as_strided``): NumPy and CuPy do."""
    return hasattr(getattr(getattr(xp, "lib", None), "stride_tricks", None), "as_strided")


def out_size(size, k, s, padding):
    """(pad_before, pad_after, output size) for one spatial axis."""
    if size is None:
        return None, None, None
    if padding == "valid":
        return 0, 0, (size - k) // s + 1
    out = -(-size // s)
    total = (out - 1) * s + k - size
    total = total if total > 0 else 0
    return total // 2, total - total // 2, out


def geometry(shape, kernel, stride, padding):
    """((pad_top, pad_bottom), (pad_left, pad_right)), Ho, Wo of a window op on ``shape`` (N, C, H, W)."""
    (pt, pb, ho), (pl, pr, wo) = (out_size(shape[i + 2], kernel[i], stride[i], padding) for i in (0, 1))
    return ((pt, pb), (pl, pr)), ho, wo


def is_chwn(x) -> bool:
    """Whether (N, C, H, W) ``x`` lies in memory as a C-contiguous (C, H, W, N) array."""
    n, c, h, w = x.shape
    item = x.itemsize
    return x.strides == (item, h * w * n * item, w * n * item, n * item) or x.size <= 1


def chwn(x_t):
    """The (N, C, H, W) view of a (C, H, W, N) array."""
    return x_t.transpose(3, 0, 1, 2)


def padded(xp, x, pads, fill=0.0):
    """``x`` (N, C, H, W) with ``pads`` around its spatial axes, in a CHWN buffer (``x`` itself
    when it needs no padding and already lies so); returned as the (C, Hp, Wp, N) array."""
    (pt, pb), (pl, pr) = pads
    if not (pt or pb or pl or pr) and is_chwn(x):
        return x.transpose(1, 2, 3, 0)
    n, c, h, w = x.shape
    out = xp.empty((c, h + pt + pb, w + pl + pr, n), dtype=x.dtype)
    if pt:
        out[:, :pt] = fill
    if pb:
        out[:, pt + h :] = fill
    if pl:
        out[:, pt : pt + h, :pl] = fill
    if pr:
        out[:, pt : pt + h, pl + w :] = fill
    out[:, pt : pt + h, pl : pl + w] = x.transpose(1, 2, 3, 0)
    return out


def _strided(xp, a, shape, strides):
    return xp.lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


def window_view(xp, x, kernel, stride, padding, fill=0.0):
    """(view (C, kh, kw, Ho, Wo, N) of padded ``x`` in CHWN, Ho, Wo): element [c, i, j, a, b, n]
    is ``x_padded[n, c, a * sh + i, b * sw + j]``. Nothing is copied but the padding."""
    pads, ho, wo = geometry(x.shape, kernel, stride, padding)
    source = padded(xp, x, pads, fill)  # (C, Hp, Wp, N)
    c, _, _, n = source.shape
    (kh, kw), (sh, sw) = kernel, stride
    s_c, s_h, s_w, s_n = source.strides
    view = _strided(xp, source, (c, kh, kw, ho, wo, n), (s_c, s_h, s_w, s_h * sh, s_w * sw, s_n))
    return view, ho, wo


def columns(xp, x, kernel, stride, padding):
    """(cols (C*kh*kw, Ho*Wo*N) contiguous, Ho, Wo): the im2col matrix, in one copy (into this
    thread's scratch buffer: the caller uses it before the next convolution kernel runs)."""
    view, ho, wo = window_view(xp, x, kernel, stride, padding)
    c, kh, kw = view.shape[:3]
    cols = scratch(xp, "cols", view.shape, x.dtype)
    cols[...] = view
    return xp.reshape(cols, (c * kh * kw, -1)), ho, wo


#: bytes of im2col matrix per block on NumPy: a block of columns is built and multiplied while
#: it is in the core's L2 cache (the whole matrix, 9x the input, goes out to memory and back)
BLOCK_BYTES = 512 << 10


def blocks(view_shape, itemsize):
    """The output positions of a window view (C, kh, kw, Ho, Wo, N) in blocks whose im2col
    columns take about :data:`BLOCK_BYTES`: ``(a0, a1, b0, b1)`` ranges of output rows and
    columns, whole rows together while one row fits, else pieces of one row."""
    c, kh, kw, ho, wo, n = view_shape
    position = c * kh * kw * n * itemsize
    if position * wo <= BLOCK_BYTES:
        rows = _even(ho, max(1, BLOCK_BYTES // (position * wo)))
        return [(a, min(a + rows, ho), 0, wo) for a in range(0, ho, rows)]
    width = _even(wo, max(1, BLOCK_BYTES // position))
    return [(a, a + 1, b, min(b + width, wo)) for a in range(ho) for b in range(0, wo, width)]


def _even(total, most):
    """The step that cuts ``total`` into as few pieces of at most ``most`` as possible, evened out."""
    pieces = -(-total // most)
    return -(-total // pieces)


def _block_columns(view, a0, a1, b0, b1):
    """The im2col columns of one block, (C*kh*kw, (a1-a0)*(b1-b0)*N), in the scratch buffer."""
    part = view[:, :, :, a0:a1, b0:b1]
    cols = scratch(np, "cols", part.shape, view.dtype)
    cols[...] = part
    c, kh, kw = part.shape[:3]
    return cols.reshape(c * kh * kw, -1)


def channel_major(xp, g):
    """``g`` (N, O, Ho, Wo) as an (O, Ho*Wo*N) matrix: free when ``g`` lies in CHWN."""
    return xp.reshape(g.transpose(1, 2, 3, 0), (g.shape[1], -1))


def conv(xp, x, w, stride, padding):
    """conv2d of ``x`` (N, C, H, W) with ``w`` (O, C, kh, kw): the (N, O, Ho, Wo) view of one GEMM
    (on NumPy, one GEMM per cache-sized block of output positions, each written in place)."""
    o = w.shape[0]
    if xp is not np:
        cols, ho, wo = columns(xp, x, w.shape[2:], stride, padding)
        out = xp.matmul(xp.reshape(w, (o, -1)), cols)  # (O, Ho*Wo*N): CHWN
        return chwn(xp.reshape(out, (o, ho, wo, x.shape[0])))
    view, ho, wo = window_view(xp, x, w.shape[2:], stride, padding)
    w2 = w.reshape(o, -1)
    out = np.empty((o, ho, wo, x.shape[0]), dtype=np.result_type(x, w))  # CHWN
    for a0, a1, b0, b1 in blocks(view.shape, view.itemsize):
        target = out[:, a0:a1, b0:b1].reshape(o, -1)  # a view: each block's positions are one run
        np.matmul(w2, _block_columns(view, a0, a1, b0, b1), out=target)
    return chwn(out)


def conv_filter_grad(xp, x, g, w, stride, padding):
    """The gradient of :func:`conv` with respect to ``w``: ``g (O, Ho*Wo*N) @ cols.T`` (on NumPy,
    summed over cache-sized blocks of output positions)."""
    if xp is not np:
        cols, _, _ = columns(xp, x, w.shape[2:], stride, padding)
        return xp.reshape(xp.matmul(channel_major(xp, g), xp.matrix_transpose(cols)), w.shape)
    view, _, _ = window_view(xp, x, w.shape[2:], stride, padding)
    o = w.shape[0]
    g_t = g.transpose(1, 2, 3, 0)  # (O, Ho, Wo, N)
    total, part = None, None
    for a0, a1, b0, b1 in blocks(view.shape, view.itemsize):
        cols = _block_columns(view, a0, a1, b0, b1)
        rows = np.reshape(g_t[:, a0:a1, b0:b1], (o, -1))
        if total is None:
            total = np.matmul(rows, cols.T)
            part = np.empty_like(total)
        else:
            total += np.matmul(rows, cols.T, out=part)
    return total.reshape(w.shape)


def conv_input_grad(xp, g, x_shape, w, stride, padding):
    """The gradient of :func:`conv` with respect to ``x`` (of shape ``x_shape``): ``w.T @ g``,
    each window's part added back in place into one padded CHWN buffer (on NumPy, block by
    cache-sized block of output positions)."""
    o, c, kh, kw = w.shape
    ho, wo = g.shape[2:]
    a = xp.matrix_transpose(xp.reshape(w, (o, -1)))
    if xp is not np:
        parts = xp.reshape(xp.matmul(a, channel_major(xp, g)), (c, kh, kw, ho, wo, g.shape[0]))
        return add_windows(xp, parts, x_shape, (kh, kw), stride, padding)
    pads, _, _ = geometry(x_shape, (kh, kw), stride, padding)
    dtype = np.result_type(a, g)
    out = _padded_zeros(np, x_shape, pads, dtype)
    g_t = g.transpose(1, 2, 3, 0)  # (O, Ho, Wo, N)
    for a0, a1, b0, b1 in blocks((c, kh, kw, ho, wo, x_shape[0]), dtype.itemsize):
        rows = np.reshape(g_t[:, a0:a1, b0:b1], (o, -1))
        parts = np.matmul(a, rows, out=scratch(np, "parts", (a.shape[0], rows.shape[1]), dtype))
        _add_parts(out, parts.reshape(c, kh, kw, a1 - a0, b1 - b0, -1), (a0, b0), stride)
    return _unpadded(out, x_shape, pads)


def add_windows(xp, parts, x_shape, kernel, stride, padding):
    """Adjoint of :func:`window_view`: ``parts`` (C, kh, kw, Ho, Wo, N) summed back into the
    (N, C, H, W) view of a padded CHWN buffer, with kh*kw strided in-place adds."""
    pads, _, _ = geometry(x_shape, kernel, stride, padding)
    out = _padded_zeros(xp, x_shape, pads, parts.dtype)
    _add_parts(out, parts, (0, 0), stride)
    return _unpadded(out, x_shape, pads)


def _padded_zeros(xp, x_shape, pads, dtype):
    """Zeros for an (N, C, H, W) input with its padding, laid out CHWN."""
    (pt, pb), (pl, pr) = pads
    n, c, h, w = x_shape
    return xp.zeros((c, h + pt + pb, w + pl + pr, n), dtype=dtype)


def _unpadded(out, x_shape, pads):
    """The (N, C, H, W) view of the unpadded part of :func:`_padded_zeros`'s buffer."""
    (pt, _), (pl, _) = pads
    h, w = x_shape[2:]
    return chwn(out[:, pt : pt + h, pl : pl + w])


def _add_parts(out, parts, origin, stride):
    """Add ``parts`` (C, kh, kw, rows, cols, N), the window parts of the output positions from
    ``origin`` (a row and a column of the output) on, into the padded CHWN buffer ``out``."""
    kh, kw, rows, cols = parts.shape[1:5]
    (a0, b0), (sh, sw) = origin, stride
    for i in range(kh):
        for j in range(kw):
            top, left = a0 * sh + i, b0 * sw + j
            out[:, top : top + sh * (rows - 1) + 1 : sh, left : left + sw * (cols - 1) + 1 : sw] += parts[:, i, j]


def max_pool(xp, x, size, stride, padding):
    """Max pooling: the running maximum over the kh*kw strided window views (no stacked copy)."""
    return chwn(_pooled(xp, x, size, stride, padding)[0])


def _pooled(xp, x, size, stride, padding):
    view, _, _ = window_view(xp, x, size, stride, padding, fill=-float("inf"))
    out = xp.array(view[:, 0, 0], copy=True)  # (C, Ho, Wo, N)
    for i in range(size[0]):
        for j in range(size[1]):
            if i or j:
                xp.maximum(out, view[:, i, j], out=out)
    return out, view


def max_pool_grad(xp, g, x, size, stride, padding, pooled=None):
    """The gradient of :func:`max_pool`: each window's gradient goes to its first maximum.

    ``pooled``: the forward's output (N, C, Ho, Wo), when at hand (else the maxima are taken
    again). Windows that do not overlap (stride at least the size, the usual 2x2/2) write
    their part straight into the gradient's buffer; overlapping ones add theirs in place."""
    if pooled is None:
        best, view = _pooled(xp, x, size, stride, padding)
    else:
        view = window_view(xp, x, size, stride, padding, fill=-float("inf"))[0]
        best = pooled.transpose(1, 2, 3, 0)  # (C, Ho, Wo, N), as the view
    g = g.transpose(1, 2, 3, 0)  # (C, Ho, Wo, N), as the view
    free = None  # windows whose maximum has not taken the gradient yet (all, before the first)
    first = xp.empty(best.shape, dtype=bool)
    (kh, kw), (sh, sw) = size, stride
    disjoint = sh >= kh and sw >= kw
    if disjoint:
        pads, ho, wo = geometry(x.shape, size, stride, padding)
        (pt, pb), (pl, pr) = pads
        n, c, h, w = x.shape
        out = xp.zeros((c, h + pt + pb, w + pl + pr, n), dtype=g.dtype)
        s_c, s_h, s_w, s_n = out.strides
        target = _strided(xp, out, (c, kh, kw, ho, wo, n), (s_c, s_h, s_w, s_h * sh, s_w * sw, s_n))
    else:
        target = xp.empty((view.shape[0], kh, kw) + view.shape[3:], dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            xp.equal(view[:, i, j], best, out=first)
            if free is None:
                free = xp.logical_not(first)
            else:
                first &= free
                if i < kh - 1 or j < kw - 1:
                    free ^= first
            xp.multiply(g, first, out=target[:, i, j])  # a multiply: four times faster than where
    if disjoint:
        return chwn(out[:, pt : pt + h, pl : pl + w])
    return add_windows(xp, target, x.shape, size, stride, padding)
