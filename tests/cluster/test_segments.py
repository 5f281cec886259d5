"""Steps in segments: each worker runs a segment of steps in one task, each step's results streamed back
(workbench.cluster.collective.segments): fewer tasks, the same bits, every step recorded as it ends."""

import threading
import time

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.collective.segments import Segments, StepSlot, segment_key
from workbench.cluster.lower import parse_key
from workbench.errors import ClusterError

OWN_CLUSTER = True  # its tests count the tasks its scheduler ran


class FakeFuture:
    """A segment task's future as far as a slot reads it."""

    def __init__(self, key=("mlp-allreduce", "1-to4-r0", "t")):
        self.key, self.status, self.value, self.error, self.callbacks = key, "pending", None, None, []

    def add_done_callback(self, callback):
        self.callbacks.append(callback)

    def finish(self, status, value=None, error=None):
        self.status, self.value, self.error = status, value, error
        for callback in self.callbacks:
            callback(self)

    def result(self, timeout=None):
        if self.status == "error":
            raise self.error
        return self.value

    def exception(self):
        return self.error


def test_a_slot_reads_like_its_members_task_future():
    import pickle

    slot, seen = StepSlot(2, 0), []
    assert slot.status == "pending" and slot.key[0] == "unsubmitted"
    slot.add_done_callback(lambda s: seen.append(("early", s.step)))  # before its segment is submitted
    segment = FakeFuture()
    slot.submitted(segment, final=False)
    slot.add_done_callback(lambda s: seen.append(("late", s.step)))
    assert slot.status == "pending" and slot.key == segment.key
    slot.arrived(pickle.dumps({"step": 2, "loss": 0.5}))
    assert slot.status == "finished" and slot.result(0) == {"step": 2, "loss": 0.5}
    assert sorted(seen) == [("early", 2), ("late", 2)]
    # the segment's last step: its result is the task's
    last = StepSlot(4, 0)
    last.submitted(segment, final=True)
    assert last.status == "pending"
    segment.finish("finished", {"step": 4, "variables": {"w": 1.0}})
    last.segment_ended()
    assert last.status == "finished" and last.result(0)["variables"] == {"w": 1.0}


def test_a_failed_segment_fails_the_steps_that_had_not_come():
    segment, error = FakeFuture(), ClusterError("step 3 failed here")
    done, waiting = StepSlot(2, 1), StepSlot(3, 1)
    for slot in (done, waiting):
        slot.submitted(segment, final=False)
    done.arrived(b"\x80\x04N.")  # pickled None
    called = []
    waiting.add_done_callback(lambda s: called.append(s.step))
    segment.finish("error", error=error)
    for slot in (done, waiting):  # what Segments registers on each task
        slot.segment_ended()
    assert done.status == "finished" and waiting.status == "error" and called == [3]
    assert waiting.exception() is error
    with pytest.raises(ClusterError, match="step 3 failed here"):
        waiting.result(0.01)
    cancelled = StepSlot(5, 1)
    cancelled.submitted(FakeFuture(), final=False)
    cancelled.segment.status = "cancelled"
    assert cancelled.status == "cancelled"


def test_segments_end_at_syncs_at_the_last_step_and_when_full():
    submitted = []

    class Client:
        status = "closed"

        def subscribe_topic(self, topic, handler):
            self.topic, self.handler = topic, handler

        def submit(self, function, task, topic, rank, steps, key, **kwargs):
            submitted.append((key, [args[0] for args, _ in steps]))
            return FakeFuture(key)

    client = Client()
    segments = Segments(client, "mlp", "tok.0", ["tcp://a:1", "tcp://b:1"], steps=3)
    calls = lambda step: [(None, (step,), {}), (None, (step,), {})]  # noqa: E731
    slots = {step: segments.add(step, sync=step == 5, calls=calls(step), last=step == 7) for step in range(1, 8)}
    assert [k for k, _ in submitted] == [
        ("mlp-allreduce", "1-to3-r0", "tok.0"),
        ("mlp-allreduce", "1-to3-r1", "tok.0"),
        ("mlp-allreduce", "4-to5-r0", "tok.0"),  # ends at the sync step
        ("mlp-allreduce", "4-to5-r1", "tok.0"),
        ("mlp-allreduce", "6-to7-r0", "tok.0"),  # the run's last step
        ("mlp-allreduce", "6-to7-r1", "tok.0"),
    ]
    assert [steps for _, steps in submitted[::2]] == [[1, 2, 3], [4, 5], [6, 7]]
    assert [slots[s][0].final for s in range(1, 8)] == [False, False, True, False, True, False, True]
    client.handler((0.0, [1, 2, b"\x80\x04K\x07."]))  # rank 1's result of step 2, as published
    assert slots[2][1].result(0) == 7 and slots[2][0].status == "pending"
    assert client.topic == "workbench-steps-tok.0"
    assert parse_key(segment_key("mlp", 6, 7, 1, "tok.0")).step == 6  # the dashboard reads the first step


def fit(kit, client, steps=32, **options):
    m = kit.mlp(dropout=0.2)
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    history = sess.fit(m["train"], kit.blobs(), batch_size=24, steps=steps, replicas=2, fetches={"loss": m["loss"]},
                       **options)  # fmt: skip
    return sess.variables, history


class StepTasks:
    """The all-reduce step tasks a scheduler ran (a plugin on the LocalCluster's in-process scheduler)."""

    def __init__(self, scheduler):
        from distributed.diagnostics.plugin import SchedulerPlugin

        keys = self.keys = set()

        class Seen(SchedulerPlugin):
            name = "test-step-tasks"

            def transition(self, key, start, finish, *args, **kwargs):
                name = parse_key(key)
                if name is not None and name.phase == "allreduce" and finish == "memory":
                    keys.add(key)

        self.plugin = Seen()
        scheduler.add_plugin(self.plugin)
        self.scheduler = scheduler

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.scheduler.remove_plugin(self.plugin.name)


@pytest.mark.slow
def test_segments_run_a_task_per_worker_and_segment_and_train_to_the_bits_of_a_task_per_step(kit, client):
    scheduler = client.cluster.scheduler
    with StepTasks(scheduler) as one:
        per_step, per_step_history = fit(kit, client, sync_every=16, segment_steps=1)
    with StepTasks(scheduler) as segments:
        segmented, history = fit(kit, client, sync_every=16, segment_steps=8)
    assert len(one.keys) == 32 * 2  # a task per worker and step
    assert len(segments.keys) == 4 * 2  # steps 1-8, 9-16 (a sync), 17-24, 25-32
    for name, value in per_step.items():
        assert segmented[name].tobytes() == value.tobytes(), name  # dropout included
    assert [r["step"] for r in history.records] == list(range(1, 33))
    assert [r["loss"] for r in history.records] == [r["loss"] for r in per_step_history.records]
    record = history.records[5]
    assert record["replicas"] == 2 and len(record["workers"]) == 2 and record["bytes_received"] > 0
    assert history.timeline().steps == list(range(1, 33))  # the timeline: every step, as before
    # what the workers published was let go from the scheduler's event log
    assert not [t for t, events in scheduler._broker.get_events().items() if t.startswith("workbench-steps-")]


@pytest.mark.slow
def test_each_step_of_a_segment_is_recorded_as_it_ends(kit, client):
    arrived = []
    late = wb.stragglers.Fixed(replica=1, delay=0.1)  # each step takes at least 0.1 s
    started = time.monotonic()
    _, history = fit(kit, client, steps=12, sync_every=12, segment_steps=16, stragglers=late,
                     callback=lambda record: arrived.append(time.monotonic() - started))  # fmt: skip
    assert [r["step"] for r in history.records] == list(range(1, 13))
    # one segment of 12 steps: the records came one by one while it ran, not all at its end
    assert arrived[-1] - arrived[0] >= 0.6, arrived
    assert all(b >= a for a, b in zip(arrived, arrived[1:]))


@pytest.mark.slow
def test_a_stop_request_reaches_a_running_segment_between_steps(kit, client):
    m = kit.mlp()
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    late = wb.stragglers.Fixed(replica=0, delay=0.05)
    stop = threading.Event()

    def callback(record):
        if record["step"] == 3:
            stop.set()
            raise KeyboardInterrupt  # what the kernel's interrupt does in the fit's loop

    with pytest.raises(KeyboardInterrupt):
        sess.fit(m["train"], kit.blobs(), batch_size=24, steps=400, replicas=2, sync_every=400, segment_steps=200,
                 stragglers=late, callback=callback)  # fmt: skip
    assert stop.is_set()
    # the workers left the segment between steps: nothing of the run is held or running there
    deadline = time.monotonic() + 10
    while True:
        held = client.run(
            lambda: __import__("workbench.cluster.collective.replica").cluster.collective.replica.held_runs()
        )
        busy = client.processing()
        if not any(held.values()) and not any(busy.values()):
            break
        assert time.monotonic() < deadline, (held, busy)
        time.sleep(0.1)
    assert np.isfinite(sess.variables["w0"]).all()


def test_segment_steps_must_be_a_whole_number(kit):
    with pytest.raises(ClusterError, match=r"segment_steps must be at least 1 \(a whole number\), got 0"):
        wb.cluster.ClusterOptions(segment_steps=0)
