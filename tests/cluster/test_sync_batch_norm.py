"""Synchronized batch norm: batch norm takes the moments of the global batch (cross_replica_sum), so a
model with it trains on 2 and 3 workers to the variables of local training, unequal shards included."""

import numpy as np
import pytest

import workbench as wb
from workbench import datasets, models
from workbench.testing import assert_close

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# 35 rows: unequal shards on 2 workers (18, 17) and on 3 (12, 12, 11)
STEPS, BATCH = 4, 35


def conv_bn_net():
    """A float64 conv + batch norm + dense net trained with SGD: exactness without float32 noise."""
    g = wb.Graph(name="convbn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.conv2d(wb.reshape(x, (-1, 1, 8, 8)), 4, 3, use_bias=False)
        h = wb.relu(wb.layers.batch_norm(h, True))
        h = wb.layers.batch_norm(wb.reshape(h, (-1, 4 * 8 * 8)), True, momentum=0.9)
        loss = wb.mean(wb.softmax_cross_entropy(wb.layers.dense(h, 10), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return {"graph": g, "train": train, "loss": loss}


def moments_net():
    """Batch norm straight on the fed rows with momentum 0: after one step the moving statistics are
    the first batch's mean and unbiased variance."""
    g = wb.Graph(name="moments")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 5), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.batch_norm(x, True, momentum=0.0)
        loss = wb.mean(wb.softmax_cross_entropy(wb.layers.dense(h, 3), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, train


@pytest.fixture(scope="module")
def digits():
    d = datasets.digits()
    return {"x": d.x_train, "y": d.y_train}


@pytest.mark.parametrize(("cluster", "strategy"), [("client", None), ("client3", "allreduce")])
def test_batch_norm_trains_on_workers_as_locally_in_float64(digits, cluster, strategy, request):
    client = request.getfixturevalue(cluster)
    workers = len(wb.cluster.info(client)["workers"])
    model = conv_bn_net()
    local = wb.Session(model["graph"], seed=3, cluster=False)
    expected = local.fit(model["train"], digits, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]})
    sess = wb.Session(model["graph"], seed=3, cluster=client)
    got = sess.fit(model["train"], digits, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                   replicas=workers, strategy=strategy)  # fmt: skip
    assert sorted(sess.variables) == sorted(local.variables)
    for name, value in local.variables.items():
        assert_close(sess.variables[name], value, rtol=1e-9, err_msg=name)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-9)
    assert not np.allclose(sess.variables["batch_norm/moving_variance"], 1.0)  # moved by the global moments


def test_a_strategy_function_with_batch_norm_equals_the_simulation(digits, client3):
    # local SGD: the replicas' weights part between syncs, their batch norms still share the global moments
    model = conv_bn_net()
    runs = {}
    for where in (client3, False):
        sess = wb.Session(model["graph"], seed=3, cluster=where)
        history = sess.fit(model["train"], digits, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                           replicas=3, strategy=wb.strategies.local_sgd(every=2))  # fmt: skip
        runs[where is False] = sess.variables, history
    (on_cluster, ch), (simulated, sh) = runs[False], runs[True]
    for name, value in simulated.items():
        assert_close(on_cluster[name], value, rtol=1e-9, err_msg=name)
    np.testing.assert_allclose(ch["loss"], sh["loss"], rtol=1e-9)
    assert ch["collectives"].tolist() == sh["collectives"].tolist()


@pytest.mark.parametrize("cluster", ["client", "client3"])
def test_the_moving_statistics_are_the_global_batchs_moments(cluster, request):
    client = request.getfixturevalue(cluster)
    workers = len(wb.cluster.info(client)["workers"])
    g, train = moments_net()
    rng = np.random.default_rng(5)
    rows = BATCH  # one batch of every row
    data = {"x": rng.normal([1.0, -2.0, 0.0, 5.0, 0.5], [1.0, 0.1, 3.0, 2.0, 1e-2], size=(rows, 5)),
            "y": rng.integers(0, 3, rows)}  # fmt: skip
    sess = wb.Session(g, seed=0, cluster=client)
    sess.fit(train, data, batch_size=rows, steps=1, replicas=workers)
    assert_close(sess.variables["batch_norm/moving_mean"], data["x"].mean(axis=0), rtol=1e-12)
    assert_close(sess.variables["batch_norm/moving_variance"], data["x"].var(axis=0, ddof=1), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cluster", ["client", "client3"])
def test_the_resnet_trains_on_workers_as_locally(digits, cluster, dtype, request):
    model = models.resnet(dtype=dtype)
    data = {"x": digits["x"].astype(dtype), "y": digits["y"]}
    local = wb.Session(model["graph"], seed=1, cluster=False)
    history = local.fit(model["train"], data, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                        feed_dict={"training": True})  # fmt: skip
    client = request.getfixturevalue(cluster)
    workers = len(wb.cluster.info(client)["workers"])
    sess = wb.Session(model["graph"], seed=1, cluster=client)
    got = sess.fit(model["train"], data, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                   replicas=workers, feed_dict={"training": True})  # fmt: skip
    assert sorted(sess.variables) == sorted(local.variables)
    assert sum(name.endswith(("moving_mean", "moving_variance")) for name in local.variables) == 12
    for name, value in local.variables.items():
        assert_close(sess.variables[name], value, rtol=rtol(name, dtype), err_msg=name)
    assert got["loss"] == pytest.approx(history["loss"], rel=1e-9 if dtype == "float64" else 1e-5)


def rtol(name: str, dtype: str) -> float:
    """float64: 1e-9 for every variable. float32: 1e-5 of each variable's scale, 1e-4 for the kernels:
    a few kernel entries get a gradient 1e-5 of the kernel's largest (batch norm's backward pass nearly
    cancels it), near Adam's epsilon, where Adam's step follows the gradient's last bits, which the
    shards' sums round differently from the whole batch's (measured: 2e-5 to 7e-5 of the kernel's scale
    at batch sizes 31 to 64, equal shards included). The float64 runs show that the sums are the
    global batch's."""
    if dtype == "float64":
        return 1e-9
    return 1e-4 if name.endswith("kernel") and not name.startswith("Adam/") else 1e-5


@pytest.mark.parametrize(
    ("options", "refused"),
    [({"strategy": "parameter_server"}, "strategy='parameter_server'"), ({"backup_replicas": 1}, "backup_replicas=1")],
)
def test_engines_that_run_each_forward_pass_alone_refuse_batch_norm(client, options, refused):
    g, train = moments_net()
    data = {"x": np.ones((8, 5)), "y": np.zeros(8, dtype=np.int64)}
    sess = wb.Session(g, seed=0, cluster=client)
    with pytest.raises(wb.ClusterError, match=rf"{refused} cannot train this graph: .* strategy='allreduce'"):
        sess.fit(train, data, batch_size=4, steps=1, replicas=1, **options)


def test_a_gpu_cluster_fit_refuses_batch_norm_by_name(client):
    g, train = moments_net()
    data = {"x": np.ones((8, 5)), "y": np.zeros(8, dtype=np.int64)}
    sess = wb.Session(g, seed=0, cluster=client, device="gpu", emulate=True)
    with pytest.raises(wb.ClusterError, match=r"synchronized batch norm\), which a cluster fit runs on CPU workers"):
        sess.fit(train, data, batch_size=4, steps=1, replicas=2)
