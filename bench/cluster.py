"""Distributed training on this machine: scheduler overhead and scaling efficiency.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/cluster.py

Part 1, scheduler overhead per training step: workbench's ``fit`` on a model so
small that compute is negligible, against the same chain of steps written by
hand with plain Dask futures (R replica tasks pinned one per worker, a pairwise
reduction, an update; each step depending on the last), on the same cluster.
Also the tasks per step that lowering makes, for a shallow and a deep model.

Part 2, scaling efficiency, throughput(2 workers) / (2 x throughput(1 worker)),
for an MLP from small to compute-bound global batches, side by side with
PyTorch DistributedDataParallel (gloo, 2 processes against 1) on the same
model and global batch. One thread per process everywhere.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import workbench as wb  # noqa: E402

FEATURES, HIDDEN, CLASSES = 256, 1024, 10
BATCHES = (256, 1024, 4096, 16384, 65536)


def mlp(features=FEATURES, hidden=HIDDEN, layers=2, name="mlp"):
    g = wb.Graph(name=name)
    with g.as_default():
        x = wb.placeholder("x", shape=(None, features))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h, width = x, features
        for i in range(layers):
            out = CLASSES if i == layers - 1 else hidden
            w = wb.variable(f"w{i}", shape=(width, out))
            b = wb.variable(f"b{i}", shape=(out,), init="zeros")
            h = wb.matmul(h, w) + b
            if i < layers - 1:
                h = wb.relu(h)
            width = out
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.SGD(0.01).minimize(loss)
    return g, train


def data(n, features=FEATURES, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, features)).astype("float32"), "y": rng.integers(0, CLASSES, n)}


# -- part 1: scheduler overhead ---------------------------------------------------------


def _replica(state, i):
    return state + i


def _pair(a, b):
    return a + b


def _update(state, total):
    return state + 0 * total


def plain_dask_chain(client, steps, replicas, workers, window=4):
    """The minimum: the same task chain with plain futures, nothing computed."""
    state = client.scatter(np.zeros(4), workers=workers[:1])
    pending = []
    started = time.perf_counter()
    for step in range(steps):
        level = [
            client.submit(_replica, state, i, key=f"plain-{step}-r{i}", workers=[workers[i % len(workers)]], allow_other_workers=True)
            for i in range(replicas)
        ]
        while len(level) > 1:
            level = [client.submit(_pair, level[j], level[j + 1], key=f"plain-{step}-p{len(level)}-{j}") for j in range(0, len(level) - 1, 2)] + (
                [level[-1]] if len(level) % 2 else []
            )
        state = client.submit(_update, state, level[0], key=f"plain-{step}-u")
        pending.append(state)
        if len(pending) > window:
            pending.pop(0).result()
    state.result()
    return (time.perf_counter() - started) / steps


def overhead(client, workers, steps=60, replicas=2):
    g, train = mlp(features=4, hidden=4, name="tiny")
    tiny = data(64, features=4)
    rows = []
    for _ in range(3):
        sess = wb.Session(g, seed=0, cluster=client)
        h = sess.fit(train, tiny, batch_size=16, steps=steps, replicas=replicas, workers=workers, sync_every=steps)
        ours = statistics.median(r["time"] for r in h.records[5:])
        plain = plain_dask_chain(client, steps, replicas, workers)
        rows.append((ours, plain))
    ours = statistics.median(r[0] for r in rows)
    plain = statistics.median(r[1] for r in rows)
    shallow = wb.cluster.lower(g, train, tiny, batch_size=16, replicas=replicas).tasks_per_step
    deep_g, deep_train = mlp(features=4, hidden=4, layers=8, name="deep")
    deep = wb.cluster.lower(deep_g, deep_train, tiny, batch_size=16, replicas=replicas).tasks_per_step
    return ours, plain, shallow, deep, len(g.operations), len(deep_g.operations)


# -- part 2: scaling --------------------------------------------------------------------


def workbench_rate(client, workers, batch, steps):
    g, train = mlp()
    d = data(max(batch * 2, 4096))
    sess = wb.Session(g, seed=0, cluster=client)
    h = sess.fit(train, d, batch_size=batch, steps=steps + 3, replicas=len(workers), workers=workers, sync_every=steps + 3)
    times = [r["time"] for r in h.records[3:]]
    return batch / statistics.median(times)


def torch_worker(rank, world, batch, steps, port, queue):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    local = batch // world
    rng = np.random.default_rng(rank)
    x = torch.from_numpy(rng.normal(size=(local, FEATURES)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, CLASSES, local))
    times = []
    for step in range(steps + 3):
        started = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - started)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        queue.put(statistics.median(times[3:]))


def torch_rate(world, batch, steps):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=torch_worker, args=(r, world, batch, steps, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    seconds = queue.get(timeout=600)
    for p in procs:
        p.join(60)
    return batch / seconds


def main():
    quick = "--quick" in sys.argv
    client = wb.cluster.connect("local", n_workers=2)
    workers = sorted(client.scheduler_info()["workers"])
    print(f"cluster: {len(workers)} worker processes x 1 thread; numpy {np.__version__}; cpu count {os.cpu_count()}")
    ours, plain, shallow, deep, ops_shallow, ops_deep = overhead(client, workers)
    print("\n## Scheduler overhead per step (2 replicas on 2 workers, negligible compute)\n")
    print("| | ms/step |\n|---|---:|")
    print(f"| workbench fit | {ours * 1e3:.1f} |\n| plain Dask futures, same chain | {plain * 1e3:.1f} |")
    print(f"| ratio | {ours / plain:.2f}x |")
    print(f"\ntasks per step (2 replicas): {shallow} for a {ops_shallow}-op graph, {deep} for a {ops_deep}-op graph (2R+1 = 5)")
    print("\n## Scaling efficiency, throughput(2) / (2 x throughput(1)), MLP 256-1024-10, SGD, float32\n")
    print("| global batch | wb 1 worker (samples/s) | wb 2 workers | wb efficiency | DDP 1 proc | DDP 2 procs | DDP efficiency |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for batch in BATCHES:
        steps = 5 if quick else max(5, min(12, 200_000 // batch))
        one = workbench_rate(client, workers[:1], batch, steps)
        two = workbench_rate(client, workers, batch, steps)
        t1 = torch_rate(1, batch, steps)
        t2 = torch_rate(2, batch, steps)
        eff, teff = two / (2 * one), t2 / (2 * t1)
        results.append((batch, eff, teff))
        print(f"| {batch} | {one:,.0f} | {two:,.0f} | {eff:.0%} | {t1:,.0f} | {t2:,.0f} | {teff:.0%} |", flush=True)
    below = [b for b, e, _ in results if e < 0.5]
    print(f"\nworkbench efficiency falls below 50% at global batch {max(below) if below else 'none measured'} and under")
    wb.cluster.close(client)


if __name__ == "__main__":
    main()
