"""Strategy functions on a cluster: the all-reduce engine's members run a strategy's replica program.

:func:`make` is what ``Session.fit(..., strategy=<a strategy function>)`` uses on a cluster session:
the client builds the replica program once (:class:`~workbench.strategies.program.ReplicaProgram`),
ships every variant it will need as graph JSON (:class:`~workbench.cluster.collective.strategy_replica.StrategyProgram`),
and :class:`StrategyEngine` runs it exactly as :class:`~workbench.cluster.collective.allreduce.AllReduceEngine`
runs a training step (one pinned task per member and step, the same shards, windows, syncs, restarts),
with the members' tasks of :mod:`workbench.cluster.collective.strategy_replica`. The host copy of a sync is rank
0's state; :meth:`StrategyEngine.variables` gives the graph's variables of it.
"""

from __future__ import annotations

import numpy as np

from workbench.cluster import failures
from workbench.cluster.collective.allreduce import AllReduceEngine, fit_keywords
from workbench.cluster.program import worker_device
from workbench.cluster.collective.stat_combine import graph_stat_rules, norm_variables
from workbench.cluster.collective.strategy_replica import StrategyProgram, run_strategy_step, start_strategy_replica
from workbench.errors import ClusterError
from workbench.graph.batch_reduction import fetch_reduction, loss_reduction
from workbench.strategies.program import ReplicaProgram
from workbench.stragglers import coerce as coerce_stragglers

#: Checkpoint members of every rank's own state: ``replicas/<rank>/<name>``, as the simulation names them.
PREFIX = "replicas/"


def strategy_program(request, program: ReplicaProgram) -> StrategyProgram:
    """The plain data the workers need of ``program`` for the steps of ``request``."""
    dues = sorted({program.due(step) for step in range(1, request.steps + 1)}, key=sorted)
    variants = tuple((tuple(sorted(due)), program.variant(due).to_json()) for due in dues)
    graph = program.record.graph
    used = {op.name for due in dues for op in program.variant(due).operations if op.type == "placeholder"}
    feeds = tuple(name for name in request.data if name in used)
    device, options = worker_device(request.device.kind, request.device.options)
    inputs = program.inputs
    stats = tuple(request.stats.values())
    norms, gradients = stat_gradients(program, stats)
    return StrategyProgram(
        strategy=program.name,
        variants=variants,
        periods=program.periods,
        feeds=feeds,
        inputs=tuple(inputs.items()),
        weight_dtype=graph.get(inputs["weight"]).dtype,
        fetches=tuple(request.fetches.values()),
        fetch_reductions=tuple(fetch_reduction(request.graph, name) for name in request.fetches.values()),
        loss_reduction=_loss_reduction(program, norms=bool(gradients)),
        seed=request.seed,
        device=device,
        device_options=options,
        stats=stats,
        stat_norms=norms,
        stat_gradients=gradients,
    )


def _loss_reduction(program: ReplicaProgram, norms: bool) -> str:
    """How the fit's loss reduces the rows: what ``r.weight`` is fed, and (``norms``) how the gradient
    norms of ``fit(stats=k)`` weight each shard's gradient (a loss neither a mean nor a sum is refused
    with the all-reduce engine's error)."""
    if program.uses_weight():
        return program.reduction()
    loss = program.record.record.loss
    if not (norms and loss):
        return "mean"
    try:
        return loss_reduction(program.record.graph, loss)
    except ClusterError as e:
        raise ClusterError(
            f"fit(stats=...) with strategy {program.name!r} reports gradient norms of the global batch's loss, "
            f"which must be a mean or a sum over the rows: {e}"
        ) from None


def stat_gradients(program: ReplicaProgram, stats: tuple) -> tuple[tuple, tuple]:
    """For each of ``stats``: the index of the gradient whose global-batch norm it reports (a ``grad_norm``),
    or -1; and those gradients (the shard's, tensors of the replica program)."""
    gradient_of = {variable: gradient for gradient, variable in program.record.record.gradients}
    norms, gradients = [], []
    for variable in norm_variables(stats):
        if variable is None or variable not in gradient_of:
            norms.append(-1)
            continue
        if gradient_of[variable] not in gradients:
            gradients.append(gradient_of[variable])
        norms.append(gradients.index(gradient_of[variable]))
    return tuple(norms), tuple(gradients)


class StrategyEngine(AllReduceEngine):
    """:class:`AllReduceEngine` whose members run a strategy function's replica program, its steps
    driven by the coordinator as the engine's (:mod:`workbench.cluster.coordinated`)."""

    def __init__(self, client, program: StrategyProgram, replica_program: ReplicaProgram, graph_variables, **kwargs):
        self.replica_program = replica_program
        self.graph_variables = list(graph_variables)
        super().__init__(client, program, **kwargs)
        self.strategy = program.strategy

    # -- every rank's own state: what a checkpoint holds and a new generation starts from ----------
    def state_specs(self) -> dict:
        graph = self.replica_program.record.graph
        names = self.replica_program.state_variables()
        ranks = range(self.max_replicas or 1)
        return {f"{PREFIX}{i}/{n}": (graph.get(n).shape, graph.get(n).dtype) for i in ranks for n in names}

    def start(self, variables: dict, step: int) -> None:
        slots = self.replica_program.initial_slots(variables, self.program.seed)
        names = self.replica_program.state_variables()
        own = {**slots, **{n: variables[n] for n in self.graph_variables}}
        ranks = range(self.max_replicas or 1)
        states = [{n: variables.get(f"{PREFIX}{i}/{n}", own[n]) for n in names} for i in ranks]
        self.rank_states = ([{n: np.array(v, copy=True) for n, v in st.items()} for st in states], int(step))
        super().start(states[0], step)

    def variables(self) -> tuple[dict, int]:
        """Rank 0's values of the graph's variables, and their step."""
        host, step = super().variables()
        return {n: host[n] for n in self.graph_variables}, step

    def checkpoint_state(self) -> dict:
        return {f"{PREFIX}{i}/{n}": v for i, state in enumerate(self._states(self.host[1])) for n, v in state.items()}

    def _states(self, step: int) -> list[dict]:
        """Every rank's state at ``step`` (the host copy's): each its own when they came home together."""
        states, at = self.rank_states
        if at == step:
            return states
        return [self.host[0]] * len(states)

    def _bring_home(self, step: int, results: list[dict]) -> None:
        self.rank_states = ([r["variables"] for r in results], step)  # every rank's own, for the next generation
        super()._bring_home(step, results)

    def _outcome(self, step: int, results: list[dict]):
        outcome = super()._outcome(step, results)
        outcome.metrics["collectives"] = max(r["collectives"] for r in results)
        return outcome

    def _place_states(self, members: list[str]) -> tuple:
        """The program on every member, and each rank's own state on its member only."""
        states = self._states(self.host[1])
        if len(states) != len(members):  # fewer workers after a restart: every replica from rank 0's state
            states = [states[0]] * len(members)
        (program,) = self._scatter([self.program])
        return program, [self._scatter([state], [worker])[0] for state, worker in zip(states, members, strict=True)]

    def _start_task(self, program, state, step: int, members: int) -> tuple:
        return start_strategy_replica, (program, state, step, self.group, 0), {}

    def _step_task(self, rank: int, args: tuple, sync: bool, stats_due: bool) -> tuple:
        """Every rank brings its state home at a sync (not rank 0 alone): replicas may differ between
        averaging steps (local SGD's optimizer slots). Every rank reports its shard's statistics."""
        return run_strategy_step, (*args[:7], sync, *args[8:]), {"stats": stats_due}

    def _join_rules(self) -> list:
        return graph_stat_rules(self.replica_program.record.graph, self.program.feeds, self.program.stats)


def make(request, client, options, events, strategy):
    """The guarded engine of a fit of ``strategy`` (a strategy function) on ``client``'s cluster."""
    from workbench.cluster.malloc import ReuseFreedMemory

    engine = failures.guard(None, client, request.data)
    with engine.translated():
        if not request.device.host_arrays:
            raise ClusterError(f"strategy functions run on CPU workers for now, not {request.device.name!r}")
        failures.check_memory(client, request.data)
        client.register_plugin(ReuseFreedMemory())
        workers = options.worker_count(client)
        replicas = options.replicas or workers
        if replicas > workers:
            raise ClusterError(
                f"a strategy runs one replica per worker; replicas={replicas} exceeds the {workers} workers"
            )
        if options.backup_replicas:
            raise ClusterError(
                f"backup_replicas={options.backup_replicas} is trained by strategy='allreduce' (the default) or "
                f"'parameter_server', not by the strategy function {strategy!r}"
            )
        stragglers = coerce_stragglers(request.stragglers, replicas)
        fetches = tuple(request.fetches.values())
        built = ReplicaProgram.build(request.graph, request.train, strategy, replicas, fetches, request.feeds)
        shipped = strategy_program(request, built)
        engine.engine = StrategyEngine(
            client,
            shipped,
            built,
            [v.name for v in request.graph.variables],
            data={n: request.data[n] for n in shipped.feeds},  # NumPy or dask arrays (see AllReduceEngine)
            batch_size=request.batch_size,
            batch_seed=request.batch_seed,
            replicas=replicas,
            stragglers=stragglers,
            **fit_keywords(request, options, events),
        )
    return engine
