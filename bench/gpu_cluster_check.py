"""Data-parallel training on GPU workers, checked on one GPU machine in under a minute.

Run from the repository root (bench/gpu_check.sh runs it after the GPU check)::

    python3 bench/gpu_cluster_check.py            # CuPy and a CUDA device; dask and distributed
    python3 bench/gpu_cluster_check.py --dry-run  # anywhere: the GPU code path emulated on NumPy

It starts a plain ``distributed.LocalCluster`` of two single-thread worker
processes that share the one GPU (dask-cuda would give each worker a GPU of its
own; the code path on the workers is the same), then trains an MLP with
``device="gpu"`` on two replicas, in float64 and in float32, and compares the
variables with a local ``device="gpu"`` session and a NumPy float64 session
(norm-wise relative error, bounds per dtype). It checks that the workers ran
their plans on the GPU, kills one worker (SIGKILL) mid-training and checks
that the run still finishes every step with the variables of the run that lost
nothing, and prints training steps/s on the cluster and locally. Prints PASS or
FAIL with the reasons and exits 1 on failure.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import workbench as wb  # noqa: E402

# norm-wise relative error of the variables after training: against the local GPU
# session (only the replicas' sum order differs), against NumPy float64. In float32 Adam
# turns rounding in near-zero gradients into steps of about the learning rate: a dry run
# measures 1.1e-4 against local and 1.3e-4 against float64 after 30 steps.
BOUNDS = {"float64": {"local": 1e-9, "numpy": 1e-9}, "float32": {"local": 1e-3, "numpy": 2e-3}}
KILL_BOUND = 1e-6  # a killed worker's tasks are recomputed: the same variables as the run that lost nothing
FEATURES, HIDDEN, CLASSES = 64, 256, 10


def build(dtype: str):
    g = wb.Graph(name=f"mlp_{dtype}")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, FEATURES), dtype=dtype)
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h, width = x, FEATURES
        for i, out in enumerate([HIDDEN, HIDDEN, CLASSES]):
            w = wb.variable(f"w{i}", shape=(width, out), init="glorot_uniform", dtype=dtype)
            b = wb.variable(f"b{i}", shape=(out,), init="zeros", dtype=dtype)
            h = wb.matmul(h, w) + b
            h = wb.relu(h) if out != CLASSES else h
            width = out
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.Adam(1e-3).minimize(loss)
    return g, train, loss


def make_data(n: int, dtype: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n)
    centers = rng.normal(size=(CLASSES, FEATURES))
    x = centers[y] + rng.normal(size=(n, FEATURES))
    return {"x": x.astype(dtype), "y": y.astype("int64")}


def rel_error(got: dict, ref: dict) -> float:
    """The largest norm-wise relative error over the variables."""
    worst = 0.0
    for name, r in ref.items():
        r = np.asarray(r, dtype=np.float64)
        d = np.asarray(got[name], dtype=np.float64) - r
        worst = max(worst, float(np.linalg.norm(d.ravel()) / (np.linalg.norm(r.ravel()) or 1.0)))
    return worst


def steps_per_s(history, skip: int) -> float:
    times = [r["time"] for r in history.records[skip:]]
    return len(times) / sum(times) if times and sum(times) > 0 else float("nan")


class Check:
    def __init__(self, args, client):
        self.args, self.client = args, client
        self.gpu = {"device": "gpu", "emulate": True} if args.dry_run else {"device": "gpu"}
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failures.append(what)

    def fit(self, dtype: str, cluster=False, device=None, **fit):
        """(variables, history, seconds) of a fresh session's first fit."""
        g, train, loss = build(dtype)
        options = device if device is not None else {}
        sess = wb.Session(g, seed=1, cluster=cluster, **options)
        data = make_data(self.args.examples, dtype)
        started = time.perf_counter()
        hist = sess.fit(train, data, batch_size=self.args.batch, steps=self.args.steps, fetches=[loss], **fit)
        return sess.variables, hist, time.perf_counter() - started

    def agreement(self, dtype: str) -> dict:
        print(f"\n{dtype}: 2 replicas on 2 GPU workers against local training", flush=True)
        numpy_vars, _, _ = self.fit("float64")
        local_vars, local_hist, _ = self.fit(dtype, device=self.gpu)
        dist_vars, dist_hist, seconds = self.fit(dtype, self.client, self.gpu, replicas=2, sync_every=10)
        bounds = BOUNDS[dtype]
        e_local, e_numpy = rel_error(dist_vars, local_vars), rel_error(dist_vars, numpy_vars)
        self.expect(e_local <= bounds["local"], f"cluster vs local GPU session: {e_local:.2e} <= {bounds['local']:.0e}")
        self.expect(e_numpy <= bounds["numpy"], f"cluster vs NumPy float64:     {e_numpy:.2e} <= {bounds['numpy']:.0e}")
        self.expect(all(type(v) is np.ndarray for v in dist_vars.values()), "variables come back as NumPy arrays")
        skip = min(5, self.args.steps // 2)
        print(f"  steps/s: cluster {steps_per_s(dist_hist, skip):.1f} (whole fit {self.args.steps / seconds:.1f}, "
              f"first steps compile), local GPU {steps_per_s(local_hist, skip):.1f}, "
              f"batch {self.args.batch}", flush=True)  # fmt: skip
        return dist_vars

    def workers_on_gpu(self) -> None:
        from workbench.cluster import worker_plans

        seen = self.client.run(lambda: sorted(repr(d) for d in worker_plans.opened_devices() if d.kind == "gpu"))
        sends = self.client.run(lambda dask_worker: getattr(dask_worker, "workbench_device_transfers", "n/a (NumPy)"))
        print(f"  workers ran on: {seen}; CuPy arrays sent by {sorted(set(sends.values()))}", flush=True)
        on_gpu = all(s and all(("emulated" in r) == self.args.dry_run for r in s) for s in seen.values())
        self.expect(len(seen) == 2 and on_gpu, "both workers opened their GPU")

    def kill_one(self, dtype: str, expected: dict) -> None:
        print(f"\n{dtype}: one worker killed (SIGKILL) after the first sync", flush=True)
        pids = self.client.run(os.getpid)
        victim = sorted(pids)[-1]
        g, train, loss = build(dtype)
        sess = wb.Session(g, seed=1, cluster=self.client, **self.gpu)
        synced, done, killed_at, restarts = threading.Event(), [], [], []

        def watch(event):
            if event["kind"] == "synced":
                synced.set()
            elif event["kind"] == "restarted":
                restarts.append(event["step"])

        sess.events.subscribe(watch)

        def kill():
            if synced.wait(30):
                os.kill(pids[victim], signal.SIGKILL)
                killed_at.append(len(done))

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        hist = sess.fit(train, make_data(self.args.examples, dtype), batch_size=self.args.batch, steps=self.args.steps,
                        fetches=[loss], replicas=2, sync_every=10, callback=done.append)  # fmt: skip
        killer.join(5)
        steps = self.args.steps
        self.expect(
            bool(killed_at) and killed_at[0] < steps, f"killed mid-training (after step {killed_at[:1]} of {steps})"
        )
        self.expect(
            [r["step"] for r in hist.records] == list(range(1, steps + 1)), "every step recorded once, in order"
        )
        error = rel_error(sess.variables, expected)
        self.expect(error <= KILL_BOUND, f"variables as without the kill: {error:.2e} <= {KILL_BOUND:.0e} "
                                         f"(restarts from steps {restarts})")  # fmt: skip
        self.client.wait_for_workers(2, timeout=30)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="emulate the GPU path on NumPy (no GPU needed)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--examples", type=int, default=16384)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds the whole check may take")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    from distributed import Client, LocalCluster

    print(f"workbench GPU workers check{' (dry run: NumPy in place of CuPy)' if args.dry_run else ''}", flush=True)
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    client = Client(cluster)
    check = Check(args, client)
    try:
        client.wait_for_workers(2, timeout=60)
        print(f"cluster: 2 worker processes sharing one GPU, up in {time.perf_counter() - started:.1f} s", flush=True)
        check.agreement("float64")
        check.workers_on_gpu()
        expected = check.agreement("float32")
        check.kill_one("float32", expected)
    except Exception as e:  # noqa: BLE001 - reported as a failure of the check
        import traceback

        traceback.print_exc()
        check.failures.append(f"{type(e).__name__}: {e}")
    finally:
        client.close()
        cluster.close()
    seconds = time.perf_counter() - started
    if seconds > args.time_limit:
        check.failures.append(f"took {seconds:.0f} s, more than the {args.time_limit:.0f} s allowed")
    verdict = "PASS" if not check.failures else "FAIL: " + "; ".join(check.failures)
    print(f"\ngpu_cluster_check {verdict} ({seconds:.1f} s)", flush=True)
    return 0 if not check.failures else 1


if __name__ == "__main__":
    sys.exit(main())
