"""Data-parallel fit on one real multi-process Dask cluster: results like local, records, data, checkpoints."""

import os
import re
import threading
import time

import dask.array as da
import numpy as np
import pytest

import workbench as wb
from workbench import checkpoint
from workbench.events import FitStarted
from workbench.fitloop import StepOutcome

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SEED = 5
STEPS = 8
BATCH = 12


@pytest.fixture(scope="module")
def workers(client):
    return sorted(w["address"] for w in wb.cluster.info(client)["workers"])


def train(kit, m, cluster=False, seed=SEED, data=None, steps=STEPS, **fit):
    """(variables, history) of one session's first fit."""
    sess = wb.Session(m["graph"], seed=seed, cluster=cluster)
    data = kit.blobs(dtype=m["x"].dtype) if data is None else data
    hist = sess.fit(m["train"], data, batch_size=BATCH, steps=steps, fetches=[m["loss"]], **fit)
    return sess.variables, hist


# -- the same result as local training --------------------------------------------------------


STRATEGIES = ["allreduce", "parameter_server"]


# all-reduce runs one replica per worker: 3 replicas on these 2 workers are parameter_server's
# (test_allreduce.py trains on 3 workers)
@pytest.mark.parametrize("strategy, replicas", [("allreduce", 1), ("allreduce", 2), ("parameter_server", 1),
                                                ("parameter_server", 2), ("parameter_server", 3)])  # fmt: skip
def test_float64_matches_local_including_adam_slots(kit, client, strategy, replicas):
    m = kit.mlp()
    expected, local = train(kit, m)
    got, hist = train(kit, m, client, replicas=replicas, strategy=strategy)
    assert any(name.startswith("Adam/") and name.endswith("/v") for name in got)
    kit.assert_same_variables(expected, got, rtol=1e-9)
    name = m["loss"].name
    np.testing.assert_allclose(hist[name], local[name], rtol=1e-9)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_float32_matches_local(kit, client, strategy):
    m = kit.mlp(dtype="float32")
    expected, _ = train(kit, m)
    got, _ = train(kit, m, client, replicas=2, strategy=strategy)
    assert all(v.dtype == np.float32 for v in got.values() if v.ndim)
    kit.assert_same_variables(expected, got, rtol=1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_window_and_sync_every_do_not_change_the_result(kit, client, strategy):
    m = kit.mlp()
    expected, _ = train(kit, m)
    for window, sync_every in [(1, 1), (8, 3)]:
        got, hist = train(kit, m, client, replicas=2, window=window, sync_every=sync_every, strategy=strategy)
        assert len(hist) == STEPS
        kit.assert_same_variables(expected, got, rtol=1e-9)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("replicas", [1, 2])
def test_dropout_matches_local(kit, client, replicas, strategy):
    m = kit.mlp(layers=3, dropout=0.5)
    expected, local = train(kit, m)
    got, hist = train(kit, m, client, replicas=replicas, strategy=strategy)
    kit.assert_same_variables(expected, got, rtol=1e-9)
    np.testing.assert_allclose(hist[m["loss"].name], local[m["loss"].name], rtol=1e-9)


def test_second_fit_with_dropout_continues_like_local(kit, client):
    m = kit.mlp(dropout=0.5)
    local = wb.Session(m["graph"], seed=SEED, cluster=False)
    remote = wb.Session(m["graph"], seed=SEED, cluster=client)
    for sess in (local, remote):
        for steps in (3, 4):  # each fit's random draws are keyed by its own steps, on both
            sess.fit(m["train"], kit.blobs(), batch_size=BATCH, steps=steps)
    kit.assert_same_variables(local.variables, remote.variables, rtol=1e-9)


def test_second_fit_continues_like_local(kit, client):
    m = kit.mlp()
    local = wb.Session(m["graph"], seed=SEED, cluster=False)
    remote = wb.Session(m["graph"], seed=SEED, cluster=client)
    for sess in (local, remote):
        for steps in (3, 4):  # the second fit draws its batches from (seed, 2)
            sess.fit(m["train"], kit.blobs(), batch_size=BATCH, steps=steps)
    kit.assert_same_variables(local.variables, remote.variables, rtol=1e-9)


# -- records -----------------------------------------------------------------------------------


def test_records(kit, client, workers):
    m = kit.mlp()
    seen = []
    _, hist = train(kit, m, client, replicas=2, callback=seen.append)
    assert [r["step"] for r in hist.records] == list(range(1, STEPS + 1))
    assert seen == hist.records
    for r in hist.records:
        assert {"step", "time", "samples_per_s", m["loss"].name, "replicas", "workers", "bytes_moved"} <= set(r)
        assert r["time"] > 0 and r["samples_per_s"] > 0
        assert r["replicas"] == 2
        assert r["bytes_moved"] > 0
        assert np.isfinite(r[m["loss"].name])
    # the two replicas of each step ran on the two workers
    assert all(sorted(r["workers"]) == workers for r in hist.records)


def test_events_reach_subscribers(kit, client):
    m = kit.mlp()
    sess = wb.Session(m["graph"], seed=SEED, cluster=client)
    events = []
    sess.events.subscribe(events.append)
    sess.fit(m["train"], kit.blobs(), batch_size=BATCH, steps=4, replicas=2)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "fit_started" and kinds[-1] == "fit_finished"
    assert kinds.count("step") == 4


def test_allreduce_is_the_default_and_parameter_server_trains_what_it_cannot(kit, client):
    m = kit.mlp()
    data = kit.blobs()
    chunked = {"x": da.from_array(data["x"], chunks=(17, 3)), "y": da.from_array(data["y"], chunks=25)}
    sess = wb.Session(m["graph"], seed=SEED, cluster=client)
    started = []
    sess.events.subscribe(lambda e: started.append(e) if isinstance(e, FitStarted) else None)
    for fed in (data, chunked):  # dask arrays too: each member reads its rows from their chunks
        sess.fit(m["train"], fed, batch_size=BATCH, steps=2)
        assert (started[-1].strategy, started[-1].reason, started[-1].replicas) == ("allreduce", "", 2)
    cases = [
        (
            {"replicas": 2, "backup_replicas": 1},
            data,
            r"it runs one replica per worker, and replicas=2 \+ backup_replicas=1 exceeds the 2 workers",
        ),
        ({"replicas": 3}, data, "it runs one replica per worker, and replicas=3 exceeds the 2 workers"),
    ]
    for options, fed, reason in cases:
        sess.fit(m["train"], fed, batch_size=BATCH, steps=2, **options)
        assert started[-1].strategy == "parameter_server"
        assert re.fullmatch(f"parameter_server instead of allreduce: {reason}", started[-1].reason)
        with pytest.raises(wb.ClusterError, match=f"strategy='allreduce' cannot train this fit: {reason}; use "
                                                  "strategy='parameter_server'"):  # fmt: skip
            sess.fit(m["train"], fed, batch_size=BATCH, steps=2, strategy="allreduce", **options)


def test_a_strategy_is_named_and_a_new_one_plugs_in(kit, client):
    m = kit.mlp()
    sess = wb.Session(m["graph"], seed=SEED, cluster=client)
    started = []
    sess.events.subscribe(lambda e: started.append(e) if isinstance(e, FitStarted) else None)
    hist = sess.fit(m["train"], kit.blobs(), batch_size=BATCH, steps=2, strategy="parameter_server")
    assert len(hist) == 2 and started[-1].strategy == "parameter_server" and started[-1].replicas == 2
    with pytest.raises(wb.ClusterError, match="unknown strategy 'nope'; strategies are .*parameter_server"):
        sess.fit(m["train"], kit.blobs(), batch_size=BATCH, steps=2, strategy="nope")

    class Frozen:
        """An engine that leaves the variables as they are: what a strategy supplies."""

        strategy, replicas, workers, restarts = "frozen", None, None, 0

        def __init__(self, request, client_, options, events):
            assert client_ is client and options.sync_every == 7 and request.fetches == {"loss": m["loss"].name}

        def start(self, variables, step):
            self.host = (variables, step)

        def run(self, first, last, sync_at):
            for step in range(first, last + 1):
                self.host = (self.host[0], step)
                yield StepOutcome(step, {"loss": 0.0})

        def variables(self):
            return self.host

        def close(self):
            pass

    before = sess.variables
    wb.cluster.register_strategy("frozen", Frozen)
    try:
        hist = sess.fit(m["train"], kit.blobs(), batch_size=BATCH, steps=3, fetches={"loss": m["loss"]},
                        strategy="frozen", sync_every=7)  # fmt: skip
    finally:
        del wb.cluster.STRATEGIES["frozen"]
    assert hist["loss"].tolist() == [0.0, 0.0, 0.0] and started[-1].strategy == "frozen"
    kit.assert_same_variables(before, sess.variables, rtol=0)


def test_replicas_default_to_one_per_worker(kit, client):
    m = kit.mlp()
    _, hist = train(kit, m, client, steps=2)
    assert hist["replicas"].tolist() == [2, 2]


def test_workers_restricts_where_replicas_run(kit, client, workers):
    m = kit.mlp()
    expected, _ = train(kit, m)
    got, hist = train(kit, m, client, replicas=2, workers=workers[:1])
    assert all(list(r["workers"]) == workers[:1] for r in hist.records)
    kit.assert_same_variables(expected, got, rtol=1e-9)


# -- data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_dask_array_data_gives_the_numpy_result(kit, client, strategy):
    m = kit.mlp()
    data = kit.blobs()
    chunked = {"x": da.from_array(data["x"], chunks=(17, 3)), "y": da.from_array(data["y"], chunks=25)}
    assert chunked["x"].numblocks == (6, 2) and chunked["y"].numblocks == (4,)
    expected, _ = train(kit, m, client, replicas=2, data=data, strategy=strategy)
    got, hist = train(kit, m, client, replicas=2, data=chunked, strategy=strategy)
    kit.assert_same_variables(expected, got, rtol=1e-9)
    assert len(hist) == STEPS


# -- checkpoints ---------------------------------------------------------------------------------


def test_checkpoints_are_whole_files_and_a_new_session_resumes(kit, client, tmp_path):
    m = kit.mlp()
    steps = 10
    expected, _ = train(kit, m, client, replicas=2, steps=steps)
    listings = []

    def interrupt(record):  # a kernel dying after step 7
        listings.append(sorted(os.listdir(tmp_path)))
        for name in listings[-1]:
            checkpoint.read(tmp_path / name)  # every file present reads back whole
        if record["step"] == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(kit, m, client, replicas=2, steps=steps, checkpoint_dir=tmp_path, checkpoint_every=3, callback=interrupt)
    assert sorted(os.listdir(tmp_path)) == ["step-00000003.npz", "step-00000006.npz"]
    assert all(not n.startswith(".tmp") for listing in listings for n in listing)
    variables, step = checkpoint.latest(tmp_path)
    assert step == 6 and set(variables) == set(expected)

    got, hist = train(kit, m, client, replicas=2, steps=steps, checkpoint_dir=tmp_path, checkpoint_every=3)
    assert [r["step"] for r in hist.records] == [7, 8, 9, 10]
    kit.assert_same_variables(expected, got, rtol=1e-9)
    assert sorted(os.listdir(tmp_path)) == ["step-00000009.npz", "step-00000010.npz"]


def test_resume_skips_a_damaged_checkpoint(kit, client, tmp_path):
    m = kit.mlp()
    expected, _ = train(kit, m, client, replicas=2, steps=6)
    train(kit, m, client, replicas=2, steps=4, checkpoint_dir=tmp_path, checkpoint_every=2)
    (tmp_path / "step-00000004.npz").write_bytes(b"half a file")
    got, hist = train(kit, m, client, replicas=2, steps=6, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert hist.records[0]["step"] == 3
    kit.assert_same_variables(expected, got, rtol=1e-9)


def test_a_finished_run_resumes_to_nothing(kit, client, tmp_path):
    m = kit.mlp()
    first, _ = train(kit, m, client, replicas=2, steps=4, checkpoint_dir=tmp_path, checkpoint_every=2)
    again, hist = train(kit, m, client, replicas=2, steps=4, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert len(hist) == 0
    kit.assert_same_variables(first, again, rtol=0)


# -- sharing a cluster -------------------------------------------------------------------------------


def test_concurrent_sessions_do_not_collide(kit, client):
    # one graph name, so only the runs' tokens keep their task keys apart
    models = [kit.mlp(), kit.mlp(optimizer=wb.optimizers.Momentum(0.05))]
    seeds = [SEED, SEED + 1]
    solo = [train(kit, m, seed=s, steps=12)[0] for m, s in zip(models, seeds)]
    results, errors = [None, None], []

    def run(i):
        try:
            results[i] = train(kit, models[i], client, seed=seeds[i], steps=12, replicas=2, window=2)[0]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    for expected, got in zip(solo, results):
        kit.assert_same_variables(expected, got, rtol=1e-9)


# -- errors (last: the cluster must still work afterwards) -----------------------------------------


def test_an_error_in_the_graph_surfaces_quickly(kit, client):
    g = wb.Graph(name="broken")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, None), dtype="float64")  # any width: checked only when run
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(6, 3), dtype="float64")
        loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w), y))
        step = wb.optimizers.SGD(0.1).minimize(loss)
    data = kit.blobs(features=5)
    sess = wb.Session(g, seed=SEED, cluster=client)
    started = time.perf_counter()
    with pytest.raises(wb.WorkbenchError, match=r"(?s)step 1.*matmul|matmul.*step 1|matmul") as info:
        sess.fit(step, data, batch_size=BATCH, steps=5, replicas=2)
    assert time.perf_counter() - started < 30
    assert "5" in str(info.value) and "6" in str(info.value)  # the shapes that disagree
    # the cluster is still usable
    m = kit.mlp()
    expected, _ = train(kit, m, steps=3)
    got, _ = train(kit, m, client, replicas=2, steps=3)
    kit.assert_same_variables(expected, got, rtol=1e-9)
