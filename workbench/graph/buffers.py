"""Which arrays a plan's steps may overwrite: slot lifetimes, donation, and whether two arrays share memory.

:class:`Plan <workbench.graph.plan.Plan>` binds its kernel calls with these answers once, when it is
made: a slot is cleared after its last use, an in-place kernel writes into an input nothing else
needs (an intermediate is *donated*), and a fetched value that shares memory with a variable comes
back as a copy.
"""

from __future__ import annotations

import sys
from operator import itemgetter
from typing import TYPE_CHECKING

from workbench.graph.core import Operation

if TYPE_CHECKING:
    from workbench.graph.plan import Plan


class _Lifetimes:
    """When each slot is last used, which slots a step may overwrite and which it must not."""

    def __init__(self, plan: Plan, step_io: list):
        self.step_io = step_io
        # arrays from outside (feeds, variables, constants) or kept (fetches, variable updates)
        self.reads = {s for s, _ in plan.reads}
        self.fetched = {s for s in plan.fetch_slots if s is not None}
        self.pinned = set(plan.feed_slots) | self.reads | self.fetched
        self.pinned |= {i for i, v in enumerate(plan.template) if v is not None}
        for op, _ins, outs in step_io:
            if op.opdef.stateful:
                self.pinned.update(outs)
        self.last_use: dict[int, int] = {}
        for i, (_op, ins, _outs) in enumerate(step_io):
            for s in ins:
                self.last_use[s] = i
        self.made_at = {s: i for i, (_op, _ins, outs) in enumerate(step_io) for s in outs}

    def dead_after(self, i: int) -> tuple[int, ...]:
        """Slots to clear after step ``i``: made by the plan and not needed any more."""
        _op, ins, outs = self.step_io[i]
        done = {s for s in (*ins, *outs) if s not in self.pinned and self.last_use.get(s, self.made_at[s]) == i}
        return tuple(sorted(done))

    def guard(self, i: int) -> tuple[int, ...]:
        """Slots whose arrays must survive step ``i``: pinned ones and those used later."""
        later = {s for s, last in self.last_use.items() if last > i and self.made_at.get(s, -1) < i}
        return tuple(sorted(self.pinned | later))

    def update_guard(self, i: int) -> tuple[int, ...]:
        """``guard(i)`` for a variable update: without the variable reads that no later step
        and no fetch needs, so an update may overwrite the array its own read still holds."""
        return tuple(
            s for s in self.guard(i) if s not in self.reads or s in self.fetched or self.last_use.get(s, -1) > i
        )

    def donors(self, i: int, op: Operation, ins: list[int], outs: list[int]) -> tuple[int, ...]:
        """Input positions of step ``i`` whose arrays its in-place kernel may overwrite."""
        if op.opdef.inplace is None or op.opdef.stateful or op.opdef.random or len(outs) != 1:
            return ()
        out_dtype = op.outputs[0].dtype
        return tuple(
            k
            for k, s in enumerate(ins)
            if s not in self.pinned and self.last_use[s] == i and ins.count(s) == 1 and op.inputs[k].dtype == out_dtype
        )


def _owned(a) -> bool:
    """``a`` owns its memory and may be written (a view or a read-only array may not)."""
    return getattr(a, "base", False) is None and getattr(getattr(a, "flags", None), "writeable", True)


def _holds_result(a, args) -> bool:
    """``a`` has the broadcast shape of ``args``, so an elementwise result fits in it."""
    shape, ndim = a.shape, a.ndim
    for b in args:
        if b is a:
            continue
        bs = getattr(b, "shape", ())
        if bs == shape or bs == shape[ndim - len(bs) :]:  # the same shape, or its trailing axes (a bias)
            continue
        if len(bs) > ndim or any(x != y and x != 1 for x, y in zip(bs[::-1], shape[::-1])):
            return False
    return True


def _same_memory(v, a) -> bool:
    """``v`` is ``a`` or a view of it (or of what ``a`` views)."""
    root = a
    while getattr(root, "base", None) is not None:
        root = root.base
    while v is not None:
        if v is root:
            return True
        v = getattr(v, "base", None)
    return False


def _disjoint(values) -> bool:
    """No two of ``values`` are, or view, the same array (their view roots all differ).

    Checked once per run so that an in-place update need not scan every other
    variable for views of the array it writes into.
    """
    roots = set()
    count = 0
    for v in values:
        while getattr(v, "base", None) is not None:
            v = v.base
        roots.add(id(v))
        count += 1
    return len(roots) == count


def _shared(a, slots: list, guard: tuple[int, ...]) -> bool:
    """Some guarded slot holds ``a`` (an array that owns its memory) or a view of it."""
    return _viewed(a, map(slots.__getitem__, guard))


def _donor_references(slots, *args) -> int:
    """``sys.getrefcount`` of ``args[0]``, taken as a donating step takes its donor's (a local name)."""
    a = args[0]
    return sys.getrefcount(a)


def _sole_donor_count() -> int:
    """What ``sys.getrefcount`` of a donor says when nothing but the run holds it: its slot, the
    step's argument tuples and the step's own name for it, measured once with a step called the
    way :meth:`Plan.run <workbench.graph.plan.Plan.run>` calls its steps (``fn(*get(slots))``)."""
    slots = [bytearray(1)]
    get = _with_slots(itemgetter(slice(0, 1)))
    return _donor_references(*get(slots))


def _with_slots(get):
    """A getter that passes the slot list first (donating and in-place steps check it)."""
    return lambda slots: (slots, *get(slots))


#: ``sys.getrefcount`` of a donor that only the run holds (its slot and the step call's own
#: references). A view of it holds it through ``base`` and another slot holding it is one more
#: reference, so at this count the donor is shared with nothing, and a donating step skips the
#: scan of the guarded slots (:func:`_shared`), which it still makes at any other count.
SOLE_DONOR = _sole_donor_count()


def _sole_update_counts() -> tuple[int, int]:
    """What ``sys.getrefcount`` of a variable's array says in an in-place update step when nothing
    but the run holds it: (the update's read of the variable is that array, it is not). Measured
    once, as :func:`_sole_donor_count` is, with a probe shaped like the step
    (``inplace_update_step(slots, snapshot, *args)`` taking ``current = state[name]``, the array
    also in the plan's ``fresh`` table), called as :meth:`Plan.run <workbench.graph.plan.Plan.run>`
    calls its steps."""
    state = {"v": bytearray(1)}
    fresh = dict(state)

    def probe(slots, _snapshot, *args):
        current = state["v"]  # the step's own name for it
        return sys.getrefcount(current) if current is fresh["v"] else None  # the array in fresh, as the step tests

    get = _with_slots(itemgetter(0, 1))
    slots = [state["v"], bytearray(1)]
    read = probe(*get(slots))
    slots[0] = bytearray(1)
    return read, probe(*get(slots))


#: ``sys.getrefcount`` of a variable's array in its in-place update when only the run holds it
#: (its state and ``fresh`` entries, the step's name for it and, where the update's read is it,
#: the read's slot and the step's argument): a slot holding it or a view of it, or another
#: variable viewing it, is one reference more, so at these counts the update skips the scans
#: of the guarded slots and of the other variables.
SOLE_UPDATE_READ, SOLE_UPDATE = _sole_update_counts()


def _viewed(a, values, but=None) -> bool:
    """Some value other than ``but`` is ``a`` (an array that owns its memory) or a view of it.

    The inner loop of every in-place check, run a few hundred times a step: kept flat.
    """
    for v in values:
        if v is but:
            continue
        while v is not None:
            if v is a:
                return True
            v = getattr(v, "base", None)
    return False


def _copy(xp, v):
    return xp.asarray(v, copy=True)
