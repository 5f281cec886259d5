"""Cluster step engines by strategy name: how a distributed strategy plugs into ``fit``.

A strategy is a factory ``make(request, client, options, events) -> StepEngine``
(see :mod:`workbench.fitloop`): ``request`` is the fit as plain values, ``client``
the session's ``distributed.Client``, ``options`` the
:class:`~workbench.cluster.options.ClusterOptions` and ``events`` the session's
event stream (for engine events such as ``Synced`` and ``Restarted``).
``Session.fit(..., strategy=name)`` picks one; :func:`register_strategy` adds one.
:func:`make_engine` guards every engine it makes (:func:`workbench.cluster.failures.guard`):
whatever fails reaches the user as a ``ClusterError`` with advice and the cause chained.
"""

from __future__ import annotations

from typing import Callable

from workbench.cluster import failures
from workbench.cluster.options import ClusterOptions
from workbench.errors import ClusterError
from workbench.events import EventStream
from workbench.fitloop import FitRequest, StepEngine


def _parameter_server(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> StepEngine:
    from workbench.cluster.fit import ParameterServer

    return ParameterServer(request, client, options, events)


#: Strategy name to engine factory.
STRATEGIES: dict[str, Callable[..., StepEngine]] = {"parameter_server": _parameter_server}
#: The strategy ``fit`` uses on a cluster when none is named.
DEFAULT_STRATEGY = "parameter_server"


def register_strategy(name: str, make: Callable[..., StepEngine]) -> None:
    """Make ``Session.fit(..., strategy=name)`` train with the engines ``make`` builds."""
    STRATEGIES[name] = make


def make_engine(request: FitRequest, client, options: ClusterOptions, events: EventStream) -> StepEngine:
    """The step engine of ``options.strategy`` for one fit, its failures translated
    (:func:`~workbench.cluster.failures.guard`); data that cannot fit a worker is refused first."""
    make = STRATEGIES.get(options.strategy)
    if make is None:
        known = ", ".join(sorted(STRATEGIES))
        raise ClusterError(f"unknown strategy {options.strategy!r}; strategies are {known}")
    engine = failures.guard(None, client, request.data)
    with engine.translated():
        failures.check_memory(client, request.data)
        engine.engine = make(request, client, options, events)
    return engine
