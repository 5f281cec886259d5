"""Strategy functions on a cluster against the built-in all-reduce engine, in interleaved rounds.

    .venv/bin/python bench/strategies.py [--rounds N] [--steps N] [--batches 64,1024]

The MLP of bench/cluster.py (784-1024-1024-10, float32, SGD), a local cluster of 2 worker
processes with one thread each. Each round trains, in turn: the built-in ``allreduce`` engine
(``strategy="allreduce"``: buckets started during the backward pass), the ``"allreduce"`` strategy
*function* run by the workers as a replica program (``strategy=wb.strategies.resolve("allreduce")``:
one all_reduce op per gradient, started when the gradient exists), and ``local_sgd(every=8)``.
Reported per global batch: medians over the rounds of each round's median step time (warm-up steps
left out), samples/s from it, and bytes sent per worker per step (the communicator's count).
"""

from __future__ import annotations

import argparse
import os
import statistics

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

import workbench as wb  # noqa: E402
from cluster import WARMUP, data, mlp  # noqa: E402  (bench/, the script's folder)

SYSTEMS = {
    "allreduce engine": lambda: "allreduce",
    "allreduce strategy function": lambda: wb.strategies.resolve("allreduce"),
    "local_sgd(every=8)": lambda: wb.strategies.local_sgd(every=8),
}


def measure(client, g, train, examples, batch: int, steps: int, strategy) -> tuple[float, float]:
    """(median step seconds after warm-up, mean bytes sent per worker per step)."""
    sess = wb.Session(g, seed=0, cluster=client)
    history = sess.fit(train, examples, batch_size=batch, steps=steps, replicas=2, strategy=strategy)
    return statistics.median(history["time"][WARMUP:]), float(np.mean(history["bytes_sent"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batches", default="64,1024")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    g, train, _ = mlp()
    examples = data(max(batches) * 4)
    client = wb.cluster.connect("local", n_workers=2)
    try:
        times = {(name, b): [] for name in SYSTEMS for b in batches}
        sent = {}
        for _ in range(args.rounds):
            for batch in batches:
                for name, make in SYSTEMS.items():
                    seconds, per_step = measure(client, g, train, examples, batch, args.steps, make())
                    times[name, batch].append(seconds)
                    sent[name, batch] = per_step
        print(f"{'system':<30} {'batch':>6} {'step ms':>9} {'samples/s':>10} {'MB sent/step':>13}")
        for batch in batches:
            base = statistics.median(times["allreduce engine", batch])
            for name in SYSTEMS:
                step = statistics.median(times[name, batch])
                print(
                    f"{name:<30} {batch:>6} {step * 1e3:>9.2f} {batch / step:>10.0f} {sent[name, batch] / 1e6:>13.2f}"
                    f"   ({step / base - 1:+.1%} vs the engine)"
                )
    finally:
        wb.cluster.close(client)


if __name__ == "__main__":
    main()
