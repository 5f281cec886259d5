"""The coordinator as the all-reduce family runs it (no lineage to cut: the window stays full across
syncs), its leave-out instruction, and the shell that carries its instructions out
(:mod:`workbench.cluster.coordinated`, the run loop of the all-reduce and strategy engines); steps in
arrival order, and the asynchronous engine on that shell (:mod:`workbench.cluster.parameter_server.asynchronous`),
all without Dask."""

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from workbench.cluster.coordinated import Coordinated
from workbench.cluster.health import StepDeadline
from workbench.cluster.parameter_server.asynchronous import AsyncEngine
from workbench.cluster.program import apply_update, replica_gradients
from workbench.cluster.sync import Coordinator, LeaveOut, Record, Restart, Submit, Sync
from workbench.errors import ClusterError, CollectiveError
from workbench.fitloop import StepOutcome


def test_the_window_stays_full_across_syncs_and_submits_say_which_steps_sync():
    c = Coordinator(0, 6, window=3, sync_every=2, hold_at_sync=False)
    first = c.start()
    assert first == [Submit(1), Submit(2), Submit(3)]
    assert [s.sync for s in first] == [False, True, False]
    out = c.step_done(1, "m1")
    assert out == [Record(1, "m1"), Submit(4)]
    out = c.step_done(2, "m2")
    assert out == [Record(2, "m2"), Sync(2)]  # the shell brings the copy home from the results, then:
    assert c.synced(2) == [Submit(5)]
    assert c.host_step == 2


def test_without_sync_every_only_the_loops_steps_and_the_last_sync():
    c = Coordinator(0, 5, window=5, sync_every=None, sync_at=lambda s: s == 3, hold_at_sync=False)
    assert [s.sync for s in c.start()] == [False, False, True, False, True]


def test_a_failure_with_silent_members_leaves_them_out_then_restarts_from_the_host_copy():
    c = Coordinator(0, 6, window=2, sync_every=2, hold_at_sync=False)
    c.start()
    c.step_done(1, None)
    c.step_done(2, None)
    c.synced(2)
    out = c.failed(3, CollectiveError("peer gone"), {"tcp://b": 12.0})
    assert out == [LeaveOut(("tcp://b",)), Restart(2, 1), Submit(3), Submit(4)]
    assert c.failed(3, TimeoutError("again")) == [Restart(2, 2), Submit(3), Submit(4)]


def test_past_max_restarts_the_coordinator_gives_up_with_the_error_as_cause():
    c = Coordinator(0, 4, window=2, max_restarts=1, hold_at_sync=False)
    c.start()
    c.failed(1, OSError("one"))
    with pytest.raises(ClusterError, match="training failed 2 times; last at step 1: OSError: two"):
        c.failed(1, OSError("two"))


class _Membership:
    def __init__(self):
        self.left_out = {}

    def silent(self, addresses, waited):
        return {"w1": 30.0} if self.hang else {}

    def leave_out(self, workers, silent=None):
        self.left_out.update({w: (silent or {}).get(w, 0.0) for w in workers})

    def wait_for_departures(self, addresses, seconds):
        return False

    def choose(self, count):
        members = [w for w in ("w0", "w1") if w not in self.left_out]
        if not members:
            raise ClusterError("no workers left")
        return members


class _Group:
    addresses = ("w0", "w1")


class _Deadline:
    seconds = 10.0

    def restarted(self):
        pass


class _Engine(Coordinated):
    """The engine methods the shell calls, in memory: each step's result is its variables' value."""

    def __init__(self, lose=(), hang=False):
        self.host, self.window, self.sync_every, self.max_restarts = ({"v": 0.0}, 0), 2, 3, 5
        self.restarts, self.events, self.timeout, self.max_replicas = 0, None, 10.0, None
        self.membership, self.deadline, self.group = _Membership(), _Deadline(), _Group()
        self.membership.hang = hang
        self._transient = (CollectiveError, OSError, TimeoutError)
        self.flight, self.lose, self.submitted, self.launched = deque(), list(lose), [], []
        self.fail_launches = 0  # relaunches that fail (a second member gone meanwhile)
        self.client = SimpleNamespace(status="running")

    def _submit(self, step, sync):
        self.submitted.append(step)
        self.flight.append((step, sync))

    def _gather(self, step, sync):
        if self.lose and self.lose[0] == step:
            self.lose.pop(0)
            raise CollectiveError(f"step {step} lost")
        result = {"value": float(step)}
        if sync:
            result["variables"] = {"v": float(step)}
        return [result, result]

    def _cancel(self):
        self.flight.clear()

    def _drop(self):
        self._cancel()

    def _choose_members(self):
        return self.membership.choose(self.max_replicas)

    def _launch(self, members):
        if self.fail_launches:
            self.fail_launches -= 1
            raise CollectiveError("a member left as the run started")
        self.launched.append((members, self.host[1]))

    def _outcome(self, step, results):
        return StepOutcome(step, {"value": results[0]["value"]}, {"restarts": self.restarts})


def _run(engine, last=7, sync_at=lambda s: False):
    outcomes = list(engine.run(1, last, sync_at))
    return [o.step for o in outcomes], outcomes


def test_the_shell_reports_each_step_once_in_order_and_brings_sync_points_home():
    engine = _Engine()
    steps, _ = _run(engine, sync_at=lambda s: s == 5)
    assert steps == list(range(1, 8))
    assert engine.host == ({"v": 7.0}, 7)
    assert engine.submitted == list(range(1, 8)) and engine.launched == []


def test_the_shell_redoes_lost_steps_from_the_last_sync_without_reporting_them_twice():
    engine = _Engine(lose=[5])
    steps, outcomes = _run(engine)
    assert steps == list(range(1, 8))
    assert engine.launched == [(["w0", "w1"], 3)]  # a new generation from the host copy of step 3
    assert engine.submitted.count(4) == 2 and engine.submitted.count(5) == 2  # redone, reported once
    assert engine.restarts == 1 and outcomes[-1].metrics["restarts"] == 1


def test_the_shell_leaves_out_members_that_went_silent_and_goes_on_without_them():
    engine = _Engine(lose=[2], hang=True)
    steps, _ = _run(engine, last=4)
    assert steps == [1, 2, 3, 4]
    assert engine.membership.left_out == {"w1": 30.0}
    assert engine.launched == [(["w0"], 0)]


def test_a_step_the_loop_checkpoints_is_yielded_once_its_variables_are_home():
    engine = _Engine()
    seen = []
    for outcome in engine.run(1, 4, lambda s: s == 2):
        seen.append((outcome.step, engine.host[1]))
    assert seen[1] == (2, 2)
    assert np.asarray([s for s, _ in seen]).tolist() == [1, 2, 3, 4]


def test_when_no_member_is_left_the_fit_says_so():
    engine = _Engine(lose=[1, 1], hang=True)
    engine.membership.left_out = {"w0": 20.0}
    with pytest.raises(ClusterError, match="no workers left"):
        _run(engine, last=2)


def test_a_relaunch_that_fails_is_one_more_restart_from_the_same_copy():
    engine = _Engine(lose=[5])
    engine.fail_launches = 1
    steps, outcomes = _run(engine)
    assert steps == list(range(1, 8))
    assert engine.launched == [(["w0", "w1"], 3)]
    assert engine.restarts == 2 and outcomes[-1].metrics["restarts"] == 2


class _LateEngine(_Engine):
    """Records made whole later, as the backup engine's: a step's record waits for one more result, which
    comes two steps after it was decided (at once when the run is over)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gathered, self.completed = [], []

    def _gather(self, step, sync):
        self.gathered.append(step)
        return super()._gather(step, sync)

    def _outcome(self, step, results):
        return ("late", step, results)

    def _complete(self, outcomes, final):
        for k, entry in enumerate(outcomes):
            if isinstance(entry, tuple):
                if not final and self.gathered[-1] < entry[1] + 2:
                    return  # in order
                self.completed.append((entry[1], self.gathered[-1], final))
                outcomes[k] = super()._outcome(entry[1], entry[2])


def test_records_made_whole_later_are_yielded_in_order_once_whole():
    engine = _LateEngine()
    steps, outcomes = _run(engine, last=7, sync_at=lambda s: s == 5)
    assert steps == list(range(1, 8)) and [o.fetches["value"] for o in outcomes] == [float(s) for s in steps]
    assert engine.completed[:4] == [(1, 3, False), (2, 4, False), (3, 5, False), (4, 6, False)]
    assert all(final for _, _, final in engine.completed[-2:])  # the last ones once the run is over
    assert engine.host == ({"v": 7.0}, 7)


@pytest.mark.parametrize("status", ["connecting", "closed"])
def test_a_client_that_stopped_running_ends_the_run_without_a_restart(status):
    engine = _Engine(lose=[5])
    engine.client.status = status  # its scheduler lost, or closed under the fit: nothing to restart on
    with pytest.raises(CollectiveError, match="step 5 lost"):
        list(engine.run(1, 10, lambda s: False))
    assert engine.restarts == 0 and engine.launched == []


# -- steps in arrival order (asynchronous SGD) ---------------------------------------------------


def test_in_arrival_order_each_applied_step_submits_one_more_gradient_across_syncs():
    c = Coordinator(0, 5, window=2, sync_every=2, hold_at_sync=False)  # window: one gradient per replica
    assert c.start() == [Submit(1), Submit(2)]
    assert c.step_done(c.in_flight[0], "first to arrive") == [Record(1, "first to arrive"), Submit(3)]
    assert c.step_done(c.in_flight[0], None) == [Record(2, None), Sync(2)]
    assert c.synced(2) == [Submit(4)]


def test_forgotten_records_are_made_again_when_their_steps_are_redone_each_once():
    c = Coordinator(0, 8, window=2, sync_every=4, hold_at_sync=False)
    c.start()
    for step in range(1, 5):
        c.step_done(step, None)
    c.synced(4)
    c.step_done(5, "lost")
    c.step_done(6, "lost")  # their records waited for more, and a failure took them
    c.forget_records(5)
    c.failed(7, OSError("worker lost"))
    redone = [c.step_done(s, "again") for s in (5, 6, 7)]
    assert [[i for i in out if isinstance(i, Record)] for out in redone] == [
        [],
        [Record(6, "again")],
        [Record(7, "again")],
    ]
    with pytest.raises(ValueError, match=r"the records up to step 4 \(the host copy\) cannot be redone; got 3"):
        c.forget_records(3)


class _Future:
    """A finished (or failed, or never finishing) task of the in-memory client."""

    def __init__(self, key, value=None, error=None, status="finished"):
        self.key, self.value, self.error = key, value, error
        self.status = "error" if error is not None else status

    def add_done_callback(self, callback):
        if self.status != "pending":
            callback(self)

    def exception(self):
        return self.error

    def result(self, timeout=None):
        if self.status != "finished":
            raise TimeoutError(f"{self.key} did not finish")
        return self.value


class _Client:
    """Runs the asynchronous engine's tasks at once, in memory: a gradient is 1 and says which step's
    variables it read; ``lose``: the numbers of the gradients (counted over the whole run) that fail as a
    dead worker's would; ``hold``: the (attempt, step) whose metrics never come."""

    status = "running"

    def __init__(self, lose=(), hold=()):
        self.lose, self.hold, self.reads, self.launches, self.cancelled = set(lose), set(hold), 0, [], []

    def scatter(self, value, workers=None, **_):
        if isinstance(value, SimpleNamespace):  # the program, to every member
            self.members = tuple(workers)
        elif isinstance(value, list):  # the host copy's state, to the server
            self.launches.append((self.members, value[0]["step"]))
            return [_Future(("state", len(self.launches)), value[0])]
        return _Future(("scattered", len(self.launches)), value)

    def submit(self, fn, *args, key, replica=None, **_):
        first, state, *rest = [a.value if isinstance(a, _Future) else a for a in args]
        if fn is replica_gradients:  # (program, state, rows, ...)
            self.reads += 1
            if self.reads in self.lose:
                return _Future(key, error=OSError(f"gradient {self.reads} lost with its worker"))
            return _Future(key, {"g": 1.0, "read": state["step"], "replica": replica})
        if fn is apply_update:  # (program, state, gradient)
            return _Future(key, {"variables": {"v": state["variables"]["v"] + rest[0]["g"]}, "step": state["step"] + 1})
        gradient = first  # step_metrics(gradient, state)
        if (len(self.launches), state["step"]) in self.hold:
            return _Future(key, status="pending")
        return _Future(key, {"compute": {"w": 0.0}, "update_seconds": 0.0, "fetches": [gradient["read"]]})

    def cancel(self, futures):
        self.cancelled.extend(f.key for f in futures)


class _AsyncMembership(_Membership):
    def choose(self, count):
        return super().choose(count)[:count]

    def departed(self, addresses, seconds=None):
        return set()


class _Async(AsyncEngine):
    """The asynchronous engine on the in-memory client: each gradient arrives as it is read, so the
    replicas take turns (staleness R - 1 once they all run)."""

    def __init__(self, replicas=2, lose=(), hold=(), hang=False):
        self.client = _Client(lose, hold)
        self.request = SimpleNamespace(batch_seed=0, device=SimpleNamespace(host_arrays=True))
        self.events, self.name, self.batch_size, self.replicas, self.window = None, "m", 4, replicas, replicas
        self.sync_every, self.deadline, self.timeout = 4, StepDeadline(5.0), 5.0
        self.membership = _AsyncMembership()
        self.membership.hang = hang
        self.program = SimpleNamespace(state_variables=["v"], feeds=["x"])
        self.data, self.num_examples, self.labels, self.stragglers = {"x": np.zeros(8)}, 8, ["read"], None
        self.restarts, self.max_restarts, self._transient = 0, 5, (OSError, TimeoutError, CollectiveError)
        self.host = self.group = self.state = self.program_ref = None
        self.sources, self.reading, self.free, self.unassigned = [], {}, deque(), 0


def _async_run(engine, last=9):
    engine.start({"v": 0.0}, 0)
    records = [(o.step, o.metrics["replica"], o.metrics["staleness"], o.fetches["read"], o.metrics["restarts"])
               for o in engine.run(1, last, lambda s: False)]  # fmt: skip
    for step, _, staleness, read, _ in records:
        assert read == step - 1 - staleness  # the staleness is what the gradient read
    return records


def test_async_steps_are_the_applied_gradients_in_arrival_order_with_their_staleness():
    engine = _Async(replicas=2)
    records = _async_run(engine)
    assert [r[0] for r in records] == list(range(1, 10))
    assert [r[1] for r in records] == [0, 1] * 4 + [0]  # whichever replica's gradient came first
    assert [r[2] for r in records] == [0] + [1] * 8  # R - 1 once both replicas run
    assert (float(engine.host[0]["v"]), engine.host[1]) == (9.0, 9)  # nine gradients of 1 applied
    assert engine.client.launches == [(("w0", "w1"), 0)]


def test_a_lost_gradient_restarts_async_from_the_host_copy_reporting_each_step_once():
    engine = _Async(replicas=2, lose={6})  # the gradient that would be step 6, read after the sync at 4
    records = _async_run(engine)
    assert [r[0] for r in records] == list(range(1, 10))
    assert engine.client.launches == [(("w0", "w1"), 0), (("w0", "w1"), 4)]
    assert {key[:2] for key in engine.client.cancelled} == {("m-grad", "3-r1"), ("m-grad", "4-r0")}  # in flight
    assert [r[4] for r in records] == [0] * 5 + [1] * 4  # step 5 was reported before the failure
    assert (float(engine.host[0]["v"]), engine.host[1]) == (9.0, 9) and engine.restarts == 1


def test_records_still_waiting_for_their_metrics_at_a_failure_come_from_the_redone_steps():
    engine = _Async(replicas=2, lose={6}, hold={(1, 5)})  # step 5's metrics never come in the first attempt
    records = _async_run(engine)
    assert [r[0] for r in records] == list(range(1, 10))
    assert [r[4] for r in records] == [0] * 4 + [1] * 5  # step 5 reported once, from the redone attempt


def test_a_silent_member_is_left_out_and_async_goes_on_with_the_replicas_left():
    engine = _Async(replicas=2, lose={6}, hang=True)
    records = _async_run(engine)
    assert [r[0] for r in records] == list(range(1, 10))
    assert engine.membership.left_out == {"w1": 30.0}
    assert engine.client.launches[-1] == (("w0",), 4)
    assert [(r[1], r[2]) for r in records[5:]] == [(0, 0)] * 4  # redone on one replica: no staleness
