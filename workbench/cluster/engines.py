"""Cluster step engines by strategy name: how a distributed strategy plugs into ``fit``.

A strategy is a factory ``make(request, client, options, events) -> StepEngine``
(see :mod:`workbench.fitloop`): ``request`` is the fit as plain values, ``client``
the session's ``distributed.Client``, ``options`` the
:class:`~workbench.cluster.options.ClusterOptions` and ``events`` the session's
event stream (for engine events such as ``Synced`` and ``Restarted``).
``Session.fit(..., strategy=name)`` picks one; :func:`register_strategy` adds one.

Two come built in:

- ``"allreduce"`` (the default): each step is one pinned task per worker that
  computes its shard's gradients, all-reduces them worker to worker and updates
  its own replica of the variables (:mod:`workbench.cluster.collective.allreduce`);
- ``"parameter_server"``: each step is a task graph, replicas -> a fixed-order
  reduction tree -> one update task (:mod:`workbench.cluster.parameter_server.synchronous`). What GPU
  workers and more replicas (backups included) than workers need.

Both take NumPy or dask-array data (the all-reduce engine reads a dask array's rows from its chunks on
the workers: :mod:`workbench.cluster.chunked`).

Both run ``fit(backup_replicas=b)`` (the all-reduce engine through
:mod:`workbench.cluster.collective.backup_engine`), and ``"async"`` is asynchronous SGD.

A strategy may also say which fits it cannot train (``limits``). When ``fit`` is
not given a strategy and the default cannot train it, ``parameter_server`` does,
and the reason is in :class:`~workbench.events.FitStarted`; a strategy named
explicitly raises :class:`~workbench.errors.ClusterError` with the reason instead.

:func:`make_engine` guards every engine it makes (:func:`workbench.cluster.failures.guard`):
whatever fails reaches the user as a ``ClusterError`` with advice and the cause chained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from workbench.cluster import failures
from workbench.cluster.options import ClusterOptions
from workbench.errors import ClusterError
from workbench.events import EventStream
from workbench.fitloop import FitRequest, StepEngine


def _parameter_server(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> StepEngine:
    from workbench.cluster.parameter_server.synchronous import ParameterServer

    return ParameterServer(request, client, options, events)


def _allreduce(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> StepEngine:
    from workbench.cluster.collective.allreduce import AllReduceEngine

    if options.backup_replicas:  # R + b members, the first R gradients applied
        from workbench.cluster.collective.backup_engine import BackupAllReduceEngine

        return BackupAllReduceEngine.for_fit(request, client, options, events)
    return AllReduceEngine.for_fit(request, client, options, events)


def _async(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> StepEngine:
    from workbench.cluster.parameter_server.asynchronous import AsyncEngine

    return AsyncEngine(request, client, options, events)


def async_limits(request: FitRequest, client, options: ClusterOptions) -> str | None:
    """Why the ``async`` strategy cannot train this fit, or None."""
    if options.backup_replicas:
        return f"asynchronous SGD applies every gradient, so backup_replicas={options.backup_replicas} means nothing"
    return None


def allreduce_limits(request: FitRequest, client, options: ClusterOptions) -> str | None:
    """Why the ``allreduce`` strategy cannot train this fit, or None."""
    if not request.device.host_arrays:
        return f"it runs on CPU workers, and the session's device is {request.device.name!r}"
    workers = options.worker_count(client)
    if options.replicas is not None and options.replicas > workers:
        return f"it runs one replica per worker, and replicas={options.replicas} exceeds the {workers} workers"
    backups = options.backup_replicas
    if backups and (options.replicas or 1) + backups > workers:
        return (
            f"it runs one replica per worker, and replicas={options.replicas or 1} + backup_replicas={backups} "
            f"exceeds the {workers} workers"
        )
    return None


#: Strategy name to engine factory.
STRATEGIES: dict[str, Callable[..., StepEngine]] = {
    "parameter_server": _parameter_server,
    "allreduce": _allreduce,
    "async": _async,
}
#: Strategy name to ``limits(request, client, options) -> reason or None``: the fits it cannot train.
LIMITS: dict[str, Callable[..., str | None]] = {"allreduce": allreduce_limits, "async": async_limits}
#: The strategy ``fit`` uses on a cluster when none is named.
DEFAULT_STRATEGY = "allreduce"
#: The strategy ``fit`` falls back to when the default cannot train a fit.
FALLBACK_STRATEGY = "parameter_server"


def register_strategy(
    name: str, make: Callable[..., StepEngine], limits: Callable[..., str | None] | None = None
) -> None:
    """Make ``Session.fit(..., strategy=name)`` train with the engines ``make`` builds.

    ``limits(request, client, options)``, when given, says why the strategy cannot train a fit (or None).
    """
    STRATEGIES[name] = make
    if limits is not None:
        LIMITS[name] = limits
    else:
        LIMITS.pop(name, None)


def choose_strategy(request: FitRequest, client, options: ClusterOptions) -> tuple[str, str]:
    """The strategy for one fit, and why when ``fit`` chose it for a reason (else "").

    An explicit ``options.strategy`` that cannot train the fit raises ClusterError.
    """
    name = options.strategy or DEFAULT_STRATEGY
    if name not in STRATEGIES:
        known = ", ".join(sorted(STRATEGIES))
        raise ClusterError(f"unknown strategy {name!r}; strategies are {known}")
    limits = LIMITS.get(name)
    reason = limits(request, client, options) if limits is not None else None
    if reason is None:
        return name, ""
    if options.strategy is not None:
        # fit(stats=...) is computed by the all-reduce strategy only: the fallback is no way out then
        advice = (
            "leave stats out" if request.stats_every and name == "allreduce" else f"use strategy={FALLBACK_STRATEGY!r}"
        )
        raise ClusterError(f"strategy={name!r} cannot train this fit: {reason}; {advice}")
    if request.stats_every:  # the fallback cannot compute them: naming it is no way out
        raise ClusterError(
            f"fit(stats=...) on a cluster is computed by the all-reduce strategy, and it cannot train this "
            f"fit: {reason}; leave stats out, or change what keeps the all-reduce strategy out"
        )
    return FALLBACK_STRATEGY, f"{FALLBACK_STRATEGY} instead of {name}: {reason}"


def make_engine(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> StepEngine:
    """The step engine of ``options.strategy`` (default :data:`DEFAULT_STRATEGY`) for one fit, its
    failures translated (:func:`~workbench.cluster.failures.guard`); data that cannot fit a worker
    is refused first."""
    from workbench.cluster.malloc import ReuseFreedMemory

    name, reason = choose_strategy(request, client, options)
    if request.stats_every and name != "allreduce":
        raise ClusterError(
            f"fit(stats=...) on a cluster is computed by the all-reduce strategy, not {name!r}; "
            "use strategy='allreduce', or leave stats out"
        )
    engine = failures.guard(None, client, request.data)
    with engine.translated():
        failures.check_memory(client, request.data)
        client.register_plugin(ReuseFreedMemory())  # every strategy's tasks allocate large temporaries
        engine.engine = STRATEGIES[name](
            request, client, dataclasses.replace(options, strategy=name, reason=reason), events
        )
    return engine
