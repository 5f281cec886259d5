"""MLP training steps per second: workbench's local executor, hand-written NumPy, PyTorch eager.

Run from the repository root (one BLAS thread each; see bench/README.md)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/mlp.py

The three implementations train the same model (784 -> 1024 -> 1024 -> 10, ReLU,
mean softmax cross-entropy, plain SGD) in float32 from the same initial weights.
They are timed in interleaved windows (the order rotates every round) and the
medians are reported, so a burst of load from another process hits all three.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy and torch load their BLAS

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import workbench as wb  # noqa: E402

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

INPUTS, HIDDEN, CLASSES = 784, 1024, 10
LR = 0.01
BATCHES = (64, 512, 4096)


def step_flops(batch: int) -> int:
    """Matmul FLOPs of one training step: 3 forward GEMMs, 3 weight-gradient GEMMs and
    2 input-gradient GEMMs (the data needs no gradient)."""
    forward = INPUTS * HIDDEN + HIDDEN * HIDDEN + HIDDEN * CLASSES
    backward = forward + HIDDEN * HIDDEN + HIDDEN * CLASSES
    return 2 * batch * (forward + backward)


# -- the three implementations ------------------------------------------------------------


def build_workbench():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, INPUTS))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        sizes = (INPUTS, HIDDEN, HIDDEN, CLASSES)
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]), start=1):
            w = wb.variable(f"w{i}", shape=(n_in, n_out), init="glorot_uniform")
            b = wb.variable(f"b{i}", shape=(n_out,), init="zeros")
            h = wb.matmul(h, w) + b
            if i < 3:
                h = wb.relu(h)
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.SGD(LR).minimize(loss)
    sess = wb.Session(g, seed=0)
    return sess, train, loss, x, y


class NumpyMLP:
    """The same model by hand: forward, backward and SGD with in-place updates where it is free."""

    def __init__(self, params: dict[str, np.ndarray]):
        self.p = {k: v.copy() for k, v in params.items()}
        self.lr = np.float32(LR)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        p, n = self.p, x.shape[0]
        h1 = x @ p["w1"]
        h1 += p["b1"]
        np.maximum(h1, 0, out=h1)
        h2 = h1 @ p["w2"]
        h2 += p["b2"]
        np.maximum(h2, 0, out=h2)
        z = h2 @ p["w3"]
        z += p["b3"]
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        rows = np.arange(n)
        loss = float(np.mean(np.log(s[:, 0]) - z[rows, y]))
        dz = e
        dz /= s
        dz[rows, y] -= 1.0
        dz *= np.float32(1.0 / n)
        grads = {"w3": h2.T @ dz, "b3": dz.sum(axis=0)}
        dh2 = dz @ p["w3"].T
        dh2 *= h2 > 0
        grads["w2"], grads["b2"] = h1.T @ dh2, dh2.sum(axis=0)
        dh1 = dh2 @ p["w2"].T
        dh1 *= h1 > 0
        grads["w1"], grads["b1"] = x.T @ dh1, dh1.sum(axis=0)
        for k, g in grads.items():
            g *= self.lr
            p[k] -= g
        return loss


class TorchMLP:
    """The same model in PyTorch eager: nn.Linear layers, F.cross_entropy, optim.SGD."""

    def __init__(self, params: dict[str, np.ndarray]):
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in ((INPUTS, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES))
        )
        with torch.no_grad():
            for i, layer in enumerate(self.layers, start=1):
                layer.weight.copy_(torch.from_numpy(params[f"w{i}"].T.copy()))
                layer.bias.copy_(torch.from_numpy(params[f"b{i}"]))
        self.opt = torch.optim.SGD(self.layers.parameters(), lr=LR)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < 2:
                h = F.relu(h)
        loss = F.cross_entropy(h, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()


# -- measuring ------------------------------------------------------------------------------


def matmul_peak(sizes=(1024, 2048), repeats=7) -> dict[int, float]:
    """Best-of-``repeats`` GFLOP/s of float32 square matmuls with NumPy (one thread)."""
    rng = np.random.default_rng(0)
    out = {}
    for n in sizes:
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        c = np.empty((n, n), dtype=np.float32)
        np.matmul(a, b, out=c)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            np.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t)
        out[n] = 2 * n**3 / best / 1e9
    return out


def torch_matmul_peak(n=2048, repeats=7) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def make_batches(batch: int, count: int, seed: int):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((batch, INPUTS), dtype=np.float32) for _ in range(count)]
    ys = [rng.integers(0, CLASSES, size=batch).astype(np.int64) for _ in range(count)]
    return xs, ys


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # --clock: "cpu" counts only this process's CPU time (a shared machine)


def window(step, batches, steps: int) -> float:
    """Steps per second over ``steps`` consecutive steps."""
    t = clock()
    for i in range(steps):
        step(*batches[i % len(batches)])
    return steps / (clock() - t)


def check_same_model(params, xs, ys) -> float:
    """Largest relative difference of the loss over three steps between the implementations."""
    sess, train, loss, x, y = build_workbench()
    ref, tm = NumpyMLP(params), TorchMLP(params)
    worst = 0.0
    for i in range(3):
        feed = {x: xs[i], y: ys[i]}
        lw = float(sess.run([loss, train], feed)[0])
        ln = ref.step(xs[i], ys[i])
        lt = float(tm.step(torch.from_numpy(xs[i]), torch.from_numpy(ys[i])))
        worst = max(worst, abs(lw - ln) / abs(ln), abs(lt - ln) / abs(ln))
    return worst


def check_float32(sess, train, x, y, xb, yb) -> list[str]:
    """Names of ops in the training plan whose outputs are not float32 (besides labels and masks)."""
    sess.run(train, {x: xb, y: yb})
    plan = sess.plan_for(train, {x: xb, y: yb})
    bad = []
    for op in plan.step_ops:
        for t in op.outputs:
            if t.dtype == "float64":
                bad.append(op.name)
    return bad


def blas_info() -> list[str]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ["threadpoolctl not installed: thread counts not verified"]
    lines = []
    for pool in threadpool_info():
        lines.append(
            f"{pool.get('internal_api')} {pool.get('version')} ({pool.get('architecture', '?')}), "
            f"{pool.get('num_threads')} thread(s): {os.path.basename(pool.get('filepath', ''))}"
        )
        if pool.get("num_threads") != 1:
            raise SystemExit(f"expected one thread, got {pool}")
    return lines


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def bench_batch(batch: int, params, rounds: int, seconds: float) -> dict:
    xs, ys = make_batches(batch, 4, seed=batch)
    txs, tys = [torch.from_numpy(a) for a in xs], [torch.from_numpy(a) for a in ys]
    sess, train, _loss, x, y = build_workbench()
    ref, tm = NumpyMLP(params), TorchMLP(params)
    feeds = [({x: a, y: b},) for a, b in zip(xs, ys)]
    impls = {
        "workbench": (lambda feed: sess.run(train, feed), feeds),
        "numpy": (ref.step, list(zip(xs, ys))),
        "torch": (tm.step, list(zip(txs, tys))),
    }
    # warm up each and size the windows to about ``seconds``
    steps = {}
    for name, (fn, data) in impls.items():
        window(fn, data, 2)
        rate = window(fn, data, 3)
        steps[name] = max(2, int(rate * seconds))
    rates = {name: [] for name in impls}
    names = list(impls)
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            fn, data = impls[name]
            rates[name].append(window(fn, data, steps[name]))
    data = {"x": np.concatenate(xs), "y": np.concatenate(ys)}
    fit_rates = []
    for _ in range(3):
        hist = sess.fit(train, data=data, batch_size=batch, steps=steps["workbench"])
        times = [rec["time"] for rec in hist.records]
        fit_rates.append(len(times) / sum(times))
    out = {name: statistics.median(v) for name, v in rates.items()}
    # ratios within a round compare windows a second apart, so a load burst cancels out
    for other in ("numpy", "torch"):
        out[f"wb/{other}"] = statistics.median(w / o for w, o in zip(rates["workbench"], rates[other]))
    out["fit"] = statistics.median(fit_rates)
    out["spread"] = {name: (min(v), max(v)) for name, v in rates.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timing windows per implementation and batch size")
    parser.add_argument("--seconds", type=float, default=0.6, help="length of one timing window")
    parser.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="what times the windows: wall time, or this process's CPU time (steady on a loaded machine, "
        "where time spent waiting for a core would count against whichever implementation it hit); "
        "fit's rate is its own per-step wall time either way",
    )
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]

    print(f"CPU: {cpu_model()}; numpy {np.__version__}, torch {torch.__version__}, python {platform.python_version()}")
    print(f"torch threads: {torch.get_num_threads()}, BLAS: {torch.backends.mkldnn.is_available() and 'mkldnn ' or ''}"
          f"{'MKL' if torch.backends.mkl.is_available() else 'no MKL'}")  # fmt: skip
    for line in blas_info():
        print("BLAS pool:", line)
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        print(f"{var}={os.environ.get(var, '(unset)')}")

    sess, train, _loss, x, y = build_workbench()
    params = sess.variables
    xs, ys = make_batches(64, 3, seed=1)
    print(f"same model: largest relative loss difference over 3 steps {check_same_model(params, xs, ys):.1e}")
    print(f"float64 ops in the training plan: {check_float32(sess, train, x, y, xs[0], ys[0]) or 'none'}")

    peaks = matmul_peak()
    peak = max(peaks.values())
    print("float32 matmul peak, one thread (numpy, best of 7): "
          + ", ".join(f"n={n}: {v:.1f} GFLOP/s" for n, v in peaks.items())
          + f"; torch n=2048: {torch_matmul_peak():.1f} GFLOP/s")  # fmt: skip

    rows, fits = [], []
    for batch in args.batches:
        started = time.perf_counter()
        r = bench_batch(batch, params, args.rounds, args.seconds)
        rows.append((batch, r))
        fits.append(f"| {batch} | {r['fit']:.1f} | {r['fit'] / r['numpy']:.2f}x |")
        spread = ", ".join(f"{k} {lo:.1f}-{hi:.1f}" for k, (lo, hi) in r["spread"].items())
        print(f"batch {batch}: {time.perf_counter() - started:.0f} s; window range (steps/s): {spread}")

    print()
    peak = max(peak, *matmul_peak().values())  # measured again after the runs; the better is the peak
    print(f"Medians of {args.rounds} interleaved windows of ~{args.seconds} s ({args.clock} clock; ratios: median of "
          f"per-round ratios); peak = {peak:.1f} GFLOP/s.")  # fmt: skip
    print()
    print("| batch | workbench steps/s | numpy | torch | wb/numpy | wb/torch | % of matmul peak |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch, r in rows:
        gflops = step_flops(batch) * r["workbench"] / 1e9
        print(
            f"| {batch} | {r['workbench']:.1f} | {r['numpy']:.1f} | {r['torch']:.1f} | "
            f"{r['wb/numpy']:.2f}x | {r['wb/torch']:.2f}x | {100 * gflops / peak:.0f}% |"
        )
    print()
    print("| batch | workbench `fit` steps/s | fit/numpy |")
    print("|---:|---:|---:|")
    print("\n".join(fits))


if __name__ == "__main__":
    main()
