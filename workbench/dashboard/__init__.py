"""The Dask dashboard as a training monitor.

- :mod:`workbench.dashboard.forward` (the client): fits on a cluster send throttled
  summaries of their progress to their scheduler (``Client.log_event``); on in notebooks,
  :func:`forward` turns it on in scripts.
- :mod:`workbench.dashboard.preload` (the scheduler, ``dask scheduler --preload
  workbench.dashboard.preload``): the training monitor plugin, the Workbench page of the
  dashboard (:mod:`~workbench.dashboard.page`) and the ``workbench_training_*`` series of
  the scheduler's Prometheus ``/metrics``.

This package imports neither bokeh nor distributed until a part that needs them is used.
"""

from workbench.dashboard.forward import forward, stop, training_update

PRELOAD = "workbench.dashboard.preload"

__all__ = ["PRELOAD", "forward", "stop", "training_update"]
