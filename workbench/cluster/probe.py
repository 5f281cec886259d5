"""Timings of the cluster at hand, for the scaling model (:mod:`workbench.cluster.predict`).

- :func:`measure_allreduce`, :func:`measure_link`: the worker-to-worker all-reduce (:mod:`workbench.cluster.collective.group`)
  of a few message sizes between the cluster's workers, medians of several rounds, fitted to
  ``time = 2 (R - 1) latency + 2 (R - 1) / R x bytes / bandwidth``;
- :func:`measure_hop`: a chain of dependent tiny tasks on one worker: seconds per
  scheduler round trip;
- :func:`measure_task_seconds`: a burst of independent tiny tasks: the scheduler's time per task;
- :func:`measure_sum_rate`: how fast a worker adds two gradient-sized arrays.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from workbench.cluster.collective.group import CollectiveGroup, communicator
from workbench.errors import ClusterError

SIZES = (16 << 10, 1 << 20, 4 << 20, 16 << 20)


def _time_allreduce(group: CollectiveGroup, sizes: tuple, repeats: int) -> list[list[float]]:
    """On a member worker: seconds of each all-reduce, ``repeats`` per size (after one untimed)."""
    comm = communicator(group)
    times = []
    for size in sizes:
        flat = np.ones(max(size // 4, 1), dtype=np.float32)
        comm.allreduce(flat, f"warm.{size}")
        rounds = []
        for i in range(repeats):
            started = time.perf_counter()
            comm.allreduce(flat, f"{size}.{i}")
            rounds.append(time.perf_counter() - started)
        times.append(rounds)
    return times


def fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with ``a, b >= 0``.

    >>> [round(v, 6) for v in fit_line([1, 2, 3], [3, 5, 7])]
    [1.0, 2.0]
    >>> [round(v, 6) for v in fit_line([1, 2, 3], [5, 4, 4])]
    [4.333333, 0.0]
    """
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        return 0.0, float(np.mean(y / np.where(x > 0, x, 1)))
    b, a = np.polyfit(x, y, 1)
    if b <= 0:  # the constrained least squares: no growth, the mean
        return float(np.mean(y)), 0.0
    if a < 0:  # through the origin
        return 0.0, float(np.dot(x, y) / np.dot(x, x))
    return float(a), float(b)


def measure_allreduce(
    client, workers, sizes=SIZES, repeats: int = 5, timeout: float = 60.0, algorithm: str = "direct"
) -> list[tuple[int, float]]:
    """``(bytes, seconds)`` of one all-reduce between ``workers`` per size: the median over
    ``repeats`` rounds of the slowest rank's time."""
    workers = list(workers)
    if len(workers) < 2:
        raise ClusterError(f"measuring the all-reduce needs two workers or more, got {workers}")
    group = CollectiveGroup.create(client, workers, run="probe", timeout=timeout, algorithm=algorithm)
    try:
        futures = [
            client.submit(
                _time_allreduce, group, tuple(sizes), repeats, workers=[a], pure=False, allow_other_workers=False
            )
            for a in workers
        ]
        per_rank = client.gather(futures)
    finally:
        group.release(client)
    return [
        (int(size), statistics.median(max(rank[i][j] for rank in per_rank) for j in range(repeats)))
        for i, size in enumerate(sizes)
    ]


def measure_link(client, workers, sizes=SIZES, repeats: int = 5, timeout: float = 60.0) -> dict:
    """Latency per message and bandwidth per worker of the all-reduce between ``workers``.

    Returns ``{"latency", "bandwidth", "ranks", "samples": [(bytes, median seconds), ...]}``,
    ``time = 2 (R - 1) latency + 2 (R - 1) / R x bytes / bandwidth`` fitted to the samples.
    """
    samples = measure_allreduce(client, workers, sizes, repeats, timeout)
    ranks = len(list(workers))
    a, b = fit_line([s for s, _ in samples], [t for _, t in samples])
    latency = a / (2 * (ranks - 1))
    bandwidth = (2 * (ranks - 1) / ranks) / b if b > 0 else float("inf")
    return {"latency": latency, "bandwidth": bandwidth, "ranks": ranks, "samples": samples}


def _tick(_previous=None) -> float:
    return time.perf_counter()


def measure_hop(client, worker, hops: int = 20) -> float:
    """Seconds per dependent scheduler round trip: a chain of ``hops`` tiny tasks on ``worker``
    (one worker: no transfer between them, only the scheduler's round trip)."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        future = client.submit(_tick, workers=[worker], pure=False)
        for _ in range(hops):
            future = client.submit(_tick, future, workers=[worker], pure=False)
        future.result()
        seconds.append((time.perf_counter() - started) / (hops + 1))
    return statistics.median(seconds)


def measure_task_seconds(client, worker, tasks: int = 60) -> float:
    """The scheduler's seconds per task when ``tasks`` independent tiny tasks run at once on ``worker``."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        client.gather([client.submit(_tick, i, workers=[worker], pure=False) for i in range(tasks)])
        seconds.append((time.perf_counter() - started) / tasks)
    return statistics.median(seconds)


def _sum_rate(nbytes: int, repeats: int) -> float:
    a = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    b, out = a.copy(), np.empty_like(a)
    np.add(a, b, out=out)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        np.add(a, b, out=out)
        times.append(time.perf_counter() - started)
    return a.nbytes / max(statistics.median(times), 1e-9)


def measure_sum_rate(client, worker, nbytes: int = 16 << 20, repeats: int = 5) -> float:
    """Bytes of gradients ``worker`` adds per second (one array into another)."""
    return client.submit(_sum_rate, int(nbytes), repeats, workers=[worker], pure=False).result()
