"""Dask-array data on the all-reduce engine: each member reads its shard's rows from the array's chunks on
the cluster, fetching only the chunks its worker lacks, and trains exactly as on the same NumPy data."""

import os
import signal
import time

import dask.array as da
import numpy as np
import pytest
from dask.core import flatten

import workbench as wb
from workbench.cluster.chunked import ChunkCache, ChunkedArray, fetched, read_rows
from workbench.cluster.lower import shards
from workbench.cluster.program import take_rows
from workbench.events import FitStarted
from workbench.training import batch_indices

OWN_CLUSTER = True  # its tests count what each worker fetched, and kill a worker

UNEVEN = ((7, 30, 1, 25, 33),)  # 96 rows: batches of 32 span chunk boundaries, a chunk of one row among them


def reader(array: np.ndarray, sizes: tuple, asked: list):
    """``read_rows``' arguments for ``array`` cut into chunks of ``sizes`` rows; ``asked`` records each call."""
    boundaries = np.concatenate([[0], np.cumsum(sizes)])
    chunks = [array[a:b] for a, b in zip(boundaries[:-1], boundaries[1:])]

    def chunks_of(blocks):
        asked.append(list(blocks))
        return {b: chunks[b] for b in blocks}

    return boundaries, chunks_of


def test_rows_read_from_chunks_are_numpys_rows_in_the_order_asked():
    array = np.random.default_rng(0).normal(size=(96, 3, 2))
    asked = []
    boundaries, chunks_of = reader(array, UNEVEN[0], asked)
    for rows in [np.arange(5, 40), np.array([95, 0, 37, 7, 6, 38, 37]), np.array([37]), np.arange(96)]:
        got = read_rows(rows, boundaries, chunks_of, array.dtype, array.shape[1:])
        assert got.dtype == array.dtype and got.tobytes() == array[rows].tobytes()
    assert asked[0] == [0, 1, 2, 3] and asked[1] == [0, 1, 2, 3, 4] and asked[2] == [2]  # each chunk once a call
    with pytest.raises(wb.FeedError, match=r"rows 0\.\.96 asked of a chunked array of 96 rows"):
        read_rows(np.array([0, 96]), boundaries, chunks_of, array.dtype, array.shape[1:])
    # the parameter server's sources, (offsets, chunks) of the contiguous chunks that hold the rows, read the same
    rows = np.array([8, 40, 36, 9])
    got = take_rows(([7, 37, 38], [array[7:37], array[37:38], array[38:63]]), rows)
    assert got.tobytes() == array[rows].tobytes()


def test_the_cache_drops_the_least_recently_used_chunk_and_never_passes_its_budget():
    chunk = np.zeros(10)  # 80 bytes
    cache = ChunkCache(budget=200)
    cache.put("a", chunk)
    cache.put("b", chunk.copy())
    assert cache.get("a") is chunk  # now "b" is the least recently used
    cache.put("c", chunk.copy())
    assert sorted(cache.held) == ["a", "c"] and cache.bytes == 160
    cache.put("huge", np.zeros(30))  # larger than the whole budget: not kept, nothing dropped for it
    assert sorted(cache.held) == ["a", "c"] and cache.get("b") is None


# -- on a cluster --------------------------------------------------------------------------------


def fit(kit, client, data, replicas=None, steps=6, **kwargs):
    """A fresh session's variables, history and FitStarted event after ``steps`` of Adam on ``data``."""
    m = kit.mlp(name="chunked")
    sess = wb.Session(m["graph"], seed=3, cluster=client)
    started = []
    sess.events.subscribe(lambda e: started.append(e) if isinstance(e, FitStarted) else None)
    history = sess.fit(m["train"], data, batch_size=32, steps=steps, replicas=replicas, **kwargs)
    sess.close()
    return sess.variables, history, started[-1]


def uneven(data: dict) -> dict:
    return {
        "x": da.from_array(data["x"], chunks=(UNEVEN[0], (4, 2))),  # chunked across features too
        "y": da.from_array(data["y"], chunks=UNEVEN),
    }


def held_keys(client, seconds: float = 10.0) -> dict:
    """Each worker's keys in memory, once none holds any (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        held = client.run(lambda dask_worker: sorted(map(str, dask_worker.data)))
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("replicas, mixed", [(1, False), (2, False), (2, True)], ids=["1", "2", "2-mixed"])
def test_dask_array_data_trains_as_the_same_numpy_data(kit, client, replicas, mixed, monkeypatch):
    """``mixed``: the labels a NumPy array, the features a dask array."""
    data = kit.blobs()
    expected, _, _ = fit(kit, client, data, replicas=replicas)

    def never(*args, **kwargs):
        raise AssertionError("the client materialized the dask array")

    for method in ("__array__", "compute"):  # the rows are read on the workers only
        monkeypatch.setattr(da.Array, method, never)
    fed = {**uneven(data), "y": data["y"]} if mixed else uneven(data)
    got, history, started = fit(kit, client, fed, replicas=replicas)
    assert (started.strategy, started.reason, started.replicas) == ("allreduce", "", replicas)
    assert history["replicas"].tolist() == [replicas] * 6
    kit.assert_same_variables(expected, got, rtol=1e-12)
    assert held_keys(client) == {w: [] for w in client.scheduler_info()["workers"]}  # the chunks go with the fit


def placed_by_halves(client, data: dict, workers: list) -> tuple[dict, dict]:
    """``data`` as dask arrays (chunks of 16 rows) whose first half lives on ``workers[0]``, the second on
    ``workers[1]``, persisted; and each chunk's key (a string) to its workers and its bytes."""
    placed, where = {}, {}
    for name, value in data.items():
        halves = [
            client.persist(da.from_array(part, chunks=16), workers=[w]) for part, w in zip(np.split(value, 2), workers)
        ]
        placed[name] = client.persist(da.concatenate(halves))
        chunk_keys = [str(k) for k in flatten(placed[name].__dask_keys__())]
        deadline = time.monotonic() + 20
        while True:  # the concatenation's chunks are computed where their halves are
            who = {str(k): set(v) for k, v in client.who_has(placed[name]).items()}
            if all(who.get(k) for k in chunk_keys) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        nbytes = placed[name].chunks[0][0] * value[0].nbytes
        where.update({k: (who[k], nbytes) for k in chunk_keys})
    return placed, where


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_each_worker_fetches_only_the_chunks_it_lacks_and_each_once(kit, client):
    data = kit.blobs()
    workers = sorted(client.scheduler_info()["workers"])
    placed, where = placed_by_halves(client, data, workers)
    assert {k: w for k, (w, _) in where.items() if w not in ({workers[0]}, {workers[1]})} == {}
    before = client.run(fetched)
    steps = 9
    expected, _, _ = fit(kit, client, data, replicas=2, steps=steps)
    got, _, started = fit(kit, client, placed, replicas=2, steps=steps)
    assert (started.strategy, started.reason) == ("allreduce", "")
    kit.assert_same_variables(expected, got, rtol=1e-12)
    after = client.run(fetched)
    keys = {w: {k: n - before[w]["keys"].get(k, 0) for k, n in after[w]["keys"].items()} for w in workers}
    keys = {w: {k for k, n in ks.items() if n} for w, ks in keys.items()}
    assert all(n == 1 for w in workers for k, n in after[w]["keys"].items() if k in keys[w])  # each fetched once

    # the chunks each rank's rows are in: the same batches as local training draws
    names = {name: [k for k in where if k.startswith(f"('{placed[name].name}'")] for name in placed}
    touched = [set(), set()]
    for step in range(steps):
        index = next(batch_indices(len(data["x"]), 32, step + 1, (3, 0), start=step))
        for rank, part in enumerate(shards(index, 2)):
            touched[rank] |= {k for ks in names.values() for k in (ks[b] for b in np.unique(part // 16))}
    lacking = {w: [touched[r] - {k for k, (h, _) in where.items() if w in h} for r in (0, 1)] for w in workers}
    assert keys[workers[0]] in lacking[workers[0]] and keys[workers[1]] in lacking[workers[1]]
    assert all(keys[w] for w in workers)  # both fetched: the data were split between them
    for w in workers:
        delta = after[w]["bytes"] - before[w]["bytes"]
        assert delta == sum(where[k][1] for k in keys[w])


def take_twice(source, first, second):
    """Rows ``first`` then ``second`` of ``source`` (in one task: its cache lives as long as the source)."""
    return source.take(first), source.take(second)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_reads_its_own_chunks_in_place_and_keeps_what_it_fetched_within_the_budget(client):
    array = np.random.default_rng(1).normal(size=(40, 3))
    holder, other = sorted(client.scheduler_info()["workers"])
    chunked = ChunkedArray("x", da.from_array(array, chunks=10))
    source = chunked.source(client, [holder], timeout=10.0)
    first, second = np.arange(5, 15), np.arange(0, 10)  # chunks 0 and 1, then chunk 0 again
    for budget, fetches in [(array[:10].nbytes, 2), (array.nbytes, 1)]:  # one chunk: chunk 0 is dropped for 1
        source.cache_bytes = budget
        for worker, expected in [(holder, 0), (other, fetches)]:
            before = client.run(fetched, workers=[worker])[worker]
            task = client.submit(take_twice, source, first, second, workers=[worker], pure=False)
            got = task.result(timeout=30)
            assert got[0].tobytes() == array[first].tobytes() and got[1].tobytes() == array[second].tobytes()
            after = client.run(fetched, workers=[worker])[worker]
            key = str(source.keys[0])
            assert after["keys"].get(key, 0) - before["keys"].get(key, 0) == expected
            assert after["bytes"] - before["bytes"] == (expected + (expected > 0)) * array[:10].nbytes


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_fit_restarts_from_the_last_sync_on_dask_array_data(kit, client):
    data = kit.blobs(n=512)
    chunked = {"x": da.from_array(data["x"], chunks=50), "y": da.from_array(data["y"], chunks=50)}
    m = kit.mlp(name="chunked-kill")
    local = wb.Session(m["graph"], seed=0, cluster=False)
    local.fit(m["train"], data, batch_size=32, steps=30, sync_every=5)
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]

    names = {a.name for a in chunked.values()}
    lost = []

    def kill(record):
        if record["step"] == 6:  # the victim takes chunks with it: the scheduler computes them again
            held = client.run(lambda dask_worker: [str(k) for k in dask_worker.data], workers=[victim])[victim]
            lost.extend(k for k in held if any(n in k for n in names))
            os.kill(pids[victim], signal.SIGKILL)

    history = sess.fit(m["train"], chunked, batch_size=32, steps=30, sync_every=5, callback=kill)
    assert lost and [r["step"] for r in history.records] == list(range(1, 31))
    assert history.records[-1]["restarts"] >= 1
    kit.assert_same_variables(local.variables, sess.variables, rtol=1e-9)
    sess.close()
    deadline = time.monotonic() + 60
    while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:  # the nanny's new one
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_strategy_function_trains_on_dask_array_data_as_on_numpy_data(kit, client):
    def sync(r):
        r.apply({v: wb.all_reduce(g * r.weight) for v, g in r.gradients.items()})

    data = kit.blobs()
    m = kit.mlp(name="chunked-strategy", optimizer=wb.optimizers.Momentum(0.05))
    results = []
    for fed in (data, uneven(data)):
        sess = wb.Session(m["graph"], seed=0, cluster=client)
        sess.fit(m["train"], fed, batch_size=32, steps=4, replicas=2, strategy=sync)
        results.append(sess.variables)
        sess.close()
    kit.assert_same_variables(results[0], results[1], rtol=1e-12)


def unreadable_second_chunk(block, block_info=None):
    if block_info[0]["chunk-location"][0] == 1:
        raise OSError("part-0001.npy: unreadable")
    return block


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_chunk_that_cannot_be_computed_is_a_feed_error_naming_the_feed(kit, client):
    data = kit.blobs()
    broken = da.from_array(data["x"], chunks=32).map_blocks(unreadable_second_chunk, dtype=data["x"].dtype)
    m = kit.mlp(name="chunked-broken")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    with pytest.raises(wb.FeedError, match=r"data\['x'\]: its chunk \('.*', 1, 0\) failed") as caught:
        sess.fit(m["train"], {"x": broken, "y": data["y"]}, batch_size=32, steps=2)
    assert "part-0001.npy: unreadable" in str(caught.value.__cause__)
    sess.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_backup_engine_trains_on_dask_array_data_as_on_numpy_data(kit, client):
    data = kit.blobs()
    late = wb.stragglers.Fixed(replica=1, delay=0.4)  # rank 0's gradient is always the one applied
    options = dict(replicas=1, backup_replicas=1, stragglers=late, steps=4)
    expected, _, _ = fit(kit, client, data, **options)
    got, _, started = fit(kit, client, uneven(data), **options)
    assert (started.strategy, started.reason) == ("allreduce", "")
    kit.assert_same_variables(expected, got, rtol=1e-12)
