"""Host time per training step of a tiny model: workbench's own Python, not the math.

An 8 -> 8 -> 8 -> 4 MLP on a batch of 4 spends almost all of a step in the
session (feed checks, the plan cache, events, the kernel loop), so this is
what a refactor of those layers costs or saves. Public API only, so the same
script times older checkouts (``bench/ab.py``)::

    .venv/bin/python bench/step_overhead.py
    .venv/bin/python bench/ab.py --before /tmp/before --after . --rounds 7 -- bench/step_overhead.py

Prints a Markdown table: CPU microseconds of this process per ``Session.run`` of
the training op and per step of ``Session.fit``, medians of ``--rounds`` windows
(CPU time rather than wall time, so a loaded machine moves it less).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import workbench as wb


def tiny_model():
    g = wb.Graph(name="tiny")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 8))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        for i, (n_in, n_out) in enumerate([(8, 8), (8, 8), (8, 4)], start=1):
            h = wb.matmul(h, wb.variable(f"w{i}", shape=(n_in, n_out), init="glorot_uniform"))
            h = h + wb.variable(f"b{i}", shape=(n_out,), init="zeros")
            h = wb.relu(h) if i < 3 else h
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, train, loss


def per_call(fn, seconds: float, batch: int = 50) -> float:
    """Seconds per call of ``fn`` over a window of about ``seconds`` (calls made ``batch`` at a time)."""
    calls, started = 0, time.process_time()  # CPU time: what other processes do costs this one little
    while time.process_time() - started < seconds:
        for _ in range(batch):
            fn()
        calls += batch
    return (time.process_time() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    g, train, loss = tiny_model()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4096, 8)).astype(np.float32)
    Y = rng.integers(0, 4, 4096)
    feed = {"x": X[:4], "y": Y[:4]}
    sess = wb.Session(g, seed=0)
    sess.run(train, feed)
    fit_steps = 400

    def fit():
        sess.fit(train, {"x": X, "y": Y}, batch_size=4, steps=fit_steps, fetches={"loss": loss})

    runs, fits = [], []
    for _ in range(args.rounds):
        runs.append(per_call(lambda: sess.run(train, feed), args.seconds))
        fits.append(per_call(fit, args.seconds, batch=1) / fit_steps)
    print("| measure | us |")
    print("|---|---:|")
    print(f"| Session.run(train) | {statistics.median(runs) * 1e6:.1f} |")
    print(f"| fit step (with a loss fetch) | {statistics.median(fits) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
