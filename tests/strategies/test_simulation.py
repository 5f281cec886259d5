"""The one-process simulation of R replicas against local training and against itself."""

import numpy as np
import pytest

import workbench as wb
from workbench import fit_arguments
from workbench.simulation import SimulatedReplicas


def mlp(dtype="float64", optimizer=None, loss_kind="mean", dropout=False):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype=dtype)
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(4, 8), dtype=dtype)
        b = wb.variable("b", shape=(8,), init="zeros", dtype=dtype)
        w2 = wb.variable("w2", shape=(8, 3), dtype=dtype)
        h = wb.relu(wb.matmul(x, w) + b)
        if dropout:
            h = wb.dropout(h, 0.25)
        per_example = wb.softmax_cross_entropy(wb.matmul(h, w2), y)
        loss = wb.mean(per_example) if loss_kind == "mean" else wb.sum(per_example) * 0.01
        train = (optimizer or wb.optimizers.SGD(0.1)).minimize(loss)
    return g, train, loss


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(384, 4)), "y": rng.integers(0, 3, 384)}


def fit(g, train, data, steps=12, batch_size=64, **kwargs):
    sess = wb.Session(g, seed=0, cluster=False)
    history = sess.fit(train, data, batch_size=batch_size, steps=steps, **kwargs)
    return sess.variables, history


def assert_close(a, b, rtol):
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=rtol * np.abs(b[name]).max(), err_msg=name)


@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_allreduce_equals_local_training_in_float64(data, replicas, optimizer):
    make = {
        "sgd": lambda: wb.optimizers.SGD(0.1),
        "momentum": lambda: wb.optimizers.Momentum(0.05, nesterov=True),
        "adam": lambda: wb.optimizers.Adam(0.01),
    }[optimizer]
    g, train, loss = mlp(optimizer=make())
    local, lh = fit(g, train, data, fetches=[loss])
    simulated, sh = fit(g, train, data, fetches=[loss], replicas=replicas, strategy="allreduce")
    assert_close(simulated, local, 1e-9)
    np.testing.assert_allclose(sh[loss.name], lh[loss.name], rtol=1e-9)  # fetches: the global batch's loss
    assert sh.records[0]["replicas"] == replicas and sh.records[0]["collectives"] == 3


def test_a_wider_model_in_threads_equals_local_training():
    """Arrays large enough that NumPy runs the replicas' threads at once (a race would show)."""
    rng = np.random.default_rng(2)
    g = wb.Graph(name="wide")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w1 = wb.variable("w1", shape=(64, 256), dtype="float64")
        w2 = wb.variable("w2", shape=(256, 10), dtype="float64")
        loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(wb.relu(wb.matmul(x, w1)), w2), y))
        train = wb.optimizers.SGD(0.2).minimize(loss)
    data = {"x": rng.normal(size=(512, 64)), "y": rng.integers(0, 10, 512)}
    local, _ = fit(g, train, data, steps=6)
    for replicas in (2, 4):
        simulated, _ = fit(g, train, data, steps=6, replicas=replicas, strategy="allreduce")
        assert_close(simulated, local, 1e-9)


def test_uneven_shards_a_sum_loss_and_dropout_still_equal_local_training(data):
    g, train, _ = mlp(loss_kind="sum", dropout=True)
    local, _ = fit(g, train, data, batch_size=64)
    simulated, _ = fit(g, train, data, batch_size=64, replicas=3, strategy="allreduce")  # shards of 22, 21, 21
    assert_close(simulated, local, 1e-9)


def test_replicas_without_a_strategy_mean_allreduce(data):
    g, train, _ = mlp()
    named, _ = fit(g, train, data, replicas=2, strategy="allreduce")
    default, history = fit(g, train, data, replicas=2)
    assert_close(default, named, 0)
    assert history.records[0]["collectives"] == 3


def test_float32_agrees_with_local_training_relative_to_the_values(data):
    g, train, _ = mlp(dtype="float32")
    local, _ = fit(g, train, data)
    simulated, _ = fit(g, train, data, replicas=2, strategy="allreduce")
    assert_close(simulated, local, 1e-5)


def test_local_sgd_every_1_equals_allreduce(data):
    g, train, _ = mlp()
    allreduce, _ = fit(g, train, data, replicas=2, strategy="allreduce")
    local_sgd, _ = fit(g, train, data, replicas=2, strategy=wb.strategies.local_sgd(every=1))
    assert_close(local_sgd, allreduce, 1e-9)


@pytest.mark.parametrize("every", [3, 4])
def test_diloco_with_a_plain_outer_step_equals_local_sgd(data, every):
    g, train, _ = mlp()
    local_sgd, _ = fit(g, train, data, steps=13, replicas=3, strategy=wb.strategies.local_sgd(every=every))
    diloco = wb.strategies.diloco(every=every, outer_lr=1, outer_momentum=0)
    outer, _ = fit(g, train, data, steps=13, replicas=3, strategy=diloco)
    assert_close(outer, local_sgd, 1e-9)


def test_diloco_with_momentum_differs_and_trains(data):
    g, train, loss = mlp()
    _, plain = fit(g, train, data, steps=24, replicas=2, strategy=wb.strategies.local_sgd(every=4), fetches=[loss])
    _, outer = fit(g, train, data, steps=24, replicas=2, strategy=wb.strategies.diloco(every=4), fetches=[loss])
    assert not np.allclose(plain[loss.name][8:], outer[loss.name][8:])
    assert outer[loss.name][-4:].mean() < outer[loss.name][:4].mean()


def test_local_sgd_every_4_sends_a_quarter_of_allreduces_bytes(data):
    g, train, _ = mlp()
    variables, allreduce = fit(g, train, data, steps=16, replicas=2, strategy="allreduce")
    _, local_sgd = fit(g, train, data, steps=16, replicas=2, strategy=wb.strategies.local_sgd(every=4))
    model_bytes = sum(v.nbytes for v in variables.values())
    replicas = 2
    assert sum(local_sgd["bytes_sent"]) == 4 * 2 * (replicas - 1) / replicas * model_bytes
    assert sum(local_sgd["bytes_sent"]) * 4 == sum(allreduce["bytes_sent"])
    assert local_sgd["collectives"].tolist() == [0, 0, 0, 3] * 4  # no communication on the other steps


def test_bytes_for_three_replicas_follow_two_r_minus_one_over_r(data):
    g, train, _ = mlp()
    variables, history = fit(g, train, data, steps=16, replicas=3, strategy=wb.strategies.local_sgd(every=4))
    model_bytes = sum(v.nbytes for v in variables.values())
    assert sum(history["bytes_sent"]) == pytest.approx(4 * 2 * 2 / 3 * model_bytes, rel=0.05)


def test_compressed_halves_the_bytes_and_stays_close_to_allreduce(data):
    g, train, _ = mlp(dtype="float32")
    exact, full = fit(g, train, data, replicas=2, strategy="allreduce")
    half, compressed = fit(g, train, data, replicas=2, strategy=wb.strategies.compressed())
    assert sum(compressed["bytes_sent"]) * 2 == sum(full["bytes_sent"])
    assert_close(half, exact, 2e-2)
    assert any(not np.array_equal(half[n], exact[n]) for n in exact)


def test_a_user_strategy_registered_by_decorator_trains_like_the_builtin(data):
    @wb.strategy("sync_sum_of_weighted")
    def sync(r):
        r.apply({v: wb.all_reduce(g * r.weight, op="sum") for v, g in r.gradients.items()})

    g, train, _ = mlp()
    local, _ = fit(g, train, data)
    mine, history = fit(g, train, data, replicas=3, strategy="sync_sum_of_weighted")
    assert_close(mine, local, 1e-9)
    assert history.records[0]["collectives"] == 3


def test_the_issues_example_local_sgd_by_name(data):
    @wb.strategy("my_local_sgd")
    def my_local_sgd(r):
        r.apply(r.gradients)  # a local step, no communication
        with r.every(4):
            r.assign({v: wb.all_reduce(v, op="mean") for v in r.variables})

    g, train, _ = mlp()
    mine, _ = fit(g, train, data, steps=48, replicas=2, strategy="my_local_sgd")
    builtin, _ = fit(g, train, data, steps=48, replicas=2, strategy=wb.strategies.local_sgd(every=4))
    assert_close(mine, builtin, 0)


def test_replicas_stay_identical_under_allreduce_and_drift_under_local_sgd(data):
    g, train, _ = mlp()
    for strategy, steps, same in [("allreduce", 5, True), (wb.strategies.local_sgd(every=4), 5, False)]:
        sess = wb.Session(g, seed=0, cluster=False)
        request = fit_arguments.request(sess, train, data, 64, steps, None, None, False)
        engine = SimulatedReplicas(request, strategy, 2)
        engine.start(sess.variables, 0)
        list(engine.run(1, steps, lambda step: False))
        state = engine.checkpoint_state()
        equal = all(np.array_equal(state[f"replicas/0/{n}"], state[f"replicas/1/{n}"]) for n in ("w", "b", "w2"))
        assert equal is same
        engine.close()


@pytest.mark.parametrize(
    "strategy", [wb.strategies.local_sgd(every=3), wb.strategies.diloco(every=3)], ids=["local_sgd", "diloco"]
)
def test_checkpoints_hold_every_replicas_state_and_slots_and_resume_exactly(data, tmp_path, strategy):
    g, train, _ = mlp(optimizer=wb.optimizers.Momentum(0.05))
    straight, _ = fit(g, train, data, steps=10, replicas=2, strategy=strategy)
    first = wb.Session(g, seed=0, cluster=False)
    first.fit(train, data, batch_size=64, steps=10, replicas=2, strategy=strategy, checkpoint_dir=tmp_path,
              checkpoint_every=5, callback=lambda record: record["step"] == 5 and first.request_stop())  # fmt: skip
    saved = np.load(tmp_path / "step-00000005.npz")
    members = set(saved.files)
    assert {"variables/w", "variables/replicas/0/w", "variables/replicas/1/w"} <= members
    assert "variables/replicas/1/Momentum/w/momentum" in members  # the optimizer's slots, per replica
    if strategy.name == "diloco":
        assert {"variables/replicas/0/diloco/w/anchor", "variables/replicas/1/diloco/w/outer_momentum"} <= members
    resumed = wb.Session(g, seed=0, cluster=False)
    history = resumed.fit(train, data, batch_size=64, steps=10, replicas=2, strategy=strategy, checkpoint_dir=tmp_path)
    assert history.records[0]["step"] == 6
    assert_close(resumed.variables, straight, 0)


def test_step_metrics_and_events(data):
    g, train, loss = mlp()
    seen = []
    sess = wb.Session(g, seed=0, cluster=False)
    sess.events.subscribe(seen.append)
    history = sess.fit(train, data, batch_size=64, steps=3, replicas=2, strategy="allreduce", fetches={"loss": loss})
    started = next(e for e in seen if e.kind == "fit_started")
    assert started.strategy == "allreduce" and started.replicas == 2
    assert set(history.records[0]) >= {"loss", "replicas", "bytes_sent", "collectives", "compute_seconds"}


def test_parameter_server_still_needs_a_cluster(data):
    g, train, _ = mlp()
    with pytest.raises(wb.ClusterError, match="strategy='parameter_server' needs a cluster"):
        fit(g, train, data, steps=1, strategy="parameter_server")


def test_validation_of_a_simulated_fit_sees_the_steps_variables(data):
    g, train, loss = mlp()
    held_out = {"x": data["x"][:64], "y": data["y"][:64]}
    _, local = fit(g, train, data, steps=6, fetches={"loss": loss}, validation=(held_out, 3))
    _, simulated = fit(g, train, data, steps=6, fetches={"loss": loss}, validation=(held_out, 3), replicas=2)
    np.testing.assert_allclose(simulated["val_loss"], local["val_loss"], rtol=1e-9)
    assert len(simulated["val_loss"]) == 2


def test_more_replicas_than_examples_in_a_batch_are_refused(data):
    g, train, _ = mlp()
    with pytest.raises(wb.ArgumentError, match="a batch of 2 examples cannot be split across 3 replicas"):
        fit(g, train, data, steps=1, batch_size=2, replicas=3)


def test_feed_dict_values_reach_every_replica():
    g = wb.Graph(name="scaled")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        scale = wb.placeholder("scale", shape=(), dtype="float64")
        w = wb.variable("w", shape=(3,), dtype="float64")
        train = wb.optimizers.SGD(0.1).minimize(wb.mean((wb.sum(x * w, axis=1) * scale - 1.0) ** 2))
    data = {"x": np.random.default_rng(3).normal(size=(64, 3))}
    local, _ = fit(g, train, data, steps=4, batch_size=16, feed_dict={"scale": 3.0})
    simulated, _ = fit(g, train, data, steps=4, batch_size=16, feed_dict={"scale": 3.0}, replicas=2)
    assert_close(simulated, local, 1e-9)
    other, _ = fit(g, train, data, steps=4, batch_size=16, feed_dict={"scale": 1.0}, replicas=2)
    assert not np.allclose(other["w"], simulated["w"])
