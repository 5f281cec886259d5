"""GraphView: a layered drawing of a graph, with collapsible name scopes and live node states."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import traitlets

from workbench.events import ROOT, Event, FitFinished, FitStarted, NodeState, RunFailed, RunFinished, RunStarted, Step
from workbench.graph.core import Graph
from workbench.widgets import snapshots
from workbench.widgets._base import View, front_end
from workbench.widgets.drawn import drawn_operations
from workbench.widgets.statistics import TITLES, StepStats, profile_stats
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

    During ``fit(..., stats=k)`` the nodes are also filled by a statistic of the
    model (:attr:`stat`: each variable's gradient norm, or the mean or std of each
    op's output), fetched every k steps; a scrubber (slider) picks the step shown
    (:attr:`step`, 0: the latest). ``view.follow(training_view)`` links it to a
    :class:`~workbench.widgets.TrainingView`: clicking its loss curve shows that
    step's statistics here, and moving the scrubber marks the step there. In a
    notebook, a view of the graph that is showing links itself to the TrainingView
    of each new fit.

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
    #: The statistic the nodes are filled by ("grad_norm", "mean", "std"; "" for none).
    stat = traitlets.Unicode("").tag(sync=True)
    #: The step whose statistics are shown (one of :attr:`stat_steps`; 0: the latest).
    step = traitlets.Int(0).tag(sync=True)
    #: Steps with statistics, the statistics present, the shown values by visible node, their colour scale.
    stat_steps = traitlets.List(traitlets.Int()).tag(sync=True)
    stat_kinds = traitlets.List(traitlets.Unicode()).tag(sync=True)
    node_stats = traitlets.Dict().tag(sync=True)
    stat_scale = traitlets.Dict().tag(sync=True)

    def __init__(self, graph: Graph, collapsed=None, fold_over: int = FOLD_OVER, stat: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stats = StepStats()
        self._linked: list = []  # unobserve callbacks of a linked TrainingView
        self.graph = graph
        self.stat = stat
        _VIEWS.add(self)
        self.op_states: dict[str, str] = {}
        self._runs: dict[str, list[str]] = {}  # session token -> ops of its run in progress
        self.names = [op.name for op in drawn_operations(graph)]  # bodies of loops and branches too
        self.fold_over = fold_over
        self._scopes = set(all_scopes(graph))  # scopes ops added later (fit's statistics) start folded
        self.collapsed = sorted(default_collapsed(graph, fold_over) if collapsed is None else collapsed)
        self._relayout()

    @traitlets.observe("collapsed")
    def _on_collapsed(self, change) -> None:
        if hasattr(self, "graph"):
            self._relayout()

    def _relayout(self) -> None:
        new = set(all_scopes(self.graph)) - self._scopes
        if new:
            self._scopes |= new
            fold = new & set(default_collapsed(self.graph, self.fold_over))
            if fold - set(self.collapsed):
                self.collapsed = sorted(set(self.collapsed) | fold)  # lays out again
                return
        self.names = [op.name for op in drawn_operations(self.graph)]  # ops added since (fit's statistics) too
        self.layout = graph_layout(self.graph, self.collapsed)
        self.states = group_states(self.op_states, self.collapsed)
        self._show_stats()

    @traitlets.observe("stat", "step")
    def _on_stat(self, change) -> None:
        if hasattr(self, "graph"):
            self._show_stats()

    def _show_stats(self) -> None:
        """Copy the statistics of the chosen step into the synced traits."""
        self.stat_steps, self.stat_kinds = list(self.stats.steps), self.stats.kinds()
        stat = self.stat if self.stat in TITLES else ""
        step = self.step or (self.stats.steps[-1] if self.stats.steps else 0)
        self.node_stats = self.stats.node_values(stat, step, self.collapsed) if stat else {}
        self.stat_scale = (
            {**self.stats.scale(stat, self.collapsed), "step": step, "title": TITLES[stat]} if stat else {}
        )

    def show_profile(self, profile, step: int = 0) -> None:
        """Colour the nodes by seconds per step (``stat="time"``, folded scopes by their sum): ``profile``
        is a :class:`~workbench.History` of ``fit(..., profile=k)`` (each op's median) or ``{op: seconds}``
        (``Session.last_profile``), shown as step ``step``."""
        timed = profile.profile() if hasattr(profile, "profile") else dict(profile)
        self.stats.add(int(step), profile_stats(timed))
        self.step = int(step) if step else 0
        self.stat = "time"
        self._show_stats()

    def show_step(self, step: int) -> int:
        """Show the statistics of the recorded step nearest ``step``; returns that step."""
        self.step = self.stats.nearest(int(step))
        return self.step

    def follow(self, stream=ROOT, session=None):
        """Follow ``stream``: an event stream (by default every session's; only ``session``'s events when
        given), or a :class:`~workbench.widgets.TrainingView`, whose stream this view then follows and
        whose selected step it shows (and sets, from the scrubber)."""
        from workbench.widgets.training_view import TrainingView

        if not isinstance(stream, TrainingView):
            return super().follow(stream, session=session)
        for unobserve in self._linked:
            unobserve()
        view = stream
        super().follow(view._stream, session=view._session if session is None else session)
        self.stats.clear()  # the statistics of the run that view shows
        self.step = 0
        self._draw_new_ops()
        self._show_stats()

        def picked(change):  # a click on the training view's curves
            if change["new"]:
                self.show_step(change["new"])

        def scrubbed(change):  # the scrubber here
            if change["new"] and view.selected_step != change["new"]:
                view.selected_step = change["new"]

        view.observe(picked, "selected_step")
        self.observe(scrubbed, "step")
        self._linked = [lambda: view.unobserve(picked, "selected_step"), lambda: self.unobserve(scrubbed, "step")]
        return self

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

    def unfold_one_level(self) -> None:
        """Open the outermost folded scopes (those drawn as boxes now), keeping their own scopes folded:
        what the toolbar's "unfold one level" does, so a big model opens a level at a time."""
        self.collapsed = unfold_one_level(self.collapsed, all_scopes(self.graph))

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
    def _fit_started(self, event: FitStarted) -> bool:
        if event.graph != self.graph.token:
            return False
        if event.start == 0:
            self.stats.clear()  # a new fit: its own statistics
            self.step = 0
        self._draw_new_ops()
        return False

    def _draw_new_ops(self) -> None:
        """Lay out again if ops were added since (a fit's statistics): their new scopes drawn folded."""
        if set(all_scopes(self.graph)) - self._scopes:
            self._relayout()

    @handle.register
    def _fit_finished(self, event: FitFinished) -> bool:
        return event.graph == self.graph.token  # show the last statistics now

    @handle.register
    def _step(self, event: Step) -> bool:
        timed = event.metrics.get("profile") or {}  # fit(profile=k): each op's seconds
        if event.graph != self.graph.token or not (event.stats or timed):
            return False
        self.stats.add(event.step, {**event.stats, **profile_stats(timed)})
        if not self.stat:
            self.stat = self.stats.kinds()[0] if self.stats.kinds() else ""
        return False

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
        if self.stats.steps != self.stat_steps:
            self._show_stats()

    def snapshot_state(self):
        return self.layout, self.states, self.node_stats, self.stat_scale

    def __repr__(self) -> str:
        """One line: ``graph mlp · 45 ops · 2,410 parameters · 3 scopes folded``."""
        from workbench.graph.summary import trainable_parameters

        return (
            f"graph {self.graph.name} · {len(self.graph.operations)} ops · {trainable_parameters(self.graph):,} "
            f"parameters · {len(self.collapsed)} scopes folded"
        )

    def render_snapshot(self, state) -> str:
        return snapshots.graph_svg(*state)


#: Every GraphView made in this process (weakly), for :func:`link_shown`.
_VIEWS: weakref.WeakSet = weakref.WeakSet()


def link_shown(training_view, graph_token: str) -> list[GraphView]:
    """Link every open GraphView of the graph ``graph_token`` to ``training_view`` (what the
    notebook does when a fit of that graph starts); returns them."""
    views = [v for v in list(_VIEWS) if v.graph.token == graph_token and v.comm is not None]
    for view in views:
        view.follow(training_view)
    return views


def unfold_one_level(collapsed, scopes) -> list[str]:
    """``collapsed`` less its outermost folded scopes (no folded scope around them), plus those
    scopes' direct sub-scopes (so what opens shows its own scopes folded)."""
    folded = set(collapsed)
    top = {s for s in folded if not any(a in folded for a in scopes_of(s))}
    return sorted((folded - top) | {s for s in scopes if s.rpartition("/")[0] in top})
