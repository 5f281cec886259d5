"""Scheduler preload: the Workbench page on the dashboard, the training monitor and its ``/metrics`` series.

Load it into any Dask scheduler where workbench is installed::

    dask scheduler --preload workbench.dashboard.preload

or for every scheduler, in Dask's configuration (``distributed.scheduler.preload``,
e.g. ``DASK_DISTRIBUTED__SCHEDULER__PRELOAD='["workbench.dashboard.preload"]'``,
or the scheduler options of dask-kubernetes, dask-jobqueue and dask-gateway).
Local clusters started by workbench load it themselves. Importing this module
registers the page (distributed builds a scheduler's dashboard from its
``applications`` when the scheduler is created, after its preloads are imported);
:func:`dask_setup` adds the :class:`~workbench.dashboard.monitor.TrainingMonitor`
plugin and the Prometheus collector.
"""

from __future__ import annotations

from workbench.dashboard.monitor import NAME, TrainingMonitor, register_metrics
from workbench.dashboard.page import register_page

register_page()


def dask_setup(scheduler) -> None:
    """Called by the scheduler once it starts: keep the fits' summaries and serve their metrics."""
    scheduler.add_plugin(TrainingMonitor(), name=NAME, idempotent=True)
    register_metrics()
