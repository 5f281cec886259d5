"""The graph layer: IR, gradients, passes, plans and graph files."""

from workbench.graph.core import (
    Graph,
    Operation,
    Source,
    Tensor,
    Variable,
    get_default_graph,
    group,
    name_scope,
    reset_default_graph,
)
from workbench.graph.gradients import gradients
from workbench.graph.passes import eliminate_common_subexpressions, fold_constants, optimize, prune, validate
from workbench.graph.plan import Plan
from workbench.graph.cond import cond
from workbench.graph.scan import scan

__all__ = [
    "Graph",
    "Operation",
    "Plan",
    "Source",
    "Tensor",
    "Variable",
    "cond",
    "scan",
    "eliminate_common_subexpressions",
    "fold_constants",
    "get_default_graph",
    "gradients",
    "group",
    "name_scope",
    "optimize",
    "prune",
    "reset_default_graph",
    "validate",
]
