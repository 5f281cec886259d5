"""Asynchronous SGD on a real cluster: strategy="async" (3 worker processes), and a killed worker."""

import os
import signal

import numpy as np
import pytest

import workbench as wb
from workbench.events import FitStarted, Restarted, Synced

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_async_applies_each_gradient_as_it_arrives_with_staleness_about_r_minus_1(client3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    sess = wb.Session(model["graph"], seed=0, cluster=client3)
    started = []
    sess.events.subscribe(lambda e: started.append(e) if isinstance(e, FitStarted) else None)
    steps = 36
    history = sess.fit(
        model["train"], data, batch_size=24, steps=steps, replicas=3, strategy="async", fetches=[model["loss"]],
        sync_every=10,
    )  # fmt: skip
    assert started[-1].strategy == "async" and started[-1].replicas == 3
    records = history.records
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # one record per applied gradient
    assert {r["replica"] for r in records} == {0, 1, 2}
    staleness = np.asarray([r["staleness"] for r in records])
    assert staleness[0] == 0 and staleness.min() >= 0 and staleness.max() <= steps
    assert abs(staleness[3:].mean() - 2) < 0.75  # R - 1 with equal replicas
    losses = np.asarray(history[model["loss"].name])
    assert np.isfinite(losses).all() and losses[-6:].mean() < losses[:6].mean()
    assert sess.variables.keys() >= {"w0", "b0", "w1", "b1"}


def test_async_draws_its_stragglers_per_gradient_and_refuses_backups(client3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    sess = wb.Session(model["graph"], seed=0, cluster=client3)
    late = wb.stragglers.Fixed(replica=0, delay=1.0)
    history = sess.fit(model["train"], data, batch_size=24, steps=12, replicas=2, strategy="async", stragglers=late)
    counts = np.bincount([r["replica"] for r in history.records], minlength=2)
    assert counts[1] > counts[0]  # the slow replica hands in fewer gradients
    assert all(r["delay"] == (1.0 if r["replica"] == 0 else 0.0) for r in history.records)
    with pytest.raises(wb.ClusterError, match="asynchronous SGD applies every gradient"):
        sess.fit(model["train"], data, batch_size=24, steps=2, replicas=2, backup_replicas=1, strategy="async")


@pytest.fixture
def fresh3(client3):
    """The module's three workers, all there again: the tests below kill or stop one of them (a killed
    worker's nanny starts another; a stopped one is continued), after the tests above."""
    client3.wait_for_workers(3, timeout=60)
    return client3


def kill_at_first_sync(sess, client, pick, sig=signal.SIGKILL):
    """At the fit's first host sync, send ``sig`` to the worker ``pick(sorted workers)``; the events it saw."""
    pids, seen = client.run(os.getpid), []

    def listener(event):
        seen.append(event)
        if isinstance(event, Synced) and sum(isinstance(e, Synced) for e in seen) == 1:
            os.kill(pids[pick(sorted(pids))], sig)

    sess.events.subscribe(listener)
    return seen


def test_a_killed_replica_restarts_async_from_the_last_host_copy_reporting_each_gradient_once(fresh3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    sess = wb.Session(model["graph"], seed=0, cluster=fresh3)
    seen = kill_at_first_sync(sess, fresh3, lambda workers: workers[1])  # replica 1, not the server
    steps = 30
    history = sess.fit(
        model["train"], data, batch_size=24, steps=steps, replicas=2, strategy="async", fetches=[model["loss"]],
        sync_every=10,
    )  # fmt: skip
    assert [r["step"] for r in history.records] == list(range(1, steps + 1))  # each applied gradient once
    restarts = [e for e in seen if isinstance(e, Restarted)]
    # from a host copy: the first sync's, or the next one's where replica 0 reached it before the loss was seen
    assert restarts and restarts[0].step in (10, 20)
    assert history.records[-1]["restarts"] == len(restarts)
    after = history.records[restarts[-1].step :]
    assert {r["replica"] for r in after} == {0, 1}  # two replicas again after the restart
    assert np.isfinite(history[model["loss"].name]).all()


def test_one_async_replica_is_plain_sgd_even_when_its_worker_is_killed(fresh3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    local = wb.Session(model["graph"], seed=0)
    local.fit(model["train"], data, batch_size=24, steps=25)
    sess = wb.Session(model["graph"], seed=0, cluster=fresh3)
    seen = kill_at_first_sync(sess, fresh3, lambda workers: workers[0])  # the one replica, and the server
    history = sess.fit(model["train"], data, batch_size=24, steps=25, replicas=1, strategy="async", sync_every=10)
    assert [e.step for e in seen if isinstance(e, Restarted)] == [10]
    assert [r["step"] for r in history.records] == list(range(1, 26))
    assert all(r["staleness"] == 0 for r in history.records)
    kit.assert_same_variables(local.variables, sess.variables, rtol=1e-9)  # the redone steps too


def test_a_stopped_replica_is_left_out_and_async_finishes_on_the_workers_left(fresh3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    sess = wb.Session(model["graph"], seed=0, cluster=fresh3)
    pids, victim = fresh3.run(os.getpid), sorted(fresh3.run(os.getpid))[1]
    seen = kill_at_first_sync(sess, fresh3, lambda workers: workers[1], sig=signal.SIGSTOP)  # replica 1 hangs
    try:
        history = sess.fit(
            model["train"], data, batch_size=24, steps=30, replicas=2, strategy="async", sync_every=10,
            step_timeout=3, fetches=[model["loss"]],
        )  # fmt: skip
    finally:
        os.kill(pids[victim], signal.SIGCONT)
    assert [r["step"] for r in history.records] == list(range(1, 31))
    restarts = [e for e in seen if isinstance(e, Restarted)]
    assert restarts and restarts[-1].step % 10 == 0  # from a host copy
    redone = [r for r in history.records if r["step"] > restarts[-1].step]
    assert redone and all(victim not in r["workers"] for r in redone)  # left out: the other two train
    assert {r["replica"] for r in redone} == {0, 1}
