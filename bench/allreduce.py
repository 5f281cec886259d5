"""All-reduce between 2 worker processes: workbench's collective over Dask's comm against gloo.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/allreduce.py

For each size (float32; 4 KB, 512 KB and 7.46 MB by default, ``--sizes`` picks among
4 KB, 512 KB, 1 MB, 7.46 MB and 32 MB; 7.46 MB is the MLP of bench/cluster.py), the median time of one
in-place all-reduce (sum) of a flat array: workbench's :mod:`workbench.cluster.collective.group`
on an embedded Dask cluster of 2 worker processes, and ``torch.distributed.all_reduce``
with the gloo backend in 2 processes (``pip install torch``; benchmark only). Rounds of
both are interleaved, so a noisy machine moves both alike; ``--rounds`` and ``--iters``
set how many. Also the per-message cost: the smallest size is latency only. On a loaded machine
read the ratios: each round's median against gloo's in the same round, and their median; and
workbench's CPU an all-reduce on the worker's event loop thread and on the calling thread (what
the waiting leaves: the Python and the system calls per message).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

SIZES = {"4 KB": 4_000, "512 KB": 512_000, "1 MB": 1_000_000, "7.46 MB": 7_460_000, "32 MB": 32_000_000}
DEFAULT_SIZES = ("4 KB", "512 KB", "7.46 MB")


def ours(group, nbytes: int, iters: int) -> tuple[list[float], float, float]:
    """On each rank: ``iters`` timed all-reduces (after one untimed, which also lines the ranks up),
    and the CPU seconds an all-reduce took on the worker's event loop thread and on the calling thread."""
    import asyncio

    from workbench.cluster.collective.group import communicator

    async def loop_cpu() -> float:
        return time.thread_time()

    comm = communicator(group)
    flat = np.ones(nbytes // 4, dtype="float32")
    comm.allreduce(flat, bucket=f"warm-{nbytes}")
    times, cpu = [], 0.0
    loop_began = asyncio.run_coroutine_threadsafe(loop_cpu(), comm.loop).result()
    for i in range(iters):
        flat.fill(1.0)
        started, began = time.perf_counter(), time.thread_time()
        comm.allreduce(flat, bucket=f"{nbytes}-{i}")
        cpu += time.thread_time() - began
        times.append(time.perf_counter() - started)
    loop = asyncio.run_coroutine_threadsafe(loop_cpu(), comm.loop).result() - loop_began
    assert flat[0] == comm.size
    return times, loop / iters, cpu / iters


def gloo_rank(rank: int, port: int, pipe) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    while True:
        order = pipe.recv()
        if order is None:
            break
        nbytes, iters = order
        flat = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(flat)
        times = []
        for _ in range(iters):
            flat.fill_(1.0)
            started = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - started)
        pipe.send(times)
    dist.destroy_process_group()


class Gloo:
    """Two gloo ranks in their own processes, waiting for orders: ``target(rank, port, pipe)``
    receives each order from its pipe (None: stop) and sends one reply."""

    def __init__(self, target=None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = multiprocessing.get_context("spawn")
        self.pipes, self.procs = [], []
        for rank in range(2):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=target or gloo_rank, args=(rank, port, theirs), daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)

    def ask(self, order) -> list:
        """Each rank's reply to ``order``."""
        for p in self.pipes:
            p.send(order)
        return [p.recv() for p in self.pipes]

    def run(self, nbytes: int, iters: int) -> list[float]:
        return [max(t) for t in zip(*self.ask((nbytes, iters)))]

    def close(self) -> None:
        for p in self.pipes:
            p.send(None)
        for proc in self.procs:
            proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--sizes", nargs="*", default=list(DEFAULT_SIZES), choices=list(SIZES))
    args = parser.parse_args()
    sizes = {name: SIZES[name] for name in args.sizes}

    import workbench as wb
    from workbench.cluster.collective.group import CollectiveGroup

    client = wb.cluster.connect("local", n_workers=2)
    client.wait_for_workers(2)
    group = CollectiveGroup.create(client, algorithm=args.algorithm)
    gloo = Gloo()
    results: dict = {(name, who): [] for name in sizes for who in ("workbench", "gloo")}
    ratios: dict = {name: [] for name in sizes}  # each round's median against gloo's
    cpu: dict = {name: [] for name in sizes}  # (event loop thread, calling thread) s an all-reduce, per rank and round
    try:
        for _ in range(args.rounds):
            for name, nbytes in sizes.items():
                futures = [
                    client.submit(ours, group, nbytes, args.iters, workers=[a], pure=False) for a in group.addresses
                ]
                per_rank = client.gather(futures)
                ours_round = [max(t) for t in zip(*[times for times, _, _ in per_rank])]
                cpu[name] += [(loop, calling) for _, loop, calling in per_rank]
                gloo_round = gloo.run(nbytes, args.iters)
                results[name, "workbench"] += ours_round
                results[name, "gloo"] += gloo_round
                ratios[name].append(statistics.median(ours_round) / statistics.median(gloo_round))
    finally:
        gloo.close()
        wb.cluster.close(client)
    print(f"all-reduce, float32, 2 processes; median of {args.rounds} x {args.iters} (ms; GB/s = size / time)")
    print("| size | workbench | gloo | workbench / gloo | per round | median of rounds |")
    print("|---|---:|---:|---:|---|---:|")
    for name, nbytes in sizes.items():
        a = statistics.median(results[name, "workbench"])
        b = statistics.median(results[name, "gloo"])
        print(
            f"| {name} | {a * 1e3:.2f} ms ({nbytes / a / 1e9:.2f} GB/s) | {b * 1e3:.2f} ms ({nbytes / b / 1e9:.2f} GB/s) "
            f"| {a / b:.2f} | {', '.join(f'{r:.2f}' for r in ratios[name])} | {statistics.median(ratios[name]):.2f} |"
        )
    print("\nworkbench's CPU an all-reduce, median over ranks and rounds (us; the rest of the time is waiting)")
    print("| size | event loop thread | calling thread |")
    print("|---|---:|---:|")
    for name in sizes:
        loop, calling = (statistics.median(c) * 1e6 for c in zip(*cpu[name]))
        print(f"| {name} | {loop:.0f} | {calling:.0f} |")


if __name__ == "__main__":
    main()
