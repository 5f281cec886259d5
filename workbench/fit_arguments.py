"""``Session.fit``'s arguments, checked and turned into what the loop runs: the
:class:`~workbench.fitloop.FitRequest` (the data, fetches and fixed feeds checked against the graph,
the batch order's seed) and the step engine (local, or the cluster strategy's with its
:class:`~workbench.cluster.options.ClusterOptions`).

The session's own plumbing, apart from it: :meth:`workbench.Session.fit` calls :func:`request` and
:func:`engine`, then runs the :class:`~workbench.fitloop.FitLoop`.
"""

from __future__ import annotations

import dataclasses
import os

from workbench import checkpoint
from workbench import stragglers as straggler_models
from workbench.clock import Clock
from workbench.errors import ArgumentError, ClusterError, FeedError
from workbench.fitloop import FitRequest, LocalSteps
from workbench.graph.probes import probes, watch
from workbench.training import check_data, is_dask_array


def request(
    session, train, data, batch_size, steps, epochs, fetches, check_numerics, stats=None, feed_dict=None,
    checkpoint_dir=None, stragglers=None,
) -> FitRequest:  # fmt: skip
    """The checked arguments of ``session.fit`` as plain values, for the loop and its engine.

    A fit into a ``checkpoint_dir`` that an earlier fit of this session wrote draws the batches of
    that fit (it continues it), not those of a new one.
    """
    arrays = examples(session, data)
    n = check_data(arrays)
    if steps is None:
        steps = (epochs or 1) * (n // batch_size)
    labels, fetch_list = fetch_labels(fetches)
    session._fits += 1
    made = FitRequest(
        graph=session.graph,
        train=session._fetch_name(train),
        data=arrays,
        batch_size=batch_size,
        steps=steps,
        fetches={label: session._fetch_name(f) for label, f in zip(labels, fetch_list)},
        batch_seed=(session.seed, session._fits),
        seed=session.seed,
        device=session.device,
        check_numerics=check_numerics,
        stats={} if stats is None else statistics(session, train),
        stats_every=stats or 0,
        feeds=fixed_feeds(session, feed_dict, arrays),
        stragglers=stragglers,
    )
    if checkpoint_dir is not None:  # resuming here: the batches of the fit it continues
        where = os.path.abspath(checkpoint.check_path(checkpoint_dir))
        made = dataclasses.replace(made, batch_seed=session._batch_seeds.setdefault(where, made.batch_seed))
    return made


def engine(session, request: FitRequest, replicas, strategy, checkpoint_every, clock=None, **cluster):
    """The step engine of a fit and how often its loop checkpoints: the session's own steps, or the
    cluster strategy's engine (``cluster``: window, sync_every, workers, backup_replicas, step_timeout,
    segment_steps).
    ``clock``: the simulation's :class:`~workbench.clock.Clock` (the wall clock when None)."""
    clock = clock or Clock()
    if session.client is None:
        return local_engine(
            request, session, replicas, strategy, cluster.get("backup_replicas", 0), clock
        ), checkpoint_every
    if clock.virtual:
        raise ArgumentError(
            "fit(clock='virtual') is the one-process simulation's clock: a cluster fit runs on the wall clock "
            "(create the session with cluster=False to simulate the replicas here)"
        )
    from workbench.cluster.engines import make_engine
    from workbench.cluster.options import ClusterOptions

    workers = cluster["workers"]
    chosen = workers if workers is None or isinstance(workers, str) else tuple(workers)
    function = runs_a_strategy_function(strategy)
    if not function and forward_collectives(request.graph):
        # the replicas exchange statistics in their forward pass (a synchronized batch norm): the
        # "allreduce" strategy function's replica programs run those collectives; the engines cannot
        refuse_forward_collectives(request, strategy, cluster["backup_replicas"])
        function, strategy = True, "allreduce"
    if session._resident is None:
        from workbench.cluster.resident import ResidentData

        session._resident = ResidentData()  # its data on the workers, kept from fit to fit while unchanged
    options = ClusterOptions(
        None if function else strategy,
        replicas,
        cluster["window"],
        cluster["sync_every"],
        chosen,
        cluster["backup_replicas"],
        cluster["step_timeout"],
        resident=session._resident,
        segment_steps=cluster.get("segment_steps", 16),
    )
    every = checkpoint_every or cluster["sync_every"]
    if function:  # the members run the strategy's replica program (rank 0 reports fit(stats=k))
        from workbench.cluster.collective import strategy_engine

        return strategy_engine.make(request, session.client, options, session.events, strategy), every
    return make_engine(request, session.client, options, session.events), every


def stragglers_for(value, replicas, backup_replicas=0):
    """``fit(stragglers=...)`` checked (:func:`workbench.stragglers.coerce`) against the replicas asked
    for (``replicas + backup_replicas`` of them run; None: one per worker, checked by the engine)."""
    total = None if replicas is None or isinstance(backup_replicas, bool) else replicas + int(backup_replicas or 0)
    return straggler_models.coerce(value, total)


#: ``fit(strategy=ASYNC)``: asynchronous SGD (a parameter-server role applies each gradient as it arrives).
ASYNC = "async"


def local_engine(request: FitRequest, session, replicas, strategy, backups=0, clock=None):
    """Local training, or with ``replicas``, a strategy function, stragglers, backups or the virtual
    clock the one-process simulation of the replicas (:mod:`workbench.simulation`); with
    ``strategy="async"`` its asynchronous baseline (:mod:`workbench.lab_async`)."""
    clock = clock or Clock()
    stragglers = request.stragglers
    if stragglers is not None and strategy in (None, "local") and replicas in (None, 1) and not backups:
        raise ArgumentError(
            "fit(stragglers=...) delays replicas: give replicas=R (simulated in this process) or a cluster session"
        )
    if strategy == ASYNC:
        return local_async(request, replicas, backups, clock)
    lab = stragglers is not None or backups or clock.virtual
    if strategy in (None, "local") and replicas in (None, 1) and not lab:
        return LocalSteps(session, request)
    if strategy == "parameter_server":
        raise ClusterError(
            "strategy='parameter_server' needs a cluster: create the session with cluster='local' or an address"
        )
    synced = forward_collectives(request.graph)
    if backups and synced:
        raise ArgumentError(
            f"the graph exchanges values between replicas in its forward pass ({synced[0]!r}: a "
            "synchronized batch norm), which the simulation with backup replicas does not run (a backup "
            "left out of a step would hold its peers' forward pass); leave backup_replicas out"
        )
    from workbench.simulation import SimulatedReplicas

    chosen = "allreduce" if strategy in (None, "local") else strategy
    return SimulatedReplicas(request, chosen, replicas or 1, int(backups or 0), stragglers, clock)


def refuse_forward_collectives(request: FitRequest, strategy, backups) -> None:
    """ClusterError when a cluster fit of a graph with collectives in its forward pass asks for an
    engine that runs each replica's forward pass on its own (the parameter server, asynchronous SGD,
    backup replicas): its batch norm would take each shard's moments, not the global batch's. Or for
    a GPU: the replica programs that run those collectives run on CPU workers for now."""
    synced = forward_collectives(request.graph)[0]
    asked = f"strategy={strategy!r}" if strategy not in (None, "allreduce") else None
    if asked is None and backups:
        asked = f"backup_replicas={backups}"
    if asked is not None:
        raise ClusterError(
            f"{asked} cannot train this graph: it exchanges values between replicas in its forward pass "
            f"({synced!r}: a synchronized batch norm, whose moments are the global batch's), and that "
            "engine runs each replica's forward pass on its own; train it with strategy='allreduce' "
            "(the default) or a strategy function, without backup replicas"
        )
    if request.device.kind != "cpu":
        raise ClusterError(
            f"this graph exchanges values between replicas in its forward pass ({synced!r}: a synchronized "
            f"batch norm), which a cluster fit runs on CPU workers for now, not on {request.device.name!r}: "
            "create the session with device='cpu', or fit on one GPU without a cluster"
        )


def forward_collectives(graph) -> list[str]:
    """The collective ops the graph itself holds (``cross_replica_sum`` of batch norm's global moments),
    which only a replica program running on a communicator computes."""
    return [op.name for op in graph.operations if op.opdef.collective]


def local_async(request: FitRequest, replicas, backups=0, clock=None):
    """``strategy="async"`` without a cluster: the one-process simulation's asynchronous SGD
    (:mod:`workbench.lab_async`)."""
    from workbench.lab_async import AsyncReplicas

    if backups:
        raise ArgumentError(f"fit(strategy='async') has no backup replicas (backup_replicas={backups})")
    synced = forward_collectives(request.graph)
    if synced:
        raise ArgumentError(
            f"fit(strategy='async') cannot train this graph: it exchanges values between replicas in its "
            f"forward pass ({synced[0]!r}: a synchronized batch norm), and asynchronous SGD runs each "
            "replica's forward pass on its own; use strategy='allreduce' (the default)"
        )
    return AsyncReplicas(request, replicas or 1, request.stragglers, clock or Clock())


def runs_a_strategy_function(strategy) -> bool:
    """Whether ``strategy`` names a strategy function (not one of the cluster's own engines)."""
    from workbench.cluster.engines import STRATEGIES
    from workbench.strategies import is_strategy, names

    if strategy is None or (isinstance(strategy, str) and strategy in STRATEGIES):
        return False
    if isinstance(strategy, str) and not is_strategy(strategy):
        raise ClusterError(
            f"unknown strategy {strategy!r}; strategies are {', '.join(sorted(STRATEGIES))} (cluster engines) "
            f"and {', '.join(names())} (registered strategy functions)"
        )
    return is_strategy(strategy)


def fixed_feeds(session, feed_dict, data: dict) -> dict:
    """``fit``'s ``feed_dict``: placeholder name to a checked host array, fed at every step."""
    if feed_dict is None:
        return {}
    if not isinstance(feed_dict, dict):
        raise FeedError(f"fit() feed_dict must be a dict from placeholders to values, got {type(feed_dict).__name__}")
    fixed = {}
    for key, value in feed_dict.items():
        ph = session._placeholder(key)
        if ph.name in data:
            raise FeedError(f"fit() feeds placeholder {ph.name!r} both in data (by rows) and in feed_dict")
        fixed[ph.name] = session._feed_value(ph, value)
    return fixed


def statistics(session, train) -> dict[str, str]:
    """Label to tensor of the graph's statistic ops (:func:`workbench.watch`'s defaults if it has none)."""
    found = probes(session.graph) or watch(session._fetch_name(train), graph=session.graph)
    return {p.label: p.tensor for p in found}


def examples(session, data: dict) -> dict:
    """Placeholder name to checked examples (dask arrays cast lazily)."""
    arrays = {}
    for key, value in data.items():
        ph = session._placeholder(key)
        arrays[ph.name] = (
            value.astype(ph.dtype) if is_dask_array(value) else session._feed_value(ph, value, any_length=True)
        )
    return arrays


def fetch_labels(fetches) -> tuple[list[str], list]:
    """``fit``'s fetches as labels and tensors (a dict, a list, or one fetch)."""
    if fetches is None:
        return [], []
    if isinstance(fetches, dict):
        return list(fetches), list(fetches.values())
    if not isinstance(fetches, (list, tuple)):
        fetches = [fetches]
    return [f if isinstance(f, str) else f.name for f in fetches], list(fetches)
