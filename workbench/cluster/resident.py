"""A session's NumPy data kept on its workers between fits, while their content is unchanged.

The all-reduce family of engines (:mod:`workbench.cluster.collective.allreduce`) gives every member its own copy
of each array of a fit's data. :class:`ResidentData` keeps those copies, one Dask future per
``(content digest, worker)``, so that a later fit of the same session on the same workers starts
without sending them again. The digest is of the array's dtype, shape and bytes, not its identity:
an array changed in place is sent again.

Each copy is scattered to its one worker under a key of its own, never broadcast: Dask keeps one
replica of broadcast data once no task waits for it (the active memory manager drops the others),
and the worker left holding it may be one that dies; a key held by exactly one worker stays there
until released or until that worker leaves. Before each use the scheduler is asked where the
copies are (``who_has``): those of workers that left are gone, and are sent again.

What it keeps is bounded: the copies of the latest launch (a fit's start, or its restart on the
members left), on that launch's members; the others are released before new data are sent, so a
worker never holds two versions of an array for one session. :meth:`ResidentData.release` (called
by ``Session.close``) releases all of them; a new client starts afresh.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import threading
from collections.abc import Callable

import numpy as np


def content_digest(array: np.ndarray) -> str | None:
    """SHA-256 of ``array``'s dtype, shape and bytes (None for object arrays: their bytes are pointers).

    SHA-256 because CPUs hash it in hardware (SHA-NI, ARMv8): about 2 GB/s, a fraction of sending
    the bytes to even one worker."""
    if array.dtype.hasobject:
        return None
    contiguous = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{contiguous.dtype.str}{contiguous.shape}".encode())
    digest.update(contiguous.reshape(-1).view(np.uint8).data)
    return digest.hexdigest()


_HASHING = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-digests")


def digests_soon(arrays: list) -> concurrent.futures.Future:
    """The :func:`content_digest` of each of ``arrays``, computed in a thread (hashlib lets go of the
    GIL), so that what the caller sends meanwhile overlaps them."""
    return _HASHING.submit(lambda: [content_digest(a) for a in arrays])


class ResidentData:
    """The copies of a session's arrays on its workers: ``(digest, worker) -> Future``.

    ``place(client, arrays, members, scatter)`` returns each member's futures of ``arrays`` (member
    order, then array order), sending only what that member lacks (``scatter(values, [worker])``);
    ``timeout`` bounds the question to the scheduler; ``digests``, the arrays' digests when already on
    their way (:func:`digests_soon`). ``sent`` counts the copies sent so far, ``sent_bytes`` their bytes.
    """

    def __init__(self):
        self.client = None
        self.held: dict[tuple[str, str], object] = {}
        self.sent = 0
        self.sent_bytes = 0
        self._lock = threading.Lock()

    def place(
        self, client, arrays: list, members: list[str], scatter: Callable, timeout: float = 30.0, digests=None
    ) -> list[list]:
        digests = (digests or digests_soon(arrays)).result()
        with self._lock:
            if client is not self.client:  # another client: the copies the old one held are not ours to use
                self._release(list(self.held))
                self.client = client
            wanted = {(d, w) for d in digests if d is not None for w in members}
            self._release([k for k in self.held if k not in wanted])  # replaced, or on a worker not used now
            self._release(self._lost(timeout))
            return [self._place_on(w, arrays, digests, scatter) for w in members]

    def _place_on(self, worker: str, arrays: list, digests: list, scatter: Callable) -> list:
        """``worker``'s futures of ``arrays``: those it holds, the others sent now (each distinct array once)."""
        missing: dict = {}  # digest (or the position, for an array without one) -> position of its first array
        for i, d in enumerate(digests):
            if d is None or (d, worker) not in self.held:
                missing.setdefault(i if d is None else d, i)
        sent = dict(zip(missing, scatter([arrays[i] for i in missing.values()], [worker]))) if missing else {}
        for ident, i in missing.items():
            self.sent += 1
            self.sent_bytes += int(arrays[i].nbytes)
            if digests[i] is not None:
                self.held[(ident, worker)] = sent[ident]
        return [self.held[(d, worker)] if d is not None else sent[i] for i, d in enumerate(digests)]

    def _lost(self, timeout: float) -> list:
        """The entries whose copy the scheduler no longer has on their worker (it left, or the key was lost)."""
        if not self.held:
            return []
        keys = list({f.key for f in self.held.values()})
        where = self.client.sync(self.client.scheduler.who_has, keys=keys, callback_timeout=timeout)
        return [(d, w) for (d, w), f in self.held.items() if f.status != "finished" or w not in where.get(f.key, ())]

    def release(self) -> None:
        """Release every copy (the workers drop them once no task needs them) and forget the client."""
        with self._lock:
            self._release(list(self.held))
            self.client = None

    def _release(self, entries: list) -> None:
        for entry in entries:
            future = self.held.pop(entry)
            with contextlib.suppress(Exception):  # a closed client: nothing left to tell
                future.release()
