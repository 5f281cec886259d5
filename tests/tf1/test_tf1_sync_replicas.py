"""``tf.train.SyncReplicasOptimizer`` on a cluster session today: ``replicas`` and ``backup_replicas`` as
``fit``'s defaults; with backups the fit trains with the parameter-server strategy and says why, and
``stats=`` (computed by the all-reduce strategy) is refused naming that reason."""

import numpy as np
import pytest

import workbench as wb
import workbench.tf1 as tf
from workbench.events import FitStarted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def model(total):
    tf.reset_default_graph()
    x = tf.placeholder(tf.float32, [None, 4])
    y = tf.placeholder(tf.int64, [None])
    W = tf.Variable(tf.zeros([4, 3]))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.matmul(x, W)))
    opt = tf.train.SyncReplicasOptimizer(
        tf.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=2, total_num_replicas=total
    )
    rng = np.random.default_rng(0)
    data = {x: rng.normal(size=(48, 4)).astype("float32"), y: rng.integers(0, 3, 48)}
    return opt.minimize(loss), loss, data


def test_sync_replicas_with_a_backup_trains_on_the_cluster_and_says_how():
    train, loss, data = model(total=3)
    with tf.Session("local") as sess:
        sess.run(tf.global_variables_initializer())
        started = []
        unsubscribe = sess.events.subscribe(lambda e: started.append(e) if isinstance(e, FitStarted) else None)
        try:
            history = sess.fit(train, data, batch_size=12, steps=4, fetches={"loss": loss})
        finally:
            unsubscribe()
        assert len(history.records) == 4 and np.isfinite(history.records[-1]["loss"])
        (event,) = started
        assert event.strategy == "parameter_server" and "backup_replicas=1" in event.reason
        with pytest.raises(wb.ClusterError, match=r"fit\(stats=...\) .*backup_replicas=1"):
            sess.fit(train, data, batch_size=12, steps=2, stats=1)
        train2, loss2, data2 = model(total=2)  # no backups: the default all-reduce strategy, with statistics
        sess2 = tf.Session(cluster=sess.client)
        try:
            history = sess2.fit(train2, data2, batch_size=12, steps=2, stats=1)
        finally:
            sess2.close()
        assert sorted(history.stats) == [1, 2]
