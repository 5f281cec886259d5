"""fit(stats=k) on a cluster: the all-reduce replicas compute the statistic ops every k steps; the client joins
them into the global batch's statistics."""

import numpy as np
import pytest

import workbench as wb
from workbench.events import Step
from workbench.widgets import GraphView, TrainingView

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_stats_of_a_distributed_fit_colour_the_graph_view(client, kit):
    model, data = kit.mlp(hidden=8), kit.blobs(n=96)
    g, train = model["graph"], model["train"]
    sess = wb.Session(g, cluster=client)
    training = TrainingView().follow(sess.events)
    view = GraphView(g).follow(training)
    steps = []
    unsubscribe = sess.events.subscribe(lambda e: steps.append(e) if isinstance(e, Step) and e.stats else None)
    try:
        history = sess.fit(train, data, batch_size=32, steps=6, fetches={"loss": model["loss"]}, stats=2, replicas=2)
    finally:
        unsubscribe()
    assert sorted(history.stats) == [2, 4, 6] and [e.step for e in steps] == [2, 4, 6]
    local = wb.Session(g, cluster=False).fit(train, data, batch_size=32, steps=2, stats=2)
    assert set(history.stats[2]) == set(local.stats[2])  # the same statistics as a local fit
    assert all(np.isfinite(v) for v in history.stats[6].values())
    view.throttle.flush()
    assert view.stat == "grad_norm" and view.stat_steps == [2, 4, 6] and view.node_stats  # the view is coloured


def test_stats_with_the_parameter_server_strategy_say_what_computes_them(client, kit):
    model, data = kit.mlp(hidden=8), kit.blobs(n=64)
    sess = wb.Session(model["graph"], cluster=client)
    with pytest.raises(
        wb.ClusterError,
        match=r"fit\(stats=...\) on a cluster is computed by the all-reduce strategy, not 'parameter_server'",
    ):
        sess.fit(model["train"], data, batch_size=32, steps=2, stats=1, strategy="parameter_server")


def test_the_statistics_of_a_distributed_fit_are_the_global_batchs_as_in_local_training(client, kit):
    model, data = kit.mlp(hidden=8), kit.blobs(n=96)
    g, train = model["graph"], model["train"]
    spread = wb.Session(g, cluster=client, seed=0).fit(
        train, data, batch_size=33, steps=4, stats=2, replicas=2
    )  # shards of 17 and 16 rows: unequal shares
    local = wb.Session(g, cluster=False, seed=0).fit(train, data, batch_size=33, steps=4, stats=2)
    assert sorted(spread.stats) == sorted(local.stats) == [2, 4]
    for step in (2, 4):
        got, want = spread.stats[step], local.stats[step]
        assert set(got) == set(want)
        kinds = {label.rpartition("/")[2] for label in want}
        assert kinds == {"grad_norm", "mean", "std"}
        for label, value in want.items():
            assert got[label] == pytest.approx(value, rel=2e-4, abs=1e-6), (step, label)
