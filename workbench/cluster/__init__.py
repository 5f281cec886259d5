"""Running graphs on a Dask cluster: connecting, lowering to task graphs, data-parallel training.

``scaling_study`` lives above the session, in :mod:`workbench.scaling` (``wb.scaling_study``).
"""

from workbench.cluster.connect import close, close_default, connect, default_client, info, local_cluster, set_default
from workbench.cluster.lower import Lowered, lower
from workbench.cluster.engines import STRATEGIES, register_strategy
from workbench.cluster.options import ClusterOptions
from workbench.cluster.program import TrainingProgram

__all__ = [
    "ClusterOptions",
    "Lowered",
    "STRATEGIES",
    "TrainingProgram",
    "close",
    "close_default",
    "connect",
    "default_client",
    "info",
    "local_cluster",
    "lower",
    "register_strategy",
    "set_default",
]
