"""Mixed precision on a real multi-process cluster: the same training as in one process."""

import numpy as np
import pytest

import workbench as wb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, BATCH = 12, 32


def mixed_mlp(initial_scale):
    """A float16 MLP on float32 masters, with a dynamic loss scale that starts at ``initial_scale``."""
    g = wb.Graph(name="mixed")
    with g.as_default(), wb.mixed_precision("float16"):
        x = wb.placeholder("x", shape=(None, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.tanh(x @ wb.variable("w0", shape=(6, 16)) + wb.variable("b0", shape=(16,), init="zeros"))
        logits = h @ wb.variable("w1", shape=(16, 3)) + wb.variable("b1", shape=(3,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        scale = wb.optimizers.LossScale(initial=initial_scale, growth_interval=4)
        train = wb.optimizers.Adam(0.05).minimize(loss, loss_scale=scale)
    return g, train, loss


# 2**22 overflows float16 and skips the first steps. Replicas scale their shard's mean loss by
# their share of the batch, so their float16 gradients overflow where the whole batch's do; only
# a sum over the batch that overflows float16 while each shard's sum does not (replicas add in
# float32) can skip a step locally and not on the cluster: a scale exactly there would fail here.
@pytest.mark.parametrize("initial_scale", [2.0**10, 2.0**22])
def test_two_replicas_match_local_training(kit, client, initial_scale):
    g, train, loss = mixed_mlp(initial_scale)
    data = kit.blobs(dtype="float32")
    results = []
    for cluster, fit in [(False, {}), (client, {"replicas": 2})]:
        sess = wb.Session(g, seed=0, cluster=cluster)
        with np.errstate(over="ignore", invalid="ignore"):
            hist = sess.fit(train, data, batch_size=BATCH, steps=STEPS, fetches=[loss], **fit)
        results.append((sess.variables, hist[loss.name]))
    (local, local_loss), (remote, remote_loss) = results
    assert local["w0"].dtype == np.float32 and remote["w0"].dtype == np.float32
    assert float(remote["loss_scale/scale"]) == float(local["loss_scale/scale"])
    assert int(remote["loss_scale/good_steps"]) == int(local["loss_scale/good_steps"])
    assert float(remote["Adam/step"]) == float(local["Adam/step"])
    if initial_scale > 2.0**20:
        assert 0 < float(local["Adam/step"]) < STEPS  # some steps were skipped, on both, and then it trained
    # float16 sums over 16 rows per replica instead of 32 round differently (about 1e-3), and Adam
    # turns that into steps of up to its learning rate where a gradient is near zero
    assert sorted(remote) == sorted(local)
    for name in local:
        np.testing.assert_allclose(remote[name], local[name], rtol=2e-2, atol=5e-3, err_msg=name)
    np.testing.assert_allclose(remote_loss, local_loss, rtol=2e-2)
