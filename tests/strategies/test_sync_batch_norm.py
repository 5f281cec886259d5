"""cross_replica_sum and the synchronized batch norm in the one-process simulation."""

import os

import numpy as np
import pytest

import workbench as wb
from workbench import checkpoint, datasets, models
from workbench.testing import assert_close


def net(momentum=0.9):
    g = wb.Graph(name="bn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.batch_norm(wb.layers.dense(x, 8), True, momentum=momentum)
        loss = wb.mean(wb.softmax_cross_entropy(wb.layers.dense(wb.relu(h), 3), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(90, 4)), "y": rng.integers(0, 3, 90)}
    return g, train, loss, data


@pytest.mark.parametrize(("replicas", "batch"), [(2, 16), (3, 16), (3, 15), (4, 10)])
def test_batch_norm_in_a_simulated_fit_is_the_global_batchs(replicas, batch):
    g, train, loss, data = net()
    local = wb.Session(g, seed=0)
    expected = local.fit(train, data, batch_size=batch, steps=4, fetches={"loss": loss})
    sim = wb.Session(g, seed=0)
    got = sim.fit(train, data, batch_size=batch, steps=4, fetches={"loss": loss}, replicas=replicas)
    for name, value in local.variables.items():  # unequal shards too (16 rows on 3 replicas: 6, 5, 5)
        np.testing.assert_allclose(sim.variables[name], value, rtol=1e-12, atol=1e-14, err_msg=name)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-12)
    assert got["collectives"][0] > len(g.trainable_variables)  # the moments' sums besides the gradients'


@pytest.mark.parametrize("replicas", [2, 3])
def test_the_global_moments_are_numpys_over_the_concatenated_shards(replicas, tmp_path):
    g = wb.Graph(name="moments")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2, 3), dtype="float64")  # statistics over rows and axis 2
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.batch_norm(x, True, momentum=0.0)  # momentum 0: the moving statistics are the batch's
        loss = wb.mean(wb.softmax_cross_entropy(wb.layers.dense(wb.reshape(h, (-1, 6)), 3), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    rng = np.random.default_rng(2)
    rows = 35  # one batch of every row, in unequal shards: (18, 17) or (12, 12, 11)
    data = {"x": rng.normal([[3.0], [-1e3]], [[1.0], [1e-2]], size=(rows, 2, 3)), "y": rng.integers(0, 3, rows)}
    sess = wb.Session(g, seed=0)
    sess.fit(train, data, batch_size=rows, steps=1, replicas=replicas, checkpoint_dir=str(tmp_path))
    assert_close(sess.variables["batch_norm/moving_mean"], data["x"].mean(axis=(0, 2)), rtol=1e-12)
    assert_close(sess.variables["batch_norm/moving_variance"], data["x"].var(axis=(0, 2), ddof=1), rtol=1e-12)
    # every replica holds the same bits (the sums in the collective's fixed order)
    saved, _ = checkpoint.read(os.path.join(tmp_path, os.listdir(tmp_path)[0]))
    for name in ("batch_norm/moving_mean", "batch_norm/moving_variance", "dense/kernel"):
        held = [saved[f"replicas/{rank}/{name}"] for rank in range(replicas)]
        assert all(np.array_equal(value, held[0]) for value in held), name


@pytest.mark.parametrize("replicas", [2, 3])
def test_the_resnet_trains_in_the_simulation_as_locally_in_float64(replicas):
    digits = datasets.digits()
    data = {"x": digits.x_train.astype("float64"), "y": digits.y_train}
    model = models.resnet(dtype="float64")
    fit = {"batch_size": 35, "steps": 3, "fetches": {"loss": model["loss"]}, "feed_dict": {"training": True}}
    local = wb.Session(model["graph"], seed=1)
    expected = local.fit(model["train"], data, **fit)
    sim = wb.Session(model["graph"], seed=1)
    got = sim.fit(model["train"], data, replicas=replicas, **fit)  # 35 rows: (18, 17) or (12, 12, 11)
    assert sorted(sim.variables) == sorted(local.variables)
    for name, value in local.variables.items():  # the moving statistics and Adam's moments included
        assert_close(sim.variables[name], value, rtol=1e-9, err_msg=name)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-9)


def test_asynchronous_sgd_refuses_a_synchronized_batch_norm():
    g, train, loss, data = net()
    with pytest.raises(wb.ArgumentError, match=r"strategy='async'\) cannot train this graph: .*'allreduce'"):
        wb.Session(g, seed=0).fit(train, data, batch_size=16, steps=2, replicas=2, strategy="async")


def test_cross_replica_sum_sums_values_and_gradients_across_replicas():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        w = wb.variable("w", shape=(3,), init="ones", dtype="float64")
        total = wb.cross_replica_sum(wb.sum(x * w, axis=0))  # the global batch's column sums, times w
        loss = wb.sum(total * total) / 1000.0
        train = wb.optimizers.SGD(0.01).minimize(loss)
    data = {"x": np.arange(24, dtype=np.float64).reshape(8, 3)}
    local = wb.Session(g, seed=0)
    local.fit(train, data, batch_size=8, steps=3)
    for replicas in (2, 4):
        sim = wb.Session(g, seed=0)
        sim.fit(train, data, batch_size=8, steps=3, replicas=replicas, strategy="allreduce")
        np.testing.assert_allclose(sim.variables["w"], local.variables["w"], rtol=1e-12)
    # outside a replicated fit: the identity
    assert wb.Session(g).run(total, {x: data["x"]}).tolist() == data["x"].sum(axis=0).tolist()


def test_cross_replica_sum_needs_a_shape_every_replica_shares():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        with pytest.raises(wb.ShapeError, match=r"cross_replica_sum needs the same shape on every replica"):
            wb.cross_replica_sum(x)


def test_the_lab_simulation_says_it_does_not_run_forward_collectives():
    g, train, loss, data = net()
    with pytest.raises(wb.ArgumentError, match=r"exchanges values between replicas in its forward pass"):
        wb.Session(g, seed=0).fit(train, data, batch_size=16, steps=2, replicas=2, backup_replicas=1)
