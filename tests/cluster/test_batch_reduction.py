"""A cluster fit trains on the global batch's loss whatever its batch reduction, and combines each
fetch by what it is (both strategies, real worker processes)."""

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ClusterError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 8


def summed_model(kit, reduce="sum"):
    m = kit.mlp(optimizer=wb.optimizers.SGD(0.01), name=f"mlp_{reduce}")
    g, y, logits = m["graph"], m["y"], m["logits"]
    with g.as_default():
        xent = wb.softmax_cross_entropy(logits, y)
        loss = wb.sum(xent) if reduce == "sum" else wb.mean(xent) * 2.0
        train = wb.optimizers.SGD(0.01 if reduce == "sum" else 0.3).minimize(loss)
        right = wb.cast(wb.equal(wb.argmax(logits), y), "float64")
        w0 = g.get("w0:0")
        fetches = {
            "loss": loss,
            "mean": wb.mean(xent),
            "correct": wb.sum(right),
            "worst": wb.max(xent),
            "best": -wb.max(-xent),
            "logits": logits,
            "norm": wb.sum(w0 * w0),
        }
    return g, train, fetches


def fit(g, train, fetches, data, batch_size, cluster=None, **options):
    sess = wb.Session(g, seed=0, cluster=cluster)
    history = sess.fit(train, data, batch_size=batch_size, steps=STEPS, fetches=fetches, **options)
    return sess, history


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_cluster_fit_trains_and_fetches_as_local_training(client, kit, strategy, reduce):
    g, train, fetches = summed_model(kit, reduce)
    data = kit.blobs(n=96)
    local, expected = fit(g, train, fetches, data, 25)  # 25 rows: shards of 13 and 12
    sess, history = fit(g, train, fetches, data, 25, cluster=client, strategy=strategy, sync_every=4)
    assert history.records[-1]["replicas"] == 2
    kit.assert_same_variables(local.variables, sess.variables, rtol=1e-9)
    for label in fetches:
        got, want = np.asarray(history[label]), np.asarray(expected[label])
        assert got.shape == want.shape, label
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max(), err_msg=label)
    assert np.asarray(history["logits"]).shape == (STEPS, 25, 3)  # rows in order, not averages of rows


def test_a_summed_loss_moves_as_far_as_locally(client, kit):
    """The defect: a sum trained at 1/R of the local rate (gradients averaged as if it were a mean)."""
    g, train, fetches = summed_model(kit, "sum")
    data = kit.blobs(n=96)
    start = wb.Session(g, seed=0).variables
    local, _ = fit(g, train, {}, data, 32)
    sess, _ = fit(g, train, {}, data, 32, cluster=client)
    for name, value in local.variables.items():
        moved = np.abs(value - start[name]).max()
        np.testing.assert_allclose(sess.variables[name], value, rtol=1e-9, atol=1e-9 * moved, err_msg=name)


def test_a_loss_it_cannot_split_is_refused_naming_the_op(client, kit):
    m = kit.mlp(name="mlp_max")
    g = m["graph"]
    with g.as_default():
        worst = wb.max(wb.softmax_cross_entropy(m["logits"], m["y"]))
        train = wb.optimizers.SGD(0.1).minimize(worst)
        odd = wb.log(wb.sum(m["logits"]))
    data = kit.blobs(n=96)
    sess = wb.Session(g, seed=0, cluster=client)
    with pytest.raises(ClusterError, match=r"the loss 'max.*test_batch_reduction.py.*cannot be split across replicas"):
        sess.fit(train, data, batch_size=32, steps=2)
    with pytest.raises(ClusterError, match=r"fetch 'log.*cannot be combined across replicas: it applies 'log'"):
        sess.fit(m["train"], data, batch_size=32, steps=2, fetches={"odd": odd})
    local = wb.Session(g, seed=0)  # locally both are fine
    local.fit(train, data, batch_size=32, steps=2, fetches={"odd": odd})
