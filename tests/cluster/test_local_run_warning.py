"""A cluster session's ``run`` of a training step says, once, that it runs in this process."""

import warnings

import numpy as np
import pytest

import workbench as wb
from workbench.session import LocalRunWarning


@pytest.mark.slow
def test_run_of_a_training_step_on_a_cluster_session_says_once_where_it_runs():
    from distributed import Client, LocalCluster

    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        w = wb.variable("w", init=[[1.0], [2.0]])
        loss = wb.mean(wb.matmul(x, w))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            sess = wb.Session(g, cluster=client)
            feed = {x: np.ones((4, 2), "float32")}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sess.run(loss, feed_dict=feed)  # not a training step: nothing said
                assert caught == []
                sess.run(train, feed_dict=feed)
                sess.run(train, feed_dict=feed)
            (said,) = caught
            assert said.category is LocalRunWarning and said.filename == __file__
            assert str(said.message).startswith(
                "sess.run(train) runs the training step in this (the notebook's) process, not on the session's cluster; "
                "to train data-parallel on the cluster call sess.fit(train, data={...}, batch_size=..., replicas=N)"
            )
            np.testing.assert_allclose(sess.variables["w"], [[0.8], [1.8]], rtol=1e-6)
