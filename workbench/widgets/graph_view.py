"""GraphView: a layered drawing of a graph, with collapsible name scopes and live node states."""

from __future__ import annotations

from typing import Any

import traitlets

from workbench.graph.core import Graph
from workbench.widgets import snapshots
from workbench.widgets._base import View, front_end
from workbench.widgets.layout import all_scopes, default_collapsed, graph_layout, group_states


class GraphView(View):
    """An interactive drawing of ``graph``.

    Placeholders, variables and constants have their own shapes and colors; each
    node shows its op type and output shape, and a click shows its dtype, inputs
    and the line that defined it. Name scopes are boxes whose title folds them
    into one node (click the node to unfold); the gradient subgraph and the
    optimizer updates start folded. While a session runs the graph, nodes are
    colored by state: waiting, running, done or error.

    >>> import workbench as wb
    >>> g = wb.Graph(name="g")
    >>> with g.as_default():
    ...     w = wb.variable("w", shape=(2,), init=1.0)
    ...     train = wb.optimizers.SGD(0.1).minimize(wb.sum(w * w))
    >>> view = GraphView(g)
    >>> view.collapsed, len(view.layout["nodes"])
    (['SGD', 'gradients'], 5)
    """

    _esm = front_end("graph_view.js")
    layout = traitlets.Dict().tag(sync=True)
    collapsed = traitlets.List(traitlets.Unicode()).tag(sync=True)
    states = traitlets.Dict().tag(sync=True)

    def __init__(self, graph: Graph, collapsed=None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.graph = graph
        self.op_states: dict[str, str] = {}
        self._runs: dict[Any, list[str]] = {}  # session -> ops of its run in progress
        self.collapsed = sorted(default_collapsed(graph) if collapsed is None else collapsed)
        self._relayout()

    @traitlets.observe("collapsed")
    def _on_collapsed(self, change) -> None:
        if hasattr(self, "graph"):
            self._relayout()

    def _relayout(self) -> None:
        self.layout = graph_layout(self.graph, self.collapsed)
        self.states = group_states(self.op_states, self.collapsed)

    def toggle(self, scope: str) -> None:
        """Fold or unfold a name scope."""
        if scope not in all_scopes(self.graph):
            raise KeyError(f"graph {self.graph.name!r} has no name scope {scope!r}")
        folded = set(self.collapsed) ^ {scope}
        self.collapsed = sorted(folded)

    def handle(self, event: dict) -> bool:
        kind, session = event.get("kind"), event.get("session")
        if kind == "run_started":
            names = [n for n in event.get("ops", ()) if isinstance(n, str)]
            if not names or not all(n in self.graph for n in names):
                return False  # another graph's run
            self._runs[session] = names
            for name in names:
                self.op_states[name] = "running"
        elif kind == "run_finished" and session in self._runs:
            for name in self._runs.pop(session):
                self.op_states[name] = "done"
            return True
        elif kind == "run_failed" and session in self._runs:
            self._fail(self._runs.pop(session), event.get("op"))
            return True
        elif kind == "node_state" and event.get("op") in self.graph:
            self.op_states[event["op"]] = event.get("state", "done")
        return False

    def _fail(self, names: list[str], failed) -> None:
        """Ops before the failed one (in graph order) are done, the rest never ran."""
        at = self.graph.operation(failed).index if failed in self.graph else -1
        for name in names:
            index = self.graph.operation(name).index
            self.op_states[name] = "done" if index < at else "waiting"
        if failed in self.graph:
            self.op_states[failed] = "error"

    def _sync(self) -> None:
        self.states = group_states(self.op_states, self.collapsed)

    def snapshot_state(self):
        return self.layout, self.states

    def render_snapshot(self, state) -> str:
        return snapshots.graph_svg(*state)
