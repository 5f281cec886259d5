"""What recording the timeline costs: step time with tracing on and off, interleaved, medians.

Spans are on by default (every replica records a few clock reads per step; the client keeps them
and lays them out into spans when a timeline is read, :meth:`workbench.spans.Lanes.record`). This runs
the same fit with tracing on and off in alternating order each round, so load from other processes
hits both alike, and prints the median step time of each and their ratio::

    .venv/bin/python bench/timeline_overhead.py --rounds 6 --steps 40

Engines: the all-reduce engine on a local cluster of ``--workers`` worker processes, and the
one-process simulation of as many replicas. A step's time is the loop's (``History["time"]``),
its median over the steps after the first two (which compile and connect). On a shared machine
those medians move with the load; the CPU seconds this process spent per step (``time.process_time``:
the simulation's replica threads included, a cluster's workers not) move less. The last columns time
what tracing costs directly, which the load inflates least (best of 3 fits): the replicas' marks and
keeping them on the client (``Lanes.record``), both on the step's path, and laying them out into
spans (what ``History.timeline()`` or a live view pays when it reads them, off the step's path).
For the simulation a last line gives on / off from one fit traced every other step.
"""

from __future__ import annotations

import argparse
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


def step_seconds(session, train, loss, data, steps: int, **kwargs) -> tuple[float, float]:
    """The fit's median step time after the first two steps, and this process's CPU seconds per step over
    the same steps (every thread's: the simulation's replicas run here; a cluster's on its workers)."""
    cpu = []

    def each_step(record):
        if record["step"] in (2, steps):
            cpu.append(time.process_time())

    hist = session.fit(train, data, batch_size=96, steps=steps, fetches={"loss": loss}, callback=each_step, **kwargs)
    return statistics.median(hist["time"][2:]), (cpu[1] - cpu[0]) / (steps - 2)


def tracing_microseconds(fit, tries: int = 3) -> tuple[float, float, float, int]:
    """What tracing costs per step of a real fit, timed directly: the replicas' marks (the same calls
    replayed on the marks the fit recorded, every replica's summed), keeping them on the client
    (``Lanes.record``, timed inside it: the median step) and laying them out (reading every step's spans
    once, as ``History.timeline()`` does): the best of ``tries`` fits of each; and the spans per step."""
    original = spans.Lanes.record
    marks_us, record_us, layout_us, made = float("inf"), float("inf"), float("inf"), 0
    for _ in range(tries):
        kept: list[float] = []
        recorded: list[list[dict]] = []

        def timed(self, step, results, _kept=kept, _recorded=recorded):
            started = time.perf_counter()
            held = original(self, step, results)
            _kept.append(time.perf_counter() - started)
            _recorded.append([r["marks"] for r in results if r.get("marks")])
            return held

        spans.Lanes.record = timed
        try:
            hist = fit()
        finally:
            spans.Lanes.record = original
        steps = [r["spans"] for r in hist.records]
        started = time.perf_counter()
        made = sum(len(s) for s in steps)  # the first read lays every step out
        layout_us = min(layout_us, 1e6 * (time.perf_counter() - started) / len(steps))
        record_us = min(record_us, 1e6 * statistics.median(kept))
        started = time.perf_counter()
        for step in recorded:
            for m in step:
                replayed = spans.Marks(m["offset"])
                for phase in m["phases"]:
                    replayed.phase(*phase)
                for key, at in m["arrivals"].items():
                    replayed.arrived(key, at)
                replayed.backward_began(m["backward"])
                replayed.as_dict()
        marks_us = min(marks_us, 1e6 * (time.perf_counter() - started) / len(recorded))
    return marks_us, record_us, layout_us, made // len(steps)


def flipped_ratio(session, train, loss, data, steps: int, **kwargs) -> float:
    """One fit with tracing on every other step (set between steps, read by each replica as its step
    begins): the median traced step over the median untraced one. Steps side by side share the load,
    the plans and the memory; for the simulation only (a cluster's workers would need a call a step)."""

    def flip(record):
        set_tracing(record["step"] % 2 == 0)  # the next step, an odd one, traced

    set_tracing(True)
    try:
        hist = session.fit(train, data, batch_size=96, steps=steps, fetches={"loss": loss}, callback=flip, **kwargs)
    finally:
        set_tracing(True)
    seconds = hist["time"]
    on = [seconds[k - 1] for k in range(3, steps + 1, 2)]
    off = [seconds[k - 1] for k in range(4, steps + 1, 2)]
    return statistics.median(on) / statistics.median(off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--flipped-steps", type=int, default=600, help="the simulated fit traced every other step")
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
        flipped = flipped_ratio(
            wb.Session(g, seed=0, cluster=False), train, loss, data, args.flipped_steps, replicas=args.workers
        )
        cost = {
            "allreduce": tracing_microseconds(
                lambda: wb.Session(g, seed=0, cluster=client).fit(
                    train, data, batch_size=96, steps=20, strategy="allreduce"
                )
            ),
            "simulation": tracing_microseconds(
                lambda: wb.Session(g, seed=0, cluster=False).fit(
                    train, data, batch_size=96, steps=20, replicas=args.workers
                )
            ),
        }
    finally:
        set_tracing(True)
        wb.cluster.close(client)
    print(
        f"| engine ({args.workers} replicas, {args.rounds} rounds) | tracing on (ms) | tracing off (ms) | on / off"
        " | CPU on / off"
        " | marks + record per step (us) | of a step | layout per step (us) | spans per step | of a step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for engine in ("allreduce", "simulation"):
        on, off = (statistics.median(t for t, _ in times[engine, state]) for state in (True, False))
        cpu_on, cpu_off = (statistics.median(c for _, c in times[engine, state]) for state in (True, False))
        marks, record, layout, made = cost[engine]
        kept = marks + record  # on the step's path whether or not anyone reads the timeline
        print(
            f"| {engine} | {1000 * on:.2f} | {1000 * off:.2f} | {on / off:.3f} | {cpu_on / cpu_off:.3f}"
            f" | {marks:.1f} + {record:.1f}"
            f" | {kept / 1e6 / off:.2%} | {layout:.1f} | {made} | {layout / 1e6 / off:.2%} |"
        )
    print(f"\nsimulation, one fit of {args.flipped_steps} steps traced every other step: on / off {flipped:.3f}")


if __name__ == "__main__":
    main()
