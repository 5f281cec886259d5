"""cross_replica_sum and the synchronized batch norm in the one-process simulation."""

import numpy as np
import pytest

import workbench as wb


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
