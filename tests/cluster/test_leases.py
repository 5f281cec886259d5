"""Leases for replicas: a worker drops a run's replica (its variables, data and plans) when the run's
client leaves the scheduler, when the run drops it, or when no step comes within the run's lease."""

import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
from distributed import Client

import workbench as wb
from workbench.cluster.collective.allreduce import AllReduceEngine
from workbench.cluster.program import TrainingProgram
from workbench.cluster.collective.replica import expired, held_runs

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds


def held(client) -> dict:
    return {w: runs for w, runs in client.run(held_runs).items() if runs}


def wait_until_dropped(client, seconds: float = 30.0) -> float:
    started = time.monotonic()
    while held(client):
        assert time.monotonic() - started < seconds, f"replicas still held: {held(client)}"
        time.sleep(0.2)
    return time.monotonic() - started


def test_expired_replicas_are_the_released_and_the_idle():
    def replica(key, lease, used, busy=False):
        return SimpleNamespace(start_key=key, lease=lease, used=used, turn_busy=lambda: busy)

    replicas = {
        "kept": replica(("a", 1), 10.0, 95.0),
        "released": replica(("b", 1), 10.0, 99.0),
        "idle": replica(("c", 1), 10.0, 80.0),
        "busy": replica(("d", 1), 10.0, 80.0, busy=True),
        "no lease": replica(("e", 1), 0.0, 0.0),
    }
    wanted = {("a", 1), ("c", 1), ("d", 1), ("e", 1)}
    assert expired(replicas, wanted, now=100.0) == ["released", "idle"]


def engine_for(client, kit, **options):
    m = kit.mlp(name="leased")
    program = TrainingProgram.from_graph(m["graph"], m["train"], [m["loss"].name], seed=0)
    engine = AllReduceEngine(client, program, kit.blobs(n=256), 32, (0, 1), name="leased", **options)
    return engine, wb.Session(m["graph"], seed=0).variables


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_closed_client_leaves_no_replica_behind(client, kit):
    other = Client(client.scheduler.address, timeout=30)
    engine, start = engine_for(other, kit)
    engine.start(start, 0)
    for _ in engine.run(1, 3, sync_at=lambda s: False):
        pass
    assert len(held(client)) == 2  # one replica per worker, kept between fits' steps
    other.close()  # without engine.close(): a notebook closed, its client gone
    assert wait_until_dropped(client) < 30


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_killed_kernel_leaves_no_replica_behind(client, kit, tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        import numpy as np
        import workbench as wb
        from distributed import Client
        client = Client({client.scheduler.address!r})
        g = wb.Graph(name="killed")
        with g.as_default():
            x = wb.placeholder("x", (None, 4))
            w = wb.variable("w", (4, 1))
            loss = wb.mean(wb.matmul(x, w) ** 2.0)
            train = wb.optimizers.SGD(0.01).minimize(loss)
        sess = wb.Session(g, seed=0, cluster=client)
        def told(record):
            if record["step"] == 3:
                print("training", flush=True)
        sess.fit(train, {{"x": np.ones((4096, 4), "float32")}}, batch_size=32, steps=10**6, callback=told)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "training"
        assert len(held(client)) == 2
        proc.kill()
        proc.wait(timeout=30)
        # a step task already running when the client died (its peer's released before it started) waits in
        # the collective for at most the group's timeout (60 s), then its replica's lease ends
        assert wait_until_dropped(client, seconds=90) < 90
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_without_steps_is_dropped_at_the_end_of_its_lease(client, kit):
    engine, start = engine_for(client, kit, lease=2.0)
    engine.start(start, 0)
    for _ in engine.run(1, 2, sync_at=lambda s: False):
        pass
    assert len(held(client)) == 2
    assert wait_until_dropped(client) < 20  # the engine still holds its start tasks: the lease ends it
    engine.close()
