"""Asynchronous SGD on a real cluster: strategy="async" (3 worker processes)."""

import numpy as np
import pytest

import workbench as wb
from workbench.events import FitStarted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_async_applies_each_gradient_as_it_arrives_with_staleness_about_r_minus_1(client3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    sess = wb.Session(model["graph"], seed=0, cluster=client3)
    started = []
    sess.events.subscribe(lambda e: started.append(e) if isinstance(e, FitStarted) else None)
    steps = 36
    history = sess.fit(
        model["train"], data, batch_size=24, steps=steps, replicas=3, strategy="async", fetches=[model["loss"]],
        sync_every=10,
    )  # fmt: skip
    assert started[-1].strategy == "async" and started[-1].replicas == 3
    records = history.records
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # one record per applied gradient
    assert {r["replica"] for r in records} == {0, 1, 2}
    staleness = np.asarray([r["staleness"] for r in records])
    assert staleness[0] == 0 and staleness.min() >= 0 and staleness.max() <= steps
    assert abs(staleness[3:].mean() - 2) < 0.75  # R - 1 with equal replicas
    losses = np.asarray(history[model["loss"].name])
    assert np.isfinite(losses).all() and losses[-6:].mean() < losses[:6].mean()
    assert sess.variables.keys() >= {"w0", "b0", "w1", "b1"}


def test_async_draws_its_stragglers_per_gradient_and_refuses_backups(client3, kit):
    model, data = kit.mlp(), kit.blobs(n=240)
    sess = wb.Session(model["graph"], seed=0, cluster=client3)
    late = wb.stragglers.Fixed(replica=0, delay=1.0)
    history = sess.fit(model["train"], data, batch_size=24, steps=12, replicas=2, strategy="async", stragglers=late)
    counts = np.bincount([r["replica"] for r in history.records], minlength=2)
    assert counts[1] > counts[0]  # the slow replica hands in fewer gradients
    assert all(r["delay"] == (1.0 if r["replica"] == 0 else 0.0) for r in history.records)
    with pytest.raises(wb.ClusterError, match="asynchronous SGD applies every gradient"):
        sess.fit(model["train"], data, batch_size=24, steps=2, replicas=2, backup_replicas=1, strategy="async")
