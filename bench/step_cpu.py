"""Where a 2-worker all-reduce step's time goes at a small batch: the CPU each process spends a step.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. .venv/bin/python bench/step_cpu.py [--rounds 3]

MLP 784-1024-1024-10, float32, SGD, global batch 64 (``bench/cluster.py``'s overhead point), on a
local cluster of 2 single-threaded worker processes (its scheduler lives in this process, so the
client's CPU below includes the scheduler's). For steps in segments (``segment_steps=16``) and a task
per worker and step (``segment_steps=1``), in interleaved rounds, medians over rounds of: the wall
time a step, this process's CPU a step (client and scheduler), each worker process's CPU a step, and
the parts each replica measures (compute: forward, backward and the gradients into their buckets;
reduce: waiting for the all-reduce after compute; update: the optimizer). Two cores run all three
processes, so what the client and the scheduler spend is taken from the replicas.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import psutil  # noqa: E402

import workbench as wb  # noqa: E402

from cluster import data, mlp  # noqa: E402  (bench/, the script's folder: the benchmark's model and data)

BATCH = 64
MODES = {"segments": 16, "a task per step": 1}


def one_fit(client, workers, fed, steps: int, segment_steps: int) -> dict:
    """One fit's per-step figures (the first 4 steps left out: compilation and the first transfers)."""
    g, train, loss = mlp()
    sess = wb.Session(g, seed=0, cluster=client)
    sess.fit(train, fed, batch_size=BATCH, steps=2, fetches=[loss], segment_steps=segment_steps)  # warm plans
    marks = {}

    def mark(record):
        if record["step"] == 4:
            marks["start"] = (time.perf_counter(), time.process_time(), [w.cpu_times() for w in workers])

    h = sess.fit(train, fed, batch_size=BATCH, steps=steps, fetches=[loss], sync_every=steps,
                 segment_steps=segment_steps, callback=mark)  # fmt: skip
    wall, cpu, before = marks["start"]
    n = steps - 4
    end = [w.cpu_times() for w in workers]
    records = h.records[4:]
    return {
        "wall": (time.perf_counter() - wall) / n,
        "client": (time.process_time() - cpu) / n,
        "workers": [((e.user + e.system) - (b.user + b.system)) / n for b, e in zip(before, end)],
        "compute": statistics.median(r["compute_seconds"] for r in records),
        "reduce": statistics.median(r["reduce_seconds"] for r in records),
        "update": statistics.median(r["update_seconds"] for r in records),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    client = wb.cluster.connect("local", n_workers=2)
    fed = data(256)
    try:
        workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        seen = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                seen[mode].append(one_fit(client, workers, fed, args.steps, MODES[mode]))
        med = lambda rows, key: statistics.median(row[key] for row in rows)  # noqa: E731
        print(f"global batch {BATCH}, 2 workers x 1 thread; medians of {args.rounds} interleaved rounds x "
              f"{args.steps - 4} steps; cpu count {os.cpu_count()}\n")  # fmt: skip
        print("| ms a step | wall | client + scheduler CPU | worker 0 CPU | worker 1 CPU | replica compute | "
              "reduce wait | update |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for mode, rows in seen.items():
            w0 = statistics.median(row["workers"][0] for row in rows)
            w1 = statistics.median(row["workers"][1] for row in rows)
            print(f"| {mode} | {med(rows, 'wall') * 1e3:.1f} | {med(rows, 'client') * 1e3:.1f} | {w0 * 1e3:.1f} | "
                  f"{w1 * 1e3:.1f} | {med(rows, 'compute') * 1e3:.1f} | {med(rows, 'reduce') * 1e3:.1f} | "
                  f"{med(rows, 'update') * 1e3:.1f} |")  # fmt: skip
    finally:
        wb.cluster.close(client)


if __name__ == "__main__":
    main()
