"""The lab's one-process simulation at scale: 100 simulated replicas, the digits MLP, 100 steps.

    .venv/bin/python bench/lab.py [--replicas 100] [--steps 100] [--batch 1000] [--rounds 3]

The digits MLP of ``python -m workbench.demo`` (64-64-10, ReLU, Adam), a global batch of 1000
rows split over the replicas (10 rows each at R = 100), on the virtual clock
(``clock="virtual", compute_seconds=0.01``) under ``wb.stragglers.Bernoulli(p=0.1, delay=0.05)``.
Each round times, in turn: synchronous SGD, synchronous SGD with 4 backup replicas (R = 96,
b = 4: the paper's split of 100 machines) and asynchronous SGD (100 applied gradients), each from
a fresh session (plan compilation included). Reported: the median wall seconds of each, and its
virtual time to the last step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import workbench as wb  # noqa: E402
from workbench import datasets  # noqa: E402
from workbench.demo import build_mlp  # noqa: E402


def configurations(replicas: int) -> dict[str, dict]:
    return {
        "sync": {"replicas": replicas},
        "sync + 4 backups": {"replicas": replicas - 4, "backup_replicas": 4},
        "async": {"replicas": replicas, "strategy": "async"},
    }


def measure(data: dict, steps: int, batch: int, options: dict) -> tuple[float, float, float]:
    """(wall seconds, virtual seconds at the last step, final loss) of one fit."""
    model = build_mlp()
    sess = wb.Session(model["graph"], seed=0)
    started = time.perf_counter()
    history = sess.fit(
        model["train"],
        data,
        batch_size=batch,
        steps=steps,
        fetches={"loss": model["loss"]},
        stragglers=wb.stragglers.Bernoulli(p=0.1, delay=0.05, seed=0),
        clock="virtual",
        compute_seconds=0.01,
        **options,
    )
    return time.perf_counter() - started, float(history["elapsed"][-1]), float(history["loss"][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    split = datasets.digits()
    data = {"x": split.x_train, "y": split.y_train}
    runs = configurations(args.replicas)
    seconds: dict[str, list] = {label: [] for label in runs}
    results = {}
    for _ in range(args.rounds):
        for label, options in runs.items():
            wall, virtual, loss = measure(data, args.steps, args.batch, options)
            seconds[label].append(wall)
            results[label] = (virtual, loss)
    print(f"{args.replicas} simulated replicas, {args.steps} steps of {args.batch} rows, {args.rounds} rounds")
    print(f"{'run':<18} {'wall s (median)':>16} {'min':>8} {'max':>8} {'virtual s':>10} {'final loss':>11}")
    for label, walls in seconds.items():
        virtual, loss = results[label]
        print(
            f"{label:<18} {statistics.median(walls):>16.2f} {min(walls):>8.2f} {max(walls):>8.2f} "
            f"{virtual:>10.3f} {loss:>11.4f}"
        )


if __name__ == "__main__":
    main()
