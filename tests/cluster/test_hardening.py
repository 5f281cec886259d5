"""Hung workers, a lost scheduler, a closed client, data too big, ending early: each gets a bounded,
named answer (real processes: ``dask scheduler`` and ``dask worker`` started here, signals sent to them)."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.lower import parse_key
from workbench.errors import ClusterError
from workbench.events import FitInterrupted, Restarted, Synced

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 60


@pytest.fixture
def cli(tmp_path, dask_cli):
    """A scheduler and two workers (no nannies) started here; stopped workers are continued at the end."""
    processes = dask_cli(tmp_path)
    address = processes.scheduler()
    processes.worker(address, "w1")
    processes.worker(address, "w2")
    client = processes.connect(address, 2)
    pids = client.run(os.getpid)
    try:
        yield processes, client, pids
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        client.close()
        processes.stop()


@pytest.fixture(scope="module")
def problem(kit):
    model, data = kit.mlp(), kit.blobs(256)
    local = wb.Session(model["graph"], seed=0)
    local.fit(model["train"], data, batch_size=32, steps=STEPS)
    return model, data, local.variables


def once(action):
    """An event listener that calls ``action`` at the first sync of the fit."""
    done = threading.Event()

    def listener(event):
        if isinstance(event, Synced) and not done.is_set():
            done.set()
            action()

    listener.done = done
    return listener


def test_a_hung_worker_is_left_out_and_the_fit_finishes_on_the_other(cli, problem, kit):
    processes, client, pids = cli
    model, data, reference = problem
    victim = sorted(pids)[-1]
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    events = []
    sess.events.subscribe(events.append)
    stop = once(lambda: os.kill(pids[victim], signal.SIGSTOP))
    sess.events.subscribe(stop)
    started = time.monotonic()
    history = sess.fit(model["train"], data, batch_size=32, steps=STEPS, replicas=2, sync_every=10,
                       fetches=[model["loss"]])  # fmt: skip
    elapsed = time.monotonic() - started
    assert stop.done.is_set() and elapsed < 90  # the default step timeout for fast steps is 10 s
    assert [r["step"] for r in history.records] == list(range(1, STEPS + 1))
    kit.assert_same_variables(reference, sess.variables, rtol=1e-9)
    restarts = [e for e in events if isinstance(e, Restarted)]
    assert restarts and restarts[0].step == 10  # from the last sync
    after = [r for r in history.records if r["step"] > 20]
    assert all(victim not in r["workers"] for r in after)


def test_backup_replicas_finish_with_one_of_two_workers_stopped(cli, problem):
    processes, client, pids = cli
    model, data, _ = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    stop = once(lambda: os.kill(pids[sorted(pids)[0]], signal.SIGSTOP))
    sess.events.subscribe(stop)
    started = time.monotonic()
    history = sess.fit(model["train"], data, batch_size=32, steps=STEPS, replicas=2, backup_replicas=1,
                       sync_every=10, fetches=[model["loss"]])  # fmt: skip
    assert stop.done.is_set() and time.monotonic() - started < 90
    assert [r["step"] for r in history.records] == list(range(1, STEPS + 1))
    assert np.isfinite(history.records[-1][model["loss"].name])


def test_no_worker_left_is_a_cluster_error_naming_them(cli, problem):
    processes, client, pids = cli
    model, data, _ = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    sess.events.subscribe(once(lambda: [os.kill(pid, signal.SIGSTOP) for pid in pids.values()]))
    started = time.monotonic()
    with pytest.raises(ClusterError, match="no worker is left: .*tcp://127.0.0.1:.*stopped answering") as raised:
        sess.fit(model["train"], data, batch_size=32, steps=STEPS, replicas=2, sync_every=10, step_timeout=5)
    assert time.monotonic() - started < 60 and raised.value.__cause__ is not None


def test_a_killed_scheduler_is_a_cluster_error_with_its_cause(cli, problem):
    processes, client, pids = cli
    model, data, _ = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    sess.events.subscribe(once(lambda: processes.started[0].kill()))  # the scheduler
    started = time.monotonic()
    with pytest.raises(
        ClusterError, match="lost the Dask scheduler at tcp://127.0.0.1.*start the cluster again"
    ) as raised:
        sess.fit(model["train"], data, batch_size=32, steps=100_000, replicas=2, sync_every=10)
    assert time.monotonic() - started < 60 and raised.value.__cause__ is not None
    assert len(sess.last_history.records) >= 10


def test_a_client_closed_from_another_thread_is_a_cluster_error(cli, problem):
    processes, client, pids = cli
    model, data, _ = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    sess.events.subscribe(once(lambda: threading.Thread(target=client.close).start()))
    with pytest.raises(ClusterError, match="client was closed while the fit ran") as raised:
        sess.fit(model["train"], data, batch_size=32, steps=100_000, replicas=2, sync_every=10)
    assert raised.value.__cause__ is not None


def test_data_larger_than_a_worker_memory_is_refused_with_advice(tmp_path, dask_cli, kit):
    processes = dask_cli(tmp_path)
    address = processes.scheduler()
    processes.worker(address, "small", "--memory-limit", "300MiB")
    client = processes.connect(address, 1)
    try:
        model = kit.mlp()
        data = {"x": np.zeros((4_500_000, 6)), "y": np.zeros(4_500_000, "int64")}  # 250 MB, never touched
        sess = wb.Session(model["graph"], seed=0, cluster=client)
        with pytest.raises(ClusterError, match=r"data \(2\d\d MiB\) does not fit .* limit is 300 MiB.*dask array"):
            sess.fit(model["train"], data, batch_size=32, steps=5)
    finally:
        client.close()
        processes.stop()


def test_stop_and_interrupt_on_a_cluster_keep_the_last_step(client, problem, kit):
    """parameter_server keeps the exact step; the all-reduce engine keeps its last host copy (below)."""
    model, data, _ = problem
    local = wb.Session(model["graph"], seed=0)
    local.fit(model["train"], data, batch_size=32, steps=7)
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    history = sess.fit(model["train"], data, batch_size=32, steps=STEPS, replicas=2, sync_every=20,
                       callback=lambda r: sess.request_stop() if r["step"] == 7 else None,
                       strategy="parameter_server")  # fmt: skip
    assert len(history.records) == 7
    kit.assert_same_variables(local.variables, sess.variables, rtol=1e-9)

    def interrupt(record):
        if record["step"] == 7:
            raise KeyboardInterrupt

    other = wb.Session(model["graph"], seed=0, cluster=client)
    ends = []
    other.events.subscribe(lambda e: ends.append(e) if isinstance(e, FitInterrupted) else None)
    with pytest.raises(KeyboardInterrupt):
        other.fit(
            model["train"],
            data,
            batch_size=32,
            steps=STEPS,
            replicas=2,
            sync_every=20,
            callback=interrupt,
            strategy="parameter_server",
        )
    kit.assert_same_variables(local.variables, other.variables, rtol=1e-9)
    assert len(other.last_history.records) == 7 and ends[-1].step == 7 and ends[-1].reason == "interrupted"
    scheduler = client.cluster.scheduler  # the fit's tasks are cancelled and forgotten
    deadline = time.monotonic() + 10
    while any(isinstance(k, tuple) and parse_key(k) for k in scheduler.tasks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in scheduler.tasks if isinstance(k, tuple) and parse_key(k)]
    started = time.monotonic()
    assert len(other.fit(model["train"], data, batch_size=32, steps=5, replicas=2).records) == 5
    assert time.monotonic() - started < 20


def test_a_stopped_allreduce_fit_keeps_its_last_host_copy_and_a_history_that_matches(client, problem, kit):
    model, data, _ = problem
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    history = sess.fit(model["train"], data, batch_size=32, steps=STEPS, replicas=2, sync_every=5,
                       callback=lambda r: sess.request_stop() if r["step"] == 7 else None)  # fmt: skip
    kept = len(history.records)
    assert kept == 5 and [r["step"] for r in history.records] == [1, 2, 3, 4, 5]  # the sync before step 7
    local = wb.Session(model["graph"], seed=0)
    local.fit(model["train"], data, batch_size=32, steps=kept)
    kit.assert_same_variables(local.variables, sess.variables, rtol=1e-9)
