"""Exported models: the cost of export and load, and inference rows/s of the model file
(``Model.predict`` on NumPy) against ``sess.run`` and ONNX Runtime's CPU provider.

    .venv/bin/python bench/export.py [--quick]

Models: the quickstart's digits MLP (64-256-10 here, trained 200 steps) and a small CNN
(conv 3x3 same / max pool / conv 3x3 stride 2 same / dense) on 8x8 digits. Inference at
batch 1, 64 and 1024 rows; medians of ``--rounds`` interleaved timings of ``--seconds`` each
(``export_onnx``'s first call includes importing onnx). One
thread for every runtime (``OMP_NUM_THREADS=1``, ORT's intra-op threads 1), so the numbers
compare kernels and per-call overhead, not parallelism.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import workbench as wb  # noqa: E402


def mlp():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(x @ wb.variable("w0", shape=(64, 256)) + wb.variable("b0", shape=(256,), init="zeros"))
        logits = h @ wb.variable("w1", shape=(256, 10)) + wb.variable("b1", shape=(10,), init="zeros")
        train = wb.optimizers.Adam(1e-3).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, wb.softmax(logits, name="probs"), train, (64,)


def cnn():
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 1, 8, 8))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.conv2d(x, wb.variable("k0", shape=(16, 1, 3, 3), init="he_normal"), padding="same"))
        h = wb.max_pool2d(h, 2)
        h = wb.relu(wb.conv2d(h, wb.variable("k1", shape=(32, 16, 3, 3), init="he_normal"), stride=2, padding="same"))
        logits = wb.reshape(h, (-1, 128)) @ wb.variable("w", shape=(128, 10))
        train = wb.optimizers.Adam(1e-3).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, wb.softmax(logits, name="probs"), train, (1, 8, 8)


def rates(fns, rows: int, seconds: float, rounds: int) -> list[float]:
    """Median rows/s of each of ``fns`` over ``rounds`` interleaved timings of about ``seconds`` each."""
    for fn in fns:
        fn()  # warm: plans compiled, sessions created
    found = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, found, strict=True):
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                fn()
                calls += 1
            out.append(calls * rows / (time.perf_counter() - start))
    return [statistics.median(out) for out in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short timings")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    rounds, seconds = (3, 0.1) if args.quick else (args.rounds, args.seconds)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    digits = load_digits()
    data, labels = (digits.data / 16).astype("float32"), digits.target.astype("int64")
    folder = tempfile.mkdtemp()
    print("| model | batch | sess.run rows/s | Model.predict rows/s | ONNX Runtime rows/s | ORT / predict |")
    print("|---|---:|---:|---:|---:|---:|")
    timings = []
    for build in (mlp, cnn):
        g, x, y, probs, train, shape = build()
        X = data.reshape(-1, *shape)
        sess = wb.Session(g, seed=0)
        sess.fit(train, {x: X, y: labels}, batch_size=64, steps=200)
        started = time.perf_counter()
        path = sess.export(os.path.join(folder, f"{g.name}.wbmodel"), {"x": x}, {"probs": probs})
        exported = time.perf_counter() - started
        started = time.perf_counter()
        model = wb.load_model(path)
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        onnx_path = wb.export_onnx(model, os.path.join(folder, f"{g.name}.onnx"))
        onnx_seconds = time.perf_counter() - started
        runtime = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
        timings.append((g.name, exported, loaded, onnx_seconds, os.path.getsize(path), os.path.getsize(onnx_path)))
        for batch in (1, 64, 1024):
            rows = np.resize(X, (batch, *shape)).astype("float32")
            fns = (
                lambda: sess.run(probs, {x: rows}),  # noqa: B023
                lambda: model.predict({"x": rows}),  # noqa: B023
                lambda: runtime.run(None, {"x": rows}),  # noqa: B023
            )
            a, b, c = rates(fns, batch, seconds, rounds)
            print(f"| {g.name} | {batch} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {c / b:.2f} |")
    print()
    print("| model | export s | load_model s | export_onnx s | model file bytes | ONNX bytes |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, exported, loaded, onnx_seconds, size, onnx_size in timings:
        print(f"| {name} | {exported:.4f} | {loaded:.4f} | {onnx_seconds:.4f} | {size:,} | {onnx_size:,} |")


if __name__ == "__main__":
    main()
