"""GraphView: a layered drawing of a graph, with collapsible name scopes and live node states."""

from __future__ import annotations

import functools
from typing import Any

import traitlets

from workbench.events import Event, NodeState, RunFailed, RunFinished, RunStarted
from workbench.graph.core import Graph
from workbench.widgets import snapshots
from workbench.widgets._base import View, front_end
from workbench.widgets.layout import (
    FOLD_OVER,
    all_scopes,
    default_collapsed,
    graph_layout,
    group_states,
    scopes_of,
)


class GraphView(View):
    """An interactive drawing of ``graph``.

    Placeholders, variables and constants have their own shapes and colors; each
    node shows its op type and output shape, and a click shows its dtype, inputs
    and the line that defined it. Name scopes are laid out as compound nodes:
    boxes that hold only their members, whose title folds them into one node
    (click the node to unfold). The gradient subgraph, the optimizer updates and
    user scopes of more than ``fold_over`` operations start folded; the toolbar
    folds or unfolds everything, zooms, fits the drawing to the width, and
    searches: a match inside folded scopes is revealed and highlighted. While a
    session runs the graph, nodes are colored by state: waiting, running, done
    or error; a run belongs to this view
    when its events carry this graph's token (:attr:`Graph.token`), whatever
    other graphs with the same op names do.

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
    #: Every operation's name, for the search box (it finds ops inside folded scopes too).
    names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: The node the search found (shown highlighted, scrolled into view).
    highlight = traitlets.Unicode("").tag(sync=True)
    #: Scale of the drawing; with ``fit`` the front end sets it so the drawing fits the view's width.
    zoom = traitlets.Float(1.0, min=0.01, max=4.0).tag(sync=True)
    fit = traitlets.Bool(True).tag(sync=True)

    def __init__(self, graph: Graph, collapsed=None, fold_over: int = FOLD_OVER, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.graph = graph
        self.op_states: dict[str, str] = {}
        self._runs: dict[str, list[str]] = {}  # session token -> ops of its run in progress
        self.names = [op.name for op in graph.operations]
        self.collapsed = sorted(default_collapsed(graph, fold_over) if collapsed is None else collapsed)
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

    def fold_all(self) -> None:
        """Fold every name scope (unfolding one then shows its own scopes folded)."""
        self.collapsed = all_scopes(self.graph)

    def unfold_all(self) -> None:
        """Open every name scope, the gradient subgraph included."""
        self.collapsed = []

    def search(self, text: str) -> list[str]:
        """Names of the operations that contain ``text`` (case-insensitive), an exact match first."""
        needle = text.strip().lower()
        found = [n for n in self.names if needle and needle in n.lower()]
        return sorted(found, key=lambda n: (n.lower() != needle, n.rsplit("/", 1)[-1].lower() != needle))

    def reveal(self, text: str) -> str:
        """Unfold the scopes around the first operation :meth:`search` finds, highlight it and return
        its name; KeyError when nothing matches."""
        found = self.search(text)
        if not found:
            raise KeyError(f"graph {self.graph.name!r} has no operation matching {text!r}")
        name = found[0]
        self.collapsed = sorted(set(self.collapsed) - set(scopes_of(name)))
        self.highlight = name
        return name

    @functools.singledispatchmethod
    def handle(self, event: Event) -> bool:
        """Update node states from one event of a run of this view's graph."""
        return False

    @handle.register
    def _started(self, event: RunStarted) -> bool:
        if event.graph != self.graph.token:
            return False  # another graph's run
        names = [n for n in event.ops if n in self.graph]  # ops a pass made (fused, merged) are not drawn
        self._runs[event.session] = names
        for name in names:
            self.op_states[name] = "running"
        return False

    @handle.register
    def _finished(self, event: RunFinished) -> bool:
        if event.graph != self.graph.token or event.session not in self._runs:
            return False
        for name in self._runs.pop(event.session):
            self.op_states[name] = "done"
        return True

    @handle.register
    def _failed(self, event: RunFailed) -> bool:
        if event.graph != self.graph.token or event.session not in self._runs:
            return False
        self._fail(self._runs.pop(event.session), event.op)
        return True

    @handle.register
    def _node(self, event: NodeState) -> bool:
        if event.graph == self.graph.token and event.op in self.graph:
            self.op_states[event.op] = event.state
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
