"""Running graphs on a Dask cluster: connecting, lowering to task graphs, data-parallel training."""

from workbench.cluster.connect import close, close_default, connect, default_client, info, local_cluster, set_default

__all__ = ["close", "close_default", "connect", "default_client", "info", "local_cluster", "set_default"]
