"""ClusterView: the workers of a Dask cluster and a link to its dashboard."""

from __future__ import annotations

from typing import Any

import traitlets

import anywidget

from workbench.widgets import snapshots
from workbench.widgets._base import Snapshot, front_end


class ClusterView(Snapshot, anywidget.AnyWidget):
    """A table of workers (threads, memory, GPUs) with totals and the dashboard link.

    ``info`` is what :func:`workbench.cluster.info` returns; ``None`` shows that
    no default cluster is set. When ``info`` has a ``dashboard_note`` (why the
    dashboard or its workbench page is missing), the view shows it.

    >>> view = ClusterView({"scheduler": "tcp://127.0.0.1:8786", "dashboard": "http://127.0.0.1:8787/status",
    ...                     "workers": [{"address": "tcp://127.0.0.1:1", "name": "0", "threads": 1,
    ...                                  "memory": 2**30, "gpus": 0}]})
    >>> view.info["workers"][0]["threads"]
    1
    """

    _esm = front_end("cluster_view.js")
    _css = front_end("views.css")
    info = traitlets.Dict(allow_none=True).tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)

    def __init__(self, info: dict[str, Any] | None = None, message: str = "", **kwargs: Any) -> None:
        super().__init__(info=info, message=message, **kwargs)

    def snapshot_state(self):
        return self.info, self.message

    def render_snapshot(self, state) -> str:
        return snapshots.cluster_svg(*state)
