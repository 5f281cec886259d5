"""GPU workers: the cluster's replica and update plans on the GPU path, emulated on NumPy (no GPU needed)."""

import os
import signal
import threading
import time

import dask
import numpy as np
import pytest

import workbench as wb
from workbench.cluster import worker_plans
from workbench.cluster.program import TrainingProgram, host_state, to_host

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds

SEED = 3
EMULATED = {"device": "gpu", "emulate": True}


def local_fit(kit, m, steps, batch_size=12, **session):
    sess = wb.Session(m["graph"], seed=SEED, cluster=False, **session)
    hist = sess.fit(m["train"], kit.blobs(), batch_size=batch_size, steps=steps, fetches=[m["loss"]])
    return sess.variables, hist


# -- the program carries the device -----------------------------------------------------------


def test_the_program_names_the_workers_device_and_only_their_options(kit):
    m = kit.mlp()
    cpu = TrainingProgram.from_graph(m["graph"], m["train"])
    gpu = TrainingProgram.from_graph(
        m["graph"],
        m["train"],
        device="gpu:1",
        device_options={"emulate": True, "results": "device", "cuda_graphs": True},
    )
    assert (cpu.device, cpu.device_options) == ("cpu", ())
    assert (gpu.device, gpu.device_options) == ("gpu", (("emulate", True),))  # a worker's GPU is its first visible one
    assert gpu.digest != cpu.digest  # workers compile them apart


def test_device_options_that_cannot_reach_workers_are_refused(kit):
    m = kit.mlp()
    with pytest.raises(wb.ClusterError, match=r"device options \['memory_pool'\] must be plain values"):
        TrainingProgram.from_graph(m["graph"], m["train"], device="gpu", device_options={"memory_pool": object()})
    with pytest.raises(wb.ClusterError, match="device 'cpu' takes no options, got fuse"):
        TrainingProgram.from_graph(m["graph"], m["train"], device_options={"fuse": False})
    with pytest.raises(wb.ClusterError, match="unknown device 'tpu'"):
        TrainingProgram.from_graph(m["graph"], m["train"], device="tpu")


def test_workers_compile_fused_plans_on_the_gpu_namespace(kit):
    m = kit.mlp()
    program = TrainingProgram.from_graph(m["graph"], m["train"], device="gpu", device_options={"emulate": True})
    compiled = worker_plans.compiled(program)
    assert compiled.device.kind == "gpu" and compiled.device.emulated and worker_plans.compiled(program) is compiled
    update_ops = {op.type for op in compiled.update.graph.operations}
    assert "fused_elementwise" in update_ops  # the Adam update, as a local GPU session fuses it
    plain = worker_plans.compiled(TrainingProgram.from_graph(m["graph"], m["train"]))
    assert plain.device.kind == "cpu" and "fused_elementwise" not in {op.type for op in plain.update.graph.operations}


class FakeDeviceArray:
    """Stands in for a CuPy array: what the host conversions look at."""

    __module__ = "cupy._core.core"

    def __init__(self, value):
        self.value = np.asarray(value)

    def get(self):
        return self.value.copy()


def test_host_syncs_copy_device_arrays_to_numpy():
    state = {"variables": {"w": FakeDeviceArray([1.0, 2.0]), "b": np.zeros(2)}, "step": 4}
    host = host_state(state)
    assert host["step"] == 4 and all(type(v) is np.ndarray for v in host["variables"].values())
    np.testing.assert_array_equal(host["variables"]["w"], [1.0, 2.0])
    assert type(to_host(FakeDeviceArray(3.0))) is np.ndarray and to_host(np.float64(2.0)) == 2.0


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_emulated_gpu_lowering_matches_a_local_gpu_session(kit, replicas):
    m = kit.mlp()
    low = wb.cluster.lower(
        m["graph"], m["train"], kit.blobs(), batch_size=12, replicas=replicas, steps=6, fetches=[m["loss"]],
        seed=SEED, batch_seed=(SEED, 1), device="gpu", device_options={"emulate": True},
    )  # fmt: skip
    state, *metrics = dask.get(low.dsk, [low.state_key, *low.metric_keys], scheduler="sync")
    expected, hist = local_fit(kit, m, steps=6, **EMULATED)
    kit.assert_same_variables(expected, state["variables"], rtol=1e-9)
    np.testing.assert_allclose([mt["fetches"][0] for mt in metrics], hist[m["loss"].name], rtol=1e-9)


# -- on a real multi-process cluster -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_gpu_workers_match_a_local_gpu_session(kit, client):
    m = kit.mlp()
    expected, local = local_fit(kit, m, steps=8, **EMULATED)
    sess = wb.Session(m["graph"], seed=SEED, cluster=client, **EMULATED)
    hist = sess.fit(m["train"], kit.blobs(), batch_size=12, steps=8, fetches=[m["loss"]], replicas=2, sync_every=3)
    kit.assert_same_variables(expected, sess.variables, rtol=1e-9)
    np.testing.assert_allclose(hist[m["loss"].name], local[m["loss"].name], rtol=1e-9)
    assert {len(r["workers"]) for r in hist.records} == {2}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_gpu_worker_costs_no_progress(kit, client):
    steps = 60
    m = kit.mlp(hidden=16)
    data = kit.blobs(n=256)
    reference = wb.Session(m["graph"], seed=SEED, cluster=False, **EMULATED)
    reference.fit(m["train"], data, batch_size=32, steps=steps)
    sess = wb.Session(m["graph"], seed=SEED, cluster=client, **EMULATED)
    pids = client.run(os.getpid)
    victim = sorted(pids)[-1]
    synced, done, killed_at = threading.Event(), [], []
    sess.events.subscribe(lambda e: synced.set() if e["kind"] == "synced" else None)

    def kill():
        synced.wait(60)
        time.sleep(0.05)
        os.kill(pids[victim], signal.SIGKILL)
        killed_at.append(len(done))

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    history = sess.fit(m["train"], data, batch_size=32, steps=steps, replicas=2, sync_every=10, callback=done.append)
    killer.join(5)
    assert not killer.is_alive()
    assert [r["step"] for r in history.records] == list(range(1, steps + 1))
    assert killed_at and killed_at[0] < steps  # mid-training
    kit.assert_same_variables(reference.variables, sess.variables, rtol=1e-9)
    client.wait_for_workers(2, timeout=60)  # the nanny brought the worker back


# -- sending device arrays between workers ------------------------------------------------------


class FakeCupy:
    """A stand-in CuPy module whose arrays distributed has no serializer for."""

    class ndarray:
        __module__ = "fakecupy"

        def __init__(self, host):
            self.host = np.asarray(host)

        def __eq__(self, other):
            return FakeCupy.ndarray(self.host == other.host)

        def all(self):
            return self.host.all()

    @staticmethod
    def arange(n, dtype):
        return FakeCupy.ndarray(np.arange(n, dtype=dtype))

    @staticmethod
    def asarray(host):
        return FakeCupy.ndarray(host)

    @staticmethod
    def ascontiguousarray(x):
        return FakeCupy.ndarray(np.ascontiguousarray(x.host))

    @staticmethod
    def asnumpy(x):
        return x.host


def test_device_arrays_go_as_host_copies_where_distributed_cannot_send_them():
    from distributed.protocol.serialize import dask_dumps, dask_loads

    from workbench.cluster.transfers import device_transfers

    assert device_transfers(FakeCupy) == "host copies"
    value = FakeCupy.ndarray(np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    back = dask_loads(*dask_dumps(value))
    assert type(back) is FakeCupy.ndarray
    np.testing.assert_array_equal(back.host, value.host)
    assert device_transfers(FakeCupy) == "host copies"  # once registered, they stay
