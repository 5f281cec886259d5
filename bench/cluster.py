"""Distributed training on this machine, side by side with PyTorch DDP, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/cluster.py [--quick]
        [--rounds N] [--steps N] [--batches 256,1024,...]

MLP 784-1024-1024-10, float32, SGD, one thread per process everywhere (``pip install
torch``: benchmark only). Measured in interleaved rounds (every system once per round, in
turn), reported as medians over the rounds of each round's median step time:

- E(2) = throughput on 2 workers / (2 x one-process throughput) at each global batch, for
  workbench's ``allreduce`` and ``parameter_server`` strategies (2 Dask worker processes; the
  one process is a local ``Session.fit``) and DDP (gloo, 2 processes; the one process is the
  same model without DDP);
- per-step overhead at global batch 64: step time on 2 workers minus half the one-process
  step time, for each;
- bytes received per worker per step, as the all-reduce counts them, against
  ``2 (R - 1) / R`` x the model's bytes; tasks per step of each strategy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

import workbench as wb  # noqa: E402
from allreduce import Gloo  # noqa: E402  (bench/, the script's folder)

SIZES = (784, 1024, 1024, 10)
BATCHES = (256, 1024, 4096, 16384)
OVERHEAD_BATCH = 64
WARMUP = 3
STRATEGIES = ("allreduce", "allreduce 1/task", "parameter_server")
# each one's fit options: "allreduce 1/task" is the all-reduce engine with a task per worker and step
# (segment_steps=1), as before steps ran in segments (workbench.cluster.collective.segments)
OPTIONS = {"allreduce": {}, "allreduce 1/task": {"strategy": "allreduce", "segment_steps": 1}, "parameter_server": {}}


def mlp():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, SIZES[0]))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        for i, (a, b) in enumerate(zip(SIZES, SIZES[1:])):
            h = wb.matmul(h, wb.variable(f"w{i}", shape=(a, b))) + wb.variable(f"b{i}", shape=(b,), init="zeros")
            if i < len(SIZES) - 2:
                h = wb.relu(h)
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.SGD(0.01).minimize(loss)
    return g, train, loss


def data(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, SIZES[0])).astype("float32"), "y": rng.integers(0, SIZES[-1], n)}


MODEL_BYTES = 4 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))


# -- workbench ---------------------------------------------------------------------------------


def workbench_step(client, batch: int, steps: int, strategy: str | None, fed: dict) -> tuple[float, dict]:
    """Median step time (seconds) of one fit, and its last record; ``client=None``: a local fit."""
    g, train, loss = mlp()
    sess = wb.Session(g, seed=0, cluster=client if client is not None else False)
    options = {} if client is None else {"strategy": strategy, "sync_every": steps + WARMUP, **OPTIONS[strategy]}
    h = sess.fit(train, fed, batch_size=batch, steps=steps + WARMUP, fetches=[loss], **options)
    return statistics.median(r["time"] for r in h.records[WARMUP:]), h.records[-1]


# -- DDP: two long-lived gloo processes that take orders ----------------------------------------


def torch_rank(rank: int, port: int, pipe) -> None:
    """A gloo rank: ``(mode, batch, steps)`` -> its median step time (``"single"``: rank 0 alone, no DDP)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    while (order := pipe.recv()) is not None:
        mode, batch, steps = order
        if mode == "single" and rank == 1:
            pipe.send(None)
            continue
        torch.manual_seed(0)
        layers = []
        for i, (a, b) in enumerate(zip(SIZES, SIZES[1:])):
            layers.append(torch.nn.Linear(a, b))
            if i < len(SIZES) - 2:
                layers.append(torch.nn.ReLU())
        model = torch.nn.Sequential(*layers)
        if mode == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        local = batch // 2 if mode == "ddp" else batch
        rng = np.random.default_rng(rank)
        x = torch.from_numpy(rng.normal(size=(local, SIZES[0])).astype("float32"))
        y = torch.from_numpy(rng.integers(0, SIZES[-1], local))
        times = []
        for _ in range(steps + WARMUP):
            started = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - started)
        if mode == "ddp":
            dist.barrier()
        pipe.send(statistics.median(times[WARMUP:]))
    dist.destroy_process_group()


# -- the run -----------------------------------------------------------------------------------


def one_round(client, torch, batches, steps, datasets, times: dict, seen: dict) -> None:
    for batch in (OVERHEAD_BATCH, *batches):
        n = steps if batch < 16384 else max(3, steps // 3)
        fed = datasets[batch]
        times[("one", batch)].append(workbench_step(None, batch, n, None, fed)[0])
        for strategy in STRATEGIES:
            seconds, record = workbench_step(client, batch, n, strategy, fed)
            times[(strategy, batch)].append(seconds)
            seen[strategy] = record
        times[("ddp one", batch)].append(torch.ask(("single", batch, n))[0])
        times[("ddp", batch)].append(torch.ask(("ddp", batch, n))[0])


def report(batches, times: dict, seen: dict, rounds: int, steps: int) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"MLP {'-'.join(map(str, SIZES))} float32 SGD; 2 workers x 1 thread; medians of {rounds} interleaved "
          f"rounds x {steps} steps; numpy {np.__version__}, cpu count {os.cpu_count()}\n")  # fmt: skip
    print("## E(2) = throughput(2) / (2 x throughput(1 process))\n")
    print(f"| global batch | {' | '.join(STRATEGIES)} | DDP (gloo) | 1 process ms/step (wb / torch) |")
    print("|---:|" + "---:|" * (len(STRATEGIES) + 2))
    for b in batches:
        e = {s: med[("one", b)] / (2 * med[(s, b)]) for s in STRATEGIES}
        ddp = med[("ddp one", b)] / (2 * med[("ddp", b)])
        print(f"| {b} | {' | '.join(f'{e[s]:.2f}' for s in STRATEGIES)} | {ddp:.2f} | "
              f"{med[('one', b)] * 1e3:.1f} / {med[('ddp one', b)] * 1e3:.1f} |")  # fmt: skip
    print("\n## Samples/s on 2 workers\n")
    print(f"| global batch | {' | '.join(STRATEGIES)} | DDP (gloo) |")
    print("|---:|" + "---:|" * (len(STRATEGIES) + 1))
    for b in (OVERHEAD_BATCH, *batches):
        rates = [b / med[(s, b)] for s in (*STRATEGIES, "ddp")]
        print(f"| {b} | {' | '.join(f'{r:,.0f}' for r in rates)} |")
    b = OVERHEAD_BATCH
    print(f"\n## Per-step overhead at global batch {b}: step(2) - step(1 process) / 2\n")
    print("| | step on 2, ms | 1 process, ms | overhead, ms | vs DDP |\n|---|---:|---:|---:|---:|")
    ddp_over = med[("ddp", b)] - med[("ddp one", b)] / 2
    for name, key, one in [*((s, s, "one") for s in STRATEGIES), ("DDP (gloo)", "ddp", "ddp one")]:
        over = med[(key, b)] - med[(one, b)] / 2
        print(f"| {name} | {med[(key, b)] * 1e3:.1f} | {med[(one, b)] * 1e3:.1f} | {over * 1e3:.1f} | "
              f"{over / ddp_over:.2f}x |")  # fmt: skip
    record = seen["allreduce"]
    bound = 2 * (2 - 1) / 2 * MODEL_BYTES
    print("\n## Traffic and tasks per step (2 workers)\n")
    print(f"allreduce: {record['bytes_received'] / 1e6:.3f} MB received per worker per step (counted), "
          f"2(R-1)/R x model = {bound / 1e6:.3f} MB ({record['bytes_received'] / bound:.3f}x); "
          f"{record['replicas']} tasks per segment (a task per worker running up to segment_steps=16 steps; "
          f"here each fit's {WARMUP} + --steps steps in one); allreduce 1/task: {record['replicas']} tasks per step")  # fmt: skip
    g, train, _ = mlp()
    ps_tasks = wb.cluster.lower(g, train, data(64), batch_size=64, replicas=2).tasks_per_step
    print(f"parameter_server: {MODEL_BYTES * 2 / 1e6:.3f} MB through task results per step (gradients to the "
          f"reducer, variables back; not counted); {ps_tasks} tasks per step")  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, few steps, batches up to 4096")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batches", default=None, help="comma-separated global batches")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    steps = args.steps or (4 if args.quick else 12)
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else BATCHES[:3] if args.quick else BATCHES
    datasets = {b: data(max(b, 256)) for b in (OVERHEAD_BATCH, *batches)}
    client = wb.cluster.connect("local", n_workers=2)
    torch = Gloo(torch_rank)
    times: dict = {}
    for key in [(s, b) for s in ("one", "ddp one", "ddp", *STRATEGIES) for b in (OVERHEAD_BATCH, *batches)]:
        times[key] = []
    seen: dict = {}
    try:
        for r in range(rounds):
            started = time.perf_counter()
            one_round(client, torch, batches, steps, datasets, times, seen)
            print(f"round {r + 1}/{rounds}: {time.perf_counter() - started:.0f} s", flush=True)
        print()
        report(batches, times, seen, rounds, steps)
    finally:
        torch.close()
        wb.cluster.close(client)


if __name__ == "__main__":
    main()
