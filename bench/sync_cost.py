"""What a host sync costs the all-reduce engine's steps: the same fit with the variables brought home at
every step, every 4th step, and only at the end, in interleaved rounds.

    cd bench && python sync_cost.py [--rounds N] [--steps N] [--batch N]

The MLP of bench/cluster.py (784-1024-1024-10, float32, 7.45 MB of variables, SGD), a local cluster of
2 worker processes with one thread each, ``strategy="allreduce"``. A sync step's tasks bring rank 0's
copy of the variables home with their results while the next steps run (the coordinator keeps the
window full across syncs), so a sync should cost the copy on the worker (a memcpy of the model) and the
transfer to the client beside the loop, not a drained pipeline. Reported: medians over the rounds of each
fit's median step time (warm-up steps left out), and the difference from the fit without syncs.
"""

from __future__ import annotations

import argparse
import os
import statistics

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import workbench as wb  # noqa: E402
from cluster import WARMUP, data, mlp  # noqa: E402  (bench/, the script's folder)


def measure(client, g, train, examples, batch: int, steps: int, sync_every: int | None) -> float:
    sess = wb.Session(g, seed=0, cluster=client)
    every = steps + WARMUP if sync_every is None else sync_every
    history = sess.fit(train, examples, batch_size=batch, steps=steps + WARMUP, sync_every=every, replicas=2)
    sess.close()
    return statistics.median(history["time"][WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    g, train, _ = mlp()
    examples = data(args.batch * 4)
    settings = {"only at the end": None, "every 4th step": 4, "every step": 1}
    client = wb.cluster.connect("local", n_workers=2)
    try:
        times = {name: [] for name in settings}
        for r in range(args.rounds):
            order = list(settings) if r % 2 == 0 else list(reversed(settings))  # interleaved, alternating
            for name in order:
                times[name].append(measure(client, g, train, examples, args.batch, args.steps, settings[name]))
        base = statistics.median(times["only at the end"])
        print(f"{'host sync':<18} {'step ms':>9} {'vs no sync':>11}   (batch {args.batch}, {args.rounds} rounds)")
        for name in settings:
            step = statistics.median(times[name])
            print(f"{name:<18} {step * 1e3:>9.2f} {step / base - 1:>+10.1%}")
    finally:
        wb.cluster.close(client)


if __name__ == "__main__":
    main()
