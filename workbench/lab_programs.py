"""The two plans the lab's simulated replicas run: one replica's gradients, and the fit's optimizer
applied to gradients handed in.

Synchronous SGD with backup replicas and asynchronous SGD (:mod:`workbench.lab_sync`,
:mod:`workbench.lab_async`) decide *which* gradients to apply and *when* from the replicas'
arrivals, so the exchange cannot sit inside one replica's plan as an ``all_reduce`` op: the
gradients come out of one plan (``gradient_plan``: a replica's shard in, its gradients and the
fit's fetches out) and go into another (``apply_plan``: the fit's optimizer, slots and all, fed the
gradients to apply). Both are compiled from one replica program (:mod:`workbench.strategies.program`)
whose strategy applies fed gradients, so the optimizer's update is the fit's own.
"""

from __future__ import annotations

import numpy as np

from workbench import ops
from workbench.errors import ArgumentError
from workbench.fitloop import FitRequest
from workbench.graph.batch_reduction import fetch_reduction
from workbench.graph.compile import compile_plan
from workbench.strategies.program import UPDATE, ReplicaProgram
from workbench.strategies.registry import Strategy


class LabPrograms:
    """The gradient and apply plans of one fit, and the state they share.

    Attributes
    ----------
    gradients : list of str
        The gradient tensors, in the optimizer's order.
    fed : list of str
        The placeholders the apply plan takes the gradients through, in the same order.
    kind : {"mean", "sum"}
        How the loss reduces the batch: what weights a replica's gradient in a sum over replicas.
    """

    def __init__(self, request: FitRequest):
        if request.stats_every:
            raise ArgumentError("fit(stats=...) is not computed by the simulation's stragglers, backups or async runs")
        self.request = request
        fed: list[str] = []

        def apply_fed_gradients(r):
            handed = {}
            for i, v in enumerate(r.variables):
                handed[v] = ops.placeholder(f"gradient_{i}", shape=v.shape, dtype=v.dtype)
                fed.append(handed[v].name)
            r.apply(handed)

        strategy = Strategy("handed_in", apply_fed_gradients)
        fetches = tuple(request.fetches.values())
        self.program = ReplicaProgram.build(request.graph, request.train, strategy, 1, fetches, request.feeds)
        self.graph = self.program.variant(frozenset())
        record = self.program.record.record
        self.gradients = [g for g, _ in record.gradients]
        self.variables = [v for _, v in record.gradients]
        self.fed = fed
        self.dtypes = [self.graph.get(g).dtype for g in self.gradients]
        self.kind = self.program.reduction() if record.loss else "mean"
        self.labels = list(request.fetches)
        self.reductions = [fetch_reduction(request.graph, name) for name in request.fetches.values()]

    def state_names(self) -> list[str]:
        """Every variable the plans read or write (the graph's, the optimizer's slots)."""
        return self.program.state_variables()

    def initial_state(self, variables: dict[str, np.ndarray]) -> dict:
        """The shared state at the start: ``variables``' values on the device (copies)."""
        put = self.request.device.put
        return {name: put(np.array(variables[name], copy=True)) for name in self.state_names()}

    def gradient_plan(self, state: dict):
        req = self.request
        fetches = [*self.gradients, *req.fetches.values()]
        return compile_plan(self.graph, fetches, list(req.data), req.device, state=state, seed=req.seed, own_state=True)

    def apply_plan(self, state: dict):
        req = self.request
        return compile_plan(self.graph, [UPDATE], self.fed, req.device, state=state, seed=req.seed, own_state=True)

    def compute(self, plan, rows: np.ndarray, offset: int, step: int) -> tuple[list, list]:
        """One replica's gradients (host copies) and fetches on ``rows`` of the data at ``step`` (1-based)."""
        req, device = self.request, self.request.device
        feeds = {name: device.put(a[rows]) for name, a in req.data.items()}
        values = plan.run(
            [feeds[name] for name in plan.feed_names],
            check_numerics=req.check_numerics,
            step=step - 1,
            row_offset=offset,
        )
        host = [np.array(device.to_host(v)) for v in values]
        return host[: len(self.gradients)], host[len(self.gradients) :]

    def apply(self, plan, gradients: list) -> None:
        """Run the optimizer's update with ``gradients`` (host arrays, the optimizer's order)."""
        put = self.request.device.put
        fed = dict(zip(self.fed, gradients, strict=True))
        plan.run([put(fed[name]) for name in plan.feed_names], check_numerics=self.request.check_numerics)

    def host_variables(self, state: dict) -> dict[str, np.ndarray]:
        """The graph's variables of ``state``, as host copies."""
        to_host = self.request.device.to_host
        graph = {v.name for v in self.request.graph.variables}
        return {n: np.array(to_host(v)) for n, v in state.items() if n in graph}


def shards(index: np.ndarray, count: int) -> tuple[list[np.ndarray], list[int]]:
    """The cluster's split of a batch's rows into ``count`` shards, and each shard's row offset."""
    parts = np.array_split(index, count)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])[:-1]]).astype(int).tolist()
    return parts, offsets
