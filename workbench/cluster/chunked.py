"""Dask-array data read by rows on the workers: a replica takes its shard's rows from the array's chunks.

The all-reduce family of engines trains each member on rows of the whole data set. For a dask
array, nothing of it passes through the client: :class:`ChunkedArray` persists the array on the
fit's workers once (``client.persist``, its futures held while the fit runs) and sends each
member a :class:`ChunkedSource`, the chunks' keys and their boundaries along axis 0 only. On the
worker, a step's rows come from the chunks that hold them (:func:`read_rows`): a chunk the worker
holds is read where Dask keeps it (``worker.data``); one it lacks is fetched from the peers that
hold it, as Dask's own ``Worker.gather`` does (the scheduler's ``who_has``, then
``gather_from_workers``), but kept in the source's own :class:`ChunkCache` (least recently used
first out, within a byte budget), never in Dask's store: the scheduler does not count it as a
replica, and a worker's memory for the data stays bounded by its own chunks plus the budget.

A worker that dies takes its chunks with it; the scheduler computes them again from the graph
(the client's futures still want them), and the next generation of the run waits for them
(:meth:`ChunkedArray.source`) before it starts. A step that finds a chunk on no worker waits for
it, within the source's timeout, then fails as a lost peer does (the run restarts).

The rows are the same bits as NumPy data's (``array[rows]`` of each chunk, in the order asked
for), so a fit on a dask array trains exactly as one on the same NumPy array.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable

import numpy as np

from workbench.errors import ClusterError, CollectiveError, FeedError
from workbench.training import is_dask_array

#: The share of a worker's memory limit that the chunks it fetched may take, all chunked feeds together
#: (its own chunks are Dask's and are not counted); without a memory limit, :data:`UNLIMITED_CACHE` bytes.
CACHE_SHARE = 0.25
UNLIMITED_CACHE = 1 << 30


def read_rows(
    rows: np.ndarray, boundaries: np.ndarray, chunks: Callable[[list[int]], dict], dtype, row_shape: tuple
) -> np.ndarray:
    """Rows ``rows`` of a chunked array, in that order.

    ``boundaries``: where each chunk starts along axis 0, then the number of rows; ``chunks(blocks)``
    returns ``{block: chunk}`` for the blocks asked for (all at once: a worker fetches what it lacks in
    one round). ``dtype`` and ``row_shape`` are the array's (the rows' shape beyond axis 0).
    """
    rows = np.asarray(rows)
    total = int(boundaries[-1])
    if len(rows) and (rows.min() < 0 or rows.max() >= total):
        raise FeedError(f"rows {int(rows.min())}..{int(rows.max())} asked of a chunked array of {total} rows")
    blocks = np.searchsorted(boundaries, rows, side="right") - 1
    wanted = [int(b) for b in np.unique(blocks)]
    got = chunks(wanted)
    out = np.empty((len(rows), *row_shape), dtype=dtype)
    for b in wanted:
        at = blocks == b
        out[at] = got[b][rows[at] - boundaries[b]]
    return out


class ChunkCache:
    """Chunks a worker fetched, least recently used first out, within ``budget`` bytes.

    A chunk larger than the whole budget is not kept (the step that fetched it still uses it).
    """

    def __init__(self, budget: int):
        self.budget = int(budget)
        self.held: collections.OrderedDict = collections.OrderedDict()
        self.bytes = 0

    def get(self, key):
        chunk = self.held.get(key)
        if chunk is not None:
            self.held.move_to_end(key)
        return chunk

    def put(self, key, chunk: np.ndarray) -> None:
        size = int(chunk.nbytes)
        if key in self.held or size > self.budget:
            return
        while self.held and self.bytes + size > self.budget:
            _, dropped = self.held.popitem(last=False)
            self.bytes -= int(dropped.nbytes)
        self.held[key] = chunk
        self.bytes += size


# -- what each worker fetched (read with ``client.run(fetched)``) --------------------------------

_FETCHED_LOCK = threading.Lock()
_FETCHED = {"chunks": 0, "bytes": 0, "keys": collections.Counter()}


def _count_fetched(chunks: dict) -> None:
    with _FETCHED_LOCK:
        for key, chunk in chunks.items():
            _FETCHED["chunks"] += 1
            _FETCHED["bytes"] += int(chunk.nbytes)
            _FETCHED["keys"][str(key)] += 1


def fetched() -> dict:
    """What this worker process fetched from its peers for chunked sources so far: ``chunks``,
    ``bytes`` and ``keys`` (each chunk key, as a string, to the times it was fetched)."""
    with _FETCHED_LOCK:
        return {"chunks": _FETCHED["chunks"], "bytes": _FETCHED["bytes"], "keys": dict(_FETCHED["keys"])}


class ChunkedSource:
    """A member's source of one feed held as chunks on the cluster: what :func:`~workbench.cluster.program.take_rows`
    reads a step's rows from, on the worker.

    Parameters
    ----------
    keys : list
        The Dask key of each chunk along axis 0 (one chunk spans every other axis).
    boundaries : sequence of int
        Where each chunk starts, then the number of rows.
    dtype, row_shape :
        The array's dtype, and the shape of a row.
    timeout : float
        Seconds a step waits for a chunk that is on no worker (being computed again) before it fails.
    cache_bytes : int, optional
        Bytes of fetched chunks kept (default: :data:`CACHE_SHARE` of the worker's memory limit, shared
        by the ``shared_by`` chunked feeds of the fit).
    """

    def __init__(self, keys, boundaries, dtype, row_shape, timeout: float = 60.0, cache_bytes=None, shared_by=1):
        self.keys = list(keys)
        self.boundaries = np.asarray(boundaries, dtype=np.int64)
        self.dtype, self.row_shape = np.dtype(dtype), tuple(row_shape)
        self.timeout, self.cache_bytes, self.shared_by = float(timeout), cache_bytes, max(1, int(shared_by))
        self._cache: ChunkCache | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": None}  # a worker's cache is its own

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (run in a task on a worker)."""
        return read_rows(rows, self.boundaries, self._chunks, self.dtype, self.row_shape)

    def _chunks(self, blocks: list[int]) -> dict:
        from distributed import get_worker
        from distributed.utils import sync

        worker = get_worker()
        if self._cache is None:
            self._cache = ChunkCache(self.cache_bytes if self.cache_bytes is not None else self._budget(worker))
        got, lacking = {}, []
        for b in blocks:
            key = self.keys[b]
            chunk = _held(worker, key)
            if chunk is None:
                chunk = self._cache.get(key)
            if chunk is None:
                lacking.append(b)
            else:
                got[b] = chunk
        if lacking:
            keys = [self.keys[b] for b in lacking]
            arrived = sync(worker.loop, gather_chunks, worker, keys, self.timeout)
            for b, key in zip(lacking, keys):
                got[b] = arrived[key]
                self._cache.put(key, arrived[key])
        return got

    def _budget(self, worker) -> int:
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
        whole = int(limit * CACHE_SHARE) if limit else UNLIMITED_CACHE
        return whole // self.shared_by


def _held(worker, key):
    """The chunk ``key`` where this worker's Dask store holds it, or None."""
    try:
        return worker.data[key]
    except KeyError:
        return None


async def gather_chunks(worker, keys: list, timeout: float) -> dict:
    """``keys`` from the peers that hold them, not into the worker's store (as ``Worker.gather`` does, less
    the storing): the scheduler asked where they are until every one arrived, within ``timeout`` seconds
    (a chunk on no worker is being computed again, one whose holder died meanwhile is asked for again)."""
    from distributed.utils_comm import gather_from_workers, retry_operation

    deadline = time.monotonic() + timeout
    arrived: dict = {}
    while True:
        missing = [k for k in keys if k not in arrived]
        who_has = await retry_operation(worker.scheduler.who_has, keys=missing)
        where = {}
        for key in missing:
            holders = set(who_has.get(key, ()))
            if worker.address in holders and _held(worker, key) is not None:  # it came here meanwhile
                arrived[key] = _held(worker, key)
            elif holders - {worker.address}:
                where[key] = holders - {worker.address}
        if where:
            data, _, failed, _ = await gather_from_workers(where, rpc=worker.rpc, who=worker.address)
            if failed:
                raise ClusterError(f"chunks {failed} of the data could not be read from their workers")
            _count_fetched(data)
            arrived.update(data)
        if len(arrived) == len(keys):
            return arrived
        if time.monotonic() > deadline:
            lost = [k for k in keys if k not in arrived]
            raise CollectiveError(f"chunks {lost} of the data were on no worker for {timeout:g} s")
        await asyncio.sleep(0.1)


class ChunkedArray:
    """A fit's dask array feed on the client: persisted on the fit's workers at its first placement, its
    chunks' futures held while the fit runs; each placement gives the members a :class:`ChunkedSource`.

    Chunked along other axes than the first, it is rechunked first to one chunk across them.
    """

    def __init__(self, name: str, array):
        if any(np.isnan(c) for c in array.chunks[0]):
            raise FeedError(
                f"data[{name!r}] has chunks of unknown length along axis 0; call compute_chunk_sizes() on it first"
            )
        if array.ndim > 1 and any(len(c) > 1 for c in array.chunks[1:]):
            array = array.rechunk({i: -1 for i in range(1, array.ndim)})
        self.name, self.array = name, array
        self.persisted = None
        self.futures: list = []

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def source(self, client, workers: list[str], timeout: float, shared_by: int = 1) -> ChunkedSource:
        """The members' source of this feed: the array persisted on ``workers`` the first time (elsewhere too
        where none of them is left) and waited for, as long as computing it takes; at a relaunch, waited for
        until every chunk is in memory again (the scheduler computes those of a worker that died again from
        the graph), within ``timeout`` seconds: a relaunch that cannot start is one more restart."""
        from dask.core import flatten
        from distributed import futures_of, wait

        first = self.persisted is None
        if first:
            self.persisted = client.persist(self.array, workers=list(workers), allow_other_workers=True)
            self.futures = futures_of(self.persisted)
        with client.as_current():  # wait asks the default client, and a session's need not be it
            wait(self.futures, timeout=None if first else timeout)
        for future in self.futures:
            if future.status == "error":
                raise FeedError(f"data[{self.name!r}]: its chunk {future.key} failed") from future.exception()
            if future.status != "finished":  # cancelled, or lost with no graph to compute it again from
                raise CollectiveError(f"data[{self.name!r}]: its chunk {future.key} is {future.status}")
        array = self.persisted
        boundaries = np.concatenate([[0], np.cumsum(array.chunks[0])]).astype(np.int64)
        keys = list(flatten(array.__dask_keys__()))
        return ChunkedSource(keys, boundaries, array.dtype, array.shape[1:], timeout=timeout, shared_by=shared_by)


def feed_value(name: str, value):
    """A feed of a fit as the all-reduce family keeps it: a :class:`ChunkedArray` for a dask array,
    else a NumPy array."""
    return ChunkedArray(name, value) if is_dask_array(value) else np.asarray(value)
