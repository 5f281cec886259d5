"""Execution plans: a graph compiled to a flat list of kernel calls over numbered slots.

A :class:`Plan` is made once per (fetches, feeds) and then run many times. Running
it is a tight loop: fetch the input slots, call the kernel, store the outputs.
There is no graph walk, no name lookup and no shape inference per step.

Memory: a slot is cleared after its last use, and an op with an ``inplace``
kernel writes into an input that the plan made, that nothing uses later and
that no other slot shares (an intermediate is *donated*), instead of
allocating. With ``own_state=True`` variable updates also write into the
variable's array, so a plan never hands a variable's array out: fetched
values that share memory with one come back as copies.
"""

from __future__ import annotations

import functools
import sys
import time
import zlib
from dataclasses import dataclass
from operator import itemgetter
from typing import Any
from collections.abc import Callable, Sequence

from workbench.errors import ExecutionError, NumericsError, WorkbenchError
from workbench.graph.core import Graph, Operation, Tensor
from workbench.graph.buffers import (
    SOLE_DONOR,
    SOLE_UPDATE,
    SOLE_UPDATE_READ,
    _copy,
    _disjoint,
    _holds_result,
    _Lifetimes,
    _owned,
    _same_memory,
    _shared,
    _viewed,
    _with_slots,
)
from workbench.graph.rng import generator
from workbench.graph.schedule import HandleSlot, schedule_collectives, start_bucket, wait
from workbench.graph.profile import run_profiled
from workbench.ops.collective import SOLO
from workbench.ops.fused import FUSED


@dataclass(frozen=True)
class PlanSnapshot:
    """What :meth:`Plan.restore` puts back: which array each variable is (not a copy of its
    values), the arrays the plan's updates made (which later updates may write into) and
    the run count. What a CUDA graph capture needs undone: capturing runs no kernel, but
    may replace arrays."""

    state: dict
    fresh: dict
    runs: int


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
        Seeds random ops, together with each op's seed and the step (see :meth:`run`).
    own_state : bool
        Variable updates may write into the variables' arrays (see the module notes).
    compilers : sequence of callables
        The device's compilers of fused elementwise programs (:mod:`workbench.ops.fused`).
    bucket_bytes : int, optional
        Start consecutive sum and mean all-reduces as flat buckets of about this many bytes
        (:mod:`workbench.graph.schedule`); default: one communicator call per collective op.

    Attributes
    ----------
    feed_names, fetch_names : tuple of str
        The placeholders :meth:`run` takes values for, in order, and the fetches it returns.
    runs : int
        Runs so far (read-only).
    buckets : dict
        The position (in :attr:`steps`) of each bucket of all-reduces' start, and its
        :class:`~workbench.graph.schedule.CollectiveBucket` (none without ``bucket_bytes``).
    backward : int or None
        The position (in :attr:`steps`) of the backward pass's first kernel call: the first op under
        a ``gradients`` name scope (:func:`~workbench.graph.gradients.gradients`); None without one.
    backward_began : float or None
        When (``time.time()``) the last run reached :attr:`backward`: what splits a step's compute
        into forward and backward (:mod:`workbench.spans`); None when it did not.

    Build plans with :func:`workbench.graph.compile.compile_plan`, which prunes,
    optimizes and rewrites the graph for a device first.
    """

    def __init__(
        self,
        graph: Graph,
        fetches: Sequence[str],
        feeds: Sequence[str],
        xp,
        state: dict,
        seed: int = 0,
        own_state: bool = False,
        compilers: Sequence[Callable] = (),
        bucket_bytes: int | None = None,
    ):
        self.graph, self.xp, self.state, self.seed = graph, xp, state, seed
        self.own_state = own_state
        self.feed_names, self.fetch_names = tuple(feeds), tuple(fetches)
        self._compilers = tuple(compilers)
        self._runs = 0
        self._step = 0  # the run's context (see run), read by random ops
        self._row_offset = 0
        self._comm = SOLO  # the run's communicator (see run), read by collective ops
        slot_of: dict[Tensor, Any] = {}
        self.template: list[Any] = []
        self.reads: list[tuple[int, str]] = []
        self.steps: list[tuple[Callable, Callable, Any, tuple]] = []
        self.step_ops: list[Operation] = []
        self._fresh: dict[str, Any] = {}  # variable name -> the array this plan's last update made
        self._disjoint = False  # no two variables share memory (checked once per run, for in-place updates)

        def new_slot(t: Tensor, value=None) -> int:
            slot_of[t] = len(self.template)
            self.template.append(value)
            return slot_of[t]

        feed_slots, step_io = {}, []
        for op in graph.operations:
            if op.type == "placeholder":
                feed_slots[op.name] = new_slot(op.outputs[0])
            elif op.type == "constant":
                new_slot(op.outputs[0], xp.asarray(op.attrs["value"]))
            elif op.type == "variable":
                self.reads.append((new_slot(op.outputs[0]), op.name))
            elif op.opdef.collective:  # a start (input -> handle) and a done (handle -> output)
                ins = [slot_of[t] for t in op.inputs]
                handle = new_slot(HandleSlot(op))
                step_io.append((op, ins, [handle]))
                # the done also holds the input, so no step writes into it while peers may read it
                step_io.append((op, [handle, *ins], [new_slot(t) for t in op.outputs]))
            elif op.opdef.kernel is not None:
                ins = [slot_of[t] for t in op.inputs]
                step_io.append((op, ins, [new_slot(t) for t in op.outputs]))
        step_io, self._starts, buckets = schedule_collectives(step_io, bucket_bytes)
        self.buckets = buckets  # position of a bucket's start -> its CollectiveBucket
        self.feed_slots = [feed_slots[name] for name in feeds]
        self.fetch_slots = []
        for name in fetches:
            found = graph.get(name)
            self.fetch_slots.append(slot_of[found] if isinstance(found, Tensor) else None)
        lifetimes = _Lifetimes(self, step_io)
        for i, (op, ins, outs) in enumerate(step_io):
            if len(ins) > 1:
                get = itemgetter(*ins)
            else:
                get = itemgetter(slice(ins[0], ins[0] + 1)) if ins else _nothing
            donors = lifetimes.donors(i, op, ins, outs)
            if i in buckets:
                fn = self._bind_bucket(buckets[i])
            elif op.opdef.collective:
                fn = self._bind_start(op) if i in self._starts else wait
            else:
                fn = self._bind(op, lifetimes.update_guard(i) if op.opdef.stateful else lifetimes.guard(i), donors)
            if donors or (op.opdef.stateful and op.opdef.inplace is not None and own_state):
                get = _with_slots(get)
            out = outs[0] if len(outs) == 1 else tuple(outs)
            self.steps.append((fn, get, out, lifetimes.dead_after(i)))
            self.step_ops.append(op)
        self.backward = next((i for i, op in enumerate(self.step_ops) if _is_gradient(op)), None)
        self.backward_began: float | None = None
        if self.backward is not None:  # one clock read a run, where the backward pass begins
            fn, get, out, dead = self.steps[self.backward]
            self.steps[self.backward] = (self._bind_backward(fn), get, out, dead)

    def _bind(self, op: Operation, guard: tuple[int, ...], donors: tuple[int, ...]) -> Callable:
        opdef, xp, attrs = op.opdef, self.xp, op.attrs
        if op.type == FUSED and self._compilers:
            attrs = {**attrs, "compilers": self._compilers}
        if opdef.bodies:  # control flow: each body compiled once, here, into a sub-plan the kernel runs
            # seeded by the op (or the forward op a gradient copies): two dropouts in two branches differ
            seed = zlib.crc32(f"{self.seed}/{attrs.get('seed_scope') or op.name}".encode())
            subs = (attrs[key].compile(xp, self._compilers, seed=seed) for key in opdef.bodies)
            attrs = {**attrs, "plans": tuple(_InRun(sub, self) for sub in subs)}
        kernel = functools.partial(opdef.kernel, xp, **attrs) if attrs else functools.partial(opdef.kernel, xp)
        if opdef.random:
            op_seed = attrs.get("seed")
            op_seed = zlib.crc32(op.name.encode()) if op_seed is None else int(op_seed)
            shape = op.inputs[0].shape if op.inputs else None
            batched = bool(shape) and shape[0] is None  # its first axis is the batch axis

            def random_step(*args):
                rng = generator([self.seed, op_seed, self._step], batched, self._row_offset)
                return kernel(*args, rng=rng)

            return random_step
        if opdef.writes is not None:
            return self._bind_multi_update(op, kernel, guard)
        if opdef.stateful:
            return self._bind_update(op, kernel, guard)
        if donors:
            inplace = functools.partial(opdef.inplace, xp, **attrs)

            def donating_step(slots, *args):
                for k in donors:
                    a = args[k]
                    # at SOLE_DONOR references nothing else holds ``a`` or a view of it: no scan needed
                    if (
                        _owned(a)
                        and _holds_result(a, args)
                        and (sys.getrefcount(a) == SOLE_DONOR or not _shared(a, slots, guard))
                    ):
                        return inplace(a, *args)
                return kernel(*args)

            return donating_step
        return kernel

    def _bind_start(self, op: Operation) -> Callable:
        """The start of a collective: hands its input to the run's communicator, returns the handle."""
        kind = op.opdef.collective if isinstance(op.opdef.collective, str) else op.type
        plan, xp, attrs = self, self.xp, op.attrs

        def start_step(value):
            return plan._comm.start(kind, xp, value, **attrs)

        if attrs.get("weighted"):  # each rank's part scaled by its replica's weight (see cross_replica_sum)

            def start_step(value):  # noqa: F811 - the weighted form of the start above
                share = getattr(plan._comm, "weight", 1.0)
                if share == 1.0:
                    return plan._comm.start(kind, xp, value, **attrs)
                return _Unweighted(plan._comm.start(kind, xp, value * share, **attrs), share)

        return start_step

    def _bind_bucket(self, bucket) -> Callable:
        """The start of a bucket of all-reduces: one flat array to the run's communicator, a handle per member."""
        plan, xp, replicas = self, self.xp, bucket.ops[-1].attrs.get("replicas")

        def bucket_start(*values):
            return start_bucket(plan._comm, xp, bucket, replicas, values)

        return bucket_start

    def _bind_backward(self, fn: Callable) -> Callable:
        """The backward pass's first kernel call, noting when it began (:attr:`backward_began`)."""
        plan = self

        def backward_step(*args):
            plan.backward_began = time.time()
            return fn(*args)

        return backward_step

    def _bind_update(self, op: Operation, kernel: Callable, guard: tuple[int, ...]) -> Callable:
        """A variable update: replaces ``state[name]``; in place when the plan owns the state,
        the array is one this plan made, and no live slot or other variable shares it."""
        state, name, fresh = self.state, op.inputs[0].op.name, self._fresh
        if not (self.own_state and op.opdef.inplace is not None):

            def update_step(_snapshot, *args):
                state[name] = value = kernel(state[name], *args)
                return value

            return update_step
        plan, xp, inplace = self, self.xp, functools.partial(op.opdef.inplace, self.xp, **op.attrs)
        # the reference counts that tell that only the run holds the variable's array; where a later
        # step or a fetch still needs the update's read (its slot guarded), none: the scans decide
        guarded = set(guard)
        read_free = not any(slot in guarded for slot, read in self.reads if read == name)
        sole_read = SOLE_UPDATE_READ if read_free else -1

        def inplace_update_step(slots, _snapshot, *args):
            current = state[name]
            if (
                current is fresh.get(name)
                and _owned(current)
                and _holds_result(current, args)
                # at the sole count nothing else holds ``current`` or a view of it: no scans needed
                and (
                    sys.getrefcount(current) == (sole_read if _snapshot is current else SOLE_UPDATE)
                    or (
                        not _shared(current, slots, guard)
                        and (plan._disjoint or not _viewed(current, state.values(), but=current))
                    )
                )
            ):
                return inplace(current, current, *args)
            # an array, not a NumPy scalar (what 0-d arithmetic gives), so later updates can write into it
            state[name] = value = fresh[name] = xp.asarray(kernel(current, *args))
            plan._disjoint = False  # a new array: later updates of this run check the other variables again
            return value

        return inplace_update_step

    def _bind_multi_update(self, op: Operation, kernel: Callable, guard: tuple[int, ...]) -> Callable:
        """An update of several variables (``opdef.writes``): in place when every one of them may be
        (as :meth:`_bind_update` decides for one), else new arrays for all of them."""
        positions = op.opdef.writes(op.attrs, len(op.inputs))
        names = [op.inputs[k].op.name for k in positions]
        plan, state, fresh, single = self, self.state, self._fresh, len(op.outputs) == 1
        inplace = None
        if self.own_state and op.opdef.inplace is not None:
            inplace = functools.partial(op.opdef.inplace, self.xp, None, **op.attrs)

        def current(args) -> list:
            args = list(args)
            for k, name in zip(positions, names):
                args[k] = state[name]  # an earlier update of this run may have replaced the read's array
            return args

        def in_place_ok(slots) -> bool:
            held = None if plan._disjoint else list(state.values())
            for name in names:
                a = state[name]
                if a is not fresh.get(name) or not _owned(a) or _shared(a, slots, guard):
                    return False
                if held is not None and _viewed(a, held, but=a):
                    return False
            return True

        def replace(args):
            values = tuple(kernel(*current(args)))  # fused_update's kernels return a tuple, one or more
            for name, value in zip(names, values):
                state[name] = value
                if inplace is not None:
                    fresh[name] = value
            plan._disjoint = False
            return values[0] if single else values

        if inplace is None:
            return lambda *args: replace(args)

        def multi_update_step(slots, *args):
            if in_place_ok(slots):
                values = inplace(*current(args))
                return values[0] if single else values
            return replace(args)

        return multi_update_step

    def producers(self) -> list[int]:
        """For each fetch, the index of the kernel call that computes it (-1: none does; a feed,
        a constant or a variable read holds it before the run starts)."""
        made = {}
        for i, (_fn, _get, out, _dead) in enumerate(self.steps):
            for o in (out,) if out.__class__ is int else out:
                made[o] = i
        return [made.get(s, -1) for s in self.fetch_slots]

    def watch(self, fetches: Sequence[int], callback: Callable[[int, Any], None]) -> None:
        """Call ``callback(k, value)`` during each run, as soon as the kernel call that computes
        fetch ``k`` (for each ``k`` in ``fetches``) returns: what lets a caller start on a value
        (the all-reduce of a gradient) while the run goes on. Fetches no kernel call computes
        (see :meth:`producers`) are not reported."""
        wanted: dict[int, list] = {}
        made = self.producers()
        for k in fetches:
            if made[k] >= 0:
                wanted.setdefault(made[k], []).append(k)
        for index, ks in wanted.items():
            fn, get, out, dead = self.steps[index]
            positions = [(k, None if out.__class__ is int else out.index(self.fetch_slots[k])) for k in ks]

            def watched(*args, _fn=fn, _positions=positions):
                result = _fn(*args)
                for k, position in _positions:
                    callback(k, result if position is None else result[position])
                return result

            self.steps[index] = (watched, get, out, dead)

    @property
    def variable_names(self) -> list[str]:
        return [name for _, name in self.reads]

    @property
    def runs(self) -> int:
        return self._runs

    def snapshot(self) -> PlanSnapshot:
        """The state a run changes (for a caller that must undo one, as CUDA graph capture does)."""
        return PlanSnapshot(dict(self.state), dict(self._fresh), self._runs)

    def restore(self, snapshot: PlanSnapshot) -> None:
        """Put back what :meth:`snapshot` saved."""
        self.state.clear()
        self.state.update(snapshot.state)
        self._fresh.clear()
        self._fresh.update(snapshot.fresh)
        self._runs = snapshot.runs

    def count_run(self) -> None:
        """Count a run done without :meth:`run` (a replayed capture of one)."""
        self._runs += 1
        self.backward_began = None  # a replay runs no step of this plan: no time to tell

    def run(
        self,
        feed_values: list,
        check_numerics: bool = False,
        *,
        step: int | None = None,
        row_offset: int = 0,
        comm=None,
        profile: dict | None = None,
    ) -> list:
        """Run once with the (already checked) feed values; returns the fetched values.

        Parameters
        ----------
        feed_values : list
            One value per name of :attr:`feed_names`, in order.
        check_numerics : bool
            Stop at the first op that makes a NaN or Inf (NumericsError names it).
        step : int, optional
            Keys random draws (dropout): a training step draws the same on any
            machine. Default: the number of runs so far.
        row_offset : int
            Where the fed rows start in the global batch (0: they are the whole
            batch). Random ops on batch-first inputs key their draws by global
            row, so a shard draws what a run of the whole batch draws for its rows.
        comm : communicator, optional
            What collective ops talk to (see :mod:`workbench.ops.collective`): this replica's
            rank of its group. Default: one replica on its own.
        profile : dict, optional
            Time every kernel call and put ``{op name: seconds}`` here (see :mod:`workbench.graph.profile`).
        """
        self._step = self._runs if step is None else step
        self._row_offset = row_offset
        self._comm = SOLO if comm is None else comm
        self.backward_began = None
        slots = self.template.copy()
        state = self.state
        for slot, name in self.reads:
            slots[slot] = state[name]
        if self.own_state:
            self._disjoint = _disjoint(state.values())
        for slot, value in zip(self.feed_slots, feed_values):
            slots[slot] = value
        if profile is not None:
            profile.update(run_profiled(self, slots, kernel_error))
        elif check_numerics:
            self._run_checked(slots)
        else:
            i = -1
            try:
                for i, (fn, get, out, dead) in enumerate(self.steps):  # noqa: B007 - the handler names step i
                    # no name for the result: the next step's donor is then held by its slot alone
                    if out.__class__ is int:
                        slots[out] = fn(*get(slots))
                    else:
                        for o, r in zip(out, fn(*get(slots))):
                            slots[o] = r
                    for d in dead:
                        slots[d] = None
            except WorkbenchError:
                raise
            except Exception as e:  # a kernel failed on these values: say which op, and where it was made
                raise kernel_error(self.step_ops[i], e) from e
        self._runs += 1
        values = [None if s is None else slots[s] for s in self.fetch_slots]
        if self.own_state:  # never hand out a variable's array: later updates write into it
            held = list(state.values())
            values = [
                v if v is None or not any(_same_memory(v, h) for h in held) else _copy(self.xp, v) for v in values
            ]
        return values

    def _run_checked(self, slots: list) -> None:
        xp = self.xp
        for i, ((fn, get, out, dead), op) in enumerate(zip(self.steps, self.step_ops)):
            try:
                result = fn(*get(slots))
            except WorkbenchError:
                raise
            except Exception as e:
                raise kernel_error(op, e) from e
            if i in self._starts:  # handles: the values are checked where the collective is waited for
                if out.__class__ is int:
                    slots[out] = result
                else:  # a bucket's start: a handle per member
                    for o, r in zip(out, result, strict=True):
                        slots[o] = r
                continue
            results = (result,) if out.__class__ is int else tuple(result)
            for o, r, t in zip((out,) if out.__class__ is int else out, results, op.outputs):
                slots[o] = r
                if t.dtype.startswith("float") and not bool(xp.all(xp.isfinite(r))):
                    bad = "NaN" if bool(xp.any(xp.isnan(r))) else "Inf"
                    where = f"\n  {op.source}" if op.source else ""
                    error = NumericsError(f"{op.type} {op.name!r} produced {bad} (output {t.name!r}){where}")
                    error.op = op.name
                    raise error
            for d in dead:
                slots[d] = None

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        return f"<Plan of {len(self.steps)} kernel calls, {len(self.template)} slots>"


class _InRun:
    """A body's sub-plan as the kernel of a control-flow op runs it: with the enclosing run's step and
    row offset, so random ops in the body draw as they would in the plan itself."""

    __slots__ = ("sub", "plan")

    def __init__(self, sub, plan: Plan):
        self.sub, self.plan = sub, plan

    def run(self, arrays) -> list:
        return self.sub.run(arrays, step=self.plan._step, row_offset=self.plan._row_offset)


def kernel_error(op: Operation, error: Exception) -> ExecutionError:
    """The ExecutionError for ``op``'s kernel failing with ``error``: the op, the error and the user's line."""
    where = f"\n  {op.source}" if op.source else ""
    return ExecutionError(f"{op.type} {op.name!r} failed: {type(error).__name__}: {error}{where}", op=op.name)


def written_variables(op: Operation) -> list[str]:
    """Names of the variables a stateful op writes (none for other ops)."""
    if op.opdef.writes is not None:
        return [op.inputs[k].op.name for k in op.opdef.writes(op.attrs, len(op.inputs))]
    return [op.inputs[0].op.name] if op.opdef.stateful and op.inputs else []


def _is_gradient(op: Operation) -> bool:
    """Whether ``op`` belongs to a backward pass: ``gradients()`` makes its ops under a ``gradients`` scope."""
    return "gradients" in op.name.split("/")[:-1]


def _nothing(slots) -> tuple:
    return ()


class _Unweighted:
    """A weighted collective in flight: its result divided by this rank's weight again."""

    __slots__ = ("handle", "share")

    def __init__(self, handle, share: float):
        self.handle, self.share = handle, share

    def done(self) -> bool:
        return self.handle.done()

    def wait(self, timeout: float | None = None):
        return self.handle.wait() / self.share
