"""The scaling predictor under stragglers: a synchronous step as the R-th of R + b arrivals (4 workers)."""

import pytest

import workbench as wb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def client4():
    client = wb.cluster.connect("local", n_workers=4)
    try:
        client.wait_for_workers(4, timeout=60)
        yield client
    finally:
        wb.cluster.close(client)


@pytest.mark.parametrize("backups", [0, 1])
def test_predicted_median_step_under_lognormal_delays_is_within_15_percent(client4, kit, backups):
    model, data = kit.mlp(), kit.blobs(n=480)
    late = wb.stragglers.LogNormal(median=0.25, sigma=0.5, seed=0)
    study = wb.scaling_study(
        model["graph"], model["train"], data, batch_size=48, steps=24, workers=(4,), cluster=client4,
        predict=[4, 8], stragglers=late, backup_replicas=backups,
    )  # fmt: skip
    measured = study.rows[0]["median_step_seconds"]
    predicted = study.predicted("allreduce", 4)["median_step_seconds"]
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured)
    assert study.predicted("allreduce", 8)["median_step_seconds"] > 0.25  # the delays stay in the model
