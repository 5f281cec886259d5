"""Statistics of a model computed by the graph itself: ops added under the ``stats`` name scope.

:func:`watch` adds, for a training update, one scalar op per statistic:

- ``grad_norm``: the L2 norm of each trainable variable's gradient (drawn on the variable);
- ``mean`` and ``std``: the mean and standard deviation of each forward op's output
  (every op the loss depends on, placeholders, variables and constants left out).

Each statistic op is named ``stats/<op>/<stat>`` (``stats/layer1/w/grad_norm``), so a
graph saved with them (``to_json``) keeps them, :func:`probes` finds them again, and
views fold the ``stats`` scope like the gradients. Training fetches them with the
step every ``k`` steps (``Session.fit(..., stats=k)``): the numbers are those of that
very step (its batch, its gradients), computed by the same compiled plan, and a
cluster prunes them from the programs it ships.

>>> import workbench as wb
>>> g = wb.Graph(name="g")
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 2))
...     w = wb.variable("w", shape=(2, 1), init=1.0)
...     loss = wb.mean(wb.relu(x @ w), name="loss")
...     train = wb.optimizers.SGD(0.1).minimize(loss)
>>> [(p.op, p.stat) for p in watch(train, stats=("grad_norm", "mean"))]
[('w', 'grad_norm'), ('matmul', 'mean'), ('relu', 'mean'), ('loss', 'mean')]
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench import ops
from workbench.errors import ArgumentError, GraphError
from workbench.graph.core import Graph, Operation, Tensor, get_default_graph
from workbench.ops.registry import is_float

SCOPE = "stats"
#: The statistics :func:`watch` knows, in the order it adds them.
STATS = ("grad_norm", "mean", "std")
_NOT_ACTIVATIONS = ("placeholder", "variable", "constant")


@dataclass(frozen=True)
class Probe:
    """One statistic op: ``stat`` of the op ``op``, computed by the scalar tensor ``tensor``."""

    op: str
    stat: str
    tensor: str

    @property
    def label(self) -> str:
        """``"<op>/<stat>"``: the key of the statistic in ``Step.stats`` and ``History.stats``."""
        return f"{self.op}/{self.stat}"


def probes(graph: Graph) -> list[Probe]:
    """The statistic ops already in ``graph`` (added by :func:`watch`), in graph order."""
    found = []
    for op in graph.operations:
        if not op.name.startswith(SCOPE + "/") or not op.outputs:
            continue
        target, _, stat = op.name[len(SCOPE) + 1 :].rpartition("/")
        if stat in STATS and target in graph:
            found.append(Probe(target, stat, op.outputs[0].name))
    return found


def check_stats(stats) -> tuple[str, ...]:
    """``stats`` (a name or names from :data:`STATS`) as a tuple, or ArgumentError."""
    stats = (stats,) if isinstance(stats, str) else tuple(stats)
    unknown = [s for s in stats if s not in STATS]
    if unknown or not stats:
        named = unknown[0] if unknown else stats
        raise ArgumentError(f"unknown statistic {named!r}; statistics are {', '.join(STATS)}")
    return stats


def watch(train=None, stats=STATS, *, graph: Graph | None = None) -> list[Probe]:
    """Add the statistic ops of ``stats`` for the update ``train`` to its graph (once: ops already
    there are kept) and return every probe of the graph.

    Parameters
    ----------
    train : Operation, or its name, optional
        An update made by an optimizer (``opt.minimize(loss)``); by default every update of ``graph``.
    stats : str or sequence of str
        Which of :data:`STATS`.
    graph : Graph, optional
        The graph (by default ``train``'s, or the default graph).
    """
    stats = check_stats(stats)
    if graph is None:
        graph = train.graph if isinstance(train, (Operation, Tensor)) else get_default_graph()
    records = _records(graph, train)
    have = {(p.op, p.stat) for p in probes(graph)}
    wanted: list[tuple[str, str, Tensor]] = []
    if "grad_norm" in stats:
        for record in records:
            wanted += [(var, "grad_norm", graph.get(grad)) for grad, var in record.gradients]
    for op in _forward_ops(graph, records):
        wanted += [(op.name, stat, op.outputs[0]) for stat in ("mean", "std") if stat in stats]
    with graph.as_default():
        for target, stat, tensor in wanted:
            if (target, stat) not in have:
                _add(graph, target, stat, tensor)
                have.add((target, stat))
    return probes(graph)


def _records(graph: Graph, train) -> list:
    if train is None:
        return list(graph.training.values())
    name = train if isinstance(train, str) else train.name
    op = graph.get(name)
    name = op.name if isinstance(op, Operation) else op.op.name
    if name not in graph.training:
        raise GraphError(f"{name!r} is not an optimizer's update: watch the op that opt.minimize(loss) returned")
    return [graph.training[name]]


def _forward_ops(graph: Graph, records) -> list[Operation]:
    """Ops the losses depend on, in graph order, with a float output (no statistics of statistics)."""
    seen: set[str] = set()
    todo = [graph.get(r.loss).op for r in records if r.loss]
    while todo:
        op = todo.pop()
        if op.name not in seen:
            seen.add(op.name)
            todo += [t.op for t in op.inputs]
    return [
        op
        for op in graph.operations
        if op.name in seen
        and op.type not in _NOT_ACTIVATIONS
        and op.outputs
        and is_float(op.outputs[0].dtype)
        and not op.name.startswith(SCOPE + "/")
    ]


def _add(graph: Graph, target: str, stat: str, tensor: Tensor) -> None:
    with graph.name_scope(SCOPE), graph.name_scope(target):
        x = tensor if tensor.dtype in ("float32", "float64") else ops.cast(tensor, "float32")
        if stat == "grad_norm":
            value = ops.sqrt(ops.sum(x * x), name=stat)
        elif stat == "mean":
            value = ops.mean(x, name=stat)
        else:
            centered = x - ops.mean(x)
            value = ops.sqrt(ops.mean(centered * centered), name=stat)
    if value.op.name != f"{SCOPE}/{target}/{stat}":
        raise GraphError(f"graph {graph.name!r} already has an operation named {SCOPE}/{target}/{stat}")
