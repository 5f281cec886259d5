"""Batch inference of an exported model over dask arrays: chunk by chunk, the model shipped once per worker."""

import dask
import dask.array as da
import numpy as np
import pytest

import workbench as wb
from workbench.cluster import infer


def exported(kit, tmp_path, n=150):
    m, data = kit.mlp(), kit.blobs(n=n)
    sess = wb.Session(m["graph"], seed=0, cluster=False)
    sess.fit(m["train"], data, batch_size=30, steps=6)
    probs = wb.softmax(m["logits"])
    path = sess.export(tmp_path / "mlp.wbmodel", inputs={"x": m["x"]}, outputs={"probs": probs, "logits": m["logits"]})
    return wb.load_model(path), data["x"]


def test_predict_over_a_dask_array_is_lazy_and_keeps_the_chunks(kit, tmp_path):
    model, x = exported(kit, tmp_path)
    expected = model.predict({"x": x})
    lazy = model.predict({"x": da.from_array(x, chunks=40)})
    assert all(isinstance(v, da.Array) for v in lazy.values()) and list(lazy) == ["probs", "logits"]
    assert lazy["probs"].chunks == ((40, 40, 40, 30), (3,))
    keys = [str(k) for k in dict(lazy["probs"].__dask_graph__())]
    assert sum(k.startswith("InferenceProgram-") for k in keys) == 1  # one program key, whatever the chunks
    with dask.config.set(scheduler="sync"):
        for name, value in lazy.items():
            np.testing.assert_allclose(value.compute(), expected[name], rtol=1e-12)


def test_predict_over_a_dask_array_checks_its_shape(kit, tmp_path):
    model, x = exported(kit, tmp_path, n=60)
    with pytest.raises(wb.FeedError, match=r"input 'x' expects shape \(None, 6\), got \(60, 5\)"):
        model.predict({"x": da.from_array(x[:, :5], chunks=20)})


def test_predict_on_emulated_gpu_workers_compiles_for_the_gpu(kit, tmp_path):
    model, x = exported(kit, tmp_path, n=60)
    infer.PLANS.clear()
    with dask.config.set(scheduler="sync"):
        lazy = model.predict({"x": da.from_array(x, chunks=20)}, device="gpu", emulate=True)
        np.testing.assert_allclose(lazy["probs"].compute(), model.predict(x)["probs"], rtol=1e-6)
    (plan,) = infer.PLANS.values()  # once for the three chunks, with the GPU's rewrite
    assert "fused_elementwise" in {op.type for op in plan.graph.operations}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_predict_over_a_dask_array_on_a_local_cluster_equals_numpy(client, kit, tmp_path):
    model, x = exported(kit, tmp_path, n=400)
    expected = model.predict({"x": x})
    before = client.run(lambda: infer.PLANS.compiled)
    lazy = model.predict({"x": da.from_array(x, chunks=50)})  # 8 chunks over 2 worker processes
    probs, logits = client.compute([lazy["probs"], lazy["logits"]], sync=True)
    np.testing.assert_allclose(probs, expected["probs"], rtol=1e-12)
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-12)
    after = client.run(lambda: infer.PLANS.compiled)
    compiled = {w: after[w] - before[w] for w in after}
    assert set(compiled.values()) <= {0, 1} and sum(compiled.values()) >= 1, compiled  # at most once per worker
    scattered = da.from_array(x, chunks=100).persist()  # chunks already on the workers
    np.testing.assert_allclose(model.predict(scattered)["probs"].compute(), expected["probs"], rtol=1e-12)
