"""Where an all-reduce step's time goes inside ``fit`` on 2 local workers.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/step_profile.py [--quick]

MLP 784-1024-1024-10, float32, SGD. For each global batch: the median step time of
``fit(strategy="allreduce")`` and its parts as the replicas measure them (compute: forward,
backward and the gradients into their buckets; reduce: waiting for the all-reduce after
compute; update: the optimizer), against the same shard's forward and backward pass and
the same update run in a plain loop, in a worker process between fits (what the step
would cost with no collective and no Dask around it). Rounds are interleaved; medians.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import workbench as wb  # noqa: E402

from cluster import SIZES, data, mlp  # noqa: E402  (bench/, the script's folder: the benchmark's model and data)


def plain_step(program, variables, rows, repeats):
    """In a worker: the shard's gradients and the update, as plain plan runs (medians, seconds)."""
    from workbench.cluster.worker_plans import WorkerPlans

    plans = WorkerPlans(program)
    plans.replica_state.update(variables)
    plans.update_state.update({n: v.copy() for n, v in variables.items()})
    feeds = [rows[n] for n in plans.replica.feed_names]
    compute, update = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        grads = plans.replica.run(feeds)[: len(program.gradients)]
        compute.append(time.perf_counter() - started)
        started = time.perf_counter()
        plans.update.run([grads[i] for i in plans.update_order])
        update.append(time.perf_counter() - started)
    return statistics.median(compute), statistics.median(update)


def main():
    quick = "--quick" in sys.argv
    batches = (64, 512) if quick else (64, 512, 4096)
    rounds, steps = (2, 12) if quick else (5, 30)
    g, train, loss = mlp()
    client = wb.cluster.connect("local", n_workers=2)
    workers = sorted(client.scheduler_info()["workers"])
    program = wb.cluster.TrainingProgram.from_graph(g, train, [loss.name])
    variables = {n: v for n, v in wb.Session(g, seed=0).variables.items()}
    rows = {b: data(b // 2) for b in batches}
    got: dict = {b: {"step": [], "compute": [], "reduce": [], "update": [], "plain compute": [], "plain update": []}
                 for b in batches}  # fmt: skip
    for _ in range(rounds):
        for batch in batches:
            sess = wb.Session(g, seed=0, cluster=client)
            h = sess.fit(train, data(batch * 4), batch_size=batch, steps=steps, fetches=[loss], strategy="allreduce",
                         sync_every=steps)  # fmt: skip
            records = h.records[3:]
            row = got[batch]
            row["step"].append(statistics.median(r["time"] for r in records))
            for key in ("compute", "reduce", "update"):
                row[key].append(statistics.median(r[f"{key}_seconds"] for r in records))
            plain = client.submit(plain_step, program, variables, rows[batch], 5, workers=[workers[0]], pure=False)
            compute, update = plain.result()
            row["plain compute"].append(compute)
            row["plain update"].append(update)
    print(
        f"2 workers x 1 thread; MLP {'-'.join(map(str, SIZES))} float32 SGD; medians of {rounds} rounds x {steps} steps\n"
    )
    print(
        "| global batch | step ms | compute ms | reduce wait ms | update ms | plain compute ms | plain update ms | compute / plain |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in batches:
        m = {k: statistics.median(v) * 1e3 for k, v in got[batch].items()}
        print(f"| {batch} | {m['step']:.1f} | {m['compute']:.1f} | {m['reduce']:.1f} | {m['update']:.1f} | "
              f"{m['plain compute']:.1f} | {m['plain update']:.1f} | {m['compute'] / m['plain compute']:.2f}x |")  # fmt: skip
    wb.cluster.close(client)


if __name__ == "__main__":
    main()
