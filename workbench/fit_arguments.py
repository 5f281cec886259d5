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
from workbench.errors import ClusterError, FeedError
from workbench.fitloop import FitRequest, LocalSteps
from workbench.graph.probes import probes, watch
from workbench.training import check_data, is_dask_array


def request(
    session, train, data, batch_size, steps, epochs, fetches, check_numerics, stats=None, feed_dict=None,
    checkpoint_dir=None,
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
    )
    if checkpoint_dir is not None:  # resuming here: the batches of the fit it continues
        where = os.path.abspath(checkpoint.check_path(checkpoint_dir))
        made = dataclasses.replace(made, batch_seed=session._batch_seeds.setdefault(where, made.batch_seed))
    return made


def engine(session, request: FitRequest, replicas, strategy, checkpoint_every, **cluster):
    """The step engine of a fit and how often its loop checkpoints: the session's own steps, or the
    cluster strategy's engine (``cluster``: window, sync_every, workers, backup_replicas, step_timeout)."""
    if session.client is None:
        return local_engine(request, session, replicas, strategy), checkpoint_every
    from workbench.cluster.engines import make_engine
    from workbench.cluster.options import ClusterOptions

    workers = cluster["workers"]
    chosen = workers if workers is None or isinstance(workers, str) else tuple(workers)
    function = runs_a_strategy_function(strategy)
    options = ClusterOptions(
        None if function else strategy,
        replicas,
        cluster["window"],
        cluster["sync_every"],
        chosen,
        cluster["backup_replicas"],
        cluster["step_timeout"],
    )
    every = checkpoint_every or cluster["sync_every"]
    if function:  # the members run the strategy's replica program (rank 0 reports fit(stats=k))
        from workbench.cluster import strategy_engine

        return strategy_engine.make(request, session.client, options, session.events, strategy), every
    return make_engine(request, session.client, options, session.events), every


def local_engine(request: FitRequest, session, replicas, strategy):
    """Local training, or with ``replicas`` or a strategy function the one-process simulation of
    the replicas (:mod:`workbench.simulation`)."""
    if strategy in (None, "local") and replicas in (None, 1):
        return LocalSteps(session, request)
    if strategy == "parameter_server":
        raise ClusterError(
            "strategy='parameter_server' needs a cluster: create the session with cluster='local' or an address"
        )
    from workbench.simulation import SimulatedReplicas

    return SimulatedReplicas(request, "allreduce" if strategy in (None, "local") else strategy, replicas or 1)


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
