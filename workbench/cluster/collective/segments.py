"""Steps off the scheduler's per-step path: each member runs a segment of steps in one task.

A step of the all-reduce family used to be ``R`` tasks: each one submitted by the client, assigned
by the scheduler, reported back and its result fetched, on the cores the replicas train on. Here the
driver groups the steps the coordinator submits into segments (up to ``segment_steps`` of them, a
segment always ending at a sync step); each member runs its steps of a segment in one task
(:func:`~workbench.cluster.collective.replica.run_segment`), all-reducing with its peers step after
step as before. Each step's result is published on the scheduler's event topic of the generation as
soon as the step is done (``Worker.log_event``; the client hears of it through
``Client.subscribe_topic``), so the fit records, streams and checks progress step by step; the last
step of a segment is the task's result (a sync step's variables come home as a task result, never
through the scheduler's event log).

The driver's coordinated loop does not change: a step's entry in flight holds a :class:`StepSlot` per
member, which reads like the member's task future (``status``, ``result``, ``exception``,
``add_done_callback``, ``key``): finished when its result arrived, failed or cancelled with its
segment's task (a failed step fails its segment's task, and the steps after it with it). The steps of a
segment are submitted as one task per member with ``priority=-first step``, so each worker runs its
segments in order; the next segment is submitted while the one before runs (the coordinator's window
holds two segments), so a worker goes from one to the next without waiting for the client.

The published results of a generation are let go from the scheduler's event log as they are read
(truncated at each sync and when the generation ends): the log stays bounded by a sync period.
"""

from __future__ import annotations

import concurrent.futures
import pickle
import threading

from workbench.cluster.collective.replica import run_segment
from workbench.cluster.lower import allreduce_key, task_key


def segment_key(name: str, first: int, last: int, rank: int, token: str) -> tuple[str, str, str]:
    """The key of rank ``rank``'s task of steps ``first..last`` (one step: the step task's key).

    >>> segment_key("mlp", 17, 32, 1, "9f2c41d7")
    ('mlp-allreduce', '17-to32-r1', '9f2c41d7')
    >>> segment_key("mlp", 5, 5, 0, "9f2c41d7")
    ('mlp-allreduce', '5-r0', '9f2c41d7')
    """
    if first == last:
        return allreduce_key(name, first, rank, token)
    return task_key(name, "allreduce", first, f"to{last}", f"r{rank}", token=token)


class StepSlot:
    """One member's result of one step of a segment, read like that member's task future of the step."""

    __slots__ = ("step", "rank", "segment", "final", "_payload", "_arrived", "_callbacks")

    def __init__(self, step: int, rank: int):
        self.step, self.rank = step, rank
        self.segment = None  # the segment's task future, once submitted
        self.final = False  # the segment's last step: its result is the task's
        self._payload = None
        self._arrived = threading.Event()
        self._callbacks: list = []

    @property
    def key(self):
        return self.segment.key if self.segment is not None else ("unsubmitted", f"{self.step}-r{self.rank}", "")

    @property
    def status(self) -> str:
        if self.segment is None:
            return "pending"
        if self._arrived.is_set():
            return "finished"
        status = self.segment.status
        return status if self.final or status in ("error", "cancelled", "lost") else "pending"

    def exception(self):
        status = self.segment.status if self.segment is not None else "pending"
        if status == "cancelled":
            raise concurrent.futures.CancelledError(f"step {self.step}: its segment's task was cancelled")
        return self.segment.exception() if status in ("error", "lost") else None

    def result(self, timeout: float | None = None):
        if self.final:
            return self.segment.result(timeout=timeout)
        if not self._arrived.wait(timeout):
            if self.segment is not None and self.segment.status in ("error", "lost"):
                raise self.segment.exception()
            raise TimeoutError(f"step {self.step}: no result from rank {self.rank} within {timeout} s")
        payload = self._payload
        return pickle.loads(payload) if isinstance(payload, bytes) else payload

    def add_done_callback(self, callback) -> None:
        """``callback(self)`` once its result came or its segment's task ended (at once if so already).
        The segment's future is not asked for a callback per slot: :class:`Segments` registers one per
        task (each registration wakes the client's event loop)."""
        if self._arrived.is_set():
            callback(self)
            return
        self._callbacks.append(callback)
        if self._segment_over():  # it ended already (or meanwhile: the segment's callback may have run)
            callback(self)

    def _segment_over(self) -> bool:
        return self.segment is not None and self.segment.status in ("finished", "error", "cancelled", "lost")

    def arrived(self, payload: bytes) -> None:
        """Its result came (on the client's event loop): unpickled when read, in the driver's thread."""
        self._payload = payload
        self._arrived.set()
        self._called()

    def segment_ended(self) -> None:
        """Its segment's task ended (on the client's event loop): the last step's result is in, or the
        steps that had not come failed with it."""
        if self.final:
            self._arrived.set()
        self._called()

    def _called(self) -> None:
        for callback in list(self._callbacks):  # kept: the event may come after the task's end, or before
            callback(self)

    def submitted(self, segment, final: bool) -> None:
        self.segment, self.final = segment, final


class Segments:
    """The driver's side of one generation's segments: the steps not submitted yet, each step's slots,
    the segment tasks in flight and the event topic their steps' results come on."""

    def __init__(self, client, name: str, token: str, addresses: list[str], steps: int):
        self.client, self.name, self.token = client, name, token
        self.addresses, self.steps = list(addresses), int(steps)
        self.topic = f"workbench-steps-{token}"
        self.pending: list = []  # (step, sync, [(task, args, keywords) per rank], slots)
        self.slots: dict[tuple[int, int], StepSlot] = {}
        self.tasks: list = []  # the segments' futures, until the generation ends
        client.subscribe_topic(self.topic, self._heard)

    def add(self, step: int, sync: bool, calls: list, last: bool) -> list[StepSlot]:
        """Step ``step``'s per-rank ``(task, args, keywords)``: its slots (submitted with its segment,
        at once when the segment is full, the step syncs or is the run's ``last``)."""
        slots = [StepSlot(step, rank) for rank in range(len(calls))]
        for slot in slots:
            self.slots[(step, slot.rank)] = slot
        self.pending.append((step, calls, slots))
        if sync or last or len(self.pending) >= self.steps:
            self.flush()
        return slots

    def flush(self) -> None:
        """The pending steps as one segment: a task per member."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        first, last = pending[0][0], pending[-1][0]
        for rank, worker in enumerate(self.addresses):
            task = pending[0][1][rank][0]
            steps = [(calls[rank][1], calls[rank][2]) for _, calls, _ in pending]
            future = self.client.submit(
                run_segment,
                task,
                self.topic,
                rank,
                steps,
                key=segment_key(self.name, first, last, rank, self.token),
                workers=[worker],
                allow_other_workers=False,
                priority=-first,
                pure=False,
            )
            self.tasks.append((last, future))
            ranks = [slots[rank] for _, _, slots in pending]
            for k, slot in enumerate(ranks):
                slot.submitted(future, final=k == len(pending) - 1)
            future.add_done_callback(lambda _, ranks=ranks: [slot.segment_ended() for slot in ranks])
            self.slots.pop((last, rank), None)  # its result is the task's, no event comes for it

    def _heard(self, event) -> None:
        """A step's result published by its member (the client's event loop: kept as it came)."""
        rank, step, payload = event[1]
        slot = self.slots.pop((step, rank), None)
        if slot is not None:
            slot.arrived(payload)

    def gathered(self, step: int) -> None:
        """Step ``step`` left the window: the segments that ended by it and are done are let go (its slots
        stay until their results come: a backup engine's late members report after the step left)."""
        self.tasks = [(last, f) for last, f in self.tasks if last > step or f.status != "finished"]

    def cancel(self) -> list:
        """Forget the steps not submitted yet; the segment tasks held, to cancel."""
        self.pending = []
        tasks, self.tasks = [f for _, f in self.tasks], []
        return tasks

    def truncate(self) -> None:
        """Let the scheduler forget the results published so far (they were read)."""
        if getattr(self.client, "status", None) == "running":
            self.client.loop.add_callback(_truncate, self.client, self.topic)

    def close(self) -> None:
        """Stop listening and let the scheduler forget the topic; the tasks are the driver's to drop."""
        self.pending, self.slots, self.tasks = [], {}, []
        if getattr(self.client, "status", None) == "running":
            self.client.unsubscribe_topic(self.topic)
            self.client.loop.add_callback(_truncate, self.client, self.topic, True)


def _forget_topic(topic: str, drop: bool = False, dask_scheduler=None) -> None:
    """On the scheduler: empty ``topic``'s event log (and with ``drop``, forget the topic)."""
    broker = getattr(dask_scheduler, "_broker", None)
    if broker is None:
        return
    broker.truncate(topic)
    if drop:
        getattr(broker, "_topics", {}).pop(topic, None)


async def _truncate(client, topic: str, drop: bool = False) -> None:
    try:
        await client._run_on_scheduler(_forget_topic, topic, drop, wait=True)
    except Exception:  # bookkeeping only: a scheduler that went away took its log with it
        pass
