"""Synchronized batch norm: batch norm takes the moments of the global batch (cross_replica_sum), so a
model with it trains on 2 and 3 workers to the variables of local training."""

import numpy as np
import pytest

import workbench as wb
from workbench import datasets, models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, BATCH = 4, 48


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


@pytest.fixture(scope="module")
def digits():
    d = datasets.digits()
    return {"x": d.x_train, "y": d.y_train}


@pytest.mark.parametrize("cluster", ["client", "client3"])
def test_batch_norm_trains_on_workers_as_locally_in_float64(digits, cluster, request):
    client = request.getfixturevalue(cluster)
    workers = len(wb.cluster.info(client)["workers"])
    model = conv_bn_net()
    local = wb.Session(model["graph"], seed=3, cluster=False)
    expected = local.fit(model["train"], digits, batch_size=50, steps=STEPS, fetches={"loss": model["loss"]})
    sess = wb.Session(model["graph"], seed=3, cluster=client)
    # 50 rows on 3 workers: unequal shards (17, 17, 16), still the global batch's gradient
    got = sess.fit(model["train"], digits, batch_size=50, steps=STEPS, fetches={"loss": model["loss"]},
                   replicas=workers)  # fmt: skip
    assert sorted(sess.variables) == sorted(local.variables)
    for name, value in local.variables.items():
        np.testing.assert_allclose(sess.variables[name], value, rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-9)
    assert not np.allclose(sess.variables["batch_norm/moving_variance"], 1.0)  # moved by the global moments


@pytest.mark.parametrize("cluster", ["client"])  # 3 workers: the float64 test above
def test_the_resnet_trains_on_workers_as_locally(digits, cluster, request):
    model = models.resnet()
    local = wb.Session(model["graph"], seed=1, cluster=False)
    history = local.fit(model["train"], digits, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                        feed_dict={"training": True})  # fmt: skip
    client = request.getfixturevalue(cluster)
    workers = len(wb.cluster.info(client)["workers"])
    sess = wb.Session(model["graph"], seed=1, cluster=client)
    got = sess.fit(model["train"], digits, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                   replicas=workers, feed_dict={"training": True})  # fmt: skip
    assert sorted(sess.variables) == sorted(local.variables)
    for name, value in local.variables.items():
        scale = float(abs(value).max()) if value.size else 0.0
        # float32: the shards' moments add in another order than the batch's; Adam's m / sqrt(v) divides
        # that noise by the tiny v of entries whose gradient is near zero, so the weights themselves get
        # 1e-4 of their scale, everything else (the batch norm statistics, Adam's moments) 1e-5
        weight = not name.startswith("Adam/") and name.endswith("kernel")
        rtol = 1e-4 if weight else 1e-5
        np.testing.assert_allclose(sess.variables[name], value, rtol=rtol, atol=rtol * scale, err_msg=name)
    assert got["loss"] == pytest.approx(history["loss"], rel=1e-5)
