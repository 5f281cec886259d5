"""The device seam: what a plan is compiled for and run on.

A :class:`Device` supplies the array namespace kernels run with, a graph
rewrite of its own (the GPU fuses elementwise chains), transfers between the
host and itself, the compilers of fused programs, and the call that runs a
plan (the GPU may replay it as a CUDA graph). :class:`CPU` is NumPy;
:class:`workbench.gpu.GPU` is CuPy. Sessions and cluster workers hold a
device and never branch on which one it is, as dask's ``get_async`` is one
loop made specific by the executor it is handed.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable, Sequence

import numpy as np

from workbench.errors import DeviceError


@runtime_checkable
class Device(Protocol):
    """Where plans run.

    Attributes
    ----------
    name : str
        ``"cpu"``, ``"gpu:0"``, ... (part of every plan's cache key).
    kind : str
        ``"cpu"`` or ``"gpu"``: what a cluster worker opens for a program of this device.
    options : dict
        The options the device was opened with (``Session(..., **options)``).
    xp : module
        The array namespace kernels run with.
    fused_compilers : sequence of callables
        ``compiler(xp, program, arrays)`` returning a callable that computes a
        fused elementwise program in one kernel, or None (see :mod:`workbench.ops.fused`).
    host_arrays : bool
        Whether plans on it compute host (NumPy) arrays on its own code path, so that a value it
        holds is the client's as it is (the CPU). A GPU's values go through :meth:`to_host`, an
        emulated GPU's too: it runs a GPU's code path on NumPy.
    device_arrays : bool
        Whether the values it holds are in device memory (CuPy arrays), which a cluster's workers
        send each other through distributed's CUDA serializers (not the CPU's, nor an emulated GPU's).
    worker_options : tuple of str
        The options a cluster worker's device of this kind is opened with, of those a session's
        takes; the others concern only the client's session.
    """

    name: str
    kind: str
    options: dict
    xp: Any
    fused_compilers: Sequence[Callable]
    host_arrays: bool
    device_arrays: bool
    worker_options: tuple

    def rewrite(self, graph, fetches: Sequence[str]):
        """The graph a plan for ``fetches`` runs on this device (a pure pass)."""

    def put(self, array: np.ndarray) -> Any:
        """``array`` (checked, on the host) on the device; device arrays pass through."""

    def holds(self, value) -> bool:
        """Whether ``value`` is already an array of this device (a feed that needs no copy)."""

    def to_host(self, value) -> np.ndarray:
        """A NumPy array of a device value (waits for it)."""

    def result(self, value) -> Any:
        """What ``Session.run`` hands back for a fetched device value."""

    def run(
        self,
        plan,
        feeds: list,
        *,
        check_numerics: bool = False,
        step: int | None = None,
        row_offset: int = 0,
        emit=None,
    ) -> list:
        """``plan.run(feeds, ...)`` on this device; returns the fetched device values. ``emit(event, **fields)``,
        when given, hears what the device decides about the run (a GPU: whether it is captured)."""


class CPU:
    """NumPy on the host: plans run as compiled, values are already host arrays.

    >>> CPU().name, CPU().xp.__name__
    ('cpu', 'numpy')
    """

    name = "cpu"
    kind = "cpu"
    xp = np
    fused_compilers: tuple = ()
    host_arrays = True
    device_arrays = False
    worker_options: tuple = ()

    def __init__(self, **options: Any) -> None:
        if options:
            raise DeviceError(f"device 'cpu' takes no options, got {', '.join(sorted(options))}")
        self.options: dict = {}

    def __repr__(self) -> str:
        return "<CPU>"

    def rewrite(self, graph, fetches):
        return graph

    def put(self, array):
        return array

    def holds(self, value) -> bool:
        return isinstance(value, np.ndarray)

    def to_host(self, value) -> np.ndarray:
        return np.asarray(value)

    def result(self, value):
        # fetched arrays the caller may change: copies of read-only ones (constants, broadcast views)
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            return value.copy()
        return value

    def run(self, plan, feeds, *, check_numerics=False, step=None, row_offset=0, emit=None, comm=None):
        return plan.run(feeds, check_numerics=check_numerics, step=step, row_offset=row_offset, comm=comm)
