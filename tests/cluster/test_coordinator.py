"""The coordinator as the all-reduce family runs it (no lineage to cut: the window stays full across
syncs), its leave-out instruction, and the shell that carries its instructions out
(:mod:`workbench.cluster.coordinated`, the run loop of the all-reduce and strategy engines), all
without Dask."""

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from workbench.cluster.coordinated import Coordinated
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
