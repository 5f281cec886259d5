import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import workbench as wb

DASK = str(Path(sys.executable).with_name("dask"))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def graph():
    g = wb.Graph(name="test")
    with g.as_default():
        yield g


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskProcesses:
    """``dask scheduler`` and ``dask worker`` processes started by a test, each stopped by its pid."""

    free_port = staticmethod(free_port)

    def __init__(self, logs: Path):
        self.logs, self.started, self.schedulers = logs, [], []

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
        log = open(self.logs / f"{name}.log", "wb")
        proc = subprocess.Popen([DASK, *args], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.logs)
        log.close()
        self.started.append(proc)
        return proc

    def scheduler(self, *tls: str, dashboard: int | None = None, preload: tuple[str, ...] = ()) -> str:
        """Start a scheduler (TLS when given its options); with ``dashboard``, serve it on that port."""
        protocol = "tls" if tls else "tcp"
        port = free_port()
        served = ["--dashboard-address", f"127.0.0.1:{dashboard}"] if dashboard else ["--no-dashboard"]
        preloads = [arg for module in preload for arg in ("--preload", module)]
        proc = self.start(f"scheduler-{port}", "scheduler", "--protocol", protocol, "--host", "127.0.0.1",
                          "--port", str(port), *served, *preloads, *tls)  # fmt: skip
        self.schedulers.append(proc)
        return f"{protocol}://127.0.0.1:{port}"

    def worker(self, address: str, name: str, *tls: str) -> None:
        self.start(name, "worker", address, "--name", name, "--host", "127.0.0.1", "--nthreads", "1",
                   "--no-nanny", "--no-dashboard", "--death-timeout", "60", *tls)  # fmt: skip

    def connect(self, address: str, workers: int, **kw):
        """A client once ``workers`` workers are up (the processes' logs in the error if they never are)."""
        try:
            client = wb.cluster.connect(address, timeout=30, **kw)
            if workers:
                client.wait_for_workers(workers, timeout=60)
        except Exception as e:  # noqa: BLE001 - show the processes' own logs
            raise AssertionError(f"cluster at {address} did not come up: {e}\n{self.log()}") from e
        return client

    def stop(self) -> None:
        """Workers first, one at a time (a TLS worker told to stop while its scheduler goes down
        can linger), then the scheduler; SIGKILL for any that outlives its grace period (10 s, or
        2 s once every scheduler is gone: a worker then has no one to leave gracefully)."""
        orphaned = bool(self.schedulers) and all(proc.poll() is not None for proc in self.schedulers)
        for proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=2 if orphaned else 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def running(self) -> bool:
        return all(proc.poll() is None for proc in self.started)

    def log(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(self.logs.glob("*.log"))
        )


@pytest.fixture(scope="session")
def dask_cli():
    """The class that starts clusters with the ``dask`` command (test modules cannot import each other)."""
    return DaskProcesses
