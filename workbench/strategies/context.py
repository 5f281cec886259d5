"""The replica context: the view of one replica a strategy function builds its update from.

:func:`build` copies the fit's graph (the user's graph is never changed), adds the replica's
inputs (``replica/id``, ``replica/weight``, ``replica/step``) and calls the strategy with a
:class:`ReplicaContext`. What the function calls is recorded as it goes: each ``r.apply`` and
``r.assign`` is one **write** (a parallel assignment), and the ops made after it read the
values it wrote; each ``with r.every(k):`` is a block of ops that runs only on steps where
``step % k == 0``. :mod:`workbench.strategies.program` lowers that record to plans.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import numpy as np

from workbench import ops
from workbench.errors import StrategyError, WorkbenchError
from workbench.graph.core import Graph, Operation, Tensor, Variable, user_source
from workbench.graph.passes import bind_placeholders, needed_ops, rebuild
from workbench.graph.records import TrainingRecord
from workbench.ops import collective
from workbench.strategies import weights

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INPUTS = ("placeholder", "variable", "constant")


class VariableDict(dict):
    """A dict keyed by the replica program's variables that also finds a key by its name (or by
    the same variable of the user's graph)."""

    def __getitem__(self, key):
        if not dict.__contains__(self, key):
            name = key if isinstance(key, str) else getattr(key, "name", None)
            for v in self:
                if v.name == name:
                    return dict.__getitem__(self, v)
        return dict.__getitem__(self, key)

    def __contains__(self, key) -> bool:
        name = key if isinstance(key, str) else getattr(key, "name", None)
        return dict.__contains__(self, key) or any(v.name == name for v in self)


@dataclass
class Write:
    """One ``r.apply`` or ``r.assign`` call: where its ops are (``start <= index < stop``), its
    write ops, and the every-blocks it is in."""

    kind: str
    start: int
    stop: int = -1
    writes: list = field(default_factory=list)  # the stateful ops it made
    source: object = None


@dataclass
class Record:
    """What a strategy function built, for the lowering: the graph it built into and where."""

    strategy: str
    graph: Graph
    base: int  # ops below this index are the fit's own graph (forward, backward, its optimizer)
    replicas: int
    record: TrainingRecord
    fetches: tuple
    inputs: dict  # "id" | "weight" | "step" -> placeholder name
    reduction: str | None  # "mean" | "sum" (None: the loss was not analysed, r.weight unused)
    writes: list = field(default_factory=list)
    blocks: list = field(default_factory=list)  # (k, start, stop) of each every-block
    slots: dict = field(default_factory=dict)  # slot variable name -> the variable it starts from (or None)

    def block_of(self, index: int) -> frozenset:
        """The periods of the every-blocks op ``index`` is in."""
        return frozenset(k for k, start, stop in self.blocks if start <= index < stop)

    def phase_of(self, index: int) -> int:
        """How many writes ended before op ``index`` was made: the values it reads."""
        return sum(1 for w in self.writes if w.stop <= index)

    @property
    def periods(self) -> tuple[int, ...]:
        return tuple(sorted({k for k, _, _ in self.blocks}))


class ReplicaContext:
    """``r``: one replica of a data-parallel fit, as a strategy function sees it.

    Attributes
    ----------
    gradients : dict
        ``{Variable: Tensor}`` in the optimizer's order: the gradient of the fit's loss on this
        replica's shard.
    weight : Tensor
        The scalar that makes the sum over replicas of ``r.weight * g`` the gradient of the global
        batch's loss (a mean loss: this replica's share of the rows; a sum loss: 1).
    variables : list of Variable
        The trainable variables (those with a gradient).
    replica_id, step : Tensor
        int64 scalars: this replica's rank, and the step (1-based).
    num_replicas : int
    """

    def __init__(self, record: Record, gradients: VariableDict):
        self._record, self._gradients = record, gradients
        self._slots: dict[tuple[str, str], Variable] = {}
        self._open: list = []

    # -- what a replica sees ------------------------------------------------------------------
    @property
    def gradients(self) -> VariableDict:
        return VariableDict(self._gradients)

    @property
    def variables(self) -> list[Variable]:
        return list(self._gradients)

    @property
    def num_replicas(self) -> int:
        return self._record.replicas

    @property
    def replica_id(self) -> Tensor:
        return self._record.graph.get(self._record.inputs["id"])

    @property
    def step(self) -> Tensor:
        return self._record.graph.get(self._record.inputs["step"])

    @property
    def weight(self) -> Tensor:
        rec = self._record
        if rec.reduction is None:
            if rec.record.loss is None:
                raise self._error("r.weight needs the fit's loss: train with optimizer.minimize(loss)")
            try:
                rec.reduction = weights.batch_reduction(rec.graph, rec.record.loss)
            except StrategyError as e:
                raise self._error(str(e)) from None
        return rec.graph.get(rec.inputs["weight"])

    def tensor(self, t) -> Tensor:
        """The replica program's tensor ``t`` names: a tensor of the fit's graph (the loss, a
        placeholder ...) or its name. The program is a copy of that graph: its tensors, not the
        user's, go into the strategy's ops."""
        name = t if isinstance(t, str) else getattr(t, "name", None)
        graph = self._record.graph
        if not isinstance(name, str) or name.partition(":")[0] not in graph:
            raise self._error(f"r.tensor: the fit's graph has no tensor {name!r}")
        found = graph.get(name)
        if not isinstance(found, Tensor):
            raise self._error(f"r.tensor: {name!r} is an operation, not a tensor")
        return found

    # -- what a replica does -------------------------------------------------------------------
    def apply(self, gradients) -> None:
        """Apply the fit's own optimizer (the one of ``train = opt.minimize(loss)``, slots and all)
        to ``gradients`` (``{variable: gradient}``, one for every variable of :attr:`gradients`)."""
        values = self._gradient_values(gradients)
        with self._write("apply") as write:
            write.writes.extend(_copy_update(self._record, values))

    def assign(self, values) -> None:
        """Set variables or slots: ``{target: value, ...}``, a parallel assignment (every value is
        read before any target changes); later ops read the new values."""
        if not isinstance(values, dict):
            raise self._error(f"r.assign takes a dict {{variable: value}}, got {type(values).__name__}")
        pairs = [(self._target(target), value) for target, value in values.items()]
        with self._write("assign") as write, self._record.graph.name_scope("assign"):
            for target, value in pairs:
                write.writes.append(ops.assign(target, value).op)

    @contextlib.contextmanager
    def every(self, k: int):
        """Inside, what the strategy builds runs only on steps where ``step % k == 0``; on other
        steps it does not run at all (no communication)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise self._error(f"r.every(k) needs a positive integer, got {k!r}")
        graph = self._record.graph
        start = len(graph.operations)
        self._open.append(int(k))
        try:
            with graph.name_scope(f"every_{int(k)}"):
                yield
        finally:
            self._open.pop()
            self._record.blocks.append((int(k), start, len(graph.operations)))

    def slot(self, v, name: str, init=None) -> Variable:
        """Per-replica state shaped like variable ``v``: starts as ``v``'s value at the start of the
        fit (or ``init``: a number, an array or an initializer name), saved in checkpoints."""
        var = self._target(v, what="r.slot")
        key = (var.name, str(name))
        found = self._slots.get(key)
        if found is None:
            rec = self._record
            found = ops.variable(
                f"{var.name}/{name}", var.shape, "zeros" if init is None else init, var.dtype, trainable=False
            )
            self._slots[key] = found
            rec.slots[found.name] = var.name if init is None else None
        return found

    # -- checks -----------------------------------------------------------------------------
    def _error(self, message: str) -> StrategyError:
        return StrategyError(f"strategy {self._record.strategy!r}, {_where(user_source())}: {message}")

    @contextlib.contextmanager
    def _write(self, kind: str):
        rec = self._record
        write = Write(kind, len(rec.graph.operations), source=user_source())
        yield write
        write.stop = len(rec.graph.operations)
        rec.writes.append(write)

    def _target(self, target, what: str = "r.assign") -> Variable:
        """The program's variable (a variable of the graph or a slot) that ``target`` names."""
        graph = self._record.graph
        name = target if isinstance(target, str) else getattr(target, "name", None)
        found = None
        if isinstance(target, (Variable, str)) and name in graph:
            found = graph.get(name)
        if not isinstance(found, Variable):
            shown = repr(name) if name is not None else type(target).__name__
            made = f" (a {target.op.type} op)" if isinstance(target, Tensor) else ""
            raise self._error(f"{what} needs a variable or a slot, got {shown}{made}")
        return found

    def _gradient_values(self, gradients) -> dict[str, Tensor]:
        if not isinstance(gradients, dict):
            raise self._error(f"r.apply takes a dict {{variable: gradient}}, got {type(gradients).__name__}")
        values = {}
        for key, value in gradients.items():
            var = self._target(key, what="r.apply")
            if var not in self._gradients:
                raise self._error(f"r.apply: {var.name!r} is not a trainable variable of the fit's optimizer")
            if not isinstance(value, Tensor) or value.graph is not self._record.graph:
                value = ops.constant(value, dtype=var.dtype) if not isinstance(value, Tensor) else value
            if value.graph is not self._record.graph:
                raise self._error(f"r.apply: the gradient of {var.name!r} belongs to another graph")
            if tuple(value.shape or ()) != tuple(var.shape) or value.dtype != var.dtype:
                raise self._error(
                    f"r.apply: the gradient of {var.name!r} is {value.dtype} {value.shape}; "
                    f"the variable is {var.dtype} {var.shape}"
                )
            values[var.name] = value
        missing = [v.name for v in self._gradients if v.name not in values]
        if missing:
            raise self._error(f"r.apply needs a gradient for every variable; missing: {', '.join(missing)}")
        return values


def _copy_update(rec: Record, values: dict[str, Tensor]) -> list[Operation]:
    """A copy of the fit's optimizer update (every op between the gradients and the update op)
    with ``values`` (variable name -> tensor) in place of the gradients; its stateful ops."""
    graph, record = rec.graph, rec.record
    train = graph.operation(record.update)
    grads = {graph.get(g): values[v] for g, v in record.gradients}
    forward = needed_ops(graph, [t.op for t in grads])
    mapped: dict = dict(grads)
    copies: dict[Operation, Operation] = {}
    writes = []
    source = user_source()
    update = needed_ops(graph, [train])
    with graph.name_scope("apply"):
        for op in graph.operations[: rec.base]:
            if op not in update or op in forward or op.type in _INPUTS:
                continue
            inputs = [mapped.get(t, t) for t in op.inputs]
            control = [copies.get(c, c) for c in op.control_inputs]
            copy = graph.add_op(op.type, inputs, op.attrs, name=op.name, control_inputs=control, source=source)
            copies[op] = copy
            mapped.update(zip(op.outputs, copy.outputs, strict=True))
            if op.opdef.stateful:
                writes.append(copy)
    return writes


def _where(source) -> str:
    """``line 4: r.assign(...)``, the user's line (in a cell, its line number in the cell)."""
    if source is None:
        return "line ?"
    return f"line {source.lineno}: {source.code}" if source.code else f"line {source.lineno}"


def _user_frame(error: BaseException):
    """The innermost frame of ``error``'s traceback outside the workbench package, as a Source."""
    from workbench.graph.records import Source
    import linecache

    found, tb = None, error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep):
            found = Source(filename, tb.tb_lineno, linecache.getline(filename, tb.tb_lineno).strip())
        tb = tb.tb_next
    return found


def build(graph: Graph, train: str, strategy, replicas: int, fetches=(), feeds=None) -> Record:
    """Call ``strategy`` (a :class:`~workbench.strategies.registry.Strategy`) on a replica of ``graph``'s
    fit of ``train`` with ``replicas`` replicas; the record of what it built. ``feeds``: placeholder
    name to the value fed at every step (``fit(feed_dict=...)``), bound into the program as constants."""
    record = graph.training.get(train)
    if record is None:
        known = ", ".join(repr(n) for n in graph.training) or "none"
        raise StrategyError(
            f"strategy {strategy.name!r}: {train!r} is not an optimizer update; a strategy needs the "
            f"operation optimizer.minimize() returned (this graph has: {known})"
        )
    copy, _ = rebuild(bind_placeholders(graph, feeds or {}))
    copy.training = dict(graph.training)
    loss_dtype = copy.get(record.loss).dtype if record.loss else copy.get(record.gradients[0][0]).dtype
    rec = Record(strategy.name, copy, len(copy.operations), int(replicas), record, tuple(fetches), {}, None)
    with copy.as_default(), copy.name_scope("replica"):
        rec.inputs["id"] = ops.placeholder("id", shape=(), dtype="int64").name
        rec.inputs["weight"] = ops.placeholder("weight", shape=(), dtype=loss_dtype).name
        rec.inputs["step"] = ops.placeholder("step", shape=(), dtype="int64").name
    rec.base = len(copy.operations)
    gradients = VariableDict((copy.get(v), copy.get(g)) for g, v in record.gradients)
    r = ReplicaContext(rec, gradients)
    try:
        with copy.as_default(), collective.replicas(replicas), copy.name_scope(strategy.name):
            strategy.fn(r)
    except StrategyError:
        raise
    except WorkbenchError as e:
        first = str(e).split("\n")[0]
        raise StrategyError(f"strategy {strategy.name!r}, {_where(_user_frame(e))}: {type(e).__name__}: {first}") from e
    _check(rec, strategy)
    return rec


def _check(rec: Record, strategy) -> None:
    """StrategyError for a strategy that writes nothing, or uses a value of an every-block outside it."""
    if not rec.writes:
        raise StrategyError(
            f"strategy {rec.strategy!r}, {_where(strategy.source())}: it never calls r.apply or r.assign, "
            "so training would change nothing"
        )
    ops_ = rec.graph.operations
    for i in range(rec.base, len(ops_)):
        op = ops_[i]
        block = rec.block_of(i)
        for t in op.inputs:
            j = t.op.index
            if j >= rec.base and t.op.type != "variable" and not rec.block_of(j) <= block:
                k = min(rec.block_of(j) - block)
                raise StrategyError(
                    f"strategy {rec.strategy!r}, {_where(op.source)}: uses {t.name!r}, computed inside "
                    f"'with r.every({k})', outside that block (it does not exist on the other steps)"
                )
