"""The NCCL backend of a collective group: GPU workers reduce CuPy arrays device to device.

Same interface as :class:`workbench.cluster.collective.communicator.Communicator`
(``start(bucket, flat, scale) -> handle``, ``handle.wait(timeout)``, ``close()``),
through ``cupy.cuda.nccl``. The unique id is made on rank 0 by a Dask task and
handed to every rank inside the :class:`~workbench.cluster.collective.group.CollectiveGroup`;
there is no rendezvous of our own. Each communicator runs its reductions on its own
CUDA stream, after the work already queued on the caller's stream, so the backward
pass keeps the device busy while buckets are reduced. NCCL sums in an order fixed by
its ring for a given group, and every rank receives the same bits.

A rank whose peer dies would wait in NCCL forever: :meth:`NcclHandle.wait` polls with
a deadline and aborts the communicator when it passes, raising :class:`ClusterError`.
Each rank needs its own GPU (NCCL refuses two ranks on one device).
"""

from __future__ import annotations

import time

from workbench.errors import ClusterError, CollectiveError


def unique_id() -> tuple:
    """NCCL's unique id for a new communicator (run on rank 0's worker)."""
    from cupy.cuda import nccl

    return tuple(nccl.get_unique_id())


def _nccl_dtype(nccl, dtype) -> int:
    table = {
        "float16": nccl.NCCL_FLOAT16,
        "float32": nccl.NCCL_FLOAT32,
        "float64": nccl.NCCL_FLOAT64,
        "int32": nccl.NCCL_INT32,
        "int64": nccl.NCCL_INT64,
    }
    found = table.get(str(dtype))
    if found is None:
        raise ClusterError(f"NCCL all-reduce does not take {dtype} arrays; use one of {sorted(table)}")
    return found


class NcclHandle:
    """A bucket's reduction queued on the communicator's stream."""

    def __init__(self, communicator: NcclCommunicator, bucket: str, flat, event):
        self.communicator, self.bucket, self.flat, self._event = communicator, bucket, flat, event

    def done(self) -> bool:
        return self._event is None or self._event.done

    def wait(self, timeout: float | None = None):
        comm = self.communicator
        limit = comm.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        pause = 1e-5
        while not self.done():
            comm.check()
            if time.monotonic() > deadline:
                comm.abort()
                raise CollectiveError(
                    f"NCCL all-reduce of bucket {self.bucket!r} on rank {comm.rank} of {comm.size} did not finish "
                    f"within {limit:g} s; "
                    f"a peer among {list(comm.addresses)} died or hangs"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        return self.flat


class NcclCommunicator:
    """Rank ``rank`` of an NCCL communicator over ``addresses`` (one GPU per worker)."""

    def __init__(self, group: str, rank: int, addresses, nccl_id: tuple, timeout: float = 60.0):
        import cupy
        from cupy.cuda import nccl

        self.cupy, self.nccl = cupy, nccl
        self.group, self.rank, self.addresses = group, rank, tuple(addresses)
        self.size, self.timeout = len(self.addresses), float(timeout)
        self.bytes_sent = self.bytes_received = 0
        self.closed = False
        self.device = cupy.cuda.Device()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # blocks until every rank has joined: the first start of each rank, inside its step task
        self.comm = nccl.NcclCommunicator(self.size, nccl_id, rank)

    def start(self, bucket: str, flat, scale: float | None = None) -> NcclHandle:
        """Queue the in-place sum of the 1-d CuPy array ``flat`` over the ranks (times ``scale``)."""
        if self.closed:
            raise ClusterError(f"communicator {self.group!r} is closed")
        cupy = self.cupy
        if not isinstance(flat, cupy.ndarray) or flat.ndim != 1:
            raise ClusterError(f"the NCCL backend reduces 1-d CuPy arrays, got {type(flat).__name__}")
        ready = cupy.cuda.Event(disable_timing=True)
        ready.record(cupy.cuda.get_current_stream())
        self.stream.wait_event(ready)  # the values the caller's stream is still computing
        ptr = flat.data.ptr
        self.comm.allReduce(
            ptr, ptr, flat.size, _nccl_dtype(self.nccl, flat.dtype), self.nccl.NCCL_SUM, self.stream.ptr
        )
        if scale is not None:
            with self.stream:
                flat *= flat.dtype.type(scale)
        moved = 2 * (self.size - 1) * flat.nbytes // max(self.size, 1)
        self.bytes_sent += moved
        self.bytes_received += moved
        done = cupy.cuda.Event(disable_timing=True)
        done.record(self.stream)
        return NcclHandle(self, bucket, flat, done)

    def allreduce(self, flat, bucket: str = "all", scale: float | None = None, timeout: float | None = None):
        return self.start(bucket, flat, scale).wait(timeout)

    def check(self) -> None:
        try:
            self.comm.check_async_error()
        except self.nccl.NcclError as e:
            raise CollectiveError(f"NCCL failed on rank {self.rank} of {self.size}: {e}") from e

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.comm.abort()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.synchronize()
            self.comm.destroy()
