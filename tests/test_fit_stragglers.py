"""fit(stragglers=...) and strategy="async": the arguments checked before any engine runs."""

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ArgumentError, StrategyError


def _session():
    g = wb.Graph("strag")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        y = wb.placeholder("y", shape=(None, 1))
        w = wb.variable("w", shape=(3, 1), init="zeros")
        loss = wb.mean(wb.square(wb.matmul(x, w) - y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    data = {"x": np.ones((16, 3), np.float32), "y": np.ones((16, 1), np.float32)}
    return wb.Session(g), train, data


def test_stragglers_must_be_a_distribution():
    sess, train, data = _session()
    with pytest.raises(ArgumentError, match=r"fit\(stragglers=...\) takes wb.stragglers.Bernoulli"):
        sess.fit(train, data, batch_size=8, steps=1, replicas=2, stragglers=0.3)


def test_fixed_straggler_must_be_a_replica_of_the_fit():
    sess, train, data = _session()
    with pytest.raises(ArgumentError, match="replica 3 is not one of the fit's 3 replicas"):
        sess.fit(train, data, 8, steps=1, replicas=2, backup_replicas=1, stragglers=wb.stragglers.Fixed(3, 0.1))


def test_stragglers_without_replicas_are_refused():
    sess, train, data = _session()
    with pytest.raises(ArgumentError, match="stragglers=...\\) delays replicas"):
        sess.fit(train, data, 8, steps=1, stragglers=wb.stragglers.Fixed(0, 0.1))


def test_async_is_a_strategy_name():
    from workbench.cluster.engines import STRATEGIES
    from workbench.fit_arguments import runs_a_strategy_function

    assert "async" in STRATEGIES
    assert runs_a_strategy_function("async") is False


def test_async_without_a_cluster_says_where_it_trains():
    sess, train, data = _session()
    try:
        history = sess.fit(train, data, 8, steps=2, replicas=2, strategy="async")
    except StrategyError as e:
        assert "async" in str(e)
    else:  # the one-process simulation of asynchronous SGD
        assert len(history.records) == 2
