"""The parameter-server family of cluster step engines: synchronous steps as Dask task graphs, and asynchronous SGD."""
