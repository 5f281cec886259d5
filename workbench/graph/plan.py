"""Execution plans: a graph compiled to a flat list of kernel calls over numbered slots.

A :class:`Plan` is made once per (fetches, feeds) and then run many times. Running
it is a tight loop: fetch the input slots, call the kernel, store the outputs.
There is no graph walk, no name lookup and no shape inference per step.
"""

from __future__ import annotations

import functools
import zlib
from operator import itemgetter
from typing import Any, Callable

import numpy as np

from workbench.errors import NumericsError
from workbench.graph.core import Graph, Operation, Tensor


class Plan:
    """A compiled graph: constants, variable reads, feeds, steps and fetch slots.

    Parameters
    ----------
    graph : Graph
        The optimized graph to run (see :func:`workbench.graph.passes.optimize`).
    fetches : list of str
        Tensor names (their values are returned) or operation names (run for effect).
    feeds : list of str
        Placeholder names, in the order :meth:`run` receives their values.
    xp : module
        The array namespace kernels run with (NumPy, CuPy, array-api-strict ...).
    state : dict
        Variable name to array; reads see the values at the start of a run and
        updates replace entries in order.
    seed : int
        Seeds random ops, together with each op's seed and the run count.
    """

    def __init__(self, graph: Graph, fetches: list[str], feeds: list[str], xp, state: dict, seed: int = 0):
        self.graph, self.xp, self.state, self.seed = graph, xp, state, seed
        self.run_count = 0
        slot_of: dict[Tensor, int] = {}
        self.template: list[Any] = []
        self.reads: list[tuple[int, str]] = []
        self.steps: list[tuple[Callable, Callable, Any]] = []
        self.step_ops: list[Operation] = []

        def new_slot(t: Tensor, value=None) -> int:
            slot_of[t] = len(self.template)
            self.template.append(value)
            return slot_of[t]

        feed_slots = {}
        for op in graph.operations:
            if op.type == "placeholder":
                feed_slots[op.name] = new_slot(op.outputs[0])
            elif op.type == "constant":
                new_slot(op.outputs[0], xp.asarray(op.attrs["value"]))
            elif op.type == "variable":
                self.reads.append((new_slot(op.outputs[0]), op.name))
            elif op.opdef.kernel is not None:
                ins = [slot_of[t] for t in op.inputs]
                outs = [new_slot(t) for t in op.outputs]
                get = itemgetter(*ins) if len(ins) > 1 else itemgetter(slice(ins[0], ins[0] + 1)) if ins else _nothing
                out = outs[0] if len(outs) == 1 else tuple(outs)
                self.steps.append((self._bind(op), get, out))
                self.step_ops.append(op)
        self.feed_slots = [feed_slots[name] for name in feeds]
        self.fetch_slots = []
        for name in fetches:
            found = graph.get(name)
            self.fetch_slots.append(slot_of[found] if isinstance(found, Tensor) else None)

    def _bind(self, op: Operation) -> Callable:
        opdef, xp, attrs = op.opdef, self.xp, op.attrs
        kernel = functools.partial(opdef.kernel, xp, **attrs) if attrs else functools.partial(opdef.kernel, xp)
        if opdef.random:
            op_seed = attrs.get("seed")
            op_seed = zlib.crc32(op.name.encode()) if op_seed is None else int(op_seed)

            def random_step(*args):
                rng = np.random.default_rng([self.seed, op_seed, self.run_count])
                return kernel(*args, rng=rng)

            return random_step
        if opdef.stateful:
            state, name = self.state, op.inputs[0].op.name

            def update_step(_snapshot, *args):
                state[name] = value = kernel(state[name], *args)
                return value

            if op.type == "assign":  # its value may be a fed array the caller still owns: keep a copy

                def assign_step(_snapshot, *args):
                    state[name] = value = xp.asarray(kernel(state[name], *args), copy=True)
                    return value

                return assign_step
            return update_step
        return kernel

    @property
    def variable_names(self) -> list[str]:
        return [name for _, name in self.reads]

    def run(self, feed_values: list, check_numerics: bool = False) -> list:
        """Run once with the (already checked) feed values; returns the fetched values."""
        slots = self.template.copy()
        state = self.state
        for slot, name in self.reads:
            slots[slot] = state[name]
        for slot, value in zip(self.feed_slots, feed_values):
            slots[slot] = value
        if check_numerics:
            self._run_checked(slots)
        else:
            for fn, get, out in self.steps:
                result = fn(*get(slots))
                if out.__class__ is int:
                    slots[out] = result
                else:
                    for o, r in zip(out, result):
                        slots[o] = r
        self.run_count += 1
        return [None if s is None else slots[s] for s in self.fetch_slots]

    def _run_checked(self, slots: list) -> None:
        xp = self.xp
        for (fn, get, out), op in zip(self.steps, self.step_ops):
            result = fn(*get(slots))
            results = (result,) if out.__class__ is int else tuple(result)
            for o, r, t in zip((out,) if out.__class__ is int else out, results, op.outputs):
                slots[o] = r
                if t.dtype.startswith("float") and not bool(xp.all(xp.isfinite(r))):
                    bad = "NaN" if bool(xp.any(xp.isnan(r))) else "Inf"
                    where = f"\n  {op.source}" if op.source else ""
                    raise NumericsError(f"{op.type} {op.name!r} produced {bad} (output {t.name!r}){where}")

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return f"<Plan of {len(self.steps)} kernel calls, {len(self.template)} slots>"


def _nothing(slots) -> tuple:
    return ()
