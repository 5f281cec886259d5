"""Median step time of synchronous SGD with and without backup replicas under stragglers, on a
local cluster (the all-reduce engine): interleaved rounds, the same injected delays in each.

    .venv/bin/python bench/stragglers.py --rounds 3 --steps 40

Each round trains the same MLP on the bundled digits twice: ``replicas=R`` and ``replicas=R,
backup_replicas=b`` (R + b worker processes), both under ``Bernoulli(p, delay, seed)``, and prints
each fit's median, mean and 90th-percentile step time (the first step, compilation, left out) and
the bytes the busiest worker received a step (median).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from sklearn.datasets import load_digits

import workbench as wb


def build():
    g = wb.Graph(name="digits")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64), dtype="float32")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.matmul(x, wb.variable("w1", shape=(64, 64))) + wb.variable("b1", shape=(64,), init="zeros"))
        logits = wb.matmul(h, wb.variable("w2", shape=(64, 10))) + wb.variable("b2", shape=(10,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    return g, train, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--backups", type=int, default=1)
    parser.add_argument("--p", type=float, default=0.3)
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    digits = load_digits()
    data = {"x": (digits.data / 16.0).astype("float32"), "y": digits.target}
    late = wb.stragglers.Bernoulli(p=args.p, delay=args.delay, seed=args.seed)
    client = wb.cluster.connect("local", n_workers=args.replicas + args.backups)
    client.wait_for_workers(args.replicas + args.backups, timeout=60)
    runs = {"sync": {}, f"sync + {args.backups} backups": {"backup_replicas": args.backups}}
    found: dict[str, list] = {label: [] for label in runs}
    try:
        for k in range(args.rounds):
            for label, options in runs.items():
                g, train, loss = build()
                sess = wb.Session(g, seed=0, cluster=client)
                started = time.perf_counter()
                history = sess.fit(
                    train, data, batch_size=args.batch, steps=args.steps, replicas=args.replicas,
                    stragglers=late, fetches=[loss], **options,
                )  # fmt: skip
                times = [r["time"] for r in history.records[1:]]
                busiest = statistics.median(r["bytes_received"] for r in history.records[1:])
                row = (statistics.median(times), statistics.fmean(times), float(np.quantile(times, 0.9)), busiest)
                found[label].append(row)
                print(
                    f"round {k + 1} {label:>18}: median {row[0] * 1e3:7.1f} ms  mean {row[1] * 1e3:7.1f} ms  "
                    f"p90 {row[2] * 1e3:7.1f} ms  busiest worker {row[3] / 1e3:.1f} kB/step "
                    f"({time.perf_counter() - started:.1f} s)",
                    flush=True,
                )
    finally:
        wb.cluster.close(client)
    print(
        "\n| run | median step (ms) | mean step (ms) | p90 step (ms) | busiest worker receives (kB/step) |\n"
        "|---|---:|---:|---:|---:|"
    )
    for label, rows in found.items():
        med, mean, p90 = (statistics.median(r[i] for r in rows) * 1e3 for i in range(3))
        busiest = statistics.median(r[3] for r in rows) / 1e3
        print(f"| {label} | {med:.1f} | {mean:.1f} | {p90:.1f} | {busiest:.1f} |")


if __name__ == "__main__":
    main()
