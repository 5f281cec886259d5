"""How fast a fit starts: a warm 1-step fit of a 2-worker session with 26 MB of NumPy data.

    .venv/bin/python bench/fit_latency.py [--rounds N] [--fits N] [--trees name=path,name=path]

The MLP of bench/cluster.py (784-1024-1024-10, float32, SGD, batch 64) on 8192 examples (25.8 MB of
``x`` and ``y``), a local cluster of 2 worker processes with one thread each. Each round, for each
tree in turn (``--trees``: each a checkout whose ``workbench`` is imported, in a process of its own;
default: the one on ``PYTHONPATH``), on a new cluster: a warm-up session's fit (imports, the workers'
first plans), then a new session's first 1-step fit, ``--fits`` more (the warm fits), and the time
``client.scatter`` takes to send the data once to each worker. Reported: medians over the rounds of
each round's median warm fit, of the first fit's extra over it, and of that send time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

EXAMPLES = 8192  # x: 8192 x 784 float32 and y: 8192 int64, 25.8 MB


def one_round(fits: int) -> dict:
    """Seconds of the first fit, each warm fit and one send of the data, on a new local cluster."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workbench as wb
    from cluster import data, mlp  # bench/, the script's folder

    client = wb.cluster.connect("local", n_workers=2)  # one thread each
    try:
        client.wait_for_workers(2, timeout=60)
        examples = data(EXAMPLES)
        g, train, loss = mlp()
        warmup = wb.Session(g, seed=0, cluster=client)
        warmup.fit(train, examples, batch_size=64, steps=1, fetches=[loss])
        warmup.close()
        sess = wb.Session(g, seed=0, cluster=client)
        times = []
        for _ in range(fits + 1):
            started = time.perf_counter()
            sess.fit(train, examples, batch_size=64, steps=1, fetches=[loss])
            times.append(time.perf_counter() - started)
        sess.close()
        sends = []
        for _ in range(3):
            started = time.perf_counter()
            sent = [client.scatter(list(examples.values()), workers=[w]) for w in client.scheduler_info()["workers"]]
            sends.append(time.perf_counter() - started)
            del sent
        return {
            "first": times[0],
            "warm": times[1:],
            "send": statistics.median(sends),
            "mb": sum(v.nbytes for v in examples.values()) / 1e6,
        }
    finally:
        wb.cluster.close(client)


def run_tree(path: str | None, fits: int) -> dict:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = path
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--one-round", "--fits", str(fits)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fits", type=int, default=7, help="warm fits per round")
    parser.add_argument("--trees", default="", help="name=path,... (default: the workbench on PYTHONPATH)")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_round:
        print(json.dumps(one_round(args.fits)))
        return
    trees = dict(t.split("=", 1) for t in args.trees.split(",") if t) or {"this tree": None}
    rounds: dict[str, list] = {name: [] for name in trees}
    for i in range(args.rounds):
        for name, path in trees.items():
            r = run_tree(path, args.fits)
            rounds[name].append(r)
            warm = statistics.median(r["warm"])
            print(
                f"round {i + 1} {name}: first {r['first']:.3f} s, warm {warm:.3f} s "
                f"(each: {', '.join(f'{t:.3f}' for t in r['warm'])}), send {r['send']:.3f} s",
                flush=True,
            )
    print(
        f"\n{rounds[next(iter(rounds))][0]['mb']:.1f} MB of data, 2 workers, 1-step fits; medians over {args.rounds} rounds"
    )
    print("| tree | warm 1-step fit (s) | first fit (s) | first minus warm (s) | data sent once (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, rs in rounds.items():
        warm = statistics.median(statistics.median(r["warm"]) for r in rs)
        first = statistics.median(r["first"] for r in rs)
        extra = statistics.median(r["first"] - statistics.median(r["warm"]) for r in rs)
        send = statistics.median(r["send"] for r in rs)
        print(f"| {name} | {warm:.3f} | {first:.3f} | {extra:.3f} | {send:.3f} |")


if __name__ == "__main__":
    main()
