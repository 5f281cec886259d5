"""The NCCL backend of the collective on real GPUs: one worker per GPU (skipped without two)."""

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.collective.group import CollectiveGroup, communicator

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

cp = pytest.importorskip("cupy")
try:
    gpus = cp.cuda.runtime.getDeviceCount()
except cp.cuda.runtime.CUDARuntimeError:
    gpus = 0
if gpus < 2:
    pytest.skip("NCCL needs a GPU per rank: fewer than 2 CUDA devices", allow_module_level=True)


def reduce_on_my_gpu(group, n):
    import cupy
    from distributed import get_worker

    rank = group.addresses.index(get_worker().address)
    cupy.cuda.Device(rank).use()  # one GPU per rank (dask-cuda would set CUDA_VISIBLE_DEVICES instead)
    comm = communicator(group)
    rng = np.random.default_rng(rank)
    flat = cupy.asarray(rng.standard_normal(n))
    comm.start("grads", flat, scale=0.5).wait(60)
    return cupy.asnumpy(flat)


def test_nccl_ranks_end_with_the_same_bits():
    client = wb.cluster.connect("local", n_workers=2)
    try:
        client.wait_for_workers(2, timeout=60)
        group = CollectiveGroup.create(client, backend="nccl", timeout=60)
        assert group.nccl_id
        results = client.gather([client.submit(reduce_on_my_gpu, group, 100_003, workers=[a], pure=False)
                                 for a in group.addresses])  # fmt: skip
        expected = (
            np.random.default_rng(0).standard_normal(100_003) + np.random.default_rng(1).standard_normal(100_003)
        ) * 0.5
        np.testing.assert_allclose(results[0], expected, rtol=1e-12)
        assert results[0].tobytes() == results[1].tobytes()
    finally:
        wb.cluster.close(client)
