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
   pairwise order of the ranks (:func:`~workbench.cluster.collective.communicator.tree_sum`: elementwise the
   very sum of whole gradients in that order, so the same bits), scales it by ``1 / rows used`` (the
   mean over the rows used) and sends the summed chunk to every other rank, the dropped ones too;
3. every rank holding all ``R`` summed chunks applies them: the same update everywhere (a dropped
   replica catches up on the variables by applying the step it was left out of, so all replicas
   keep the same bits).

A late rank only ever receives: the used ranks wait for each other (all ready by construction) and
the arbiter, never for it. Bytes a step: a used rank receives ``2 (R - 1) / R`` of the model, a
dropped one the model once, the arbiter's worker a few numbers per rank besides (where gathering
every gradient at rank 0 cost it ``R + b - 1`` models). Four message hops a step: header,
decision, pieces, sums.

**A used rank that leaves the cluster** in the middle of a step costs no progress. The driver tells
the ranks still there (:meth:`BackupRank.peer_gone`); from then on none of them applies a step that
used the departed rank without the arbiter's verdict, and each tells the arbiter the last step it
applied. For each step that used it, the arbiter sends the verdict: *commit* where some rank still
there applied it (that rank hands the departed rank's summed chunks on to the others, which may not
have had them all), else *abort*, and the step is decided again (the next attempt) among the ranks
still there that have a gradient (each keeps its own until it applies the step); where too few of
them have one, the ranks that were out of the step are asked for theirs (*wanted*: each computes
its gradient of the step, not applied yet there, and hands it in for the next attempt). All ranks apply
the same attempt of every step. The price: each rank keeps the sums of its last
:data:`KEEP_STEPS` steps (to hand them on). A rank that stops answering without leaving (a stopped
process) after it was chosen holds the step until the driver sees its heartbeats stopped (a few
seconds without progress, :func:`~workbench.cluster.health.silence_threshold`): the driver then tells
the others as if it had left, and leaves it out of the fit. A stopped rank 0, a rank that does not
report, or too few ranks still there fail the step (the driver restarts from its host copy).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from workbench.cluster.collective.communicator import chunk_bounds, tree_sum
from workbench.errors import CollectiveError

#: The arbiter stops once no replica handed a step in for this many group timeouts (the fit ended).
IDLE_TIMEOUTS = 1

#: Steps applied whose summed chunks a rank keeps, to hand on those of a rank that left (a rank
#: misses a chunk only where its owner died while sending it: one of the last steps).
KEEP_STEPS = 2

#: Steps decided that the arbiter remembers (for the verdicts after a rank left): a late rank may lag
#: the others by the backup engine's report lag at most.
DECISIONS_KEPT = 128

COMMIT, ABORT, FAILED, WANTED = 1.0, 0.0, -1.0, 2.0  # WANTED: an out rank's gradient is asked for


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
        self.rejoin = 0  # the attempt an out rank whose gradient is wanted hands it in for
        self.gone: set[int] = set()  # ranks that left the cluster (peer_gone)
        self._gone_waiters: list = []
        self._kept: deque = deque(maxlen=KEEP_STEPS)  # (step, attempt, used, chunks) applied here
        self._done = step  # the last step applied here
        self._decisions: dict[int, Decided] = {}  # the arbiter's
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

    def exchange(
        self, step: int, flats: list, start: float, ready: float, rows: int, out: bool = False, attempt: int = 0
    ) -> list[int] | None:
        """Hand step ``step``'s gradient (the buckets ``flats``) in (``out``: only say this rank has
        none), wait for the decision and the sums, and write them into ``flats``; the ranks used.

        None where this rank was out and its gradient is wanted after all (a used rank left and too
        few others have one): the caller computes it and hands it in with ``attempt=self.rejoin``."""
        future = asyncio.run_coroutine_threadsafe(
            self._hand_in(step, flats, start, ready, rows, out, attempt), self.comm.loop
        )
        try:  # a decision, a redo after a used rank left, and the verdicts: each bounded by the timeout
            message, chunks = future.result(4 * self.timeout + 5.0)
        except TimeoutError:
            future.cancel()
            raise CollectiveError(
                f"backup step {step} on {self.comm.describe(self.comm.rank)}: no decision from "
                f"{self.comm.describe(0)} within {4 * self.timeout:g} s (did it die or hang?)"
            ) from None
        if message is None:  # wanted: ``chunks`` is the attempt to hand the gradient in for
            self.rejoin = chunks
            return None
        for flat, pieces in zip(flats, chunks, strict=True):
            for (a, b), piece in zip(chunk_bounds(len(flat), len(pieces)), pieces, strict=True):
                np.copyto(flat[a:b], piece, casting="unsafe")
        self.decided_wall = float(message[0])
        return _used(message)

    def peer_gone(self, ranks) -> None:
        """Ranks ``ranks`` left the cluster (from any thread): the steps that used them wait for the
        arbiter's verdicts (see the module's docstring)."""
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
        """Ranks ``ranks`` left: wake the waits, tell the arbiter the last step applied here (from now on
        a step that used them waits for its verdict), and stand by to hand their chunks on."""
        fresh = ranks - self.gone
        if not fresh:
            return
        self.gone |= fresh
        waiters, self._gone_waiters = self._gone_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        oldest = self._kept[0][0] if self._kept else self._done + 1
        for d in sorted(fresh):
            self._post(0, self._key(0, f"gone{d}.report", self.comm.rank), np.asarray([self._done, oldest], float))
            asyncio.ensure_future(self._hand_on(d)).add_done_callback(_discard)
        if self.arbiter is not None:
            asyncio.ensure_future(self._recover(fresh)).add_done_callback(_discard)

    async def _hand_on(self, departed: int) -> None:
        """The arbiter names the steps (and attempts) this rank hands the departed rank's chunks on for."""
        asked = await self._take(self._key(0, f"gone{departed}.relay"), 0, 2 * self.timeout)
        wanted = {(int(k), int(a)) for k, a in np.asarray(asked).reshape(-1, 2)}
        for step, attempt, used, chunks in self._kept:
            if (step, attempt) not in wanted or departed not in used:
                continue
            j = used.index(departed)
            for peer in range(self.comm.size):
                if peer != self.comm.rank:
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
    async def _hand_in(self, step: int, flats: list, start: float, ready: float, rows: int, out: bool, attempt=0):
        rank = self.comm.rank
        await self._send(0, self._key(step, _header_key(attempt), rank), header(start, ready, rows, out))
        while True:
            message = await self._awaited(step, self._key(step, f"decision{attempt}"), "no decision")
            used = _used(message)
            if rank in used:
                work = asyncio.ensure_future(self._reduce(step, attempt, used, flats, float(message[1])))
            else:
                work = asyncio.ensure_future(self._collect(step, attempt, used))
            work.add_done_callback(_discard)  # it fails where a used rank left: the verdict says so
            verdict = await self._finish(step, attempt, used, work)
            if verdict == COMMIT:
                chunks = await work  # the departed rank's chunks handed on, where it had not sent them
                self._applied(step, attempt, used, chunks)
                return message, chunks
            work.cancel()
            if verdict == WANTED:
                return None, attempt + 1
            if verdict == FAILED:
                raise CollectiveError(
                    f"backup step {step}: ranks {sorted(self.gone)} left the cluster, and fewer than {self.needed} "
                    "ranks with a gradient are left (or one of them did not say whether it applied the step)"
                )
            attempt += 1  # a used rank left before any rank still there applied the step

    async def _finish(self, step: int, attempt: int, used: list[int], work) -> float:
        """COMMIT once ``work`` has every summed chunk and no used rank is known to have left; else the
        arbiter's verdict (after a used rank left, see the module's docstring)."""
        while not self.gone & set(used):
            changed = self._gone_changed()
            try:
                await asyncio.wait({work, changed}, return_when=asyncio.FIRST_COMPLETED)
                if work.done() and work.exception() is not None and not self.gone & set(used):
                    # a send to a rank that just died fails at once: the driver says who left soon
                    await asyncio.wait({changed}, timeout=self.timeout)
            finally:
                self._forget(changed)
            if work.done() and not self.gone & set(used):
                work.result()  # its error, if nobody left after all
                return COMMIT  # and applied now: no await between this look at ``gone`` and _applied
        verdict = await self._awaited(step, self._key(step, f"verdict{attempt}"), "no verdict", 2 * self.timeout)
        return float(verdict[0])

    def _applied(self, step: int, attempt: int, used: list[int], chunks: list) -> None:
        self._done = step
        self._kept.append((step, attempt, used, chunks))

    async def _awaited(self, step: int, key: str, what: str, timeout: float | None = None):
        try:
            return await self._take(key, 0, timeout)
        except TimeoutError:
            raise CollectiveError(
                f"backup step {step} on {self.comm.describe(self.comm.rank)}: {what} from "
                f"{self.comm.describe(0)} for {timeout or self.timeout:g} s (did it die or hang?)"
            ) from None

    async def _reduce(self, step: int, attempt: int, used: list[int], flats: list, rows: float) -> list:
        """This used rank's part of the reduce-scatter and all-gather: every bucket's summed chunks."""
        rank, size = self.comm.rank, len(used)
        mine = used.index(rank)
        views = [[flat[a:e] for a, e in chunk_bounds(len(flat), size)] for flat in flats]
        for b in range(len(flats)):  # read by the owners before they send the sums this rank waits for
            for j, owner in enumerate(used):
                if owner != rank:
                    self._post(owner, self._key(step, f"p{attempt}.{b}.{j}", rank), views[b][j])
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
        for b in range(len(flats)):
            for j, owner in enumerate(used):
                if owner != rank:
                    chunks[b][j] = await self._piece(step, self._key(step, f"s{attempt}.{b}.{j}"), owner)
        return chunks

    async def _collect(self, step: int, attempt: int, used: list[int]) -> list:
        """A dropped rank's copy of the sums: each chunk from its owner (or, where the owner
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

    async def _header(self, step: int, rank: int, attempt: int = 0):
        key = self._key(step, _header_key(attempt), rank)
        return rank, await self._take(key, rank, self.timeout * IDLE_TIMEOUTS)

    async def _decide(self, step: int) -> None:
        """The first ``R`` ranks with a gradient; the late ones' headers are kept (for a decision again)."""
        pending = {asyncio.ensure_future(self._header(step, r)) for r in range(self.comm.size)}
        for task in pending:
            task.add_done_callback(_discard)
        arrived: dict[int, np.ndarray] = {}
        out: set[int] = set()
        try:
            pending = await self._arrivals(pending, arrived, out)
        except asyncio.CancelledError:  # the group closed
            for task in pending:
                task.cancel()
            raise
        if len(arrived) < self.needed:
            raise CollectiveError(f"backup step {step}: only {len(arrived)} of {self.needed} gradients came")
        self._decisions[step] = entry = Decided(0, first_arrivals(arrived, self.needed), arrived, pending, out)
        for old in [k for k in self._decisions if k <= step - DECISIONS_KEPT]:
            del self._decisions[old]
        self._announce(step, entry)

    def _announce(self, step: int, entry: Decided) -> None:
        rows = sum(float(entry.arrived[r][2]) for r in entry.used)
        message = decision(time.time(), rows, entry.attempt, entry.used, self.comm.size)
        for peer in range(self.comm.size):
            self._post(peer, self._key(step, f"decision{entry.attempt}"), message)

    async def _arrivals(self, pending: set, arrived: dict, out: set) -> set:
        """Take headers until ``R`` ranks still there have a gradient (or none is left to come); the
        rest. ``out`` gets the ranks that said they have none."""
        while True:
            for task in [t for t in pending if t.done()]:
                pending.discard(task)
                if not task.cancelled() and task.exception() is None:
                    rank, head = task.result()
                    if not head[3]:
                        arrived[rank] = head
                        out.discard(rank)
                    else:
                        out.add(rank)
            for rank in self.gone & set(arrived):
                del arrived[rank]
            if len(arrived) >= self.needed or not pending:
                return pending
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)

    async def _recover(self, departed: set) -> None:
        """The verdicts on the steps that used the ranks ``departed`` (see the module's docstring)."""
        for d in sorted(departed):
            there = [r for r in range(self.comm.size) if r not in self.gone]
            reports = {}
            for r in there:  # each rank's last step applied, and the oldest whose sums it keeps
                with contextlib.suppress(TimeoutError):
                    reports[r] = await self._take(self._key(0, f"gone{d}.report", r), r)
            relays: dict[int, list] = {r: [] for r in there}
            for step, entry in sorted(self._decisions.items()):
                if d not in entry.used:
                    continue
                behind = [r for r in there if r not in reports or reports[r][0] < step]
                holders = [r for r in there if r in reports and reports[r][0] >= step]
                if len(reports) < len(there):  # a rank that did not say whether it applied the step
                    for r in behind:
                        self._post(r, self._key(step, f"verdict{entry.attempt}"), np.asarray([FAILED]))
                elif holders:
                    keepers = [r for r in holders if reports[r][1] <= step]
                    if keepers:
                        relays[keepers[0]] += [step, entry.attempt]
                    for r in behind:
                        self._post(r, self._key(step, f"verdict{entry.attempt}"), np.asarray([COMMIT]))
                elif behind:
                    asyncio.ensure_future(self._again(step, entry, behind)).add_done_callback(_discard)
            for r in there:
                self._post(r, self._key(0, f"gone{d}.relay"), np.asarray(relays[r], dtype=np.float64))

    async def _again(self, step: int, entry: Decided, behind: list[int]) -> None:
        """No rank still there applied ``step``: abort this attempt and decide the next one."""
        attempt = entry.attempt
        entry.pending = await self._arrivals(entry.pending, entry.arrived, entry.out)
        wanted = sorted(r for r in entry.out if r in behind and r not in self.gone)
        if len(entry.arrived) < self.needed and len(entry.arrived) + len(wanted) >= self.needed:
            # too few gradients without the ranks that were out of the step: they compute theirs
            for r in wanted:
                self._post(r, self._key(step, f"verdict{attempt}"), np.asarray([WANTED]))
                task = asyncio.ensure_future(self._header(step, r, attempt + 1))
                task.add_done_callback(_discard)
                entry.pending.add(task)
            behind = [r for r in behind if r not in wanted]
            entry.pending = await self._arrivals(entry.pending, entry.arrived, entry.out)
        enough = len(entry.arrived) >= self.needed
        if enough:
            entry.attempt, entry.used = attempt + 1, first_arrivals(entry.arrived, self.needed)
            self._announce(step, entry)
        for r in behind:
            self._post(r, self._key(step, f"verdict{attempt}"), np.asarray([ABORT if enough else FAILED]))


@dataclass
class Decided:
    """A step the arbiter decided: its attempt, the ranks used, the headers that came and those to come."""

    attempt: int
    used: list
    arrived: dict
    pending: set
    out: set  # the ranks that said they have no gradient (the step was decided before they began)


def _header_key(attempt: int) -> str:
    """A rank's header of the step's first attempt, or the one it hands in when its gradient is wanted."""
    return "header" if attempt == 0 else f"header{attempt}"


def _used(message) -> list[int]:
    return [r for r, used in enumerate(message[3:]) if used]


def _discard(task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a late rank that never came is no error of the step's
