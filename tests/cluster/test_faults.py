"""Faults lose nothing: killed workers, failed steps, bounded lineage (real worker processes)."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from sklearn.datasets import load_digits

import workbench as wb
from workbench.cluster.parameter_server import synchronous as cluster_fit
from workbench.cluster.collective.allreduce import AllReduceEngine
from workbench.cluster.lower import parse_key

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 80


def build():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w1 = wb.variable("w1", shape=(64, 32), dtype="float64")
        b1 = wb.variable("b1", shape=(32,), init="zeros", dtype="float64")
        w2 = wb.variable("w2", shape=(32, 10), dtype="float64")
        b2 = wb.variable("b2", shape=(10,), init="zeros", dtype="float64")
        logits = wb.matmul(wb.relu(wb.matmul(x, w1) + b1), w2) + b2
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    return g, train, loss


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return {"x": d.data / 16.0, "y": d.target}


@pytest.fixture(scope="module")
def reference(digits):
    g, train, loss = build()
    sess = wb.Session(g, seed=0)
    sess.fit(train, digits, batch_size=64, steps=STEPS, fetches=[loss])
    return sess.variables


def assert_same(variables, reference):
    assert sorted(variables) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(variables[name], value, rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_killed_worker_costs_no_progress(client, digits, reference):
    g, train, loss = build()
    sess = wb.Session(g, seed=0, cluster=client)
    pids = client.run(os.getpid)
    victim = sorted(pids)[-1]
    synced = threading.Event()
    sess.events.subscribe(lambda e: synced.set() if e["kind"] == "synced" else None)

    def kill():
        synced.wait(60)
        time.sleep(0.05)
        os.kill(pids[victim], signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    history = sess.fit(train, digits, batch_size=64, steps=STEPS, replicas=2, fetches=[loss], sync_every=10)
    killer.join(5)
    assert not killer.is_alive()
    assert [r["step"] for r in history.records] == list(range(1, STEPS + 1))
    assert_same(sess.variables, reference)
    client.wait_for_workers(2, timeout=60)  # the nanny brought the worker back


# what a step's tasks are, to cancel, in each engine
ENGINES = {
    "parameter_server": (cluster_fit.ParameterServer, lambda engine: [engine.metrics[-1][1]]),
    "allreduce": (AllReduceEngine, lambda engine: engine.tasks_of(engine.flight[-1][1])),
}


@pytest.mark.parametrize("strategy", sorted(ENGINES))
def test_a_failed_step_restarts_from_the_last_sync(client, digits, reference, monkeypatch, strategy):
    g, train, loss = build()
    sess = wb.Session(g, seed=0, cluster=client)
    restarts = []
    sess.events.subscribe(lambda e: restarts.append(e) if e["kind"] == "restarted" else None)
    engine_class, last_tasks = ENGINES[strategy]
    submit = engine_class._submit

    def submit_then_cancel(self, step, *args):
        submit(self, step, *args)
        if step == 25 and not restarts:  # lose step 25 once, as a dead worker would
            self.client.cancel(last_tasks(self))

    monkeypatch.setattr(engine_class, "_submit", submit_then_cancel)
    history = sess.fit(train, digits, batch_size=64, steps=STEPS, replicas=2, fetches=[loss], sync_every=10,
                       strategy=strategy)  # fmt: skip
    assert [e["step"] for e in restarts] == [20]  # redone from the copy of step 20, not from step 0
    assert [r["step"] for r in history.records] == list(range(1, STEPS + 1))
    assert_same(sess.variables, reference)


def test_lineage_does_not_grow_with_steps(client, digits):
    g, train, loss = build()
    sess = wb.Session(g, seed=0, cluster=client)
    scheduler = client.cluster.scheduler  # a LocalCluster's scheduler lives in this process
    counts, before = [], set(scheduler.tasks)  # what earlier tests left is not this fit's lineage

    def count(record):
        counts.append(
            sum(1 for key in scheduler.tasks.copy() if key not in before and isinstance(key, tuple) and parse_key(key))
        )

    sess.fit(
        train, digits, batch_size=64, steps=120, replicas=2, fetches=[loss], window=4, sync_every=20, callback=count
    )
    # a sync cuts the lineage: at most a sync period (plus the window) of steps is alive,
    # at step 120 as at step 20
    per_step = 2 * 2 + 1
    assert max(counts) <= per_step * (20 + 4 + 1)
    # (a step's tasks of slack: under load the scheduler forgets released tasks a moment later; a
    # lineage that grew would hold about 100 steps more)
    assert max(counts[-20:]) <= max(counts[:40]) + per_step
    assert min(counts[20:]) <= per_step * 4
