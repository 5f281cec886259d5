"""Small all-reduces from the calling thread (its own socket to each peer), on a real cluster of 2 worker processes."""

import os
import signal
import time

import numpy as np
import pytest

from workbench.cluster.collective.group import NAME, CollectiveGroup, communicator
from workbench.errors import ClusterError

OWN_CLUSTER = True  # a test kills a worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def part(rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(rank)
    return rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)


def small_reduces(group, n: int, steps: int):
    """``steps`` all-reduces of ``n`` float64 one after the other, as training steps make them."""
    comm = communicator(group)
    results = [comm.allreduce(part(comm.rank + step, n), bucket=f"s{step}") for step in range(steps)]
    return results, comm.bytes_sent, comm.bytes_received


def direct_to(dask_worker=None):
    return dask_worker.extensions[NAME].streams.direct_to()


def test_small_all_reduces_go_out_from_the_calling_thread_with_the_same_bits(client):
    workers = sorted(client.scheduler_info()["workers"])
    group = CollectiveGroup.create(client, workers, timeout=30)
    n, steps = 1000, 20
    futures = [client.submit(small_reduces, group, n, steps, workers=[w], pure=False) for w in workers]
    (first, sent0, received0), (second, sent1, received1) = client.gather(futures)
    for step in range(steps):
        expected = part(step, n) + part(1 + step, n)  # the 2 ranks' arrays in rank order
        assert first[step].tobytes() == expected.tobytes() == second[step].tobytes()
    assert sent0 == received0 == sent1 == received1 == steps * n * 8  # the whole array each way, once
    opened = client.run(direct_to, workers=workers)  # the first went through the loop and opened the sockets
    assert opened == {workers[0]: [workers[1]], workers[1]: [workers[0]]}
    group.release(client)


def late_reduce(group, after: float):
    comm = communicator(group)
    time.sleep(after)  # the peer is killed meanwhile
    started = time.monotonic()
    try:
        comm.allreduce(np.ones(1000), bucket="late", timeout=60)
    except ClusterError as e:
        return str(e), time.monotonic() - started
    return "no error", time.monotonic() - started


def test_a_killed_peer_fails_a_small_all_reduce_in_bounded_time(client):
    pids = client.run(os.getpid)
    workers = sorted(pids)
    group = CollectiveGroup.create(client, workers, timeout=3)
    client.gather([client.submit(small_reduces, group, 1000, 5, workers=[w], pure=False) for w in workers])
    assert client.run(direct_to, workers=workers[:1]) == {workers[0]: [workers[1]]}
    future = client.submit(late_reduce, group, 1.0, workers=[workers[0]], pure=False)
    os.kill(pids[workers[1]], signal.SIGKILL)
    message, seconds = future.result(timeout=60)
    assert f"rank 1 ({workers[1]})" in message  # a failed send, or nothing heard from it
    assert seconds < 10
