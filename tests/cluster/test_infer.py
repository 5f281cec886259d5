"""Sharded inference goes through the one plan compiler, on the session's kind of device."""

import dask
import numpy as np

import workbench as wb
from workbench.cluster import infer


def test_a_gpu_sessions_sharded_inference_runs_on_the_gpu(kit):
    import dask.array as da

    model, data = kit.mlp(), kit.blobs(n=50)
    gpu = wb.Session(model["graph"], seed=0, cluster=False, device="gpu", emulate=True)
    expected = wb.Session(model["graph"], seed=0, cluster=False).run(model["logits"], {"x": data["x"]})
    infer.PLANS.clear()
    with dask.config.set(scheduler="sync"):
        lazy = gpu.run(model["logits"], {"x": da.from_array(data["x"], chunks=20)})
        np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-6)
    (plan,) = infer.PLANS.values()  # compiled once for the three chunks
    assert "fused_elementwise" in {op.type for op in plan.graph.operations}  # the GPU's rewrite
    cpu_plan_ops = {
        op.type for op in wb.Session(model["graph"]).plan_for(model["logits"], {"x": data["x"]}).graph.operations
    }
    assert "fused_elementwise" not in cpu_plan_ops
