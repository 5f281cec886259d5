"""The main job: train models on scikit-learn's bundled digits and say what happened.

Run it with ``python -m workbench.demo`` (``--help`` lists the options). Each
section builds its own graph with the public API, trains it with
:meth:`Session.fit` and reports steps, final loss, test accuracy, throughput and
time. A section is a function ``(data, args) -> result dict`` listed in
``SECTIONS`` and selected with ``--sections``. The ``distributed`` and ``scaling``
sections start an embedded Dask cluster (one process per worker) and train the
MLP data-parallel on it, then measure throughput against the worker count.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

import workbench as wb
from workbench.dashboard import forward

NUM_CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """The 8x8 digits, scaled to [0, 1], split into train and test sets (flat rows of 64)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_digits(seed: int = 0, test_fraction: float = 0.25) -> Digits:
    """scikit-learn's bundled digits (no download), split with a stratified, seeded shuffle."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    x = (bunch.data / 16.0).astype("float32")
    y = bunch.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return Digits(x_train, y_train, x_test, y_test)


# -- models ------------------------------------------------------------------------------


def build_mlp(hidden: int = 64, learning_rate: float = 0.01) -> dict:
    """A two-layer perceptron on flat 64-pixel rows, trained with Adam."""
    g = wb.Graph(name="digits-mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w1 = wb.variable("w1", shape=(64, hidden), init="he_uniform")
        b1 = wb.variable("b1", shape=(hidden,), init="zeros")
        w2 = wb.variable("w2", shape=(hidden, NUM_CLASSES), init="glorot_uniform")
        b2 = wb.variable("b2", shape=(NUM_CLASSES,), init="zeros")
        h = wb.relu(wb.matmul(x, w1) + b1)
        logits = wb.matmul(h, w2) + b2
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(learning_rate).minimize(loss)
    return {"graph": g, "logits": logits, "loss": loss, "train": train}


def build_cnn(channels: int = 8, hidden: int = 32, learning_rate: float = 0.01) -> dict:
    """conv 3x3 ("same") -> relu -> 2x2 max pool -> dense -> relu -> dense, on 1x8x8 images."""
    g = wb.Graph(name="digits-cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        images = wb.reshape(x, (-1, 1, 8, 8))  # NCHW
        k = wb.variable("conv/w", shape=(channels, 1, 3, 3), init="he_uniform")
        kb = wb.variable("conv/b", shape=(channels, 1, 1), init="zeros")
        conv = wb.relu(wb.conv2d(images, k, stride=1, padding="same") + kb)
        pooled = wb.max_pool2d(conv, 2)  # (N, channels, 4, 4)
        flat = wb.reshape(pooled, (-1, channels * 16))
        w1 = wb.variable("fc1/w", shape=(channels * 16, hidden), init="he_uniform")
        b1 = wb.variable("fc1/b", shape=(hidden,), init="zeros")
        w2 = wb.variable("fc2/w", shape=(hidden, NUM_CLASSES), init="glorot_uniform")
        b2 = wb.variable("fc2/b", shape=(NUM_CLASSES,), init="zeros")
        h = wb.relu(wb.matmul(flat, w1) + b1)
        logits = wb.matmul(h, w2) + b2
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(learning_rate).minimize(loss)
    return {"graph": g, "logits": logits, "loss": loss, "train": train}


# -- sections ----------------------------------------------------------------------------


def train_and_evaluate(
    name: str, model: dict, data: Digits, args: argparse.Namespace, cluster=False, replicas=None
) -> dict:
    """Fit ``model`` on the training set, then measure loss and accuracy on the test set."""
    sess = wb.Session(model["graph"], seed=args.seed, cluster=cluster)
    started = time.perf_counter()
    history = sess.fit(
        model["train"],
        data={"x": data.x_train, "y": data.y_train},
        batch_size=args.batch_size,
        steps=args.steps,
        fetches={"loss": model["loss"]},
        replicas=replicas,
    )
    train_seconds = time.perf_counter() - started
    logits, test_loss = sess.run([model["logits"], model["loss"]], feed_dict={"x": data.x_test, "y": data.y_test})
    accuracy = float(np.mean(np.argmax(logits, axis=1) == data.y_test))
    losses = history["loss"]
    return {
        "section": name,
        "steps": len(history),
        "batch_size": args.batch_size,
        "final_loss": float(np.mean(losses[-10:])),  # the last steps' mean: one batch is noisy
        "test_loss": float(test_loss),
        "test_accuracy": accuracy,
        "samples_per_s": len(history) * args.batch_size / train_seconds,
        "seconds": time.perf_counter() - started,
        "variables": sess.variables,
    }


def mlp_section(data: Digits, args: argparse.Namespace) -> dict:
    return train_and_evaluate("mlp", build_mlp(), data, args)


def cnn_section(data: Digits, args: argparse.Namespace) -> dict:
    return train_and_evaluate("cnn", build_cnn(), data, args)


def _cluster(args: argparse.Namespace):
    """The embedded cluster the distributed sections share (started on first use)."""
    if getattr(args, "client", None) is None:
        started = time.perf_counter()
        args.client = wb.cluster.connect("local", n_workers=args.workers)
        forward()  # the fits below show on the dashboard's Workbench page
        print(
            f"local Dask cluster: {args.workers} worker processes, 1 thread each, "
            f"started in {time.perf_counter() - started:.1f} s; dashboard {args.client.dashboard_link}",
            flush=True,
        )
    return args.client


def distributed_section(data: Digits, args: argparse.Namespace) -> dict:
    """The MLP trained data-parallel on the cluster; it must end where local training ends."""
    client = _cluster(args)
    result = train_and_evaluate("distributed", build_mlp(), data, args, cluster=client, replicas=args.workers)
    local = train_and_evaluate("local", build_mlp(), data, args, cluster=False)
    result["max_difference"] = max(
        float(np.max(np.abs(result["variables"][k] - v))) for k, v in local["variables"].items()
    )
    result["replicas"] = args.workers
    return result


def scaling_section(data: Digits, args: argparse.Namespace) -> dict:
    """Throughput, speedup and efficiency against the worker count, for a wider MLP."""
    client = _cluster(args)
    model = build_mlp(hidden=1024)
    rng = np.random.default_rng(args.seed)
    rows = rng.integers(0, len(data.x_train), size=2 * args.scaling_batch)  # resampled: enough rows for big batches
    study = wb.scaling_study(
        model["graph"],
        model["train"],
        {"x": data.x_train[rows], "y": data.y_train[rows]},
        batch_size=args.scaling_batch,
        steps=args.scaling_steps,
        workers=range(1, args.workers + 1),
        cluster=client,
        seed=args.seed,
    )
    return {"section": "scaling", "study": study, "rows": study.rows}


SECTIONS: dict[str, Callable[[Digits, argparse.Namespace], dict]] = {
    "mlp": mlp_section,
    "cnn": cnn_section,
    "distributed": distributed_section,
    "scaling": scaling_section,
}


# -- command line ------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workbench.demo",
        description="Train an MLP and a small CNN on scikit-learn's digits with workbench graphs, "
        "then the MLP data-parallel on an embedded Dask cluster, with a scaling study.",
    )
    parser.add_argument("--steps", type=int, default=600, help="training steps per model (default 600)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the split, initial values and batches")
    parser.add_argument("--workers", type=int, default=2, help="workers of the local Dask cluster (default 2)")
    parser.add_argument(
        "--scaling-batch",
        type=int,
        default=65536,
        help="global batch of the scaling study (default 65536: compute-bound)",
    )
    parser.add_argument("--scaling-steps", type=int, default=6, help="measured steps per worker count (default 6)")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, from: {', '.join(SECTIONS)} (default all)",
    )
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive")
    return args


def report(result: dict) -> str:
    if result["section"] == "scaling":
        return f"scaling study (global batch fixed, workers of the local cluster):\n{result['study'].table()}"
    if result["section"] == "distributed":
        extra = (
            f"; {result['replicas']} replicas, largest difference from local training {result['max_difference']:.1e}"
        )
    else:
        extra = ""
    return (
        f"{result['section']:>4}: {result['steps']} steps of {result['batch_size']}, "
        f"final loss {result['final_loss']:.4f}, test loss {result['test_loss']:.4f}, "
        f"test accuracy {result['test_accuracy']:.2%}, "
        f"{result['samples_per_s']:,.0f} samples/s, {result['seconds']:.1f} s{extra}"
    )


def main(argv=None) -> list[dict]:
    """Run the selected sections, print one line per section, and return their results."""
    args = parse_args(argv)
    started = time.perf_counter()
    data = load_digits(seed=args.seed)
    print(
        f"digits: {len(data.x_train)} training and {len(data.x_test)} test images (8x8), seed {args.seed}",
        flush=True,
    )
    results = []
    args.client = None
    try:
        for name in args.sections:
            result = SECTIONS[name](data, args)
            print(report(result), flush=True)
            results.append(result)
    finally:
        if args.client is not None:
            wb.cluster.close(args.client)
    print(f"done in {time.perf_counter() - started:.1f} s")
    return results


if __name__ == "__main__":
    main()
