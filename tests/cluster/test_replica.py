"""Gradient buckets of the all-reduce strategy, planned and hooked without a cluster."""

import os
import subprocess
import sys

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.program import TrainingProgram
from workbench.cluster.worker_plans import plan_buckets
from workbench.graph.compile import compile_plan


def test_buckets_close_at_the_size_and_at_a_dtype_change():
    shapes = [(4, 4), (4,), (8, 8), (8,), (2,)]
    dtypes = ["float32", "float32", "float32", "float32", "float16"]
    buckets = plan_buckets([3, 2, 1, 0, 4], shapes, dtypes, bucket_bytes=64)
    assert [b.gradients for b in buckets] == [(3, 2), (1, 0), (4,)]
    assert buckets[0].offsets == ((0, 8), (8, 72)) and buckets[0].size == 72
    assert [b.dtype for b in buckets] == ["float32", "float32", "float16"]


def test_the_backward_pass_makes_the_last_layer_gradients_first_and_says_so(kit):
    m = kit.mlp(layers=3)
    g = m["graph"]
    program = TrainingProgram.from_graph(g, m["train"], [m["loss"].name])
    fetches = list(program.gradients)
    plan = compile_plan(g, fetches, program.feeds, state=wb.Session(g).variables)
    variable_of = dict(g.training[m["train"].name].gradients)
    made = plan.producers()
    first = [variable_of[fetches[i]] for i in sorted(range(len(fetches)), key=made.__getitem__)]
    assert first[:2] in (["b2", "w2"], ["w2", "b2"]) and set(first[-2:]) == {"w0", "b0"}
    assert list(program.gradient_variables) == [variable_of[f] for f in fetches]
    seen = []
    plan.watch(range(len(fetches)), lambda k, value: seen.append((k, value.copy())))
    data = kit.blobs(n=5)
    values = plan.run([data["x"], data["y"]])
    assert [variable_of[fetches[k]] for k, _ in seen] == first  # as each is computed
    for k, value in seen:
        np.testing.assert_array_equal(value, values[k])


def test_the_engine_names_what_it_cannot_train_on(kit):
    import dask.array as da

    from workbench.cluster.collective.allreduce import AllReduceEngine

    m = kit.mlp()
    data = kit.blobs()
    program = TrainingProgram.from_graph(m["graph"], m["train"])
    masked = da.from_array(data["x"], chunks=10)
    masked = masked[masked[:, 0] > 0]  # how many rows each chunk keeps is known once computed
    with pytest.raises(wb.FeedError, match=r"data\['x'\] has chunks of unknown length .* compute_chunk_sizes\(\)"):
        AllReduceEngine(None, program, {**data, "x": masked}, 8, 0)
    gpu = TrainingProgram.from_graph(m["graph"], m["train"], device="gpu", device_options={"emulate": True})
    with pytest.raises(wb.ClusterError, match="runs on CPU workers for now, not 'gpu'"):
        AllReduceEngine(None, gpu, data, 8, 0)
    with pytest.raises(wb.FeedError, match=r"lacks the placeholders \['y'\]"):
        AllReduceEngine(None, program, {"x": data["x"]}, 8, 0)


FAULTS = """
import resource, numpy as np
from workbench.cluster.malloc import reuse_freed_memory

def faults():
    np.ones(1 << 20, dtype="float32")  # 4 MiB, freed at once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        np.ones(1 << 20, dtype="float32")
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10

print(faults(), reuse_freed_memory(), faults())
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_workers_reuse_freed_memory_despite_the_nannys_trim_threshold():
    # the environment a Dask nanny gives its workers
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True, check=True).stdout
    before, done, after = out.split()
    assert done == "True"
    assert float(before) > 500  # every 4 MiB array is fresh pages
    assert float(after) < 50  # now they come back from the heap
