"""fit(feed_dict=...) on a cluster: the fixed values reach every replica's steps, validation runs with defaults."""

import numpy as np
import pytest

import workbench as wb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def switched():
    """The kit's MLP with dropout behind a ``training`` placeholder that defaults to False."""
    g = wb.Graph(name="switched")
    with g.as_default():
        training = wb.placeholder("training", shape=(), dtype="bool", default=False)
        x = wb.placeholder("x", shape=(None, 6), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(6, 12), dtype="float64")
        v = wb.variable("v", shape=(12, 3), dtype="float64")
        h = wb.dropout(wb.tanh(x @ w), 0.5, training=training)
        loss = wb.mean(wb.softmax_cross_entropy(h @ v, y))
        train = wb.optimizers.Adam(0.05).minimize(loss)
    return g, loss, train


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_fixed_feeds_train_like_local_and_validation_uses_the_defaults(kit, client, strategy):
    g, loss, train = switched()
    data, held = kit.blobs(), kit.blobs(n=30, seed=1)
    fit = dict(batch_size=12, steps=8, fetches={"loss": loss}, feed_dict={"training": True}, validation=(held, 4))
    local = wb.Session(g, seed=2, cluster=False)
    expected = local.fit(train, data, **fit)
    remote = wb.Session(g, seed=2, cluster=client)
    got = remote.fit(train, data, replicas=2, strategy=strategy, **fit)
    kit.assert_same_variables(local.variables, remote.variables, rtol=1e-9)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-9)
    np.testing.assert_allclose(got["val_loss"], expected["val_loss"], rtol=1e-9)
    # validation ran without dropout: the final value is the loss with the switch at its default
    assert got["val_loss"][-1] == pytest.approx(float(remote.run(loss, held)), rel=1e-12)
    plain = wb.Session(g, seed=2, cluster=False)
    plain.fit(train, data, batch_size=12, steps=8)
    assert not np.allclose(plain.variables["w"], remote.variables["w"])  # the feed made a difference
