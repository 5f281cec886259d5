"""A bucketed, fixed-order all-reduce between ranks, over any transport that can send an array.

A :class:`Communicator` is one rank of a group. ``start(bucket, flat)`` begins
the all-reduce of a flat array on an asyncio event loop (a Dask worker's own)
and returns at once; the calling thread keeps computing and later calls
``handle.wait(timeout)``. The result is written into ``flat`` itself.

Two bandwidth-optimal algorithms, both a reduce-scatter followed by an all-gather,
so each rank sends and receives ``2 (R - 1) / R`` of the array whatever ``R``, and one for latency:

- ``"direct"``: rank ``r`` owns chunk ``r``; every rank sends chunk ``p`` to its owner ``p``,
  the owner sums the ``R`` pieces in a pairwise tree over the ranks,
  ``(g0 + g1) + (g2 + g3) ...``, then sends the sum back to everyone. Two message
  rounds whatever ``R``; the tree is the one a reduction task graph uses, so both give
  the same bits. Chunks over ``SEGMENT`` bytes go in segments, pipelined: a segment is
  summed and sent back while the next ones still arrive.
- ``"ring"``: ``R - 1`` rounds of reduce-scatter and ``R - 1`` of all-gather around
  the ring, each rank talking to its two neighbours only; chunk ``c`` is summed as
  ``((g_c + g_c+1) + g_c+2) ...``. For large groups.
- ``"gather"``: every rank sends its whole array to every peer and sums all of them in
  the tree order: one message round, ``R - 1`` times the array. Between 2 ranks that is
  as few bytes as the others, and half their latency: ``"auto"`` uses it for small arrays there.

A small gather (of an array up to ``GATHER_BELOW`` bytes: ``"auto"``'s between 2 ranks, a step's
usual small bucket) skips the event loop where the transport can send from the calling thread
(``send_now``: Dask's comm over plain TCP, see :mod:`~workbench.cluster.collective.array_stream`):
``start`` writes the array to each peer itself and ``wait`` sums what the loop's reader handed
over (:class:`InlineHandle`), in the same order, so with the same bits; one thread wake-up instead of
a hop to the loop and one back.

Every element is summed in an order fixed by the ranks alone, once (then copied to
the others) or by every rank alike: every rank ends with the same bits, and the
result never depends on timing. Waits are bounded: a rank that hears nothing from
a peer within the timeout raises :class:`~workbench.errors.CollectiveError` (a
``ClusterError``) naming that peer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any
from collections.abc import Awaitable, Callable

import numpy as np

from workbench.errors import ClusterError, CollectiveError

ALGORITHMS = ("auto", "direct", "ring", "gather")
RING_FROM = 9  # "auto" uses the ring from this many ranks on (direct needs R - 1 connections per rank)
GATHER_BELOW = 64 << 10  # "auto" sends small arrays whole between 2 ranks: one message round instead of two
SEGMENT = 1 << 20  # "direct" pipelines chunks larger than this in segments of at most this many bytes


#: Seconds a mailbox keeps messages for a group no communicator here joined (a peer may start first).
STRAY_SECONDS = 120.0


class Mailbox:
    """Arrays that arrived, by key, and the receivers waiting for them.

    Arrays arrive on one event loop (:meth:`put`); a coroutine on that loop takes one with
    :meth:`take`, a thread with :meth:`receive` (a future the arrival resolves: no hop through the
    loop to wait). One lock covers what arrived and who waits, so the two never miss each other.

    Messages for a group that no communicator of this mailbox joins within ``stray_seconds`` are
    dropped: a stray message (another run's, a crafted one) pins no memory for longer than that.
    """

    def __init__(self, stray_seconds: float = STRAY_SECONDS):
        self._lock = threading.Lock()
        self._arrived: dict[str, Any] = {}  # key -> an array nobody took yet
        self._waiting: dict[str, Any] = {}  # key -> the receiver's future (asyncio's or a thread's)
        self._closed: set[str] = set()  # groups released here: late messages for them are dropped
        self._joined: set[str] = set()
        self._pending: set[str] = set()  # groups not joined (yet) with an expiry scheduled
        self._into: dict[str, Any] = {}  # key -> the array a receiver wants that message written into
        self.stray_seconds = float(stray_seconds)

    def join(self, group: str) -> None:
        """A communicator of ``group`` receives here: its messages are kept until taken or released."""
        with self._lock:
            self._joined.add(group)

    def _drop(self, group: str, unless_joined: bool) -> None:
        """Forget what arrived for ``group`` and cancel its receivers."""
        prefix = f"{group}|"
        with self._lock:
            if unless_joined and group in self._joined:
                return
            for key in [k for k in self._arrived if k.startswith(prefix)]:
                del self._arrived[key]
            waiters = [self._waiting.pop(k) for k in [k for k in self._waiting if k.startswith(prefix)]]
        for waiter in waiters:
            waiter.cancel()

    def _expire(self, group: str) -> None:
        self._pending.discard(group)
        self._drop(group, unless_joined=True)

    def expect(self, group: str, key: str, into) -> None:
        """Ask that ``key`` of ``group``, if it has not arrived yet, be written into ``into``
        (a transport that can read into a buffer asks :meth:`destination`). Only for an array that
        nothing reads until the message is taken: one already being read in when a wait fails may
        still land in it. On the event loop."""
        full = f"{group}|{key}"
        if group not in self._closed and full not in self._arrived:
            self._into[full] = into

    def destination(self, group: str, key: str, dtype, nbytes: int):
        """The array registered for ``key`` of ``group`` if a message of ``nbytes`` bytes of
        ``dtype`` fits it exactly (it is then handed out once), else None. On the event loop."""
        full = f"{group}|{key}"
        into = self._into.get(full)
        if into is None or into.dtype != dtype or into.nbytes != nbytes or group in self._closed:
            return None
        del self._into[full]
        return into

    def put(self, group: str, key: str, value) -> None:
        """``value`` arrived for ``key`` of ``group`` (on the event loop): to its receiver, or kept."""
        full = f"{group}|{key}"
        with self._lock:
            if group in self._closed:
                return
            if group not in self._joined and group not in self._pending:
                self._pending.add(group)
                asyncio.get_running_loop().call_later(self.stray_seconds, self._expire, group)
            waiter = self._waiting.pop(full, None)
            if waiter is None:
                self._arrived.setdefault(full, value)  # the first of two with one key wins
                return
        if not waiter.done():
            waiter.set_result(value)

    async def take(self, group: str, key: str, timeout: float):
        """The array for ``key`` of ``group`` once it arrives (on the event loop; at most ``timeout`` s)."""
        full = f"{group}|{key}"
        with self._lock:
            if full in self._arrived:
                self._into.pop(full, None)
                return self._arrived.pop(full)
            if group in self._closed:
                raise asyncio.CancelledError
            waiter = self._waiting[full] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        finally:
            self._into.pop(full, None)
            self._forget(full, waiter)

    def receive(self, group: str, key: str) -> concurrent.futures.Future:
        """A future of the array for ``key`` of ``group`` (from any thread); cancelled if the group is
        released. Pass it to :meth:`forget` when no longer waiting for it."""
        full, future = f"{group}|{key}", concurrent.futures.Future()
        with self._lock:
            if full in self._arrived:
                future.set_result(self._arrived.pop(full))
            elif group in self._closed:
                future.cancel()
            else:
                self._waiting[full] = future
        return future

    def forget(self, group: str, key: str, future) -> None:
        """No longer wait with ``future`` for ``key`` of ``group`` (what arrives later is kept until released)."""
        self._forget(f"{group}|{key}", future)

    def _forget(self, full: str, future) -> None:
        with self._lock:
            if self._waiting.get(full) is future:
                del self._waiting[full]

    def has(self, group: str, key: str) -> bool:
        """Whether ``key`` of ``group`` has arrived and is not taken yet."""
        with self._lock:
            return f"{group}|{key}" in self._arrived

    def release(self, group: str) -> None:
        """Forget ``group``: drop what arrived for it, cancel its waiters, ignore what comes later."""
        with self._lock:
            self._closed.add(group)
            self._joined.discard(group)
        self._drop(group, unless_joined=False)
        prefix = f"{group}|"
        for key in [k for k in self._into if k.startswith(prefix)]:
            del self._into[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._arrived) + len(self._waiting)


def chunk_bounds(n: int, size: int) -> list[tuple[int, int]]:
    """``size`` contiguous, near-equal ranges covering ``range(n)`` (as ``np.array_split``)."""
    q, extra = divmod(n, size)
    bounds, start = [], 0
    for i in range(size):
        stop = start + q + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def tree_sum(parts: list, out=None):
    """``(p0 + p1) + (p2 + p3) ...``, pairwise over ``parts`` in order; into ``out`` when given.

    ``parts`` may include ``out`` itself; intermediate sums go to fresh arrays, the last into ``out``
    (between 2 ranks there are none: one add, in place).
    """
    level = list(parts)
    while len(level) > 2:
        nxt = [level[j] + level[j + 1] for j in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    if out is None:
        return level[0] + level[1] if len(level) == 2 else level[0]
    if len(level) == 2:
        np.add(level[0], level[1], out=out)
    elif level[0] is not out:
        np.copyto(out, level[0])
    return out


Send = Callable[[int, str, Any], Awaitable[None]]
SendNow = Callable[[int, str, Any], bool]


class Handle:
    """One bucket's all-reduce in flight; :meth:`wait` gives the reduced array (the one passed in).

    :meth:`summed` returns as soon as the sum is in the array, while peers may still be reading
    what this rank sent from it: the array is then read-only until :meth:`wait` returns.
    """

    def __init__(
        self,
        communicator: Communicator,
        bucket: str,
        flat,
        future: concurrent.futures.Future | None,
        summed: concurrent.futures.Future | None = None,
    ):
        self.communicator, self.bucket, self.flat, self._future = communicator, bucket, flat, future
        self._summed = summed

    def done(self) -> bool:
        return self._future is None or self._future.done() or (self._summed is not None and self._summed.done())

    def wait(self, timeout: float | None = None):
        """Block until the bucket is reduced and every peer has what this rank sent (at most
        ``timeout`` seconds, default the group's); the array is the caller's again."""
        self._block([self._future], timeout)
        return self.flat

    def summed(self, timeout: float | None = None):
        """Block until the sum is in the array (at most ``timeout`` seconds); write to it only after :meth:`wait`."""
        self._block([self._future] if self._summed is None else [self._summed, self._future], timeout)
        return self.flat

    def _block(self, futures: list, timeout: float | None) -> None:
        """Wait for the first of ``futures`` (the whole reduction last); its error, or a timeout naming the peers."""
        if self._future is None:
            return
        timeout = self.communicator.timeout if timeout is None else timeout
        done, _ = concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        if not done:
            self._future.cancel()
            waiting = sorted(self.communicator.waiting_on.get(self.bucket, ()))
            who = ", ".join(map(self.communicator.describe, waiting)) or "its peers"
            raise CollectiveError(
                f"all-reduce of bucket {self.bucket!r} on rank {self.communicator.rank} timed out after "
                f"{timeout:g} s waiting for {who}"
            )
        for future in done:
            future.result()  # raises the reduction's error


class InlineHandle(Handle):
    """A small all-reduce that the calling thread does itself: no hop through the event loop.

    The array went out to every peer in :meth:`Communicator.start` (written to the socket by this
    thread: the array is free again once it returns); :meth:`wait` takes the peers' arrays as the
    event loop's reader hands them over (the one thread wake-up left) and sums them with this
    rank's in rank order, into the array, as the event loop's gather does: the same bits.
    """

    def __init__(self, communicator, bucket, flat, scale, peers, arrivals, sending, error):
        super().__init__(communicator, bucket, flat, None)
        self._scale, self._peers, self._arrivals, self._sending = scale, peers, arrivals, sending
        self._error: CollectiveError | None = error
        self._started, self._finished = time.monotonic(), False

    def done(self) -> bool:
        if self._finished or self._error is not None:
            return True
        return all(f.done() for f in self._arrivals) and (self._sending is None or self._sending.done())

    def wait(self, timeout: float | None = None):
        """Block until the peers' arrays are here (at most ``timeout`` seconds, default the group's,
        and at most the group's timeout after :meth:`~Communicator.start` for any one peer); sum them
        into the array."""
        if not self._finished and self._error is None:
            try:
                self._finish(self.communicator.timeout if timeout is None else timeout)
            except CollectiveError as e:
                self._error = e
        if self._error is not None:
            raise self._error
        return self.flat

    summed = wait  # nothing of the array is left to send once the sum is in

    def _finish(self, timeout: float) -> None:
        comm, bucket = self.communicator, self.bucket
        deadline = time.monotonic() + timeout
        per_peer = self._started + comm.timeout
        values = []
        try:
            for peer, arrival in zip(self._peers, self._arrivals):
                try:
                    value = arrival.result(max(0.0, min(deadline, per_peer) - time.monotonic()))
                except TimeoutError:
                    raise self._timed_out(peer, timeout, per_peer < deadline) from None
                except concurrent.futures.CancelledError:
                    raise CollectiveError(
                        f"all-reduce of bucket {bucket!r} on {comm.describe(comm.rank)}: "
                        f"collective {comm.group!r} was released while it waited for {comm.describe(peer)}"
                    ) from None
                values.append(comm.checked(bucket, peer, f"{bucket}|all|{peer}", value, self.flat))
            if self._sending is not None:
                try:
                    self._sending.result(max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    raise self._timed_out(None, timeout, False) from None
        finally:
            for peer, arrival in zip(self._peers, self._arrivals):
                if not arrival.done():
                    comm.mailbox.forget(comm.group, f"{bucket}|all|{peer}", arrival)
            if self._sending is not None and not self._sending.done():
                self._sending.cancel()
        comm.count(received=sum(v.nbytes for v in values))
        r = comm.rank
        tree_sum(values[:r] + [self.flat] + values[r:], self.flat)
        if self._scale is not None:
            np.multiply(self.flat, self._scale, out=self.flat, casting="unsafe")
        self._finished = True

    def _timed_out(self, peer, timeout: float, silent_peer: bool) -> CollectiveError:
        comm = self.communicator
        if silent_peer:  # the group's timeout, counted from start(), ran out for this peer
            return CollectiveError(
                f"all-reduce of bucket {self.bucket!r} on {comm.describe(comm.rank)}: nothing from "
                f"{comm.describe(peer)} for {comm.timeout:g} s (did it die or hang?)"
            )
        waiting = [p for p, f in zip(self._peers, self._arrivals) if not f.done()]
        who = ", ".join(map(comm.describe, waiting)) or "its peers"
        return CollectiveError(
            f"all-reduce of bucket {self.bucket!r} on rank {comm.rank} timed out after {timeout:g} s waiting for {who}"
        )


class Communicator:
    """Rank ``rank`` of ``len(addresses)`` in group ``group``.

    Parameters
    ----------
    group : str
        Unique name of the group (messages carry it: two groups never mix).
    rank : int
    addresses : sequence of str
        Every rank's address, in rank order (only used in messages and errors).
    send : coroutine function ``send(rank, key, array)``
        Delivers ``array`` to ``mailbox.put(group, key, array)`` on rank ``rank``.
    send_now : ``send_now(rank, key, array) -> bool``, optional
        The same from the calling thread, at once: False where it cannot (no direct way to that
        peer yet). Small gathers then run in the calling thread (:class:`InlineHandle`).
    mailbox : Mailbox
        Where this rank's messages arrive.
    loop : asyncio event loop
        Where transfers and sums run (not the calling thread).
    timeout : float
        Seconds to wait for any one peer before :class:`ClusterError`.
    algorithm : {"auto", "direct", "ring", "gather"}

    Attributes
    ----------
    bytes_sent, bytes_received : int
        Payload bytes so far.
    """

    def __init__(
        self,
        group: str,
        rank: int,
        addresses,
        send: Send,
        mailbox: Mailbox,
        loop,
        timeout: float = 60.0,
        algorithm: str = "auto",
        send_now: SendNow | None = None,
    ):
        if algorithm not in ALGORITHMS:
            raise ClusterError(
                f"unknown all-reduce algorithm {algorithm!r}; use one of {', '.join(map(repr, ALGORITHMS))}"
            )
        self.group, self.rank, self.addresses = group, rank, tuple(addresses)
        self.size = len(self.addresses)
        self._send, self.mailbox, self.loop, self.timeout = send, mailbox, loop, float(timeout)
        self.algorithm, self._send_now = algorithm, send_now
        self.bytes_sent = self.bytes_received = 0
        self._counting = threading.Lock()  # the calling thread and the event loop both count
        self.waiting_on: dict[str, set] = {}  # bucket -> the peers it waits for now
        self.closed = False
        if loop is not None:
            loop.call_soon_threadsafe(mailbox.join, group)
        else:
            mailbox.join(group)

    def describe(self, rank: int) -> str:
        return f"rank {rank} ({self.addresses[rank]})"

    def start(self, bucket: str, flat, scale: float | None = None) -> Handle:
        """Begin the all-reduce (sum) of the 1-d array ``flat`` in place; ``scale`` multiplies the sum.

        ``bucket`` names this reduction; every rank starts the same buckets with arrays of the same
        length and dtype (in any order: messages are matched by name). The scale is applied once, by
        the rank that sums each chunk, before the chunk is sent back.
        """
        if self.closed:
            raise ClusterError(f"communicator {self.group!r} is closed")
        if getattr(flat, "ndim", 0) != 1 or not flat.flags.c_contiguous:
            raise ClusterError(f"all-reduce needs a contiguous 1-d array, got shape {getattr(flat, 'shape', None)}")
        if self.size == 1:
            if scale is not None:
                np.multiply(flat, scale, out=flat, casting="unsafe")
            return Handle(self, bucket, flat, None)
        if self._send_now is not None and flat.nbytes <= GATHER_BELOW and self._algorithm_for(flat) == "gather":
            handle = self._start_inline(bucket, flat, scale)
            if handle is not None:
                return handle
        summed: concurrent.futures.Future = concurrent.futures.Future()
        future = asyncio.run_coroutine_threadsafe(self._reduce(bucket, flat, scale, summed), self.loop)
        return Handle(self, bucket, flat, future, summed)

    def allreduce(self, flat, bucket: str = "all", scale: float | None = None, timeout: float | None = None):
        """``start(bucket, flat, scale).wait(timeout)``."""
        return self.start(bucket, flat, scale).wait(timeout)

    def count(self, sent: int = 0, received: int = 0) -> None:
        """Add to :attr:`bytes_sent` and :attr:`bytes_received` (from any thread)."""
        with self._counting:
            self.bytes_sent += sent
            self.bytes_received += received

    def _start_inline(self, bucket: str, flat, scale) -> InlineHandle | None:
        """The gather of a small array from the calling thread: sent to every peer now, summed in
        :meth:`InlineHandle.wait`. None where the first peer cannot be sent to directly yet (the event
        loop does it all then); a later peer that cannot gets the array through the event loop."""
        r = self.rank
        peers = [p for p in range(self.size) if p != r]
        key, direct, error = f"{bucket}|all|{r}", 0, None
        for peer in peers:
            try:
                if not self._send_now(peer, key, flat):
                    break
            except OSError as e:  # TimeoutError included
                error = self._send_failed(peer, key, e)
                break
            direct += 1
        if direct == 0 and error is None:
            return None
        self.count(sent=direct * flat.nbytes)
        rest = [] if error is not None else peers[direct:]
        sending = asyncio.run_coroutine_threadsafe(self._put_each(rest, key, flat), self.loop) if rest else None
        arrivals = [] if error is not None else [self.mailbox.receive(self.group, f"{bucket}|all|{p}") for p in peers]
        return InlineHandle(self, bucket, flat, scale, peers, arrivals, sending, error)

    def close(self) -> None:
        """Stop taking part: messages for this group are dropped, waits in progress end (from any thread)."""
        self.closed = True
        self.loop.call_soon_threadsafe(self.mailbox.release, self.group)

    # -- on the event loop ----------------------------------------------------------------------
    async def _reduce(self, bucket: str, flat, scale, summed: concurrent.futures.Future) -> None:
        sent: list = []
        run = {"direct": self._direct, "ring": self._ring, "gather": self._gather}[self._algorithm_for(flat)]
        try:
            await run(bucket, flat, scale, sent)
            summed.set_result(None)  # the sum is in ``flat``; the replies to what we sent may still come
            await asyncio.gather(*sent)  # every peer has read what we sent: ``flat`` is the caller's again
        finally:
            for task in sent:
                task.cancel()
            self.waiting_on.pop(bucket, None)

    async def send(self, peer: int, key: str, value) -> None:
        """Send ``value`` (an array) to rank ``peer``'s mailbox under ``key`` (on the event loop; bounded)."""
        await self._put(peer, key, value)

    async def _put(self, peer: int, key: str, value) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self._send(peer, key, value)
        except TimeoutError as e:
            raise self._send_failed(peer, key, e) from None
        except OSError as e:  # ConnectionError included
            raise self._send_failed(peer, key, e) from e
        self.count(sent=value.nbytes)

    async def _put_each(self, peers: list, key: str, value) -> None:
        for peer in peers:
            await self._put(peer, key, value)

    def _send_failed(self, peer: int, key: str, e: OSError) -> CollectiveError:
        if isinstance(e, TimeoutError):
            return CollectiveError(f"sending {key!r} to {self.describe(peer)} timed out after {self.timeout:g} s")
        return CollectiveError(f"sending {key!r} to {self.describe(peer)} failed: {type(e).__name__}: {e}")

    async def _get(self, bucket: str, peer: int, key: str, like, into: bool = False):
        waiting = self.waiting_on.setdefault(bucket, set())
        waiting.add(peer)
        if into:  # where the transport can, the message is read straight into ``like``
            self.mailbox.expect(self.group, key, like)
        try:
            value = await self.mailbox.take(self.group, key, self.timeout)
            waiting.discard(peer)
        except TimeoutError:
            raise CollectiveError(
                f"all-reduce of bucket {bucket!r} on {self.describe(self.rank)}: nothing from {self.describe(peer)} "
                f"for {self.timeout:g} s (did it die or hang?)"
            ) from None
        self.count(received=self.checked(bucket, peer, key, value, like).nbytes)
        return value

    def checked(self, bucket: str, peer: int, key: str, value, like):
        """``value``, the array ``peer`` sent for ``key``, if it has ``like``'s shape and dtype."""
        if not isinstance(value, np.ndarray) or value.shape != like.shape or value.dtype != like.dtype:
            got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
            raise CollectiveError(
                f"all-reduce of bucket {bucket!r} on {self.describe(self.rank)}: {self.describe(peer)} sent "
                f"{got} for {key!r}, where {like.dtype} {like.shape} belongs (a message of another run, or a "
                "peer with another model?); the step is refused rather than summed"
            )
        return value

    async def _exchange(self, bucket: str, sends: list, receives: list, sent: list, into: bool = False) -> list:
        """Send ``(peer, key, array)``s while receiving ``(peer, key, like)``s (each must have ``like``'s
        shape and dtype); the received arrays in order. With ``into``, each is received into its
        ``like`` where the transport can (the result is then ``like`` itself), else a new array.

        Returns once everything is received, without waiting for the sends' replies: their tasks
        go to ``sent``, awaited when the bucket is done. (An array sent in one round is written
        again only after the message it caused has come back, so the peer has read it.) The first
        failure of any send or receive ends the exchange at once.
        """
        sent.extend(asyncio.ensure_future(self._put(p, k, v)) for p, k, v in sends)
        receiving = [asyncio.ensure_future(self._get(bucket, p, k, like, into)) for p, k, like in receives]
        try:
            waiting = set(receiving)
            while waiting:
                done, _ = await asyncio.wait(
                    waiting | {t for t in sent if not t.done()}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task.exception() is not None:
                        raise task.exception()
                waiting -= done
            return [task.result() for task in receiving]
        finally:
            for task in receiving:
                task.cancel()

    def _algorithm_for(self, flat) -> str:
        if self.algorithm != "auto":
            return self.algorithm
        if self.size == 2 and flat.nbytes <= GATHER_BELOW:
            return "gather"
        return "ring" if self.size >= RING_FROM else "direct"

    async def _gather(self, bucket: str, flat, scale, sent: list) -> None:
        r = self.rank
        peers = [p for p in range(self.size) if p != r]
        sends = [(p, f"{bucket}|all|{r}", flat) for p in peers]
        receives = [(p, f"{bucket}|all|{p}", flat) for p in peers]
        if flat.nbytes <= GATHER_BELOW:
            # the fast path, without a task per message: a small send is in the socket's hands at once
            # (a peer reads whatever arrives, whether its rank waits for it yet or not)
            for peer, key, value in sends:
                await self._put(peer, key, value)
            arrays = [await self._get(bucket, peer, key, like) for peer, key, like in receives]
        else:
            arrays = await self._exchange(bucket, sends, receives, sent)
            await asyncio.gather(*sent)  # every peer has read ``flat``: the sum goes straight into it
        tree_sum(arrays[:r] + [flat] + arrays[r:], flat)
        if scale is not None:
            np.multiply(flat, scale, out=flat, casting="unsafe")

    async def _direct(self, bucket: str, flat, scale, sent: list) -> None:
        views = [flat[a:b] for a, b in chunk_bounds(len(flat), self.size)]
        segments = -(-views[0].nbytes // SEGMENT)
        if segments <= 1:
            return await self._direct_segment(bucket, bucket, views, scale, sent)
        # a pipeline: segment s is summed and sent back while the later ones still arrive. Each
        # element is summed as before (over the ranks, in the same tree), so the bits are the same
        cuts = [chunk_bounds(len(v), segments) for v in views]
        parts = [
            asyncio.ensure_future(
                self._direct_segment(
                    bucket, f"{bucket}#{s}", [v[c[s][0] : c[s][1]] for v, c in zip(views, cuts)], scale, sent
                )
            )
            for s in range(segments)
        ]
        try:
            done, _ = await asyncio.wait(parts, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()
        finally:
            for task in parts:
                task.cancel()

    async def _direct_segment(self, bucket: str, name: str, views: list, scale, sent: list) -> None:
        """The direct algorithm on ``views`` (one per rank, rank ``p`` owning ``views[p]``), messages named ``name``."""
        r = self.rank
        peers = [p for p in range(self.size) if p != r]
        pieces = await self._exchange(
            bucket,
            [(p, f"{name}|rs|{r}", views[p]) for p in peers],
            [(p, f"{name}|rs|{p}", views[r]) for p in peers],
            sent,
        )
        parts = pieces[:r] + [views[r]] + pieces[r:]
        tree_sum(parts, views[r])
        if scale is not None:
            np.multiply(views[r], scale, out=views[r], casting="unsafe")
        sums = await self._exchange(
            bucket,
            [(p, f"{name}|ag|{r}", views[r]) for p in peers],
            [(p, f"{name}|ag|{p}", views[p]) for p in peers],
            sent,
            into=True,
        )
        for p, value in zip(peers, sums):
            if value is not views[p]:
                np.copyto(views[p], value)

    async def _ring(self, bucket: str, flat, scale, sent: list) -> None:
        r, size = self.rank, self.size
        views = [flat[a:b] for a, b in chunk_bounds(len(flat), size)]
        right, left = (r + 1) % size, (r - 1) % size
        for k in range(size - 1):  # reduce-scatter: chunk c is summed g_c + g_c+1 + ... around the ring
            send, recv = (r - k) % size, (r - k - 1) % size
            (partial,) = await self._exchange(
                bucket,
                [(right, f"{bucket}|rs{k}|{r}", views[send])],
                [(left, f"{bucket}|rs{k}|{left}", views[recv])],
                sent,
            )
            np.add(partial, views[recv], out=views[recv])
        mine = (r + 1) % size
        if scale is not None:
            np.multiply(views[mine], scale, out=views[mine], casting="unsafe")
        for k in range(size - 1):  # all-gather: the sums travel on around the ring
            send, recv = (r + 1 - k) % size, (r - k) % size
            (value,) = await self._exchange(
                bucket,
                [(right, f"{bucket}|ag{k}|{r}", views[send])],
                [(left, f"{bucket}|ag{k}|{left}", views[recv])],
                sent,
                into=True,
            )
            if value is not views[recv]:
                np.copyto(views[recv], value)
