"""The transformer of workbench.models trains on 2 and 3 workers to the variables of local training."""

import numpy as np
import pytest

import workbench as wb
from workbench import datasets, models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS, BATCH = 6, 64


@pytest.fixture(scope="module")
def local():
    digits = datasets.digits()
    data = {"x": digits.x_train, "y": digits.y_train}
    model = models.transformer()
    sess = wb.Session(model["graph"], seed=1, cluster=False)
    history = sess.fit(model["train"], data, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]})
    return model, data, sess.variables, history


@pytest.mark.parametrize("cluster", ["client", "client3"])
def test_the_transformer_trains_on_workers_as_locally(local, cluster, request):
    model, data, expected, history = local
    client = request.getfixturevalue(cluster)
    workers = len(wb.cluster.info(client)["workers"])
    sess = wb.Session(model["graph"], seed=1, cluster=client)
    got = sess.fit(model["train"], data, batch_size=BATCH, steps=STEPS, fetches={"loss": model["loss"]},
                   replicas=workers)  # fmt: skip
    got_variables = sess.variables
    assert sorted(got_variables) == sorted(expected)
    for name, value in expected.items():  # float32: rtol 1e-5, near-zero entries against the variable's scale
        scale = float(abs(value).max()) if value.size else 0.0
        np.testing.assert_allclose(got_variables[name], value, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    assert got["loss"] == pytest.approx(history["loss"], rel=1e-5)
