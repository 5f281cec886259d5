"""A recurrent model built with wb.scan (and a wb.cond, layer_norm, gelu) trains on the cluster to the variables of
local training: the bodies travel inside the graph file and compile on the workers."""

from __future__ import annotations

import numpy as np
import pytest

import workbench as wb

pytestmark = pytest.mark.slow


def rnn():
    g = wb.Graph(name="rnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6, 4), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(8, 8), dtype="float64")
        u = wb.variable("u", shape=(4, 8), dtype="float64")
        v = wb.variable("v", shape=(8, 3), dtype="float64")
        s = wb.variable("s", shape=(8,), init="ones", dtype="float64")
        o = wb.variable("o", shape=(8,), init="zeros", dtype="float64")
        h0 = wb.zeros_like(wb.matmul(x[:, 0, :], u))
        h, _ = wb.scan(
            lambda h, xt: (wb.tanh(wb.matmul(h, w) + wb.matmul(xt, u)), None), wb.transpose(x, (1, 0, 2)), h0
        )
        logits = wb.cond(
            wb.constant(True), lambda: wb.matmul(wb.gelu(wb.layer_norm(h, s, o)), v), lambda: wb.matmul(h, v)
        )
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.05).minimize(loss)
    return g, train, loss


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_a_scan_model_trains_on_two_workers_to_the_local_variables(client, strategy):
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((48, 6, 4)), "y": rng.integers(0, 3, 48)}
    results = []
    for cluster in (False, client):
        g, train, loss = rnn()
        sess = wb.Session(g, seed=3, cluster=cluster)
        fit = {"strategy": strategy} if cluster else {}
        sess.fit(train, data, batch_size=12, steps=6, fetches=[loss], **fit)
        results.append(sess.variables)
    for name in results[0]:
        np.testing.assert_allclose(results[1][name], results[0][name], rtol=1e-10, atol=1e-12, err_msg=name)
