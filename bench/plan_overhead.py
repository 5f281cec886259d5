"""Host time per kernel call of a GPU plan, without a GPU: our Python alone.

Runs the fused plan of an Adam MLP training step (the plan ``device="gpu"``
runs) on a stand-in array namespace whose arrays carry only a shape and a
dtype and whose functions return new stand-ins at once, with the fused
programs dispatched through :class:`workbench.gpu.kernels.FusedKernels` on a
stand-in CuPy. What is left is the plan loop, the donation and in-place
checks, kernel binding and fused-kernel dispatch: the part of the host time
per call that does not depend on the array library. Run from the repository root::

    .venv/bin/python bench/plan_overhead.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workbench as wb  # noqa: E402
from workbench.gpu.kernels import FusedKernels  # noqa: E402
from workbench.graph.plan import Plan  # noqa: E402


class _Flags:
    __slots__ = ("c_contiguous", "writeable")

    def __init__(self):
        self.c_contiguous = self.writeable = True


FLAGS = _Flags()
BOOL, INT64 = np.dtype("bool"), np.dtype("int64")


class Fake:
    """An array that is only a shape and a dtype; arithmetic makes new ones of the broadcast shape."""

    __slots__ = ("shape", "dtype", "ndim", "size", "base")
    flags = FLAGS

    def __init__(self, shape, dtype, base=None):
        self.shape, self.dtype, self.ndim, self.base = shape, dtype, len(shape), base
        size = 1
        for d in shape:
            size *= d
        self.size = size

    def _binary(self, other, dtype=None):
        shape = getattr(other, "shape", ())
        return Fake(self.shape if shape == self.shape or len(shape) < self.ndim else _broadcast(self.shape, shape),
                    dtype or self.dtype)  # fmt: skip

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _binary

    def __gt__(self, other):
        return self._binary(other, BOOL)

    def __eq__(self, other):
        return self._binary(other, BOOL)

    __hash__ = object.__hash__

    def __iadd__(self, other):
        return self

    __isub__ = __imul__ = __iadd__

    def __neg__(self):
        return Fake(self.shape, self.dtype)

    def __getitem__(self, key):  # only [..., None] and [..., 0]
        last = key[-1]
        return Fake(self.shape + (1,) if last is None else self.shape[:-1], self.dtype, self)

    def __setitem__(self, key, value):
        pass

    def swapaxes(self, a, b):
        return Fake(self.shape[:-2] + self.shape[:-3:-1], self.dtype, self)

    def ravel(self):
        return Fake((self.size,), self.dtype, self)

    def reshape(self, shape):
        return Fake(tuple(shape), self.dtype, self)

    def astype(self, dtype):
        return Fake(self.shape, np.dtype(dtype))

    def copy(self):
        return Fake(self.shape, self.dtype)


def _broadcast(a, b):
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def _reduced(x, axis, keepdims):
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % x.ndim for a in axes)
    if keepdims:
        return Fake(tuple(1 if i in axes else d for i, d in enumerate(x.shape)), x.dtype)
    return Fake(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


class Namespace:
    """The few array-API functions an MLP step calls, on stand-ins, doing nothing."""

    float32, float64, int64 = np.float32, np.float64, np.int64
    ndarray = Fake

    @staticmethod
    def asarray(x, dtype=None, copy=None):
        if isinstance(x, Fake):
            return x if not copy else x.copy()
        a = np.asarray(x, dtype=dtype)
        return Fake(a.shape, a.dtype)

    @staticmethod
    def empty(shape, dtype):
        return Fake(tuple(shape), np.dtype(dtype))

    @staticmethod
    def matmul(a, b):
        return Fake(a.shape[:-1] + b.shape[-1:], a.dtype)

    @staticmethod
    def matrix_transpose(x):
        return x.swapaxes(-1, -2)

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return _reduced(x, axis, keepdims)

    max = sum

    @staticmethod
    def exp(x):
        return Fake(x.shape, x.dtype)

    log = exp

    @staticmethod
    def take_along_axis(x, idx, axis):
        return Fake(idx.shape, x.dtype)

    @staticmethod
    def astype(x, dtype, copy=True):
        return x if not copy and x.dtype == np.dtype(dtype) else Fake(x.shape, np.dtype(dtype))

    @staticmethod
    def reshape(x, shape, copy=None):
        return Fake(tuple(shape), x.dtype, x)

    @staticmethod
    def broadcast_to(x, shape):
        return Fake(tuple(shape), x.dtype, x)

    @staticmethod
    def arange(n, dtype=None):
        return Fake((n,), np.dtype(dtype or INT64))

    @staticmethod
    def multiply(a, b, out=None):
        return out if out is not None else a._binary(b)

    @staticmethod
    def maximum(a, b, out=None):
        return out if out is not None else a._binary(b)

    @staticmethod
    def copyto(dst, src):
        pass


class FakeCupy:
    """What FusedKernels needs of CuPy: an array type, ``empty`` and two kernel classes."""

    ndarray = Fake
    empty = staticmethod(Namespace.empty)

    @staticmethod
    def RawKernel(source, name):
        return lambda grid, block, args: None

    @staticmethod
    def ElementwiseKernel(params, out, body, name):
        def call(*arrays):
            shape = arrays[0].shape
            for a in arrays[1:]:
                if a.shape != shape:
                    shape = _broadcast(shape, a.shape)
            return Fake(shape, arrays[0].dtype)

        return call


def mlp_plan(sizes, batch):
    """The fused plan of one Adam step (as a GPU session makes it), rebuilt on stand-ins."""
    from gpu_check import mlp_graph

    rng = np.random.default_rng(0)
    X = rng.standard_normal((batch, sizes[0]), dtype=np.float32)
    Y = rng.integers(0, sizes[-1], batch)
    g, train, _ = mlp_graph(sizes, "float32")
    sess = wb.Session(g, device="gpu", emulate=True)
    sess.run(train, {"x": X, "y": Y})
    plan = sess.plan_for(train, {"x": X, "y": Y})
    state = {name: Namespace.asarray(value) for name, value in plan.state.items()}
    compilers = (FusedKernels(FakeCupy, pointer=lambda a: 0, multiprocessors=132),)
    fake = Plan(plan.graph, plan.fetch_names, plan.feed_names, Namespace, state, seed=0, own_state=True,
                compilers=compilers)  # fmt: skip
    return fake, [Fake(X.shape, X.dtype), Fake(Y.shape, Y.dtype)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the runs")
    args = parser.parse_args(argv)
    plan, feeds = mlp_plan([16, 16, 16, 10], 8)
    for _ in range(20):
        plan.run(feeds)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(lambda: [plan.run(feeds) for _ in range(args.runs)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(args.runs // 7):
            plan.run(feeds)
        times.append((time.perf_counter() - t0) / (args.runs // 7))
    run_us = statistics.median(times) * 1e6
    print(f"{len(plan)} kernel calls per step: {run_us:7.1f} us per run, {run_us / len(plan):5.2f} us per call "
          f"(stand-in arrays: our Python only)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
