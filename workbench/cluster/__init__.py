"""Running graphs on a Dask cluster: connecting, lowering to task graphs, data-parallel training."""

from workbench.cluster.connect import close, close_default, connect, default_client, info, local_cluster, set_default
from workbench.cluster.lower import Lowered, lower
from workbench.cluster.program import TrainingProgram
from workbench.cluster.scaling import ScalingStudy, scaling_study

__all__ = ["Lowered", "ScalingStudy", "TrainingProgram", "lower", "scaling_study", "close", "close_default", "connect", "default_client", "info", "local_cluster", "set_default"]
