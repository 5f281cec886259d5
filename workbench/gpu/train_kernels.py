"""The fused training-step ops as generated CuPy kernels, compiled once and cached.

:class:`UpdateKernels` and :class:`CrossEntropyKernels` are the device kernels
the GPU registers for ``fused_update`` and ``softmax_cross_entropy_with_grad``
(:func:`workbench.ops.fused_train.register_device_kernel`). Each returns None
for arrays it does not take (another namespace, a strided array, a dtype the
generator lacks), and the op's own kernel runs instead.
"""

from __future__ import annotations

import numpy as np

from workbench.gpu.kernels import _multiprocessors
from workbench.gpu.train_codegen import BLOCK, cross_entropy_kernel_source, grid, update_kernel_source
from workbench.ops.fused_train import FUSED_UPDATE, SCE_WITH_GRAD, register_device_kernel


class _Compiled:
    """Kernels of one CuPy module (or a stand-in with ``ndarray`` and ``RawKernel``), by source key."""

    def __init__(self, cupy, multiprocessors: int | None = None):
        self.cupy = cupy
        self.array_type = cupy.ndarray
        self.multiprocessors = multiprocessors or _multiprocessors(cupy)
        # key -> (what keeps the key's ids valid, RawKernel or None when the generator cannot)
        self.kernels: dict[tuple, tuple] = {}
        self.compiled = 0
        self.calls = 0

    def kernel(self, key: tuple, held, make):
        found = self.kernels.get(key)
        if found is None or found[0] is not held:
            source = make()
            found = self.kernels[key] = (held, None if source is None else self.cupy.RawKernel(source[1], source[0]))
            self.compiled += source is not None
        return found[1]


class UpdateKernels(_Compiled):
    """``fused_update`` as one kernel launch: every lane's elements in one grid-stride loop."""

    def __call__(self, xp, arrays, attrs):
        if not arrays or arrays[0].__class__ is not self.array_type:
            return None
        lanes, width, stores, program = attrs["lanes"], attrs["width"], attrs["stores"], attrs["program"]
        sizes = []
        for lane in range(lanes):
            own = arrays[lane * width : (lane + 1) * width]
            size = own[0].size
            if any(a.size != size or not a.flags.c_contiguous for a in own):
                return None
            sizes.append(np.int64(size))
        shared = arrays[lanes * width :]
        if any(a.size != 1 for a in shared):
            return None
        dtypes = tuple(a.dtype.name for a in (*arrays[:width], *shared))
        key = (id(program), stores, lanes, width, dtypes)  # programs are big tuples: hashed by id, held
        kernel = self.kernel(key, program, lambda: update_kernel_source(program, dtypes, stores, lanes, width))
        if kernel is None:
            return None
        blocks, end = grid(int(sum(sizes)), self.multiprocessors), lanes * width

        def run(arrays, outs):
            kernel((blocks,), (BLOCK,), (*arrays[:end], *outs, *sizes, *arrays[end:]))
            self.calls += 1

        return run


class CrossEntropyKernels(_Compiled):
    """``softmax_cross_entropy_with_grad`` as one kernel launch, for one-element upstream gradients."""

    def __call__(self, xp, arrays, attrs):
        logits, labels, upstream = arrays
        if logits.__class__ is not self.array_type or upstream.size != 1 or logits.ndim < 1:
            return None
        if not (logits.flags.c_contiguous and labels.flags.c_contiguous) or upstream.dtype != logits.dtype:
            return None
        lead = logits.shape[:-1]
        axes = range(len(lead)) if attrs["axis"] is None else attrs["axis"]
        axes = [axes] if isinstance(axes, int) else list(axes)
        if sorted(a % max(len(lead), 1) for a in axes) != list(range(len(lead))):
            return None  # the loss is reduced over only some axes: its gradient is not one number
        mean = bool(attrs["mean"])
        key = (logits.dtype.name, labels.dtype.name, mean)
        kernel = self.kernel(key, None, lambda: cross_entropy_kernel_source(*key))
        if kernel is None:
            return None
        cupy, sms = self.cupy, self.multiprocessors

        def run(logits, labels, upstream):
            rows, classes = int(np.prod(lead, dtype=np.int64)), logits.shape[-1]
            loss, dlogits = cupy.empty(lead, logits.dtype), cupy.empty(logits.shape, logits.dtype)
            args = (logits, labels, upstream, loss, dlogits, np.int64(rows), np.int64(classes), np.int64(max(rows, 1)))
            kernel((grid(rows, sms),), (BLOCK,), args)
            self.calls += 1
            return loss, dlogits

        return run


def register(cupy, multiprocessors: int | None = None) -> tuple[UpdateKernels, CrossEntropyKernels]:
    """Compile the training-step ops with ``cupy`` from now on; returns the two kernel caches."""
    updates, cross_entropy = UpdateKernels(cupy, multiprocessors), CrossEntropyKernels(cupy, multiprocessors)
    register_device_kernel(FUSED_UPDATE, updates)
    register_device_kernel(SCE_WITH_GRAD, cross_entropy)
    return updates, cross_entropy
