"""Time per op: one run of a plan with every kernel call timed.

``Session.run(..., profile=True)`` and every k-th step of ``fit(..., profile=k)`` run their plan
through :func:`run_profiled`: the same kernel calls as :meth:`workbench.graph.plan.Plan.run`, each
between two clock reads, summed by the graph op it belongs to (a collective's start and its wait
both count for the collective). On the host the clock is ``time.perf_counter``; on a GPU each call
is bracketed by CUDA events on the current stream, read once the run is over (host timers would
measure the launches, not the kernels).

>>> import numpy as np
>>> import workbench as wb
>>> g = wb.Graph()
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 3))
...     y = wb.sum(wb.tanh(x), name="total")
>>> sess = wb.Session(g)
>>> _ = sess.run(y, {x: np.ones((2, 3), "float32")}, profile=True)
>>> sorted(sess.last_profile)
['tanh', 'total']
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

from workbench.errors import ArgumentError, WorkbenchError


class HostTimer:
    """Kernel calls timed with the host's clock (NumPy: a call returns when its work is done)."""

    def __init__(self) -> None:
        self.times: list = []

    def start(self):
        return time.perf_counter()

    def stop(self, name: str, started) -> None:
        self.times.append((name, time.perf_counter() - started))

    def seconds(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for name, seconds in self.times:
            out[name] += seconds
        return dict(out)


class CudaTimer(HostTimer):
    """Kernel calls timed with CUDA events on the current stream, read after one synchronize."""

    def __init__(self, cupy) -> None:
        super().__init__()
        self.cupy = cupy

    def start(self):
        event = self.cupy.cuda.Event()
        event.record()
        return event

    def stop(self, name: str, started) -> None:
        event = self.cupy.cuda.Event()
        event.record()
        self.times.append((name, (started, event)))

    def seconds(self) -> dict[str, float]:
        if self.times:
            self.times[-1][1][1].synchronize()
        elapsed = self.cupy.cuda.get_elapsed_time
        out: dict[str, float] = defaultdict(float)
        for name, (begin, end) in self.times:
            out[name] += elapsed(begin, end) / 1000.0
        return dict(out)


def timer_for(xp) -> HostTimer:
    """The timer for a plan's array namespace: CUDA events for CuPy, the host's clock otherwise."""
    if getattr(xp, "__name__", "") == "cupy":
        return CudaTimer(xp)
    return HostTimer()


def run_profiled(plan, slots: list, error) -> dict[str, float]:
    """Run ``plan``'s kernel calls over ``slots`` (filled as :meth:`Plan.run` fills them), timing each;
    returns ``{op name: seconds}``. ``error(op, exception)`` makes the error a failed kernel raises."""
    timer = timer_for(plan.xp)
    for (fn, get, out, dead), op in zip(plan.steps, plan.step_ops, strict=True):
        started = timer.start()
        try:
            result = fn(*get(slots))
        except WorkbenchError:
            raise
        except Exception as e:
            raise error(op, e) from e
        timer.stop(op.name, started)
        if out.__class__ is int:
            slots[out] = result
        else:
            for o, r in zip(out, result, strict=False):
                slots[o] = r
        for d in dead:
            slots[d] = None
    return timer.seconds()


def with_profile(request, profile):
    """``request`` (a :class:`~workbench.fitloop.FitRequest`) with ``fit(profile=k)``'s period, checked."""
    if profile is None:
        return request
    if isinstance(profile, bool) or not isinstance(profile, int) or profile < 1:
        raise ArgumentError(f"fit() profile must be a positive integer (profile every k-th step), got {profile!r}")
    return dataclasses.replace(request, profile_every=int(profile))


def check_engine(engine, request) -> None:
    """``fit(profile=k)`` times the ops of a local fit; other engines say where to look instead."""
    if request.profile_every and getattr(engine, "strategy", "local") != "local":
        engine.close()
        raise ArgumentError(
            f"fit(profile={request.profile_every}) times each op of a local fit; this fit runs on the "
            f"{engine.strategy!r} engine, whose per-worker times History.timeline() gives"
        )
