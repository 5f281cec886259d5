"""The all-reduce strategy on real worker processes: same variables as local training, faults."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.collective.allreduce import AllReduceEngine
from workbench.cluster.program import TrainingProgram
from workbench.cluster.collective.replica import held_variables
from workbench.testing import assert_close

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 12


def local_run(kit, dtype, batch_size, steps=STEPS):
    m = kit.mlp(dtype=dtype, hidden=16)
    data = kit.blobs(dtype=dtype)
    start = wb.Session(m["graph"], seed=0).variables
    sess = wb.Session(m["graph"], seed=0)
    history = sess.fit(m["train"], data, batch_size=batch_size, steps=steps, fetches=[m["loss"]])
    return m, data, start, sess.variables, [r[m["loss"].name] for r in history.records]


def engine_for(client, m, data, batch_size, workers, **options):
    program = TrainingProgram.from_graph(m["graph"], m["train"], [m["loss"].name], seed=0)
    # a session's first fit draws its batches from (seed, 1)
    return AllReduceEngine(client, program, data, batch_size, (0, 1), workers=workers, name=m["graph"].name, **options)


@pytest.mark.parametrize(
    "workers, dtype, batch_size",
    [(1, "float64", 24), (2, "float32", 25), (3, "float64", 24), (3, "float64", 25)],
)
def test_trains_to_the_variables_of_local_training(client3, kit, workers, dtype, batch_size):
    m, data, start, expected, losses = local_run(kit, dtype, batch_size)
    members = sorted(client3.scheduler_info()["workers"])[:workers]
    engine = engine_for(client3, m, data, batch_size, members)
    engine.start(start, 0)
    outcomes, synced = [], []
    for outcome in engine.run(1, STEPS, sync_at=lambda s: s % 5 == 0):
        outcomes.append(outcome)
        synced.append(engine.variables()[1])
    variables, step = engine.variables()
    held = client3.run(held_variables, engine.group.token, workers=members)
    engine.close()
    for replica in held.values():  # every replica holds the same bits
        for name, value in variables.items():
            assert replica[name].tobytes() == value.tobytes(), name
    rtol = 1e-9 if dtype == "float64" else 1e-5
    assert step == STEPS
    assert [o.step for o in outcomes] == list(range(1, STEPS + 1))
    assert synced[4] == 5 and synced[9] == 10  # a host copy at each sync step
    kit.assert_same_variables(expected, variables, rtol=rtol)
    assert_close([o.fetches[m["loss"].name] for o in outcomes], losses, rtol=rtol)
    trained = [v for _, v in m["graph"].training[m["train"].name].gradients]
    model_bytes = sum(expected[v].nbytes for v in trained)
    for o in outcomes:
        assert o.metrics["tasks"] == workers
        assert o.metrics["bytes_received"] <= 2 * (workers - 1) / workers * model_bytes * 1.05


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_fit_on_three_workers_matches_local_training(client3, kit, strategy):
    m, data, _, expected, losses = local_run(kit, "float64", 24)
    sess = wb.Session(m["graph"], seed=0, cluster=client3)
    history = sess.fit(m["train"], data, batch_size=24, steps=STEPS, fetches={"loss": m["loss"]}, strategy=strategy,
                       sync_every=5)  # fmt: skip
    assert history.records[-1]["replicas"] == 3
    kit.assert_same_variables(expected, sess.variables, rtol=1e-9)
    np.testing.assert_allclose(history["loss"], losses, rtol=1e-9)


def test_two_runs_share_the_workers_without_waiting_on_each_other(client3, kit):
    # each step task waits for its peers; were it to hold its worker's only thread meanwhile, two
    # runs could each hold one worker and wait for the other's forever
    steps = 20
    runs = []
    for dtype, batch_size in (("float64", 24), ("float64", 30)):
        m, data, start, expected, _ = local_run(kit, dtype, batch_size, steps=steps)
        runs.append((engine_for(client3, m, data, batch_size, None, timeout=20, window=4), start, expected))
    results, errors = [None, None], []

    def train(i):
        engine, start, _ = runs[i]
        try:
            engine.start(start, 0)
            for _ in engine.run(1, steps, sync_at=lambda s: False):
                pass
            results[i] = (engine.variables()[0], engine.restarts)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            engine.close()

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert time.monotonic() - started < 20  # no step waited for a peer's timeout
    for (variables, restarts), (_, _, expected) in zip(results, runs):
        assert restarts == 0
        kit.assert_same_variables(expected, variables, rtol=1e-9)


def test_a_killed_worker_restarts_the_run_from_the_last_sync(client3, kit):
    steps = 30
    m, data, start, expected, _ = local_run(kit, "float64", 24, steps=steps)
    pids = client3.run(os.getpid)
    members = sorted(pids)
    engine = engine_for(client3, m, data, 24, members, timeout=5)
    engine.start(start, 0)
    reported = []
    for outcome in engine.run(1, steps, sync_at=lambda s: s % 10 == 0):
        reported.append(outcome.step)
        if outcome.step == 12:
            os.kill(pids[members[1]], signal.SIGKILL)
    variables, step = engine.variables()
    assert engine.restarts >= 1
    engine.close()
    assert reported == list(range(1, steps + 1))
    kit.assert_same_variables(expected, variables, rtol=1e-9)


@pytest.fixture
def fresh3():
    """Three worker processes of its own: the test kills two of them."""
    client = wb.cluster.connect("local", n_workers=3)
    try:
        client.wait_for_workers(3, timeout=60)
        yield client
    finally:
        wb.cluster.close(client)


def test_a_second_worker_dying_during_the_relaunch_costs_one_more_restart(fresh3, kit):
    client3 = fresh3
    steps = 30
    m, data, start, expected, _ = local_run(kit, "float64", 24, steps=steps)
    pids = client3.run(os.getpid)
    members = sorted(pids)
    engine = engine_for(client3, m, data, 24, None, timeout=5)  # any worker: restarted ones too
    relaunch = engine._launch

    def launch_while_another_dies(chosen):
        if engine.restarts == 1:  # the first relaunch: one more of its members dies as it starts
            victim = chosen[-1]
            os.kill(client3.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        return relaunch(chosen)

    engine._launch = launch_while_another_dies
    engine.start(start, 0)
    reported = []
    for outcome in engine.run(1, steps, sync_at=lambda s: s % 10 == 0):
        reported.append(outcome.step)
        if outcome.step == 12:
            os.kill(pids[members[1]], signal.SIGKILL)
    variables, _ = engine.variables()
    assert engine.restarts >= 2
    engine.close()
    assert reported == list(range(1, steps + 1))  # workers remained: the fit went on
    kit.assert_same_variables(expected, variables, rtol=1e-9)


def test_the_backup_engine_restarts_a_lost_step_from_the_last_sync(client3, kit, monkeypatch):
    from workbench.cluster.collective.backup_engine import BackupAllReduceEngine

    lost = []
    submit = BackupAllReduceEngine._submit

    def submit_then_cancel(self, step, sync):
        submit(self, step, sync)
        if step == 6 and not lost:  # lose step 6 once, as a dead worker would
            lost.append(step)
            self.client.cancel(self.tasks_of(self.flight[-1][1]))

    monkeypatch.setattr(BackupAllReduceEngine, "_submit", submit_then_cancel)
    m = kit.mlp()
    sess = wb.Session(m["graph"], seed=0, cluster=client3)
    restarted = []
    sess.events.subscribe(lambda e: restarted.append(e["step"]) if e["kind"] == "restarted" else None)
    history = sess.fit(m["train"], kit.blobs(), batch_size=24, steps=8, replicas=2, backup_replicas=1, sync_every=4,
                       fetches=[m["loss"]])  # fmt: skip
    assert lost == [6] and restarted == [4]  # redone from the copy of step 4, on R + b members again
    assert [r["step"] for r in history.records] == list(range(1, 9))
    assert history.records[-1]["restarts"] == 1 and len(history.records[-1]["arrivals"]) == 3
    assert np.isfinite(history[m["loss"].name]).all()
