"""Strategy functions on a real cluster (2 worker processes): the members run the replica program with
their collectives on the worker-to-worker communicator, and agree with the one-process simulation."""

import numpy as np
import pytest

import workbench as wb

pytestmark = pytest.mark.slow
OWN_CLUSTER = True  # its last test kills a worker


def sync(r):
    r.apply({v: wb.all_reduce(g * r.weight) for v, g in r.gradients.items()})


def gathered(r):
    """The gradients' mean from an all_gather, the variables' mean from max/min and a broadcast: every collective."""
    r.apply({v: wb.mean(wb.all_gather(g * r.weight), axis=0) * 2.0 for v, g in r.gradients.items()})
    with r.every(2):
        r.assign({v: (wb.all_reduce(v, op="max") + wb.all_reduce(v, op="min")) * 0.5 for v in r.variables})
    with r.every(3):
        r.assign({v: wb.broadcast(v, root=1) for v in r.variables})


def fit(kit, cluster, strategy, steps=8, **kwargs):
    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05))
    sess = wb.Session(m["graph"], seed=0, cluster=cluster)
    history = sess.fit(
        m["train"], kit.blobs(), batch_size=32, steps=steps, fetches={"loss": m["loss"]}, strategy=strategy, **kwargs
    )
    return sess.variables, history


@pytest.mark.parametrize(
    "strategy",
    [sync, wb.strategies.local_sgd(every=3), wb.strategies.diloco(every=3), wb.strategies.compressed(), gathered],
    ids=["user_sync", "local_sgd", "diloco", "compressed", "every_collective"],
)
def test_the_cluster_equals_the_simulation(kit, client, strategy):
    on_cluster, ch = fit(kit, client, strategy, replicas=2)
    simulated, sh = fit(kit, False, strategy, replicas=2)
    kit.assert_same_variables(simulated, on_cluster, 1e-9)
    np.testing.assert_allclose(ch["loss"], sh["loss"], rtol=1e-9)
    assert ch["collectives"].tolist() == sh["collectives"].tolist()


def test_a_user_sync_strategy_trains_to_the_variables_of_local_training(kit, client):
    on_cluster, history = fit(kit, client, sync, replicas=2)
    local, _ = fit(kit, False, None)
    kit.assert_same_variables(local, on_cluster, 1e-9)
    assert history.records[0]["replicas"] == 2


def test_local_sgd_every_4_sends_its_bytes_on_the_cluster(kit, client):
    variables, history = fit(kit, client, wb.strategies.local_sgd(every=4), steps=16, replicas=2)
    model_bytes = sum(v.nbytes for name, v in variables.items() if "/" not in name)  # not the optimizer's slots
    assert sum(history["bytes_sent"]) == pytest.approx(4 * 2 * (2 - 1) / 2 * model_bytes, rel=0.05)
    assert history["collectives"].tolist() == [0, 0, 0, 4] * 4  # one all_reduce per variable, every 4th step


def test_statistics_of_a_strategy_function_on_the_cluster_are_the_engines(kit, client):
    from workbench.strategies import resolve

    m = kit.mlp()
    found = []
    for strategy in ("allreduce", resolve("allreduce"), wb.strategies.local_sgd(every=2)):
        sess = wb.Session(m["graph"], seed=0, cluster=client)
        history = sess.fit(m["train"], kit.blobs(), batch_size=32, steps=4, replicas=2, strategy=strategy, stats=1)
        found.append(history.stats)
    engine, function, local_sgd = found
    assert sorted(engine) == sorted(function) == sorted(local_sgd) == [1, 2, 3, 4]
    assert any(label.endswith("/grad_norm") for label in engine[1])
    for step in (1, 2, 3, 4):  # the global batch's: the shards' joined, norms of the all-reduced gradient
        assert set(function[step]) == set(engine[step]) == set(local_sgd[step])
        for label, value in engine[step].items():
            np.testing.assert_allclose(function[step][label], value, rtol=1e-9, err_msg=f"{step} {label}")
    for label, value in engine[1].items():  # step 1 starts from the same variables on every replica
        np.testing.assert_allclose(local_sgd[1][label], value, rtol=1e-9, err_msg=label)
    assert local_sgd[2] != engine[2]  # then each replica's own: local steps differ from the all-reduced one
    assert all(np.isfinite(v) for v in local_sgd[4].values())


def test_checkpoints_resume_a_cluster_fit_of_diloco(kit, client, tmp_path):
    strategy = wb.strategies.diloco(every=4)
    straight, _ = fit(kit, client, strategy, steps=8, replicas=2)
    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05))
    first = wb.Session(m["graph"], seed=0, cluster=client)
    first.fit(m["train"], kit.blobs(), batch_size=32, steps=8, replicas=2, strategy=strategy, checkpoint_dir=tmp_path,
              checkpoint_every=4, callback=lambda record: record["step"] == 4 and first.request_stop())  # fmt: skip
    assert "variables/replicas/0/diloco/w0/anchor" in np.load(tmp_path / "step-00000004.npz").files
    resumed = wb.Session(m["graph"], seed=0, cluster=client)
    history = resumed.fit(m["train"], kit.blobs(), batch_size=32, steps=8, replicas=2, strategy=strategy,
                          checkpoint_dir=tmp_path)  # fmt: skip
    assert history.records[0]["step"] == 5
    kit.assert_same_variables(straight, resumed.variables, 1e-12)


@pytest.mark.parametrize("replicas", [1, 2])
def test_one_and_two_replicas_of_a_user_strategy_equal_local_training(kit, client, replicas):
    on_cluster, _ = fit(kit, client, sync, replicas=replicas)
    local, _ = fit(kit, False, None)
    kit.assert_same_variables(local, on_cluster, 1e-9)


def test_three_workers_equal_local_training_and_the_simulation(kit, client3):
    local, _ = fit(kit, False, None)
    on_cluster, _ = fit(kit, client3, sync, replicas=3)  # shards of 11, 11, 10 rows
    kit.assert_same_variables(local, on_cluster, 1e-9)
    strategy = wb.strategies.diloco(every=2)
    kit.assert_same_variables(
        fit(kit, False, strategy, replicas=3)[0], fit(kit, client3, strategy, replicas=3)[0], 1e-9
    )


def test_statistics_of_unequal_shards_are_the_engines(kit, client3):
    from workbench.strategies import resolve

    m = kit.mlp()
    found = []
    for strategy in ("allreduce", resolve("allreduce")):  # shards of 11, 11, 10 rows: weighted, then scaled
        sess = wb.Session(m["graph"], seed=0, cluster=client3)
        history = sess.fit(m["train"], kit.blobs(), batch_size=32, steps=2, replicas=3, strategy=strategy, stats=2)
        found.append(history.stats[2])
    engine, function = found
    assert set(function) == set(engine)
    for label, value in engine.items():
        np.testing.assert_allclose(function[label], value, rtol=1e-9, err_msg=label)


def test_an_unknown_name_on_a_cluster_lists_engines_and_strategies(kit, client):
    with pytest.raises(
        wb.ClusterError,
        match=r"unknown strategy 'nope'; strategies are allreduce, async, parameter_server \(cluster engines\) and .*diloco",
    ):
        fit(kit, client, "nope", replicas=2)


@pytest.mark.parametrize("strategy", [sync, wb.strategies.local_sgd(every=3)], ids=["user_sync", "local_sgd"])
def test_a_lost_step_restarts_from_the_last_sync_with_every_ranks_state(kit, client, monkeypatch, strategy):
    from workbench.cluster.collective.strategy_engine import StrategyEngine

    straight, _ = fit(kit, client, strategy, steps=16, replicas=2, sync_every=5)
    restarts = []
    submit = StrategyEngine._submit

    def submit_then_cancel(self, step, sync):
        submit(self, step, sync)
        if step == 12 and not restarts:  # lose step 12 once, as a dead worker would
            restarts.append(step)
            self.client.cancel(self.tasks_of(self.flight[-1][1]))

    monkeypatch.setattr(StrategyEngine, "_submit", submit_then_cancel)
    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05))
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    events = []
    sess.events.subscribe(lambda e: events.append(e["step"]) if e["kind"] == "restarted" else None)
    history = sess.fit(m["train"], kit.blobs(), batch_size=32, steps=16, replicas=2, strategy=strategy, sync_every=5,
                       fetches={"loss": m["loss"]})  # fmt: skip
    assert events == [10]  # redone from the copy of step 10, every rank from its own state
    assert [r["step"] for r in history.records] == list(range(1, 17))
    kit.assert_same_variables(straight, sess.variables, 1e-12)


@pytest.mark.parametrize("strategy", [sync, "allreduce"], ids=["user_sync", "engine"])
def test_a_member_that_leaves_as_the_run_restarts_is_one_more_restart(kit, client, monkeypatch, strategy):
    from workbench.cluster.collective import allreduce

    straight, _ = fit(kit, client, strategy, steps=8, replicas=2, sync_every=4)
    lost, scatter = [], allreduce.scatter_whole
    submit = allreduce.AllReduceEngine._submit

    def submit_then_cancel(self, step, sync):
        submit(self, step, sync)
        if step == 6 and not lost:  # lose step 6 once, as a dead worker would
            lost.append("step")
            self.client.cancel(self.tasks_of(self.flight[-1][1]))

    def scatter_then_gone(client, data, **kwargs):
        if lost == ["step"]:  # the restart's scatter: a member the scheduler no longer knows
            lost.append("member")
            raise KeyError(kwargs["workers"][0])
        return scatter(client, data, **kwargs)

    monkeypatch.setattr(allreduce.AllReduceEngine, "_submit", submit_then_cancel)
    monkeypatch.setattr(allreduce, "scatter_whole", scatter_then_gone)
    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05))
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    events = []
    sess.events.subscribe(lambda e: events.append(e["step"]) if e["kind"] == "restarted" else None)
    history = sess.fit(m["train"], kit.blobs(), batch_size=32, steps=8, replicas=2, strategy=strategy, sync_every=4,
                       fetches={"loss": m["loss"]})  # fmt: skip
    assert lost == ["step", "member"]
    assert events == [4, 4]  # the failed relaunch is a second restart from the same copy
    assert [r["step"] for r in history.records] == list(range(1, 9))
    kit.assert_same_variables(straight, sess.variables, 1e-12)


def test_feed_dict_on_the_cluster_equals_the_simulation(client):
    g = wb.Graph(name="scaled")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        scale = wb.placeholder("scale", shape=(), dtype="float64")
        w = wb.variable("w", shape=(3,), dtype="float64")
        train = wb.optimizers.SGD(0.1).minimize(wb.mean((wb.sum(x * w, axis=1) * scale - 1.0) ** 2))
    data = {"x": np.random.default_rng(3).normal(size=(64, 3))}
    found = []
    for cluster in (client, False):
        sess = wb.Session(g, seed=0, cluster=cluster)
        sess.fit(train, data, batch_size=16, steps=4, feed_dict={"scale": 3.0}, replicas=2,
                 strategy=wb.strategies.local_sgd(every=2))  # fmt: skip
        found.append(sess.variables["w"])
    np.testing.assert_allclose(found[0], found[1], rtol=1e-12)


def test_gradient_norms_of_a_loss_that_does_not_split_are_refused(client):
    g = wb.Graph(name="squared_mean")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        w = wb.variable("w", shape=(3,), dtype="float64")
        train = wb.optimizers.SGD(0.1).minimize(wb.mean(wb.sum(x * w, axis=1)) ** 2)  # no shard's share adds up
    data = {"x": np.random.default_rng(3).normal(size=(64, 3))}
    sess = wb.Session(g, seed=0, cluster=client)
    with pytest.raises(wb.ClusterError, match=r"fit\(stats=...\) with strategy 'local_sgd' reports gradient norms"):
        sess.fit(train, data, batch_size=16, steps=2, replicas=2, strategy=wb.strategies.local_sgd(every=2), stats=1)


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_allreduce_strategy_function_gives_the_bits_of_the_built_in_engine(kit, client3, dtype, replicas):
    from workbench.strategies import resolve

    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05), dtype=dtype)
    found = []
    for strategy in ("allreduce", resolve("allreduce")):  # the engine, then the strategy function
        sess = wb.Session(m["graph"], seed=0, cluster=client3)
        history = sess.fit(
            m["train"], kit.blobs(dtype=dtype), batch_size=33, steps=6, replicas=replicas, strategy=strategy
        )  # 33 rows: shards of 17/16 and 11/11/11
        found.append(sess.variables)
    assert history["collectives"].tolist() == [4] * 6  # w0, b0, w1, b1: the ops, in one bucket
    for name, value in found[0].items():
        assert np.asarray(value).tobytes() == np.asarray(found[1][name]).tobytes(), name


def test_a_killed_worker_costs_a_strategy_function_fit_no_progress(kit, client):
    """Last in this module: one of the module's two workers is killed (its nanny brings it back)."""
    import os
    import signal
    import threading
    import time

    local, _ = fit(kit, False, None, steps=80)
    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05))
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    pids = client.run(os.getpid)
    victim = sorted(pids)[-1]
    synced, restarted = threading.Event(), []

    def seen(event):
        if event["kind"] == "synced":
            synced.set()
        elif event["kind"] == "restarted":
            restarted.append(event["step"])

    sess.events.subscribe(seen)

    def kill():
        synced.wait(60)
        time.sleep(0.05)
        os.kill(pids[victim], signal.SIGKILL)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    history = sess.fit(m["train"], kit.blobs(), batch_size=32, steps=80, replicas=2, strategy=sync, sync_every=10,
                       fetches={"loss": m["loss"]})  # fmt: skip
    killer.join(5)
    assert not killer.is_alive()
    assert [r["step"] for r in history.records] == list(range(1, 81))  # each step once
    assert restarted and all(step % 10 == 0 for step in restarted)  # from a host copy: no step from 0
    kit.assert_same_variables(local, sess.variables, 1e-9)
    client.wait_for_workers(2, timeout=180)  # the nanny brings the worker back (slow on a loaded machine)
