"""A stopped, killed or closed-under scheduler or client ends a fit within its bound with the right advice,
on both strategies (real ``dask scheduler`` and ``dask worker`` processes started here)."""

import os
import signal
import threading
import time

import pytest

import workbench as wb
from workbench.errors import ClusterError
from workbench.events import Synced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STRATEGIES = ["allreduce", "parameter_server"]


@pytest.fixture
def cli(tmp_path, dask_cli):
    """A scheduler and two workers (no nannies); every process is continued, then stopped, at the end."""
    processes = dask_cli(tmp_path)
    address = processes.scheduler()
    processes.worker(address, "w1")
    processes.worker(address, "w2")
    client = processes.connect(address, 2)
    try:
        yield processes, client
    finally:
        for proc in processes.started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        client.close(timeout=10)
        processes.stop()


@pytest.fixture(scope="module")
def problem(kit):
    return kit.mlp(), kit.blobs(256)


def at_first_sync(sess, action):
    done = threading.Event()

    def listener(event):
        if isinstance(event, Synced) and not done.is_set():
            done.set()
            action()

    sess.events.subscribe(listener)
    return done


def endless_fit(sess, model, data, strategy, **options):
    return sess.fit(model["train"], data, batch_size=32, steps=100_000, sync_every=10, strategy=strategy, **options)


@pytest.fixture
def forwarding():
    """The dashboard's forwarder, as a notebook with the extension loaded has it: its summaries must
    never hold a fit whose scheduler stopped."""
    from workbench.dashboard.forward import forward, stop

    forward()
    yield
    stop()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_stopped_scheduler_ends_the_fit_within_its_step_timeout(cli, problem, strategy, forwarding):
    processes, client = cli
    model, data = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    done = at_first_sync(sess, lambda: os.kill(processes.started[0].pid, signal.SIGSTOP))
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"scheduler at tcp://127.0.0.1:\d+ did not answer within \d+ s"):
        endless_fit(sess, model, data, strategy, step_timeout=5)
    assert done.is_set() and time.monotonic() - started < 90  # step_timeout, then bounded questions
    assert len(sess.last_history.records) >= 10  # the steps done are kept


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_killed_scheduler_says_start_the_cluster_again(cli, problem, strategy):
    processes, client = cli
    model, data = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    at_first_sync(sess, lambda: processes.started[0].kill())
    started = time.monotonic()
    with pytest.raises(
        ClusterError, match="lost the Dask scheduler at tcp://127.0.0.1.*start the cluster again"
    ) as raised:
        endless_fit(sess, model, data, strategy)
    assert "create a new Session" not in str(raised.value)
    assert time.monotonic() - started < 90 and raised.value.__cause__ is not None
    assert len(sess.last_history.records) >= 10


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_client_closed_from_another_thread_ends_the_fit(cli, problem, strategy):
    processes, client = cli
    model, data = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    at_first_sync(sess, lambda: threading.Thread(target=client.close).start())
    started = time.monotonic()
    with pytest.raises(ClusterError, match="client was closed while the fit ran.*create a new Session") as raised:
        endless_fit(sess, model, data, strategy)
    assert raised.value.__cause__ is not None and time.monotonic() - started < 90


def test_a_worker_that_cannot_import_workbench_fails_every_fit_fast(tmp_path, dask_cli, problem):
    broken = tmp_path / "broken"
    (broken / "workbench").mkdir(parents=True)
    (broken / "workbench" / "__init__.py").write_text("raise ImportError('workbench is not installed here')\n")
    processes = dask_cli(tmp_path)
    address = processes.scheduler()
    processes.start("w1", "worker", address, "--name", "w1", "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny",
                    "--no-dashboard", env={"PYTHONPATH": str(broken)})  # fmt: skip
    client = processes.connect(address, 1)
    model, data = problem
    try:
        for attempt in range(3):
            sess = wb.Session(model["graph"], seed=0, cluster=client)
            started = time.monotonic()
            with pytest.raises(ClusterError, match="workbench|did not answer|no progress"):
                sess.fit(model["train"], data, batch_size=32, steps=5, step_timeout=5)
            assert time.monotonic() - started < 60, attempt
    finally:
        client.close(timeout=10)
        processes.stop()
