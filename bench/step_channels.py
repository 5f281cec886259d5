"""What it costs a step's small result to reach the client, by channel, on a 2-worker LocalCluster.

The all-reduce engine's members run their steps in segments (one long task per member) and stream
each step's result (a pickled dict of 1-2 KB) to the client on the scheduler's event topic; before,
each step was a task per member, submitted by the client and its result fetched. This measures the
channel alone: the workers compute nothing but the result dict, so what is left is what the client
(which hosts the scheduler of a ``LocalCluster``), the scheduler and the workers spend to move it::

    PYTHONPATH=. .venv/bin/python bench/step_channels.py [--steps 500 --task-steps 100 --rounds 3]

Modes, each for ``--steps`` steps of 2 results (one per worker), interleaved in rounds (the order
rotated each round), medians over the rounds:

- ``tasks``: 2 tiny tasks per step (pinned to their worker, ``pure=False``), ``--window`` steps in
  flight, results gathered in step order (the engine's task per step). It runs ``--task-steps`` steps
  (fewer: it is the slow one, and its per-step cost is steady once the window is full).
- ``log_event``: one long task per worker, each step's result sent with
  ``get_worker().log_event(topic, [rank, step, pickle.dumps(result)])``; the client hears it with
  ``Client.subscribe_topic`` (the handler, on the client's loop, sets a ``threading.Event`` per
  (step, rank)) and waits for each step's 2 results in order (the engine's segments).
- ``queue``: the same through a ``distributed.Queue``: the workers ``put``, the client takes one item
  a ``get``.
- ``queue_batch``: the same queue, the client taking 2 items a ``get`` (``get(batch=2)``): one round
  trip to the scheduler per step instead of one per result.

``distributed.Pub``/``Sub`` would be a fifth; the distributed this runs on has none (checked at start).

Prints a Markdown table: wall microseconds per step, and CPU microseconds per step of the client
process (client and scheduler threads: ``time.process_time``) and of the two worker processes
together (``psutil`` on their pids), as measured and net of what the same processes spend idle
(heartbeats, monitors, the workers' profilers: an idle second each round, scaled by the mode's wall
time), since a slow channel also pays its wall time's idle CPU.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import pickle
import statistics
import threading
import time
import uuid

import distributed
import psutil
from distributed import Client, LocalCluster, Queue, get_worker


def step_result(rank: int, step: int) -> dict:
    """A step's result shaped like a member's: step, rank, loss, timings and a row of statistics."""
    return {
        "step": step,
        "rank": rank,
        "loss": 0.5 + 1e-3 * step,
        "timings": {"compute": 0.01, "allreduce": 0.002, "wait": 0.0005},
        "stats": [0.001 * (k + step) for k in range(150)],
    }


def result_task(rank: int, step: int) -> dict:
    return step_result(rank, step)


def emit_events(topic: str, rank: int, steps: int) -> int:
    worker = get_worker()
    for step in range(steps):
        worker.log_event(topic, [rank, step, pickle.dumps(step_result(rank, step), protocol=5)])
    return steps


def emit_queue(name: str, rank: int, steps: int) -> int:
    queue = Queue(name)
    for step in range(steps):
        queue.put([rank, step, pickle.dumps(step_result(rank, step), protocol=5)])
    return steps


def run_tasks(client, workers, steps: int, window: int) -> None:
    in_flight = collections.deque()
    for step in range(steps):
        if len(in_flight) >= window:
            for future in in_flight.popleft():
                future.result()
        in_flight.append(
            [
                client.submit(result_task, rank, step, workers=[w], allow_other_workers=False, pure=False)
                for rank, w in enumerate(workers)
            ]
        )
    while in_flight:
        for future in in_flight.popleft():
            future.result()


def _forget_topic(topic: str, dask_scheduler=None) -> None:
    broker = dask_scheduler._broker
    broker.truncate(topic)
    broker._topics.pop(topic, None)


def run_log_event(client, workers, steps: int, window: int) -> None:
    topic = f"bench-steps-{uuid.uuid4().hex[:8]}"
    arrived = {(step, rank): threading.Event() for step in range(steps) for rank in range(len(workers))}
    payloads = {}

    def heard(event):  # on the client's event loop
        rank, step, payload = event[1]
        payloads[step, rank] = payload
        arrived[step, rank].set()

    client.subscribe_topic(topic, heard)
    tasks = [
        client.submit(emit_events, topic, rank, steps, workers=[w], allow_other_workers=False, pure=False)
        for rank, w in enumerate(workers)
    ]
    for step in range(steps):
        for rank in range(len(workers)):
            arrived[step, rank].wait(60)
            pickle.loads(payloads.pop((step, rank)))
    client.gather(tasks)
    client.unsubscribe_topic(topic)
    client.run_on_scheduler(_forget_topic, topic)


def run_queue(client, workers, steps: int, window: int, batch: bool = False) -> None:
    name = f"bench-steps-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, client=client)
    tasks = [
        client.submit(emit_queue, name, rank, steps, workers=[w], allow_other_workers=False, pure=False)
        for rank, w in enumerate(workers)
    ]
    payloads = {}
    for step in range(steps):
        for rank in range(len(workers)):
            while (step, rank) not in payloads:
                # len(workers) x steps items in all, taken len(workers) at a time: never waits past the last
                items = queue.get(batch=len(workers)) if batch else [queue.get(timeout=60)]
                for r, s, payload in items:
                    payloads[s, r] = payload
            pickle.loads(payloads.pop((step, rank)))
    client.gather(tasks)
    queue.close()


MODES = {
    "tasks": run_tasks,
    "log_event": run_log_event,
    "queue": run_queue,
    "queue_batch": lambda *a: run_queue(*a, batch=True),
}


def worker_cpu(processes) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def measure(run, processes, steps: int) -> tuple[float, float, float]:
    """Seconds per step of ``run()`` making ``steps`` steps: wall, client process CPU, workers' CPU."""
    wall, cpu, wcpu = time.perf_counter(), time.process_time(), worker_cpu(processes)
    run()
    wall, cpu, wcpu = time.perf_counter() - wall, time.process_time() - cpu, worker_cpu(processes) - wcpu
    return wall / steps, cpu / steps, wcpu / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--task-steps", type=int, default=100, help="steps of the tasks mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=8, help="steps in flight in the tasks mode")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = args.modes.split(",")
    pubsub = hasattr(distributed, "Pub")
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    client = Client(cluster)
    try:
        pids = client.run(os.getpid)
        workers = sorted(pids)
        processes = [psutil.Process(pids[w]) for w in workers]
        for mode in modes:  # warm up: worker clients, the queue extension, pickled functions
            MODES[mode](client, workers, 20, args.window)
        samples, idle = {mode: [] for mode in modes}, []
        for r in range(args.rounds):
            idle.append(measure(lambda: time.sleep(1.0), processes, 1))  # CPU seconds per wall second
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                steps = args.task_steps if mode == "tasks" else args.steps
                run = functools.partial(MODES[mode], client, workers, steps, args.window)
                samples[mode].append(measure(run, processes, steps))
    finally:
        client.close()
        cluster.close()
    size = len(pickle.dumps(step_result(0, 0), protocol=5))
    _, idle_cpu, idle_wcpu = (statistics.median(s[k] for s in idle) for k in range(3))
    print(
        f"distributed {distributed.__version__}, 2 workers, {args.steps} steps ({args.task_steps} for tasks) "
        f"of 2 results ({size} B pickled each), medians of {args.rounds} rounds; idle CPU per wall second: "
        f"client {idle_cpu:.3f}, workers {idle_wcpu:.3f}; distributed.Pub/Sub: "
        f"{'present, not measured' if pubsub else 'absent in this version'}\n"
    )
    print(
        "| channel | wall us/step | client CPU us/step | workers' CPU us/step | client CPU net of idle | workers' CPU net of idle |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        wall, cpu, wcpu = (statistics.median(s[k] for s in samples[mode]) for k in range(3))
        net, wnet = cpu - idle_cpu * wall, wcpu - idle_wcpu * wall
        cells = " | ".join(f"{v * 1e6:.0f}" for v in (wall, cpu, wcpu, net, wnet))
        print(f"| {mode} | {cells} |")


if __name__ == "__main__":
    main()
