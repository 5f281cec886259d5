"""Getting a Dask client: from a Client, a scheduler address, or ``"local"``.

Defaults come from Dask's configuration, so a shared notebook can be pointed at
another cluster without editing it::

    export DASK_WORKBENCH__CLUSTER__ADDRESS=tls://scheduler.example.org:8786

or ``dask.config.set({"workbench.cluster.address": ...})``. Keys (all optional):

- ``workbench.cluster.address``: ``"local"`` (default), a scheduler address, or ``"gateway"``
  for a dask-gateway cluster (its gateway, authentication and options from dask-gateway's own
  ``gateway.*`` configuration);
- ``workbench.cluster.gateway-cluster``: the name of a running dask-gateway cluster to use
  (default: start one, shut down when its client closes);
- ``workbench.cluster.n-workers``: workers of the local cluster (default: the CPU count, or one per GPU);
- ``workbench.cluster.timeout``: how long to wait for a scheduler (default ``"10s"``);
- ``workbench.cluster.dashboard-address``: where a local cluster serves its dashboard (default ``":0"``).

A local cluster's scheduler loads :data:`PRELOAD` (the Workbench page of its dashboard
and the training monitor); other schedulers load it with ``--preload``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from typing import Any

import dask
import dask.config

from workbench.errors import ClusterError

PRELOAD = "workbench.dashboard.preload"  # scheduler preload: the dashboard's Workbench page, training metrics
WORKER_PRELOAD = "workbench.cluster.worker_preload"  # local workers ignore the kernel's SIGINT

BLAS_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}


def config(key: str, default: Any = None) -> Any:
    """``workbench.cluster.<key>`` from Dask's configuration."""
    return dask.config.get(f"workbench.cluster.{key}", default=default)


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without CuPy or a GPU)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "no GPU"
        return 0


def local_cluster(n_workers: int | None = None, **kwargs):
    """An embedded cluster on this machine: one process per worker, one thread each, BLAS at one thread.

    With GPUs and dask-cuda installed, a ``LocalCUDACluster`` with one worker per GPU.
    Everything it opens (scheduler, workers, nannies, dashboard) listens on 127.0.0.1
    unless ``host`` or a dashboard address with a host (``"0.0.0.0:8787"``) says otherwise.
    Its workers ignore SIGINT (:data:`WORKER_PRELOAD`): a notebook's interrupt, sent to the
    kernel's process group, stops the kernel's ``fit`` but not the cluster.
    """
    gpus = gpu_count()
    dashboard = on_loopback(kwargs.pop("dashboard_address", config("dashboard-address", ":0")))
    kwargs.setdefault("host", "127.0.0.1")
    scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
    preload = list(scheduler_kwargs.get("preload") or dask.config.get("distributed.scheduler.preload", None) or [])
    scheduler_kwargs["preload"] = preload if PRELOAD in preload else [*preload, PRELOAD]
    kwargs["scheduler_kwargs"] = scheduler_kwargs
    worker_preload = list(kwargs.pop("preload", None) or dask.config.get("distributed.worker.preload", None) or [])
    kwargs["preload"] = worker_preload if WORKER_PRELOAD in worker_preload else [*worker_preload, WORKER_PRELOAD]
    if gpus:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            gpus = 0
        else:
            n = n_workers or config("n-workers") or gpus
            return LocalCUDACluster(n_workers=int(n), threads_per_worker=1, dashboard_address=dashboard, **kwargs)
    from distributed import LocalCluster

    n = n_workers or config("n-workers") or os.cpu_count() or 1
    env = {**BLAS_ENV, **kwargs.pop("env", {})}
    # Nanny processes hand ``env`` to each worker before its libraries load.
    with dask.config.set(
        {"distributed.nanny.pre-spawn-environ": {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **env}}
    ):
        return LocalCluster(
            n_workers=int(n),
            threads_per_worker=1,
            processes=True,
            dashboard_address=dashboard,
            **kwargs,
        )


def on_loopback(address):
    """A dashboard address without a host (``":0"``, ``":8787"``, ``8787``) bound to 127.0.0.1;
    Dask would bind it to every interface. None (no dashboard) and addresses with a host stay."""
    if address is None or address is False:
        return address
    text = str(address)
    return f"127.0.0.1:{text.lstrip(':')}" if text.startswith(":") or text.isdigit() else text


def connect(cluster: Any = None, *, security=None, timeout: str | float | None = None, n_workers: int | None = None):
    """A ``distributed.Client`` for ``cluster``.

    Parameters
    ----------
    cluster : Client, str, or None
        A client (used as is), a scheduler address (``"tcp://host:8786"``,
        ``"tls://..."``), ``"local"`` for an embedded cluster, ``"gateway"`` for a
        dask-gateway cluster, or None for the configured default
        (``workbench.cluster.address``, default ``"local"``).
    security : distributed.Security, optional
        Certificates for ``tls://`` addresses; without it, those of Dask's configuration
        (``distributed.comm.tls.ca-file``, ``.client.cert``, ``.client.key``).
    timeout : seconds or a Dask time string, optional
        How long to wait for the scheduler before a ClusterError, whatever the peer does
        (refuses, stays silent, answers HTTP or garbage): see :func:`probe`.
    """
    from distributed import Client

    if isinstance(cluster, Client):
        return cluster
    if cluster is None:
        cluster = config("address", "local")
    if hasattr(cluster, "scheduler_address"):  # a cluster object (LocalCluster, KubeCluster, ...)
        return Client(cluster, set_as_default=False)
    if not isinstance(cluster, str):
        raise ClusterError(f"cannot use {cluster!r} as a cluster: pass a distributed.Client, an address or 'local'")
    if cluster == "local":
        return Client(local_cluster(n_workers), set_as_default=False)
    if cluster == "gateway":
        return gateway_client()
    if "://" not in cluster:
        raise ClusterError(f"cluster address {cluster!r} needs a protocol, e.g. 'tcp://{cluster}'")
    timeout = timeout if timeout is not None else config("timeout", "10s")
    seconds = dask.utils.parse_timedelta(timeout, default="seconds")
    started = time.monotonic()
    try:
        probe(cluster, security, seconds)
        left = max(seconds - (time.monotonic() - started), 1.0)
        return Client(cluster, security=security, timeout=left, set_as_default=False)
    except ClusterError as e:
        error = e
    except OSError as e:  # includes TimeoutError and connection refusals
        error = ClusterError(f"cannot reach the Dask scheduler at {cluster} within {seconds:g} s: {e}")
    except (ValueError, TypeError) as e:  # e.g. tls:// without certificates (a TypeError in distributed)
        error = ClusterError(f"cannot connect to {cluster}: {e}")
    # The client that failed to start closes itself when collected. Collect it now: collected
    # later, inside another client's start, its close waits on that start's lock for a minute.
    gc.collect()
    raise error


def probe(address: str, security, seconds: float) -> None:
    """ClusterError unless a Dask scheduler answers at ``address`` within ``seconds``.

    Whatever the peer does (accepts and stays silent, answers HTTP, sends garbage that
    Dask would read as a frame of exabytes), the answer comes within the timeout: the
    handshake and one ``identity`` call run on a private event loop under one deadline,
    in a thread, so this works inside a running notebook loop too.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["identity"] = asyncio.run(asyncio.wait_for(_identity(address, security, seconds), seconds))
        except BaseException as e:  # noqa: BLE001 - MemoryError included: reported below
            outcome["error"] = e

    if address.startswith("tls://") and security is None and not _tls_configured():
        raise ClusterError(
            f"{address} needs TLS certificates: pass security=distributed.Security(...) "
            "or set the distributed.comm.tls.* keys of Dask's configuration"
        )
    thread = threading.Thread(target=run, name=f"workbench-probe-{address}", daemon=True)
    thread.start()
    thread.join(seconds + 2.0)
    error = outcome.get("error")
    if thread.is_alive() or isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        raise ClusterError(f"cannot reach the Dask scheduler at {address} within {seconds:g} s: no answer")
    if isinstance(error, OSError):  # refused, unknown host, closed on us (CommClosedError)
        raise ClusterError(f"cannot reach the Dask scheduler at {address} within {seconds:g} s: {error}") from error
    if error is not None:
        raise ClusterError(
            f"{address} answered, but not as a Dask scheduler ({type(error).__name__}: {error}); "
            "is it another service, such as the dashboard (by default on port 8787; the scheduler listens on 8786)?"
        ) from error
    kind = outcome["identity"].get("type") if isinstance(outcome["identity"], dict) else None
    if kind != "Scheduler":
        raise ClusterError(f"{address} is a Dask {kind or 'peer'}, not a scheduler: give the scheduler's address")


def _tls_configured() -> bool:
    """Certificates or a security loader in Dask's configuration."""
    return bool(
        dask.config.get("distributed.comm.tls.ca-file", None)
        or dask.config.get("distributed.client.security-loader", None)
    )


async def _identity(address: str, security, seconds: float):
    from distributed import Security
    from distributed.core import rpc

    if security is None:  # as Client does: a configured security loader, else the distributed.comm.tls.* keys
        from distributed import client

        loader = getattr(client, "_maybe_call_security_loader", None)
        security = (loader(address) if loader is not None else None) or Security()
    args = security.get_connection_args("client")
    remote = rpc(address, timeout=seconds, connection_args=args)
    try:
        return await remote.identity()
    finally:
        await remote.close_rpc()


def gateway_client():
    """A client of a dask-gateway cluster: the running one named by ``workbench.cluster.gateway-cluster``,
    or a new one. The gateway's address, authentication and cluster options come from dask-gateway's
    configuration (``gateway.address``, ``gateway.auth.type``, ``gateway.cluster.options``)."""
    try:
        from dask_gateway import Gateway
    except ImportError as e:
        raise ClusterError("workbench.cluster.address 'gateway' needs dask-gateway (pip install dask-gateway)") from e
    name = config("gateway-cluster")
    try:
        gateway = Gateway()
        cluster = gateway.connect(name) if name else gateway.new_cluster()
        return cluster.get_client(set_as_default=False)
    except (OSError, ValueError) as e:  # unreachable gateway, unknown cluster name
        target = f"cluster {name!r}" if name else "a new cluster"
        raise ClusterError(f"cannot get {target} from the dask-gateway: {type(e).__name__}: {e}") from e


def info(client) -> dict:
    """What the cluster holds: workers (address, name, threads, memory, GPUs) and the dashboard link."""
    scheduler = client.scheduler_info(n_workers=-1) if _takes_n_workers(client) else client.scheduler_info()
    workers = []
    for address, w in sorted(scheduler.get("workers", {}).items()):
        gpu = w.get("gpu") or {}
        workers.append(
            {
                "address": address,
                "name": str(w.get("name", address)),
                "threads": int(w.get("nthreads", 0)),
                "memory": int(w.get("memory_limit", 0) or 0),
                "gpus": len(gpu.get("name", [])) if isinstance(gpu.get("name"), list) else (1 if gpu else 0),
            }
        )
    return {"scheduler": scheduler.get("address", ""), "dashboard": client.dashboard_link, "workers": workers}


def _takes_n_workers(client) -> bool:
    import inspect

    return "n_workers" in inspect.signature(client.scheduler_info).parameters


# -- the default cluster of new sessions ---------------------------------------------------

_default: dict[str, Any] = {"client": None, "owned": False}


def set_default(cluster: Any = None, **kwargs):
    """Make ``cluster`` the default of sessions created without one (``cluster=None``); returns the client.

    ``cluster`` is as for :func:`connect`: None means the configured ``workbench.cluster.address``
    (``"local"`` unless configured).
    """
    close_default()
    client = connect(cluster, **kwargs)
    _default.update(client=client, owned=not _is_client(cluster))
    return client


def default_client():
    """The client set by :func:`set_default`, or None."""
    return _default["client"]


def close_default() -> str | None:
    """Let the default cluster go; returns what that did (None when there was none).

    A local cluster that :func:`set_default` started is shut down; a cluster reached
    by its address is only disconnected from (it keeps running for its other users),
    and a Client that was passed in is left open for its owner.
    """
    client, owned = _default["client"], _default["owned"]
    _default.update(client=None, owned=False)
    if client is None:
        return None
    address = getattr(client.scheduler, "address", None) or "the scheduler"
    if not owned:
        return f"no default cluster now; the client for {address} stays open"
    cluster = getattr(client, "cluster", None)
    # a cluster object this process started (LocalCluster, or a new dask-gateway cluster) goes with it
    shut_down = cluster is not None and getattr(cluster, "shutdown_on_close", True)
    close(client)
    if shut_down:
        return f"default cluster closed: the cluster started for it at {address} is shut down"
    return f"disconnected from {address}; that cluster keeps running"


def close(client) -> None:
    """Close a client and, if it started one, its local cluster (a ``ClusterClosed`` event says so)."""
    from workbench.events import ROOT, ClusterClosed

    cluster = getattr(client, "cluster", None)
    address = getattr(getattr(client, "scheduler", None), "address", None) or ""
    client.close()
    if cluster is not None:
        cluster.close()
    ROOT.emit(ClusterClosed, scheduler=address, shut_down=cluster is not None)


def _is_client(x) -> bool:
    from distributed import Client

    return isinstance(x, Client)
