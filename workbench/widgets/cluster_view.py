"""ClusterView: the workers of a Dask cluster and a link to its dashboard."""

from __future__ import annotations

from typing import Any

import traitlets

import anywidget

from workbench.widgets import snapshots
from workbench.events import ROOT, ClusterClosed
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
        self._unsubscribe = ROOT.subscribe(self._on_event) if info and info.get("scheduler") else None

    def _on_event(self, event) -> None:
        if isinstance(event, ClusterClosed) and self.info and event.scheduler == self.info.get("scheduler"):
            self.mark_closed(shut_down=event.shut_down)

    def mark_closed(self, shut_down: bool = True) -> None:
        """Show the cluster as closed (or only disconnected from): no workers, no dashboard link, the picture too."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        state = "closed" if shut_down else "disconnected"
        self.info = {"scheduler": (self.info or {}).get("scheduler", ""), "workers": [], "closed": state}
        self.message = (
            "closed: this notebook's sessions no longer use it"
            if shut_down
            else "disconnected: the cluster keeps running for its other users; this notebook's sessions no longer use it"
        )
        self.refresh_snapshot()

    @property
    def closed(self) -> bool:
        return bool(self.info and self.info.get("closed"))

    def _closed_word(self) -> str:
        state = self.info.get("closed")
        return state if isinstance(state, str) else "closed"

    def __repr__(self) -> str:
        if not self.info:
            return f"cluster · {self.message or 'no default cluster'}"
        if self.closed:
            return f"cluster {self.info.get('scheduler', '')} · {self._closed_word()}"
        return f"cluster {self.info.get('scheduler', '')} · {len(self.info.get('workers') or [])} workers"

    def snapshot_state(self):
        return self.info, self.message

    def render_snapshot(self, state) -> str:
        return snapshots.cluster_svg(*state)
