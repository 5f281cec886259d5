"""Predicted against measured scaling: the scaling model's profile from one worker, checked at 2 to 4.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/predict.py [--quick]

On an embedded Dask cluster of 4 worker processes (one thread each):

1. the all-reduce (``workbench.cluster.collective.group``): latency and bandwidth fitted at 2 ranks,
   then the predicted and measured time of one all-reduce at 3 and 4 ranks;
2. training (``fit``, ``strategy="parameter_server"``, and ``"allreduce"`` when ``fit`` offers
   it): a profile from one worker only (its step, compute and update at the global batch, its
   compute timed at the shards of 2, 3 and 4 workers, the link, a scheduler hop), then the
   predicted and measured step time and efficiency at 2 workers for a compute-heavy MLP
   (784-1024-1024-10, batch 1024) and at 2, 3 and 4 for a small one (64-256-10, batch 256);
   rounds interleaved, medians;
3. the seed's case, predicted: an Inception-v3-sized model (96 MB of gradients, 1 s of compute
   a step, 32 rows per GPU) on 8 to 100 GPUs over 10 GbE, InfiniBand and NVLink-class links,
   next to TensorFlow 0.8's published 56x on 100 GPUs.

A 2-core machine runs 4 workers' compute on 2 cores: measure with small compute there.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.cluster import predict as model  # noqa: E402
from workbench.cluster import probe  # noqa: E402
from workbench.cluster.engines import STRATEGIES  # noqa: E402
from workbench.scaling import _gradient_bytes, measure_profile  # noqa: E402


def mlp(sizes: list[int], name: str):
    g = wb.Graph(name=name)
    with g.as_default():
        x = wb.placeholder("x", shape=(None, sizes[0]), dtype="float32")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            h = wb.matmul(h, wb.variable(f"w{i}", shape=(a, b), init="glorot_uniform", dtype="float32"))
            h = h + wb.variable(f"b{i}", shape=(b,), init="zeros", dtype="float32")
            if i < len(sizes) - 2:
                h = wb.relu(h)
        train = wb.optimizers.SGD(0.01).minimize(wb.mean(wb.softmax_cross_entropy(h, y)))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(4096, sizes[0])).astype("float32"), "y": rng.integers(0, sizes[-1], 4096)}
    return g, train, data


def steps(client, workers, graph, train, data, batch: int, k: int, strategy: str, count: int) -> list[dict]:
    """The records of ``count`` steps with ``k`` replicas (after 3 to warm up)."""
    sess = wb.Session(graph, cluster=client)
    history = sess.fit(train, data, batch_size=batch, steps=count + 3, replicas=k, workers=workers[:k],
                       sync_every=count + 3, strategy=strategy)  # fmt: skip
    return history.records[3:]


def median(records: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in records)


def link_table(client, workers, repeats: int) -> None:
    link = probe.measure_link(client, workers[:2], repeats=repeats)
    fitted = model.Link("measured", link["bandwidth"], link["latency"])
    cores = len(os.sched_getaffinity(0))
    print(f"\n## All-reduce: fitted at 2 ranks: {link['latency'] * 1e3:.2f} ms a message, "
          f"{link['bandwidth'] / 1e9:.2f} GB/s per worker\n")  # fmt: skip
    print("| ranks | bytes | predicted ms | measured ms | error |\n|---:|---:|---:|---:|---:|")
    for ranks in (3, 4):
        for size, seconds in probe.measure_allreduce(
            client, workers[:ranks], sizes=(1 << 20, 4 << 20, 16 << 20), repeats=repeats
        ):
            predicted = model.allreduce_seconds(size, ranks, fitted) * max(1.0, ranks / cores)  # ranks share the cores
            print(
                f"| {ranks} | {size >> 20} MiB | {predicted * 1e3:.1f} | {seconds * 1e3:.1f} | {predicted / seconds - 1:+.0%} |"
            )


def training_table(client, workers, name, sizes, batch, counts, strategy, rounds, count) -> None:
    graph, train, data = mlp(sizes, name)
    measured: dict[int, list[float]] = {k: [] for k in [1, *counts]}
    compute: dict[int, list[float]] = {k: [] for k in counts}
    first: list[dict] = []
    for _ in range(rounds):  # interleaved: a noisy machine moves every count alike
        for k in measured:
            records = steps(client, workers, graph, train, data, batch, k, strategy, count)
            measured[k].append(median(records, "time"))
            first += records if k == 1 else []
        for k in counts:  # one worker's compute at the shard of k workers
            compute[k].append(median(steps(client, workers, graph, train, data, math.ceil(batch / k), 1, strategy, count),
                                     "compute_seconds"))  # fmt: skip
    variables = wb.Session(graph).variables
    profile = measure_profile(client, workers, {1: first}, batch, strategy, _gradient_bytes(graph, train, variables),
                              compute=[(math.ceil(batch / k), statistics.median(v)) for k, v in compute.items()])  # fmt: skip
    # the workers of this cluster share the machine's cores
    shared = model.Assumptions(cores=len(os.sched_getaffinity(0)))
    predicted = {r["workers"]: r for r in model.predict(profile, [1, *counts], [strategy], shared)}
    one = statistics.median(measured[1])
    print(f"\n## {name} ({'-'.join(map(str, sizes))}, batch {batch}), strategy {strategy!r}\n")
    print(f"profile: compute {profile.compute_fixed * 1e3:.2f} ms + {profile.compute_per_sample * 1e6:.2f} µs/row, "
          f"update {profile.update_seconds * 1e3:.2f} ms, overhead {profile.overhead * 1e3:.2f} ms, hop {profile.hop * 1e3:.2f} ms, "
          f"{profile.task_seconds * 1e3:.2f} ms a task, {shared.cores:g} cores shared, "
          f"{profile.model_bytes / 1e6:.2f} MB of gradients\n")  # fmt: skip
    print(
        "| workers | predicted s/step | measured s/step | error | predicted E | measured E |\n|---:|---:|---:|---:|---:|---:|"
    )
    for k in [1, *counts]:
        step, p = statistics.median(measured[k]), predicted[k]
        print(
            f"| {k} | {p['step_seconds']:.4f} | {step:.4f} | {p['step_seconds'] / step - 1:+.0%} | "
            f"{predicted[1]['step_seconds'] / p['step_seconds'] / k:.2f} | {one / step / k:.2f} |"
        )


def seed_table() -> None:
    print("\n## The seed's case, predicted: 96 MB of gradients, 1 s of compute a step, 32 rows per GPU\n")
    print("| link | strategy | 8 | 32 | 100 | speedup at 100 |\n|:---|:---|---:|---:|---:|---:|")
    for link in ("10gbe", "infiniband", "nvlink"):
        for strategy in model.STRATEGIES:
            rows = model.predict(
                model.seed_case(), [8, 32, 100], [strategy], model.Assumptions(link=link, batch="per_replica")
            )
            spec = model.LINKS[link]
            print(f"| {spec.name} ({spec.bandwidth / 1e9:g} GB/s, {spec.latency * 1e6:g} µs a message) | {strategy} | " + " | ".join(f"{r['efficiency']:.0%}" for r in rows)
                  + f" | {rows[-1]['speedup']:.0f}x |")  # fmt: skip
    print("| TensorFlow 0.8 (published) | parameter servers | | | 56% | 56x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1 round of 4 steps, the small model only")
    args = parser.parse_args()
    rounds, count = (1, 4) if args.quick else (args.rounds, args.steps)
    seed_table()
    client = wb.cluster.connect("local", n_workers=4)
    try:
        client.wait_for_workers(4, timeout=60)
        workers = sorted(client.scheduler_info()["workers"])
        link_table(client, workers, repeats=3 if args.quick else 7)
        for strategy in [s for s in model.STRATEGIES if s in STRATEGIES]:
            if not args.quick:
                training_table(client, workers, "compute", [784, 1024, 1024, 10], 1024, [2], strategy, rounds, count)
            training_table(client, workers, "small", [64, 256, 10], 256, [2, 3, 4], strategy, rounds, count)
    finally:
        wb.cluster.close(client)


if __name__ == "__main__":
    main()
