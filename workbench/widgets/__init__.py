"""Notebook views of graphs, training runs, scaling studies and clusters (ipywidgets + anywidget).

Views read the execution layer's events (:mod:`workbench.events`); nothing in
the execution layer knows about them. They render offline: each front end is a
small ES module shipped in this package and saved with the notebook's widget state.
"""

from workbench.widgets.cluster_view import ClusterView
from workbench.widgets.comparison_view import ComparisonView
from workbench.widgets.graph_view import GraphView, link_shown
from workbench.widgets.scaling_view import ScalingView
from workbench.widgets.throttle import Throttle
from workbench.widgets.timeline import TimelineView
from workbench.widgets.training_view import TrainingView

__all__ = [
    "ClusterView",
    "ComparisonView",
    "GraphView",
    "ScalingView",
    "Throttle",
    "TimelineView",
    "TrainingView",
    "link_shown",
]
