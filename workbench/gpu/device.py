"""The GPU device of a session: CuPy namespace, memory pool, transfers, plan rewriting.

``wb.Session(g, device="gpu")`` opens a :class:`GPU` and from then on runs the
same plans with the CuPy array namespace: variables live on the device, feeds
go up once per run through pinned host memory, results come back as NumPy
(``results="device"`` keeps them on the GPU), and plans are fused first
(:mod:`workbench.graph.fusion`) so chains of elementwise ops run as one kernel.
"""

from __future__ import annotations

import numpy as np

from workbench.errors import DeviceError
from workbench.graph.core import Graph
from workbench.graph.step_fusion import fuse_step
from workbench.gpu.codegen import supports_op
from workbench.gpu.graphs import CudaCapture, PlanGraphs
from workbench.gpu import conv_kernels, train_kernels
from workbench.gpu.kernels import FusedKernels

POOLS = ("default", "managed", "async", "none")
RESULTS = ("numpy", "device")


def import_cupy():
    """CuPy and its array-API namespace, or DeviceError saying which part is missing."""
    try:
        import cupy
    except ImportError as e:
        raise DeviceError(
            "device='gpu' needs CuPy, which is not installed (pip install 'workbench[gpu]', "
            f"or the cupy-cudaXXx wheel matching your CUDA driver): {e}"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError, or a missing driver library
        raise DeviceError(
            f"device='gpu' found no CUDA device: CuPy {cupy.__version__} is installed, "
            f"but the CUDA runtime says: {type(e).__name__}: {e}"
        ) from None
    if count < 1:
        raise DeviceError(f"device='gpu' found no CUDA device (CuPy {cupy.__version__} sees 0 GPUs)")
    return cupy, array_namespace(cupy), count


def array_namespace(cupy):
    """array-api-compat's CuPy namespace when installed, else CuPy itself if it has the names kernels use."""
    try:
        import array_api_compat.cupy as xp

        return direct_calls(cupy, xp)
    except ImportError:
        missing = [n for n in ("astype", "pow", "permute_dims", "concat", "matrix_transpose") if not hasattr(cupy, n)]
        if missing:
            raise DeviceError(
                f"device='gpu' needs array-api-compat with CuPy {cupy.__version__} (it lacks {', '.join(missing)}): "
                "pip install array-api-compat"
            ) from None
        return cupy


def direct_calls(cupy, xp):
    """``xp`` with its hottest wrappers (matmul, matrix_transpose, reshape) replaced by plain CuPy calls.

    array-api-compat wraps these to pass its namespace along; on a training step's
    dozens of calls the wrappers' Python shows up in the host time per step.
    """
    import types

    fast = types.ModuleType(xp.__name__, xp.__doc__)
    fast.__dict__.update(xp.__dict__)
    compat_reshape = xp.reshape

    def matrix_transpose(x, /):
        if x.ndim < 2:
            raise ValueError("x must be at least 2-dimensional for matrix_transpose")
        return x.swapaxes(-1, -2)

    def reshape(x, /, shape, *, copy=None, **kwargs):
        return cupy.reshape(x, shape) if copy is None and not kwargs else compat_reshape(x, shape, copy=copy, **kwargs)

    ndarray = getattr(cupy, "ndarray", None)

    def copyto(dst, src, /, **kwargs):
        # one device-to-device memcpy for arrays of one shape and dtype (a variable update's
        # copy); cupy.copyto takes that path too, after checks costing a few us a call.
        # Anything else (``where=``, ``casting=``, broadcasting) goes to cupy.copyto.
        if (
            not kwargs
            and src.__class__ is ndarray
            and dst.__class__ is ndarray
            and src.dtype == dst.dtype
            and src.shape == dst.shape
            and src.flags.c_contiguous
            and dst.flags.c_contiguous
        ):
            if src.nbytes:
                dst.data.copy_from_device_async(src.data, src.nbytes)
        else:
            cupy.copyto(dst, src, **kwargs)

    fast.matmul, fast.matrix_transpose, fast.reshape = cupy.matmul, matrix_transpose, reshape
    fast.copyto = copyto if hasattr(cupy, "cuda") else cupy.copyto
    return fast


def parse_device(device: str) -> int:
    """``"gpu"`` -> 0, ``"gpu:1"`` -> 1, else DeviceError."""
    name, _, index = str(device).partition(":")
    if name != "gpu" or (index and not index.isdigit()):
        raise DeviceError(f"unknown device {device!r}; use 'cpu', 'gpu' or 'gpu:<index>'")
    return int(index or 0)


_DEFAULTS = {
    "memory_pool": "default",
    "memory_limit": None,
    "results": "numpy",
    "fuse": True,
    "cuda_graphs": False,
    "emulate": False,
}


class GPU:
    """One CUDA device as a session uses it: a :class:`workbench.graph.device.Device`.

    Parameters
    ----------
    device : str
        ``"gpu"`` (device 0) or ``"gpu:<index>"``.
    memory_pool : {"default", "managed", "async", "none"} or a CuPy pool
        CuPy's device allocator for this process: its default pool, a pool of
        managed (unified) memory, the CUDA stream-ordered pool, or plain
        ``cudaMalloc`` without a pool. CuPy's allocator is process-wide.
    memory_limit : int, optional
        Cap of the pool in bytes.
    results : {"numpy", "device"}
        What :meth:`Session.run` returns for tensors.
    fuse : bool
        Fuse elementwise chains into generated kernels (default True).
    cuda_graphs : bool
        Replay whole plan runs as CUDA graphs (default False): a plan's run is
        captured once per feed signature (shapes and dtypes), after a plain run
        that left every variable's array in place, and later runs with that
        signature copy the feeds in, launch the graph and copy the fetches out,
        with no Python per kernel. Plans with random ops and runs with
        ``check_numerics`` always run plainly, as does a plan whose capture
        failed once. See :mod:`workbench.gpu.graphs`. ``graph_replays`` counts replays.
        CuPy refuses cuBLAS calls during stream capture, so matmuls are captured
        (and warmed up) through cuBLAS called directly (:mod:`workbench.gpu.blas`).
        Off by default until that path is measured on a GPU; where capture fails
        the plan runs plainly, with the reason in a ``graph_capture`` event.
    emulate : bool
        Run this code path on NumPy instead of CuPy (no GPU needed): for tests
        and dry runs of scripts meant for a GPU machine. No graphs are captured
        unless ``capture`` is given a stand-in.
    """

    kind = "gpu"
    host_arrays = False  # emulated too: values go to the host through to_host, as on a GPU
    #: What a cluster worker's GPU is opened with (``results`` and ``cuda_graphs`` concern the client's session).
    worker_options = ("memory_pool", "memory_limit", "fuse", "emulate")

    def __init__(
        self,
        device: str = "gpu",
        memory_pool="default",
        memory_limit: int | None = None,
        results: str = "numpy",
        fuse: bool = True,
        cuda_graphs: bool = False,
        emulate: bool = False,
    ):
        self.index = parse_device(device)
        if results not in RESULTS:
            raise DeviceError(f"results must be one of {', '.join(RESULTS)}, got {results!r}")
        self.name = f"gpu:{self.index}"
        given = {
            "memory_pool": memory_pool,
            "memory_limit": memory_limit,
            "results": results,
            "fuse": fuse,
            "cuda_graphs": cuda_graphs,
            "emulate": emulate,
        }
        self.options = {k: v for k, v in given.items() if v != _DEFAULTS[k]}  # those that differ from the defaults
        self.results, self.fuse, self.emulated = results, bool(fuse), bool(emulate)
        self.cuda_graphs = bool(cuda_graphs)
        self._staging: dict[tuple, list] = {}
        self._graphs: dict[int, PlanGraphs] = {}  # id(plan) -> its captured runs
        self.capture = None  # what captures and launches graphs (a CudaCapture on a GPU)
        self.fused_compilers: tuple = ()  # this device's compilers of fused programs (none when emulated)
        if self.emulated:
            self.cupy, self.xp, self.pool = None, np, None
            return
        self.cupy, self.xp, count = import_cupy()
        if self.index >= count:
            raise DeviceError(f"device {device!r} does not exist: {count} CUDA device(s) visible")
        self.cupy.cuda.Device(self.index).use()
        self.pool = configure_pool(self.cupy, memory_pool, memory_limit)
        self.kernels = _shared_kernels(self.cupy)
        self.fused_compilers = (self.kernels,)
        if self.cuda_graphs:
            self.capture = CudaCapture(self.cupy, self.xp)  # with capturable cuBLAS for matmuls

    def __repr__(self) -> str:
        return f"<GPU {self.index}{' (emulated on NumPy)' if self.emulated else ''}>"

    @property
    def device_arrays(self) -> bool:
        """Whether the values it holds are CuPy arrays (not when emulated on NumPy)."""
        return not self.emulated

    # -- plans -------------------------------------------------------------------------
    def rewrite(self, graph: Graph, fetches) -> Graph:
        """The graph a plan runs on this device: fused elementwise chains."""
        if not self.fuse:
            return graph
        return fuse_step(graph, keep=fetches, supported=supports_op)

    def run(
        self, plan, feeds: list, *, check_numerics: bool = False, step=None, row_offset: int = 0, emit=None
    ) -> list:
        """``plan.run(feeds, ...)``, replayed as a CUDA graph when ``cuda_graphs`` allows;
        ``emit(kind, **fields)`` hears why a plan is or is not captured."""
        if self.capture is None or not self.cuda_graphs:
            return plan.run(feeds, check_numerics=check_numerics, step=step, row_offset=row_offset)
        graphs = self._graphs.get(id(plan))
        if graphs is None or graphs.plan is not plan:
            graphs = self._graphs[id(plan)] = PlanGraphs(plan, self.capture, emit)
        return graphs.run(feeds, check_numerics, step=step, row_offset=row_offset)

    def plan_graphs(self) -> list[PlanGraphs]:
        """The captured runs of each plan run with ``cuda_graphs`` so far."""
        return list(self._graphs.values())

    @property
    def graph_replays(self) -> int:
        """Plan runs done by replaying a captured graph, in all."""
        return sum(g.replays for g in self._graphs.values())

    # -- transfers ---------------------------------------------------------------------
    def is_device_array(self, value) -> bool:
        return self.cupy is not None and isinstance(value, self.cupy.ndarray)

    holds = is_device_array

    def put(self, array):
        """A checked host array on the device (device arrays pass through)."""
        return array if self.is_device_array(array) else self.to_device(array)

    def to_device(self, array: np.ndarray):
        """Copy a host array to the device through a reused pinned buffer (asynchronous)."""
        if self.emulated:
            return np.array(array)
        cp = self.cupy
        array = np.ascontiguousarray(array)
        if array.nbytes == 0:
            return cp.asarray(array)
        buffer, done = self._pinned(array)
        np.copyto(buffer, array)
        out = cp.empty(array.shape, array.dtype)
        stream = cp.cuda.get_current_stream()
        out.set(buffer, stream=stream)
        done.record(stream)
        return out

    def _pinned(self, array):
        """A pinned buffer for ``array``'s shape and dtype, free to overwrite; two per key, used in turn."""
        key = (array.shape, array.dtype.str)
        ring = self._staging.get(key)
        if ring is None:
            ring = self._staging[key] = [self._new_pinned(array), self._new_pinned(array), 0]
        slot = ring[ring[2]]
        ring[2] ^= 1
        slot[1].synchronize()  # the copy that last read this buffer has finished
        return slot

    def _new_pinned(self, array):
        cp = self.cupy
        memory = cp.cuda.alloc_pinned_memory(array.nbytes)
        buffer = np.frombuffer(memory, array.dtype, array.size).reshape(array.shape)
        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record()
        return buffer, event

    def to_host(self, value) -> np.ndarray:
        """A NumPy copy of a device array (waits for it)."""
        if self.emulated or not self.is_device_array(value):
            return np.asarray(value)
        return self.cupy.asnumpy(value)

    def result(self, value):
        """What ``Session.run`` returns for a fetched tensor."""
        return value if self.results == "device" else self.to_host(value)

    def synchronize(self) -> None:
        """Wait until the device has finished all queued work."""
        if not self.emulated:
            self.cupy.cuda.get_current_stream().synchronize()


def configure_pool(cupy, memory_pool, memory_limit):
    """Install the device allocator that ``memory_pool`` names; returns the pool (or None)."""
    if memory_pool == "none":
        cupy.cuda.set_allocator(None)
        return None
    if memory_pool == "default":
        pool = cupy.get_default_memory_pool()
    elif memory_pool == "managed":
        pool = cupy.cuda.MemoryPool(cupy.cuda.malloc_managed)
    elif memory_pool == "async":
        pool = cupy.cuda.MemoryAsyncPool()
    elif hasattr(memory_pool, "malloc"):
        pool = memory_pool
    else:
        raise DeviceError(f"memory_pool must be one of {', '.join(POOLS)} or a CuPy pool, got {memory_pool!r}")
    cupy.cuda.set_allocator(pool.malloc)
    if memory_limit is not None:
        if hasattr(pool, "set_limit"):
            pool.set_limit(size=int(memory_limit))
        else:
            raise DeviceError(f"memory pool {pool!r} cannot be limited")
    return pool


_KERNELS: dict[int, FusedKernels] = {}


def _shared_kernels(cupy) -> FusedKernels:
    """One kernel cache (and registered compiler) per CuPy module, however many sessions open a GPU."""
    if id(cupy) not in _KERNELS:
        _KERNELS[id(cupy)] = FusedKernels(cupy)
        train_kernels.register(cupy)  # fused_update, softmax_cross_entropy_with_grad
        conv_kernels.register(cupy)  # conv2d and its gradients: im2col/col2im and one GEMM each
    return _KERNELS[id(cupy)]
