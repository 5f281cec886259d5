"""How GPU workers send CuPy arrays to each other: distributed's serializers, or host copies.

Distributed serializes CuPy arrays itself (through host memory over TCP, device to
device with UCX), but rebuilds a received array with RMM or ``numba.cuda``; where
neither works, a CuPy array could not be sent at all. :class:`DeviceTransfers`
checks this once on every worker (restarted ones too) with a round trip, and where
it fails registers plain host copies, which is what TCP does anyway.
"""

from __future__ import annotations

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.serialize import dask_deserialize, dask_dumps, dask_loads, dask_serialize


_HOST_COPIES: set = set()  # array types sent as host copies from this process


def host_serializers(cupy):
    """``(dumps, loads)`` for ``cupy.ndarray`` that go through one host copy."""

    def dumps(x):
        host = cupy.asnumpy(cupy.ascontiguousarray(x))
        return {"shape": list(host.shape), "dtype": host.dtype.str}, [memoryview(host).cast("B")]

    def loads(header, frames):
        host = np.frombuffer(frames[0], dtype=np.dtype(header["dtype"])).reshape(header["shape"])
        return cupy.asarray(host)

    return dumps, loads


def device_transfers(cupy=None) -> str:
    """Make CuPy arrays sendable from this process: ``"distributed"`` when its serializers
    round-trip an array, else ``"host copies"`` (registered here)."""
    if cupy is None:
        import cupy
    if cupy.ndarray in _HOST_COPIES:
        return "host copies"
    try:
        probe = cupy.arange(3, dtype="float32")
        if not bool((dask_loads(*dask_dumps(probe)) == probe).all()):
            raise ValueError("the round trip changed the array")
        return "distributed"
    except Exception:  # noqa: BLE001 - ImportError of numba.cuda, a CUDA error of numba's: all mean "use host copies"
        dumps, loads = host_serializers(cupy)
        dask_serialize.register(cupy.ndarray)(dumps)
        dask_deserialize.register(cupy.ndarray)(loads)
        _HOST_COPIES.add(cupy.ndarray)
        return "host copies"


class DeviceTransfers(WorkerPlugin):
    """Runs :func:`device_transfers` on every worker, also on those that join later; the
    answer is in ``worker.workbench_device_transfers``."""

    name = "workbench-device-transfers"

    def setup(self, worker):
        worker.workbench_device_transfers = device_transfers()
