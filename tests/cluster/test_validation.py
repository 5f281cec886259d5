"""fit(validation=...) on a cluster: an inference task evaluates the step's variables on the held-out data."""

import numpy as np
import pytest

import workbench as wb
from workbench.events import Validated

pytestmark = pytest.mark.slow


def test_cluster_validation_matches_local_validation(client, kit):
    import dask.array as da

    model, data, held_out = kit.mlp(), kit.blobs(n=64), kit.blobs(n=30, seed=1)
    fetches = {"loss": model["loss"]}
    local = wb.Session(model["graph"], seed=0, cluster=False).fit(
        model["train"], data, batch_size=16, steps=8, fetches=fetches, validation=(held_out, 4)
    )
    sess = wb.Session(model["graph"], seed=0, cluster=client)
    seen = []
    sess.events.subscribe(seen.append)
    lazy = {"x": da.from_array(held_out["x"], chunks=10), "y": held_out["y"]}  # chunks gathered on a worker
    remote = sess.fit(model["train"], data, batch_size=16, steps=8, fetches=fetches, replicas=2,
                      sync_every=100, validation=(lazy, 4))  # fmt: skip
    steps, values = remote.series("val_loss")
    assert steps.tolist() == [4, 8]
    np.testing.assert_allclose(values, local["val_loss"], rtol=1e-9)
    assert [e.examples for e in seen if isinstance(e, Validated)] == [30, 30]
    final = sess.run(model["loss"], held_out)
    assert values[-1] == pytest.approx(float(final), rel=1e-12)
