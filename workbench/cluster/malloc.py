"""Worker processes that reuse freed memory for large arrays, instead of mapping fresh pages each time.

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand memory
back to the OS). Setting that variable also switches off glibc's dynamic mmap
threshold, so every allocation above 128 KiB becomes a fresh ``mmap``, unmapped when
freed: each temporary of a training step (a 32 x 1024 activation, a 784 x 1024 weight
gradient) is first-touched again, page by page, at every step. Measured here: a
``(784, 32) @ (32, 1024)`` float32 matmul takes 1.75 ms in a worker against 0.39 ms in
a plain process. Raising the mmap threshold (up to glibc's maximum, 32 MiB) makes
such arrays come from the heap, and a top pad of 64 MiB keeps that much of the freed
heap when glibc trims it, so the next step reuses it; above that, Dask's trim
threshold still hands memory back to the OS.
"""

from __future__ import annotations

import ctypes
import sys

from distributed.diagnostics.plugin import WorkerPlugin

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3  # glibc's mallopt parameters
MAX_THRESHOLD = 32 << 20  # glibc refuses more on 64-bit machines
TOP_PAD = 64 << 20

_set: list[int] = []


def reuse_freed_memory(threshold: int = MAX_THRESHOLD, top_pad: int = TOP_PAD) -> bool:
    """Serve allocations below ``threshold`` bytes from the heap, and keep ``top_pad`` bytes of it
    when trimming (glibc only); whether it took effect.

    Idempotent; a no-op on other platforms and C libraries.
    """
    if _set and _set[0] == threshold:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold))) and bool(libc.mallopt(M_TOP_PAD, int(top_pad)))
    except (OSError, AttributeError):  # musl, or no libc.so.6
        return False
    if done:
        _set[:] = [threshold]
    return done


class ReuseFreedMemory(WorkerPlugin):
    """:func:`reuse_freed_memory` on every worker, also on those that join later."""

    name = "workbench-reuse-freed-memory"
    idempotent = True

    def setup(self, worker):
        reuse_freed_memory()
