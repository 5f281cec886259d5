"""A replica's program: what a strategy built, lowered to one graph per set of due every-blocks.

``with r.every(k):`` never becomes a select that computes both sides: a step runs the variant
of the program whose blocks are due (``step % k == 0`` for each ``k`` of the block), and the
other variants' ops simply are not in it. Lowering a variant copies the recorded graph without
the blocks that are not due, and points every read of a variable made after a write (an
``r.apply`` or ``r.assign`` that is in the variant) at the value that write made: what makes
"whatever comes after one reads the values it wrote" true in a dataflow graph whose variable
reads otherwise see the values at the start of a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.errors import StrategyError
from workbench.graph.core import Graph, Operation
from workbench.graph.plan import written_variables
from workbench.ops.state import initial_value
from workbench.strategies import weights
from workbench.strategies.context import Record, build
from workbench.strategies.registry import Strategy, resolve

UPDATE = "replica/update"


@dataclass
class ReplicaProgram:
    """One replica's program of a fit with a strategy: the same for every replica (its rank, weight and
    step are fed).

    Attributes
    ----------
    strategy : Strategy
    record : Record
        What the strategy function built (see :mod:`workbench.strategies.context`).
    fetches : tuple of str
        The fit's fetches each replica also computes.
    """

    strategy: Strategy
    record: Record
    fetches: tuple = ()
    _variants: dict = field(default_factory=dict)

    @classmethod
    def build(cls, graph: Graph, train: str, strategy, replicas: int, fetches=(), feeds=None) -> ReplicaProgram:
        """Call ``strategy`` (a name, a Strategy or a function of ``r``) for a fit of ``train`` on ``graph``
        (``feeds``: what ``fit(feed_dict=...)`` feeds at every step)."""
        chosen = resolve(strategy)
        fetches = tuple(fetches)
        return cls(chosen, build(graph, train, chosen, replicas, fetches, feeds), fetches)

    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def periods(self) -> tuple[int, ...]:
        """The ``k`` of every ``r.every(k)`` block."""
        return self.record.periods

    @property
    def inputs(self) -> dict:
        """``"id"``, ``"weight"``, ``"step"`` -> the placeholder each replica is fed."""
        return dict(self.record.inputs)

    def due(self, step: int) -> frozenset:
        """The periods whose blocks run at ``step`` (1-based)."""
        return frozenset(k for k in self.periods if step % k == 0)

    def variant(self, due: frozenset) -> Graph:
        """The program of the steps where the blocks of ``due`` run (and no other): its update op is
        :data:`UPDATE`."""
        found = self._variants.get(due)
        if found is None:
            found = self._variants[due] = lower(self.record, due)
        return found

    def state_variables(self) -> list[str]:
        """Every variable a replica holds: the graph's, its optimizer's slots and the strategy's slots."""
        return [v.name for v in self.record.graph.variables]

    def reduction(self) -> str:
        """``"mean"`` or ``"sum"``: how the fit's loss reduces the batch (what ``r.weight`` is)."""
        rec = self.record
        if rec.reduction is None:
            rec.reduction = weights.batch_reduction(rec.graph, rec.record.loss) if rec.record.loss else "mean"
        return rec.reduction

    def uses_weight(self) -> bool:
        return self.record.reduction is not None

    def initial_slots(self, variables: dict, seed: int) -> dict[str, np.ndarray]:
        """The strategy's slots at the start of a fit from the fit's starting ``variables``."""
        out = {}
        graph = self.record.graph
        for name, source in self.record.slots.items():
            if source is not None:
                out[name] = np.array(variables[source], copy=True)
            else:
                out[name] = initial_value(name, graph.operation(name).attrs, seed)
        return out

    def slots(self) -> list[str]:
        return list(self.record.slots)


def lower(rec: Record, due: frozenset) -> Graph:
    """The graph of ``rec`` on steps where exactly the blocks of ``due`` run (see the module docstring)."""
    src = rec.graph
    new = Graph(name=src.name)
    new.training = dict(src.training)
    tensors: dict = {}
    copies: dict[Operation, Operation] = {}
    visible: dict[str, object] = {}  # variable name -> the tensor of its value now
    pending: dict[str, object] = {}
    phase = 0
    writes = {id(op) for w in rec.writes for op in w.writes}
    done = []
    for i, op in enumerate(src.operations):
        strategy_op = i >= rec.base and op.type != "variable"
        if strategy_op and not rec.block_of(i) <= due:
            continue
        now = rec.phase_of(i) if i >= rec.base else 0
        if now != phase:  # a write ended: what it wrote is what later ops read
            visible.update(pending)
            pending.clear()
            phase = now
        targets = _target_positions(op)
        inputs = []
        for k, t in enumerate(op.inputs):
            if strategy_op and t.op.type == "variable" and k not in targets and t.op.name in visible:
                inputs.append(visible[t.op.name])
            else:
                inputs.append(tensors[t])
        control = [copies[c] for c in op.control_inputs if c in copies]
        copy = new.add_op(op.type, inputs, op.attrs, name=op.name, control_inputs=control, source=op.source)
        copies[op] = copy
        tensors.update(zip(op.outputs, copy.outputs, strict=True))
        if id(op) in writes:
            done.append(copy)
            for name in written_variables(op):
                pending[name] = copy.outputs[0]
    new.add_op("no_op", (), {}, name=UPDATE, control_inputs=done)
    return new


def _target_positions(op: Operation) -> tuple[int, ...]:
    """The inputs of a stateful op that name the variables it writes (not values it reads)."""
    if op.opdef.writes is not None:
        return tuple(op.opdef.writes(op.attrs, len(op.inputs)))
    return (0,) if op.opdef.stateful and op.inputs else ()


def strategy_graph(train, strategy, replicas: int = 2, fetches=()) -> Graph:
    """One replica's program of a fit of ``train`` with ``strategy``, as a Graph to draw or inspect.

    Every ``with r.every(k):`` block is in it (as a name scope ``every_<k>``), the forward and
    backward pass, the strategy's ops and collectives, pruned to what the replica's update and
    the loss need; the replica's update is the op ``replica/update``. The graph is named
    ``<graph>-<strategy>``.

    Parameters
    ----------
    train : Operation
        The fit's update (``optimizer.minimize(loss)``).
    strategy : str, Strategy or function of ``r``
    replicas : int
        R, the replicas the program is built for (``r.num_replicas``, ``all_gather``'s axis).

    Examples
    --------
    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(None, 2))
    ...     w = wb.variable("w", shape=(2,), init="zeros")
    ...     train = wb.optimizers.SGD(0.1).minimize(wb.mean((wb.sum(x * w, axis=1) - 1.0) ** 2))
    >>> program = wb.strategy_graph(train, "allreduce", replicas=2)
    >>> sorted({op.type for op in program.operations if op.opdef.collective})
    ['all_reduce']
    """
    from workbench.graph.passes import prune

    graph = getattr(train, "graph", None)
    if not isinstance(graph, Graph):
        raise StrategyError(
            f"strategy_graph needs the fit's update operation (optimizer.minimize(loss)), got {train!r}"
        )
    program = ReplicaProgram.build(graph, train.name, strategy, replicas, fetches)
    full = program.variant(frozenset(program.periods))
    loss = program.record.record.loss
    drawn = prune(full, [UPDATE, *([loss] if loss else []), *program.fetches])
    drawn.name = f"{graph.name}-{program.name}"  # GraphView's title: "graph mlp-local_sgd"
    return drawn
