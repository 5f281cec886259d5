"""Backup replicas on the all-reduce engine (Chen et al. 2016): ``R + b`` replicas run each step, the
gradients of the first ``R`` to arrive are applied, the ``b`` latest are dropped, and no replica waits
for a late one.

Every member of the run holds a :class:`BackupRank`. Rank 0's worker also runs the **arbiter**, a
coroutine on that worker's event loop that only ever handles a few numbers per rank: it does not
wait for rank 0's own thread, so a rank 0 that is still computing (or made late by
``fit(stragglers=...)``) takes part like any other replica. Per step ``k``, with messages in the
group's mailbox:

1. **who is in**: each rank, once its gradient is ready (its injected delay slept), sends the arbiter
   a header ``[start, ready, rows, out]`` (wall-clock seconds; ``out``: it has no gradient, having
   found the step decided before it began). The arbiter takes the first ``R`` ranks with a gradient,
   in the order they were ready (ties by rank), and sends every rank the decision ``[decided, rows
   used, attempt, used...]``;
2. **reduce-scatter among the used ranks** ``u_0 < ... < u_{R-1}``: chunk ``j`` of every bucket
   belongs to ``u_j``; each used rank sends ``u_j`` its piece ``j`` (its gradient, already multiplied
   by its shard's rows on the way into the bucket), ``u_j`` sums the ``R`` pieces in the fixed
   pairwise order of the ranks (:func:`~workbench.cluster.communicator.tree_sum`: elementwise the
   very sum of whole gradients in that order, so the same bits), scales it by ``1 / rows used`` (the
   mean over the rows used) and sends the summed chunk to every other rank, the dropped ones too;
3. **commit**: a used rank holding all ``R`` summed chunks tells the arbiter so; once every used
   rank has, the arbiter sends the verdict *commit*, and every rank applies the same update (a
   dropped replica catches up on the variables by applying the step it was left out of, so all
   replicas keep the same bits).

A late rank only ever receives: the used ranks wait for each other (all ready by construction) and
the arbiter, never for it. Bytes a step: a used rank receives ``2 (R - 1) / R`` of the model, a
dropped one the model once, the arbiter's worker a few numbers per rank besides (where gathering
every gradient at rank 0 cost it ``R + b - 1`` models).

A used rank that leaves the cluster in the middle of a step (the driver tells the others,
:meth:`BackupRank.peer_gone`) costs no progress: before the commit, the arbiter sends *abort* and
decides the step again (the next attempt) among the ranks still there that have a gradient (each
keeps its own until the verdict); after it, the used ranks still there hand the summed chunks the
departed rank owned to the dropped ones, which may not have had them all. No rank applies a step
before its commit, so all apply the same attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import numpy as np

from workbench.cluster.communicator import chunk_bounds, tree_sum
from workbench.errors import CollectiveError

#: The arbiter stops once no replica handed a step in for this many group timeouts (the fit ended).
IDLE_TIMEOUTS = 1

#: Committed steps whose summed chunks a used rank keeps, for the dropped ranks of a rank that left.
KEEP_STEPS = 4

COMMIT, ABORT, FAILED = 1.0, 0.0, -1.0


def header(start: float, ready: float, rows: int, out: bool) -> np.ndarray:
    """What a rank tells the arbiter first: when its step began and its gradient was ready (wall clock)."""
    return np.asarray([start, ready, float(rows), 1.0 if out else 0.0], dtype=np.float64)


def decision(decided: float, rows: float, attempt: int, used: list[int], size: int) -> np.ndarray:
    """The arbiter's decision: ``[wall-clock time, rows used, attempt, 1 for each rank used...]``."""
    message = np.zeros(3 + size, dtype=np.float64)
    message[:3] = decided, rows, attempt
    message[[3 + r for r in used]] = 1.0
    return message


def first_arrivals(arrived: dict, needed: int) -> list[int]:
    """The ``needed`` ranks of ``arrived`` (rank -> header) ready first (ties by rank), in rank order."""
    return sorted(sorted(arrived, key=lambda r: (float(arrived[r][1]), r))[:needed])


class BackupRank:
    """One rank's side of a backup group (and, on rank 0, the arbiter).

    Parameters
    ----------
    comm : Communicator
        This rank's communicator (its mailbox, event loop and sends).
    needed : int
        ``R``: gradients applied per step.
    step : int
        The last step done (the arbiter starts at the next).
    buckets : int
        How many buckets one gradient is.
    mean : bool
        Whether the loss is a mean over rows (the sum is then scaled by ``1 / rows used``).

    Attributes
    ----------
    bytes_received : int
        Bytes of the messages from peers taken so far (the communicator counts what is sent).
    """

    def __init__(self, comm, needed: int, step: int, buckets: int, mean: bool = True):
        self.comm, self.needed, self.mean, self._buckets = comm, int(needed), bool(mean), int(buckets)
        self.timeout = comm.timeout
        self.bytes_received = 0
        self.gone: set[int] = set()  # ranks that left the cluster (peer_gone)
        self._gone_waiters: list = []
        self._kept: deque = deque(maxlen=KEEP_STEPS)  # (step, attempt, used, chunks): committed, used here
        self.arbiter = None
        if comm.rank == 0:
            self.arbiter = asyncio.run_coroutine_threadsafe(self._arbitrate(step + 1), comm.loop)

    # -- the rank's thread ----------------------------------------------------------------------
    def decided(self, step: int) -> bool:
        """Whether ``step`` was decided already (this rank is out of it): a look at the mailbox from
        this thread (a stale answer only means computing a gradient that is then not used)."""
        return self.comm.mailbox.has(self.comm.group, self._key(step, "decision0"))

    def wait_decided(self, step: int, seconds: float) -> bool:
        """Sleep ``seconds``, or less if ``step`` is decided meanwhile (a straggler's wait); whether it was."""
        return self._on_loop(self._until_decided(step, seconds), seconds + self.timeout)

    def exchange(self, step: int, flats: list, start: float, ready: float, rows: int, out: bool = False) -> list[int]:
        """Hand step ``step``'s gradient (the buckets ``flats``) in (``out``: only say this rank has
        none), wait for the committed decision and write the applied sums into ``flats``; the ranks used."""
        future = asyncio.run_coroutine_threadsafe(self._hand_in(step, flats, start, ready, rows, out), self.comm.loop)
        try:  # a decision, a redo after a used rank left, and the verdicts: each bounded by the timeout
            message, chunks = future.result(4 * self.timeout + 5.0)
        except TimeoutError:
            future.cancel()
            raise CollectiveError(
                f"backup step {step} on {self.comm.describe(self.comm.rank)}: no decision from "
                f"{self.comm.describe(0)} within {4 * self.timeout:g} s (did it die or hang?)"
            ) from None
        for flat, pieces in zip(flats, chunks, strict=True):
            for (a, b), piece in zip(chunk_bounds(len(flat), len(pieces)), pieces, strict=True):
                np.copyto(flat[a:b], piece, casting="unsafe")
        self.decided_wall = float(message[0])
        return _used(message)

    def peer_gone(self, ranks) -> None:
        """Ranks ``ranks`` left the cluster (from any thread): a step that used them is decided again
        if not committed yet, and their summed chunks of committed steps go to the dropped ranks."""
        self.comm.loop.call_soon_threadsafe(self._mark_gone, {int(r) for r in ranks})

    def close(self) -> None:
        if self.arbiter is not None:
            self.arbiter.cancel()

    def _on_loop(self, coroutine, timeout: float):
        future = asyncio.run_coroutine_threadsafe(coroutine, self.comm.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise CollectiveError(f"{self.comm.describe(self.comm.rank)}: its event loop did not answer") from None

    # -- on the event loop: messages --------------------------------------------------------------
    def _key(self, step: int, what: str, rank: int | None = None) -> str:
        return f"backup{step}|{what}" if rank is None else f"backup{step}|{what}|{rank}"

    async def _send(self, peer: int, key: str, value) -> None:
        if peer == self.comm.rank:
            self.comm.mailbox.put(self.comm.group, key, value)
        else:
            await self.comm.send(peer, key, value)

    def _post(self, peer: int, key: str, value) -> None:
        """Send without waiting (a rank that left meanwhile is no error of this step's)."""
        if peer not in self.gone:
            asyncio.ensure_future(self._send(peer, key, value)).add_done_callback(_discard)

    async def _take(self, key: str, peer: int, timeout: float | None = None):
        value = await self.comm.mailbox.take(self.comm.group, key, self.timeout if timeout is None else timeout)
        if peer != self.comm.rank:
            self.bytes_received += int(getattr(value, "nbytes", 0))
        return value

    async def _decided(self, step: int) -> bool:
        return self.comm.mailbox.has(self.comm.group, self._key(step, "decision0"))

    async def _until_decided(self, step: int, seconds: float, poll: float = 0.005) -> bool:
        end = time.monotonic() + seconds
        while not await self._decided(step):
            left = end - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(poll, left))
        return True

    def _mark_gone(self, ranks: set) -> None:
        fresh = ranks - self.gone
        self.gone |= ranks
        waiters, self._gone_waiters = self._gone_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        for step, attempt, used, chunks in self._kept:  # the chunks the departed owned, to the dropped ranks
            for j, owner in enumerate(used):
                if owner not in fresh:
                    continue
                for peer in range(self.comm.size):
                    if peer not in used and peer != self.comm.rank:
                        for b, pieces in enumerate(chunks):
                            self._post(peer, self._key(step, f"s{attempt}.{b}.{j}"), pieces[j])

    def _forget(self, waiter) -> None:
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._gone_waiters.remove(waiter)

    def _gone_changed(self) -> asyncio.Future:
        waiter = asyncio.get_running_loop().create_future()
        self._gone_waiters.append(waiter)
        return waiter

    # -- on the event loop: a rank's step ---------------------------------------------------------
    async def _hand_in(self, step: int, flats: list, start: float, ready: float, rows: int, out: bool):
        rank = self.comm.rank
        await self._send(0, self._key(step, "header", rank), header(start, ready, rows, out))
        attempt = 0
        while True:
            try:
                message = await self._take(self._key(step, f"decision{attempt}"), 0)
            except TimeoutError:
                raise CollectiveError(
                    f"backup step {step} on {self.comm.describe(rank)}: no decision from {self.comm.describe(0)} "
                    f"for {self.timeout:g} s (did it die or hang?)"
                ) from None
            used = _used(message)
            reducing = None
            if rank in used:
                reducing = asyncio.ensure_future(self._reduce(step, attempt, used, flats, float(message[1])))
                reducing.add_done_callback(_discard)  # it fails where a used rank left: the verdict says so
            try:
                verdict = await self._take(self._key(step, f"verdict{attempt}"), 0, 2 * self.timeout)
            except TimeoutError:
                raise CollectiveError(
                    f"backup step {step} on {self.comm.describe(rank)}: no verdict from {self.comm.describe(0)} "
                    f"for {2 * self.timeout:g} s (did it die or hang?)"
                ) from None
            finally:
                if reducing is not None and not reducing.done():
                    reducing.cancel()
            if verdict[0] == COMMIT:
                if reducing is not None:
                    chunks = reducing.result()  # done: the arbiter commits once every used rank has all
                    self._kept.append((step, attempt, used, chunks))
                else:
                    chunks = await self._collect(step, attempt, used)
                return message, chunks
            if verdict[0] == FAILED:
                raise CollectiveError(
                    f"backup step {step}: fewer than {self.needed} ranks with a gradient are left "
                    f"(ranks {sorted(self.gone)} left the cluster)"
                )
            attempt += 1  # a used rank left before the commit: decided again

    async def _reduce(self, step: int, attempt: int, used: list[int], flats: list, rows: float) -> list:
        """This used rank's part of the reduce-scatter and all-gather; every bucket's summed chunks,
        then the ack to the arbiter."""
        rank, size = self.comm.rank, len(used)
        mine = used.index(rank)
        views = [[flat[a:e] for a, e in chunk_bounds(len(flat), size)] for flat in flats]
        sends = [
            asyncio.ensure_future(self._send(owner, self._key(step, f"p{attempt}.{b}.{j}", rank), views[b][j]))
            for b in range(len(flats))
            for j, owner in enumerate(used)
            if owner != rank
        ]
        try:
            chunks: list = [[None] * size for _ in flats]
            for b in range(len(flats)):
                pieces = [
                    views[b][mine]
                    if r == rank
                    else await self._piece(step, self._key(step, f"p{attempt}.{b}.{mine}", r), r)
                    for r in used
                ]
                total = tree_sum(pieces) if size > 1 else np.array(pieces[0], copy=True)  # a new array
                if self.mean:
                    np.multiply(total, 1.0 / rows, out=total, casting="unsafe")
                chunks[b][mine] = total
                for peer in range(self.comm.size):
                    if peer != rank:
                        self._post(peer, self._key(step, f"s{attempt}.{b}.{mine}"), total)
            await asyncio.gather(*sends)
            for b in range(len(flats)):
                for j, owner in enumerate(used):
                    if owner != rank:
                        chunks[b][j] = await self._piece(step, self._key(step, f"s{attempt}.{b}.{j}"), owner)
        finally:
            for task in sends:
                if not task.done():
                    task.cancel()
                task.add_done_callback(_discard)
        await self._send(0, self._key(step, f"ack{attempt}", rank), np.ones(1))
        return chunks

    async def _collect(self, step: int, attempt: int, used: list[int]) -> list:
        """A dropped rank's copy of the committed sums: each chunk from its owner (or, where the owner
        left, from a used rank still there)."""
        return [
            [await self._piece(step, self._key(step, f"s{attempt}.{b}.{j}"), owner) for j, owner in enumerate(used)]
            for b in range(self._buckets)
        ]

    async def _piece(self, step: int, key: str, peer: int):
        try:
            return await self._take(key, peer)
        except TimeoutError:
            raise CollectiveError(
                f"backup step {step} on {self.comm.describe(self.comm.rank)}: nothing from "
                f"{self.comm.describe(peer)} for {self.timeout:g} s (did it die or hang?)"
            ) from None

    # -- on the event loop: the arbiter -----------------------------------------------------------
    async def _arbitrate(self, step: int) -> None:
        """Decide step after step until no rank hands one in within the idle bound, or the group closes."""
        with contextlib.suppress(asyncio.CancelledError, TimeoutError, CollectiveError):
            while not self.comm.closed:
                await self._decide(step)
                step += 1

    async def _header(self, step: int, rank: int):
        return rank, await self._take(self._key(step, "header", rank), rank, self.timeout * IDLE_TIMEOUTS)

    async def _decide(self, step: int) -> None:
        """The first ``R`` ranks with a gradient; then the step's commit goes on while the next is decided."""
        pending = {asyncio.ensure_future(self._header(step, r)) for r in range(self.comm.size)}
        arrived: dict[int, np.ndarray] = {}
        try:
            pending = await self._arrivals(pending, arrived)
        except asyncio.CancelledError:  # the group closed
            for task in pending:
                task.cancel()
            raise
        if len(arrived) < self.needed:
            raise CollectiveError(f"backup step {step}: only {len(arrived)} of {self.needed} gradients came")
        asyncio.ensure_future(self._settle(step, arrived, pending)).add_done_callback(_discard)

    async def _arrivals(self, pending: set, arrived: dict) -> set:
        """Take headers until ``R`` ranks still there have a gradient (or none is left to come); the rest."""
        while True:
            for task in [t for t in pending if t.done()]:
                pending.discard(task)
                if task.exception() is None:
                    rank, head = task.result()
                    if not head[3]:
                        arrived[rank] = head
            for rank in self.gone & set(arrived):
                del arrived[rank]
            if len(arrived) >= self.needed or not pending:
                return pending
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)

    async def _settle(self, step: int, arrived: dict, pending: set) -> None:
        """Decide ``step`` (again, while a used rank leaves before the commit) and send the verdicts."""
        size, attempt = self.comm.size, 0
        try:
            while True:
                used = first_arrivals(arrived, self.needed)
                rows = sum(float(arrived[r][2]) for r in used)
                message = decision(time.time(), rows, attempt, used, size)
                for peer in range(size):
                    self._post(peer, self._key(step, f"decision{attempt}"), message)
                try:
                    acknowledged = await self._acknowledged(step, attempt, used)
                except TimeoutError:  # a used rank that neither acknowledges nor leaves: the step fails
                    acknowledged, arrived = False, {}
                if acknowledged:
                    verdict = COMMIT
                else:  # a used rank left before every used rank had the sums
                    pending = await self._arrivals(pending, arrived) if arrived else pending
                    verdict = ABORT if len(arrived) >= self.needed else FAILED
                for peer in range(size):
                    self._post(peer, self._key(step, f"verdict{attempt}"), np.asarray([verdict]))
                if verdict != ABORT:
                    return
                attempt += 1
        finally:
            for task in pending:  # the late ones' headers: taken when they come, and dropped
                task.add_done_callback(_discard)

    async def _acknowledged(self, step: int, attempt: int, used: list[int]) -> bool:
        """Whether every used rank acknowledged having the sums (False: one of them left first)."""
        waiting = {asyncio.ensure_future(self._take(self._key(step, f"ack{attempt}", r), r)) for r in used}
        try:
            while waiting:
                if self.gone & set(used):
                    return False
                changed = self._gone_changed()
                try:
                    done, waiting = await asyncio.wait(waiting | {changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    self._forget(changed)
                waiting.discard(changed)
                for task in done - {changed}:
                    task.result()  # a TimeoutError: a used rank neither acknowledged nor left
            return True
        finally:
            for task in waiting:
                task.cancel()


def _used(message) -> list[int]:
    return [r for r, used in enumerate(message[3:]) if used]


def _discard(task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late rank that never came is no error of the step's
