"""Where a plan's collectives run: each is a start and a done, moved apart so communication overlaps work.

A collective op (:mod:`workbench.ops.collective`) becomes two kernel calls in a plan: its **start**
hands the input to the run's communicator and puts a handle in a slot; its **done** waits for the
peers and puts the result in the op's output slot. :func:`schedule_collectives` moves each done down
to just before its first consumer and each start up to just after its input is made (XLA's async
collective start/done), so that whatever runs between them overlaps the communication.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.graph.core import Operation


class HandleSlot:
    """The slot key of a collective's handle (between its start and its done): one per collective op."""

    __slots__ = ("op",)

    def __init__(self, op: Operation):
        self.op = op


def wait(handle, *_inputs):
    """The done of a collective: its result, once every peer has sent its part."""
    return handle.wait()


def schedule_collectives(step_io: list) -> tuple[list, set[int]]:
    """``step_io`` with each collective's done moved down to just before its first consumer and its
    start up to just after its inputs are made (XLA's async start/done), so that communication
    overlaps the steps between; and the positions of the starts. (Each collective comes as a start
    followed by its done, in graph order.)"""
    if not any(op.opdef.collective for op, _ins, _outs in step_io):
        return step_io, set()
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
    for start in starts:
        order.pop(_index(order, start))
        made = [k for k, (_op, _ins, outs) in enumerate(order) if set(outs) & set(start[1])]
        order.insert(max(made) + 1 if made else 0, start)
    return order, {_index(order, s) for s in starts}


def _index(entries: list, entry) -> int:
    return next(k for k, e in enumerate(entries) if e is entry)
