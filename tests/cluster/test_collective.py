"""Worker-to-worker all-reduce over Dask's comm, on a real cluster of worker processes."""

import os
import signal
import time

import numpy as np
import pytest

from workbench.cluster.collective.group import CollectiveGroup, communicator
from workbench.errors import ClusterError

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def part(rank: int, n: int, dtype="float64") -> np.ndarray:
    rng = np.random.default_rng(rank)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(dtype)


def reduce_on_every_rank(group, n, buckets=1, scale=None):
    comm = communicator(group)
    flats = [part(comm.rank + 10 * b, n) for b in range(buckets)]
    handles = [comm.start(f"b{b}", f, scale=scale) for b, f in enumerate(flats)]  # all in flight at once
    return [h.wait(30) for h in handles], comm.rank, comm.bytes_received


def run_group(client, group, *args, **kwargs):
    futures = [
        client.submit(reduce_on_every_rank, group, *args, workers=[a], pure=False, **kwargs) for a in group.addresses
    ]
    return client.gather(futures)


@pytest.mark.parametrize("algorithm", ["direct", "ring"])
def test_every_rank_ends_with_the_same_bits(client3, algorithm):
    group = CollectiveGroup.create(client3, algorithm=algorithm, timeout=30)
    n = 100_003
    results = run_group(client3, group, n, buckets=3, scale=0.5)
    assert [rank for _, rank, _ in results] == [0, 1, 2]
    for b in range(3):
        expected = (part(10 * b, n) + part(1 + 10 * b, n) + part(2 + 10 * b, n)) * 0.5
        first = results[0][0][b]
        np.testing.assert_allclose(first, expected, rtol=1e-12, atol=1e-8)  # sum orders differ
        for flats, _, _ in results[1:]:
            assert flats[b].tobytes() == first.tobytes()
    # each rank receives 2 (R - 1) / R of each bucket
    assert results[0][2] == pytest.approx(3 * 2 * 2 / 3 * n * 8, rel=0.01)
    group.release(client3)


def test_two_groups_on_one_cluster_never_mix(client3):
    workers = sorted(client3.scheduler_info()["workers"])
    a = CollectiveGroup.create(client3, workers[:2], run="same")
    b = CollectiveGroup.create(client3, workers[::-1], run="same")  # same run name, other ranks
    assert a.token != b.token
    futures = []
    for group, n in ((a, 1000), (b, 2000)):
        futures.append(
            [client3.submit(reduce_on_every_rank, group, n, workers=[w], pure=False) for w in group.addresses]
        )
    ra, rb = (client3.gather(f) for f in futures)
    np.testing.assert_allclose(ra[0][0][0], part(0, 1000) + part(1, 1000))
    np.testing.assert_allclose(rb[0][0][0], part(0, 2000) + part(1, 2000) + part(2, 2000))
    a.release(client3)
    b.release(client3)


def wait_for_peer(group, after):
    comm = communicator(group)
    time.sleep(after)  # the peer is killed meanwhile
    started = time.monotonic()
    try:
        comm.allreduce(np.ones(10_000), bucket="late", timeout=60)
    except ClusterError as e:
        return str(e), time.monotonic() - started
    return "no error", time.monotonic() - started


def test_a_killed_peer_fails_the_others_in_bounded_time(client3):
    pids = client3.run(os.getpid)
    workers = sorted(pids)
    group = CollectiveGroup.create(client3, workers, timeout=3)
    futures = [client3.submit(wait_for_peer, group, 1.0, workers=[w], pure=False) for w in workers[:2]]
    os.kill(pids[workers[2]], signal.SIGKILL)
    for message, seconds in client3.gather(futures):
        assert f"rank 2 ({workers[2]})" in message
        assert seconds < 10


def streams_open(dask_worker=None):
    from workbench.cluster.collective.group import NAME

    return dask_worker.extensions[NAME].streams.open_to()


def test_large_buckets_travel_as_frames_in_segments_with_the_same_bits(client3):
    workers = sorted(client3.scheduler_info()["workers"])
    group = CollectiveGroup.create(client3, workers[:2], timeout=30)
    n = 600_001  # chunks of 2.4 MB: pipelined in segments
    results = run_group(client3, group, n)
    first = results[0][0][0]
    np.testing.assert_allclose(first, part(0, n) + part(1, n), rtol=1e-12, atol=1e-8)
    assert results[1][0][0].tobytes() == first.tobytes()
    assert results[0][2] == n * 8  # 2 (R - 1) / R of the array received: no segment twice
    opened = client3.run(streams_open, workers=workers[:2])
    # a frame stream each way (kept per peer, whatever the group: earlier tests' peers may have one too)
    assert workers[1] in opened[workers[0]] and workers[0] in opened[workers[1]]
    group.release(client3)
