"""What recording the timeline costs: step time with tracing on and off, interleaved, medians.

Spans are on by default (every replica records a few clock reads per step; the client lays them
out). This runs the same fit with tracing on and off in alternating order each round, so load from
other processes hits both alike, and prints the median step time of each and their ratio::

    .venv/bin/python bench/timeline_overhead.py --rounds 6 --steps 40

Engines: the all-reduce engine on a local cluster of ``--workers`` worker processes, and the
one-process simulation of as many replicas. A step's time is the loop's (``History["time"]``),
its median over the steps after the first two (which compile and connect). On a shared machine
those medians move with the load; the last columns time what tracing adds on the client directly
(``Lanes.step`` over the marks a fit recorded, best of 5), which the load does not inflate as much.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np

import workbench as wb
from workbench import spans
from workbench.spans import set_tracing


def model(hidden: int):
    g = wb.Graph(name="bench")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 32))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.dense(x, hidden, activation=wb.tanh, name="hidden")
        loss = wb.mean(wb.softmax_cross_entropy(wb.layers.dense(h, 10, name="out"), y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    return g, train, loss


def step_seconds(session, train, loss, data, steps: int, **kwargs) -> float:
    hist = session.fit(train, data, batch_size=96, steps=steps, fetches={"loss": loss}, **kwargs)
    return statistics.median(hist["time"][2:])


def layout_microseconds(fit) -> tuple[float, int]:
    """The client's cost of laying out one step's spans (``Lanes.step``), timed directly on the marks a
    real fit recorded: the best of 5 passes over every step, per step; and the spans per step."""
    captured, original = [], spans.Lanes.step

    def capture(self, step, results):
        captured.append((copy.deepcopy(self), step, copy.deepcopy(results)))
        return original(self, step, results)

    spans.Lanes.step = capture
    try:
        fit()
    finally:
        spans.Lanes.step = original
    best = float("inf")
    for _ in range(5):
        lanes = [copy.deepcopy(c[0]) for c in captured]
        started = time.perf_counter()
        made = sum(len(original(lane, step, results)) for lane, (_, step, results) in zip(lanes, captured, strict=True))
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / len(captured), made // len(captured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(960, 32)).astype("float32"), "y": rng.integers(0, 10, 960)}
    g, train, loss = model(args.hidden)
    client = wb.cluster.connect("local", n_workers=args.workers)
    client.wait_for_workers(args.workers, timeout=120)
    times: dict = {(engine, on): [] for engine in ("allreduce", "simulation") for on in (True, False)}
    try:
        for r in range(args.rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                set_tracing(on)
                client.run(set_tracing, on)  # on the workers too
                cluster = wb.Session(g, seed=0, cluster=client)
                times["allreduce", on].append(
                    step_seconds(cluster, train, loss, data, args.steps, strategy="allreduce")
                )
                local = wb.Session(g, seed=0, cluster=False)
                times["simulation", on].append(
                    step_seconds(local, train, loss, data, args.steps, replicas=args.workers)
                )
        set_tracing(True)
        cost = {
            "allreduce": layout_microseconds(
                lambda: wb.Session(g, seed=0, cluster=client).fit(
                    train, data, batch_size=96, steps=20, strategy="allreduce"
                )
            ),
            "simulation": layout_microseconds(
                lambda: wb.Session(g, seed=0, cluster=False).fit(
                    train, data, batch_size=96, steps=20, replicas=args.workers
                )
            ),
        }
    finally:
        set_tracing(True)
        wb.cluster.close(client)
    print(f"| engine ({args.workers} replicas, {args.rounds} rounds) | tracing on (ms) | tracing off (ms) | on / off "
          "| layout per step (us) | spans per step | layout / step |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for engine in ("allreduce", "simulation"):
        on, off = statistics.median(times[engine, True]), statistics.median(times[engine, False])
        us, made = cost[engine]
        print(
            f"| {engine} | {1000 * on:.2f} | {1000 * off:.2f} | {on / off:.3f} | {us:.1f} | {made} | {us / 1e3 / (1000 * off):.2%} |"
        )


if __name__ == "__main__":
    main()
