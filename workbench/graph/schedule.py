"""Where a plan's collectives run: each is a start and a done, moved apart so communication overlaps work.

A collective op (:mod:`workbench.ops.collective`) becomes two kernel calls in a plan: its **start**
hands the input to the run's communicator and puts a handle in a slot; its **done** waits for the
peers and puts the result in the op's output slot. :func:`schedule_collectives` moves each done down
to just before its first consumer and each start up to just after its input is made (XLA's async
collective start/done), so that whatever runs between them overlaps the communication. The few ops
that only feed a start (a strategy's ``g * r.weight``, a cast before a compressed all-reduce) move up
with it, so a gradient's all-reduce starts during the backward pass rather than after it.

With ``bucket_bytes``, consecutive starts of sum and mean all-reduces are **bucketed** as the
all-reduce engine buckets gradients (:func:`workbench.cluster.collective.replica.plan_buckets`): in the order
their inputs are made, a bucket of one dtype and reduction closes once it holds ``bucket_bytes``; it
starts as one flat all-reduce where its last input is made, and each member's done takes its part.
Sums are elementwise in the ranks' fixed order, so a bucket gives the bits of its members one by one.
A start joins a bucket only if no done of the bucket comes before it (which would wait for a
collective not yet started).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from workbench.graph.core import Operation

#: Bytes per bucket of the plans that bucket their all-reduces (the all-reduce engine's size).
BUCKET_BYTES = 4 << 20
BUCKETED = ("sum", "mean")


class HandleSlot:
    """The slot key of a collective's handle (between its start and its done): one per collective op."""

    __slots__ = ("op",)

    def __init__(self, op: Operation):
        self.op = op


def wait(handle, *_inputs):
    """The done of a collective: its result, once every peer has sent its part."""
    return handle.wait()


@dataclass(frozen=True)
class CollectiveBucket:
    """All-reduces started together as one flat array: their ops and each input's place in it."""

    ops: tuple
    bounds: tuple  # (start, stop) of each op's input in the flat array
    shapes: tuple
    dtype: str
    reduction: str  # "sum" or "mean"
    size: int
    scaled: tuple = ()  # per member: its inputs are (x, s), packed as x * s


def schedule_collectives(step_io: list, bucket_bytes: int | None = None) -> tuple[list, set[int], dict]:
    """``step_io`` with each collective's done moved down to just before its first consumer and its
    start (with the ops that only feed it) up to just after its inputs are made; and the positions
    of the starts, and of the buckets' starts (``bucket_bytes``: see the module docstring) with their
    :class:`CollectiveBucket`. (Each collective comes as a start followed by its done, in graph order;
    a bucket's entry has every member's inputs and handles.)"""
    if not any(op.opdef.collective for op, _ins, _outs in step_io):
        return step_io, set(), {}
    order = list(step_io)
    starts, dones, k = [], [], 0
    while k < len(order):
        if order[k][0].opdef.collective:
            starts.append(order[k])
            dones.append(order[k + 1])
            k += 2
        else:
            k += 1
    for done in reversed(dones):  # later first: a consumer that is another collective's start has not moved yet
        at = _index(order, done)
        order.pop(at)
        used = [k for k in range(at, len(order)) if set(order[k][1]) & set(done[2])]
        order.insert(used[0] if used else len(order), done)
    for start, done in zip(starts, dones, strict=True):
        for entry in [*_feeders(order, start, done), start]:
            _move_up(order, entry)
    if not bucket_bytes:
        return order, {_index(order, s) for s in starts}, {}
    return _merge(order, starts, dones, _bucket(order, starts, dones, bucket_bytes))


def _merge(order: list, starts: list, dones: list, groups: list) -> tuple[list, set[int], dict]:
    """``order`` with each bucket's starts made one entry, where its last member started: every
    member's inputs (a scale folded in: see :func:`_scaled`) and handles."""
    done_of = {id(s): d for s, d in zip(starts, dones, strict=True)}
    replaced, dropped, buckets = {}, set(), {}
    for members in groups:
        ins, scaled, bounds, shapes, offset = [], [], [], [], 0
        for m in members:
            shape = tuple(m[0].inputs[0].shape)
            n = int(np.prod(shape, dtype=np.int64))
            bounds.append((offset, offset + n))
            shapes.append(shape)
            offset += n
            done = done_of[id(m)]
            product = _scaled(order, m, done)
            if product is None:
                ins.extend(m[1])
                scaled.append(False)
                continue
            dropped.add(id(product))  # the multiply is done on the way into the bucket
            ins.extend(product[1])
            scaled.append(True)
            replaced[id(done)] = (done[0], [done[1][0], *product[1]], done[2])  # holds the factors instead
        op = members[-1][0]
        bucket = CollectiveBucket(
            tuple(m[0] for m in members),
            tuple(bounds),
            tuple(shapes),
            op.inputs[0].dtype,
            op.attrs["op"],
            offset,
            tuple(scaled),
        )
        replaced[id(members[-1])] = (op, ins, [m[2][0] for m in members])
        buckets[id(members[-1])] = bucket
        dropped.update(id(m) for m in members[:-1])
    left = [e for e in order if id(e) not in dropped]
    begun = {id(s) for s in starts}
    positions = {k for k, e in enumerate(left) if id(e) in begun}
    placed = {k: buckets[id(e)] for k, e in enumerate(left) if id(e) in buckets}
    return [replaced.get(id(e), e) for e in left], positions, placed


def _scaled(order: list, start, done):
    """The entry of ``x * s`` (``s`` a scalar, all of one dtype) that makes ``start``'s input, if only
    this collective uses it: a bucket packs it as ``multiply(x, s, out=...)``, the same bits, one pass
    over the array fewer (as the all-reduce engine weights gradients on their way into its buckets)."""
    (slot,) = start[1]
    entry = next((e for e in order if slot in e[2]), None)
    if entry is None or entry[0].type != "multiply" or len(entry[1]) != 2 or entry[2] != [slot]:
        return None
    out = entry[0].outputs[0]
    a, b = entry[0].inputs
    if {a.dtype, b.dtype} != {out.dtype} or {tuple(a.shape), tuple(b.shape)} != {tuple(out.shape), ()}:
        return None
    if tuple(out.shape) == ():
        return None
    users = [e for e in order if slot in e[1]]
    return entry if all(u is start or u is done for u in users) else None


def _feeders(order: list, start, done) -> list:
    """The pure ops whose outputs only the collective (its ``start`` and ``done``) or another of them
    uses, in plan order."""
    producer = {s: e for e in order for s in e[2]}
    users: dict[int, list] = {}
    for e in order:
        for s in e[1]:
            users.setdefault(s, []).append(e)
    found, frontier = {id(start), id(done)}, list(start[1])
    while frontier:
        entry = producer.get(frontier.pop())
        if entry is None or id(entry) in found or not _movable(entry[0]):
            continue
        if all(id(u) in found for s in entry[2] for u in users.get(s, ())):
            found.add(id(entry))
            frontier.extend(entry[1])
    return [e for e in order if id(e) in found and e is not start and e is not done]


def _movable(op: Operation) -> bool:
    opdef = op.opdef
    return not (opdef.collective or opdef.stateful or opdef.writes is not None)


def _move_up(order: list, entry) -> None:
    """Move ``entry`` to just after the last entry that makes one of its inputs."""
    order.pop(_index(order, entry))
    made = [k for k, (_op, _ins, outs) in enumerate(order) if set(outs) & set(entry[1])]
    order.insert(max(made) + 1 if made else 0, entry)


def _bucket(order: list, starts: list, dones: list, bucket_bytes: int) -> list:
    """The buckets of two or more starts: each a list of its members' start entries, in plan order."""
    done_of = {id(s): d for s, d in zip(starts, dones, strict=True)}
    at = {id(e): k for k, e in enumerate(order)}
    groups, current, size, key, first_done = [], [], 0, None, len(order)

    def close():
        if len(current) > 1:
            groups.append(list(current))
        current.clear()

    for start in sorted(starts, key=lambda s: at[id(s)]):
        op = start[0]
        if op.type != "all_reduce" or op.attrs.get("op") not in BUCKETED:
            continue
        spec = op.inputs[0]
        this = (spec.dtype, op.attrs["op"], op.attrs.get("replicas"))
        if current and (this != key or size >= bucket_bytes or first_done < at[id(start)]):
            close()
        if not current:
            size, key, first_done = 0, this, len(order)
        current.append(start)
        size += int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        first_done = min(first_done, at[id(done_of[id(start)])])
    close()
    return groups


class _Shared:
    """A bucket's handle, waited for once however many members' dones ask."""

    __slots__ = ("handle", "value")

    def __init__(self, handle):
        self.handle, self.value = handle, None

    def wait(self):
        if self.value is None:
            self.value = self.handle.wait()
        return self.value


class BucketPart:
    """One member's handle of a bucket: :meth:`wait` gives its part of the reduced flat array."""

    __slots__ = ("shared", "start", "stop", "shape")

    def __init__(self, shared: _Shared, start: int, stop: int, shape: tuple):
        self.shared, self.start, self.stop, self.shape = shared, start, stop, shape

    def done(self) -> bool:
        return self.shared.value is not None or self.shared.handle.done()

    def wait(self, timeout: float | None = None):
        return self.shared.wait()[self.start : self.stop].reshape(self.shape)


def start_bucket(comm, xp, bucket: CollectiveBucket, replicas, values) -> tuple:
    """Pack ``values`` (the members' inputs) into one flat array, start its all-reduce on ``comm``, and
    give each member's handle. The communicator may reduce into the array (``owned``); ``members`` says
    how many collective ops it carries."""
    flat = xp.empty(bucket.size, dtype=bucket.dtype)
    values = iter(values)
    for (a, b), shape, scaled in zip(bucket.bounds, bucket.shapes, bucket.scaled, strict=True):
        if scaled:
            xp.multiply(next(values), next(values), out=flat[a:b].reshape(shape))
        else:
            flat[a:b] = xp.reshape(xp.asarray(next(values)), (-1,))
    handle = comm.start(
        "all_reduce", xp, flat, op=bucket.reduction, replicas=replicas, members=len(bucket.ops), owned=True
    )
    shared = _Shared(handle)
    return tuple(BucketPart(shared, a, b, s) for (a, b), s in zip(bucket.bounds, bucket.shapes, strict=True))


def _index(entries: list, entry) -> int:
    return next(k for k, e in enumerate(entries) if e is entry)
