"""Backup replicas, sharded inference and scaling studies on a real multi-process cluster."""

import dask.array as da
import numpy as np
import pytest

import workbench as wb
from workbench.events import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_backup_replicas_apply_the_first_to_finish_and_count_the_rest(client, kit):
    model, data = kit.mlp(), kit.blobs(n=120)
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    history = sess.fit(
        model["train"], data, batch_size=24, steps=12, replicas=2, backup_replicas=1, fetches=[model["loss"]]
    )
    assert [len(r["dropped"]) for r in history.records] == [1] * 12  # the parameter server's (2 workers)
    assert all(r["dropped"][0] in (0, 1, 2) and len(r["arrivals"]) == 3 for r in history.records)
    assert len({w for r in history.records for w in r["workers"]}) == 2
    losses = history["mean"]
    assert np.isfinite(losses).all() and losses[-3:].mean() < losses[:3].mean()  # it trains


def test_backup_replicas_are_validated(client, kit):
    model, data = kit.mlp(), kit.blobs()
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    with pytest.raises(wb.ClusterError, match="backup_replicas must be 0 or more"):
        sess.fit(model["train"], data, batch_size=24, steps=1, replicas=2, backup_replicas=-1)


def test_sharded_inference_maps_over_chunks(client, kit):
    model, data = kit.mlp(), kit.blobs(n=100)
    local = wb.Session(model["graph"], seed=0, cluster=False)
    local.fit(model["train"], data, batch_size=20, steps=5)
    expected = local.run(model["logits"], {model["x"]: data["x"]})

    chunked = da.from_array(data["x"], chunks=30)
    lazy = local.run({"logits": model["logits"]}, {"x": chunked})
    assert isinstance(lazy["logits"], da.Array)
    assert lazy["logits"].chunks[0] == (30, 30, 30, 10)
    np.testing.assert_allclose(lazy["logits"].compute(), expected, rtol=1e-12)

    remote = wb.Session(model["graph"], seed=0, cluster=client)
    remote.set_variables(local.variables)
    result = client.compute(remote.run(model["logits"], {"x": chunked})).result()
    np.testing.assert_allclose(result, expected, rtol=1e-12)


def test_sharded_inference_refuses_what_cannot_be_split(kit):
    model, data = kit.mlp(), kit.blobs(n=40)
    sess = wb.Session(model["graph"], seed=0, cluster=False)
    with pytest.raises(wb.GraphError, match="cannot compute 'mean' chunk by chunk"):
        sess.run(model["loss"], {"x": da.from_array(data["x"], chunks=10), "y": da.from_array(data["y"], chunks=10)})
    with pytest.raises(wb.GraphError, match="operations cannot be run chunk by chunk"):
        sess.run([model["logits"], model["train"]], {"x": da.from_array(data["x"], chunks=10)})
    with pytest.raises(wb.GraphError, match="cannot update variables"):
        sess.run(
            wb.assign(model["graph"].variables[0], model["graph"].variables[0]),
            {"x": da.from_array(data["x"], chunks=10)},
        )


def test_scaling_study_reports_each_worker_count(client, kit):
    model, data = kit.mlp(hidden=32), kit.blobs(n=256)
    events, fits = [], []
    unsubscribe = ROOT.subscribe(lambda e: events.append(e) if e["kind"].startswith("scaling") else None)
    unsubscribe_fits = ROOT.subscribe(lambda e: fits.append(e) if e["kind"] == "fit_started" else None)
    try:
        study = wb.scaling_study(
            model["graph"], model["train"], data, batch_size=64, steps=4, workers=[1, 2], cluster=client
        )
    finally:
        unsubscribe()
        unsubscribe_fits()
    # each run says it is the study's (a notebook then shows the study's view, not one per run)
    assert len(fits) == 2 and {f.study for f in fits} == {events[0].session}
    assert [r["workers"] for r in study.rows] == [1, 2]
    first, second = study.rows
    assert first["speedup"] == 1.0 and first["efficiency"] == 1.0
    assert second["speedup"] == pytest.approx(second["samples_per_s"] / first["samples_per_s"])
    assert second["efficiency"] == pytest.approx(second["speedup"] / 2)
    assert [e["kind"] for e in events] == ["scaling_started", "scaling_point", "scaling_point", "scaling_finished"]
    assert "| 2 |" in study.table()
    with pytest.raises(wb.ClusterError, match="the cluster has 2 workers; the study asks for 3"):
        wb.scaling_study(model["graph"], model["train"], data, batch_size=64, steps=2, workers=[1, 3], cluster=client)
