"""wb.compare_strategies on a cluster: the runs train on the workers (wall clock), from the same start."""

import pytest

import workbench as wb
from workbench.errors import ArgumentError

pytestmark = pytest.mark.slow


def _problem(kit):
    model = kit.mlp(dtype="float32")
    return model["graph"], model["train"], model["loss"], kit.blobs(n=240, dtype="float32")


def test_compare_on_a_cluster_runs_sync_and_backups_there(client3, kit):
    g, train, loss, data = _problem(kit)
    late = wb.stragglers.Fixed(0, 0.3)
    result = wb.compare_strategies(
        g, train, data, batch_size=48, steps=6, replicas=2, validation=(data, 3), stragglers=late,
        runs={"sync": {}, "sync + 1 backup": {"backup_replicas": 1}}, cluster=client3,
        fetches={"loss": loss}, show=False,
    )  # fmt: skip
    assert result.clock == "wall"
    sync, backed = result.histories["sync"], result.histories["sync + 1 backup"]
    assert len(sync) == len(backed) == 6
    assert all(r["delays"][0] == 0.3 for r in sync.records)
    for r in backed.records:  # the latest arrival is left out: the slow replica, once every worker is warm
        assert len(r["dropped"]) == 1 and r["arrivals"][r["dropped"][0]] == max(r["arrivals"])
    assert sum(r["dropped"] == [0] for r in backed.records) >= 4
    assert all(r["arrivals"][0] >= 0.3 for r in sync.records)
    assert sync["elapsed"][-1] >= 6 * 0.3  # every synchronous step waited for the straggler
    table = result.table(key="val_loss")
    assert [r["run"] for r in table.rows] == ["sync", "sync + 1 backup"]
    assert all(t is not None for t in result.time_to(key="val_loss").values())


def test_the_virtual_clock_is_refused_on_a_cluster(client3, kit):
    g, train, loss, data = _problem(kit)
    with pytest.raises(ArgumentError, match=r"clock='virtual'\) is the one-process simulation's clock"):
        wb.compare_strategies(g, train, data, batch_size=48, steps=2, runs={"sync": {}}, clock="virtual",
                              cluster=client3, show=False)  # fmt: skip


def test_compare_on_a_cluster_runs_async_there(client3, kit):
    g, train, loss, data = _problem(kit)
    result = wb.compare_strategies(
        g, train, data, batch_size=48, steps=4, replicas=2, validation=(data, 2),
        runs={"async": {"strategy": "async"}}, cluster=client3, fetches={"loss": loss}, show=False,
    )  # fmt: skip
    history = result.histories["async"]
    assert len(history) == 8  # steps * R applied gradients, as in the simulation
    assert set(history["replica"]) <= {0, 1} and all(s >= 0 for s in history["staleness"])
    assert "val_loss" in history.fields and result.view.state["status"] == "done"
