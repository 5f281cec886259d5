"""Backup replicas on the all-reduce engine (Chen et al. 2016): ``R + b`` replicas run each step, the
gradients of the first ``R`` to arrive are applied, the ``b`` latest are dropped, and no replica waits
for a late one.

Every member of the run holds a :class:`BackupRank`. Rank 0's worker also runs the **arbiter**, a
coroutine on that worker's event loop: it does not wait for rank 0's own thread, so a rank 0 that is
still computing (or made late by ``fit(stragglers=...)``) decides without itself, exactly like any
other late replica. Per step ``k``, with messages in the group's mailbox:

1. each rank, once its gradient is ready (its injected delay slept), sends rank 0 a header
   ``[start, ready, rows, out]`` (wall-clock seconds) and, unless the step was already decided
   without it (``out``: it answers for itself that it is out of this step), its gradient buckets,
   each multiplied by its shard's rows on the way in (for a mean loss);
2. the arbiter takes the first ``R`` complete gradients in arrival order, sums each bucket over them
   in the fixed pairwise order of their ranks (:func:`~workbench.cluster.communicator.tree_sum`, as
   the all-reduce does), scales the sum by ``1 / rows used`` (the mean over the rows used) and sends
   every rank, the dropped ones included, the decision ``[decided, used...]`` and the sums;
3. every rank applies that same update: a dropped replica catches up on the variables by applying
   the step it was left out of, so all replicas keep the same bits.

Rank 0 gathers and sends ``R + b - 1`` gradients a step (the parameter server's traffic, on a
worker): the price of deciding on one clock, which is what makes the step independent of the
slowest replica. A dropped replica's late gradient is taken from the mailbox and discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np

from workbench.cluster.communicator import tree_sum
from workbench.errors import CollectiveError

#: The arbiter stops once no replica handed a step in for this many group timeouts (the fit ended).
IDLE_TIMEOUTS = 1


def header(start: float, ready: float, rows: int, out: bool) -> np.ndarray:
    """What a rank tells the arbiter first: when its step began and its gradient was ready (wall clock)."""
    return np.asarray([start, ready, float(rows), 1.0 if out else 0.0], dtype=np.float64)


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
    """

    def __init__(self, comm, needed: int, step: int, buckets: int, mean: bool = True):
        self.comm, self.needed, self.mean, self._buckets = comm, int(needed), bool(mean), int(buckets)
        self.timeout = comm.timeout
        self.arbiter = None
        if comm.rank == 0:
            self.arbiter = asyncio.run_coroutine_threadsafe(self._arbitrate(step + 1), comm.loop)

    # -- the rank's thread ----------------------------------------------------------------------
    def decided(self, step: int) -> bool:
        """Whether ``step`` was decided already (this rank is out of it): a look at the mailbox from
        this thread (a stale answer only means computing a gradient that is then not used)."""
        return self.comm.mailbox.has(self.comm.group, self._key(step, "decision"))

    def wait_decided(self, step: int, seconds: float) -> bool:
        """Sleep ``seconds``, or less if ``step`` is decided meanwhile (a straggler's wait); whether it was."""
        return self._on_loop(self._until_decided(step, seconds), seconds + self.timeout)

    def exchange(self, step: int, flats: list, start: float, ready: float, rows: int, out: bool = False) -> list[int]:
        """Hand step ``step``'s gradient (the buckets ``flats``) in (``out``: only say it is out of the
        step), wait for the decision and write the applied sums into ``flats``; the ranks used."""
        future = asyncio.run_coroutine_threadsafe(self._hand_in(step, flats, start, ready, rows, out), self.comm.loop)
        try:
            decision, sums = future.result(self.timeout + 5.0)
        except TimeoutError:
            future.cancel()
            raise CollectiveError(
                f"backup step {step} on {self.comm.describe(self.comm.rank)}: no decision from "
                f"{self.comm.describe(0)} within {self.timeout:g} s (did it die or hang?)"
            ) from None
        for flat, total in zip(flats, sums, strict=True):
            np.copyto(flat, total, casting="unsafe")
        self.decided_wall = float(decision[0])
        return [r for r, used in enumerate(decision[1:]) if used]

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

    # -- on the event loop ----------------------------------------------------------------------
    def _key(self, step: int, what: str, rank: int | None = None) -> str:
        return f"backup{step}|{what}" if rank is None else f"backup{step}|{what}|{rank}"

    async def _send(self, peer: int, key: str, value) -> None:
        if peer == self.comm.rank:
            self.comm.mailbox.put(self.comm.group, key, value)
        else:
            await self.comm.send(peer, key, value)

    async def _take(self, key: str, timeout: float | None = None):
        return await self.comm.mailbox.take(self.comm.group, key, self.timeout if timeout is None else timeout)

    async def _decided(self, step: int) -> bool:
        return self.comm.mailbox.has(self.comm.group, self._key(step, "decision"))

    async def _until_decided(self, step: int, seconds: float, poll: float = 0.005) -> bool:
        end = time.monotonic() + seconds
        while not await self._decided(step):
            left = end - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(poll, left))
        return True

    async def _hand_in(self, step: int, flats: list, start: float, ready: float, rows: int, out: bool):
        rank = self.comm.rank
        out = out or await self._decided(step)
        sends = [self._send(0, self._key(step, "header", rank), header(start, ready, rows, out))]
        if not out:
            sends += [self._send(0, self._key(step, f"g{b}", rank), flat) for b, flat in enumerate(flats)]
        await asyncio.gather(*sends)
        try:
            decision = await self._take(self._key(step, "decision"))
            sums = [await self._take(self._key(step, f"s{b}")) for b in range(len(flats))]
        except TimeoutError:
            raise CollectiveError(
                f"backup step {step} on {self.comm.describe(rank)}: no decision from {self.comm.describe(0)} "
                f"for {self.timeout:g} s (did it die or hang?)"
            ) from None
        return decision, sums

    async def _arrival(self, step: int, rank: int, buckets: int, timeout: float):
        """Rank ``rank``'s gradient of ``step`` (its header and buckets), or None if it is out."""
        head = await self._take(self._key(step, "header", rank), timeout)
        if head[3]:
            return None
        grads = [await self._take(self._key(step, f"g{b}", rank)) for b in range(buckets)]
        return head, grads

    async def _arbitrate(self, step: int) -> None:
        """Decide step after step until no rank hands one in within the idle bound, or the group closes."""
        with contextlib.suppress(asyncio.CancelledError, TimeoutError, CollectiveError):
            while not self.comm.closed:
                await self._decide(step)
                step += 1

    async def _decide(self, step: int) -> None:
        size, buckets = self.comm.size, self._buckets
        waiting = {
            asyncio.ensure_future(self._arrival(step, r, buckets, self.timeout * IDLE_TIMEOUTS)): r for r in range(size)
        }
        arrived: dict[int, tuple] = {}
        pending = set(waiting)
        while len(arrived) < self.needed and pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is None and task.result() is not None:
                    arrived.setdefault(waiting[task], task.result())
        for task in pending:  # the late ones: their gradients are taken when they come, and dropped
            task.add_done_callback(_discard)
        if len(arrived) < self.needed:
            raise CollectiveError(f"backup step {step}: only {len(arrived)} of {self.needed} gradients came")
        # several in one turn of the loop: the earliest ready first (ties by rank)
        used = sorted(sorted(arrived, key=lambda r: (float(arrived[r][0][1]), r))[: self.needed])
        rows = sum(float(arrived[r][0][2]) for r in used)
        sums = []
        for b in range(buckets):
            total = tree_sum([arrived[r][1][b] for r in used])
            if self.mean:
                np.multiply(total, 1.0 / rows, out=total, casting="unsafe")
            sums.append(total)
        mask = np.zeros(size + 1, dtype=np.float64)
        mask[0] = time.time()
        mask[[1 + r for r in used]] = 1.0
        sends = [self._send(p, self._key(step, "decision"), mask) for p in range(size)]
        sends += [self._send(p, self._key(step, f"s{b}"), sums[b]) for p in range(size) for b in range(buckets)]
        # sent while the next step is decided; a rank that died meanwhile is that step's business
        for task in map(asyncio.ensure_future, sends):
            task.add_done_callback(_discard)


def _discard(task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late rank that never came is no error of the step's
