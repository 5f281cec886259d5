"""The synchronous-SGD coordinator, driven by hand: no cluster, no Dask."""

import pytest

import workbench as wb
from workbench.cluster.sync import Coordinator, Finish, Record, Restart, Submit, Sync


def kinds(instructions, kind):
    return [i for i in instructions if isinstance(i, kind)]


def submitted(instructions):
    return [i.step for i in kinds(instructions, Submit)]


class Driver:
    """A stand-in for the shell: finishes the oldest step in flight, syncs at once, logs everything."""

    def __init__(self, coordinator):
        self.c = coordinator
        self.pending: list[int] = []
        self.log: list = []
        self.finished = False
        self.take(coordinator.start())

    def take(self, instructions):
        for i in instructions:
            self.log.append(i)
            if isinstance(i, Submit):
                self.pending.append(i.step)
            elif isinstance(i, Restart):
                self.pending.clear()
            elif isinstance(i, Sync):
                self.take(self.c.synced(i.step))
            elif isinstance(i, Finish):
                self.finished = True

    def finish_one(self):
        step = self.pending.pop(0)
        assert len(self.pending) < self.c.window
        self.take(self.c.step_done(step, {"loss": step}))
        return step

    def fail_oldest(self, error=None):
        self.take(self.c.failed(self.pending[0], error or RuntimeError("worker lost")))

    def run(self, limit=1000):
        while not self.finished and limit:
            self.finish_one()
            limit -= 1
        return self

    @property
    def records(self):
        return [i.step for i in kinds(self.log, Record)]

    @property
    def syncs(self):
        return [i.step for i in kinds(self.log, Sync)]


# -- the window ----------------------------------------------------------------------------


def test_start_fills_the_window():
    c = Coordinator(0, 10, window=3)
    assert submitted(c.start()) == [1, 2, 3]
    assert list(c.in_flight) == [1, 2, 3]


def test_window_larger_than_the_run():
    c = Coordinator(0, 2, window=8)
    assert submitted(c.start()) == [1, 2]


def test_each_finished_step_submits_one_more():
    c = Coordinator(0, 10, window=2, sync_every=100)
    c.start()
    out = c.step_done(1, "m1")
    assert out == [Record(1, "m1"), Submit(3)]
    assert list(c.in_flight) == [2, 3]


def test_window_never_exceeded_and_every_step_submitted_once():
    d = Driver(Coordinator(0, 17, window=4, sync_every=5)).run()
    assert submitted(d.log) == list(range(1, 18))
    assert d.finished


@pytest.mark.parametrize("window, sync_every", [(0, 1), (1, 0), (-1, 3)])
def test_window_and_sync_every_must_be_positive(window, sync_every):
    with pytest.raises(ValueError, match="must be positive"):
        Coordinator(0, 5, window=window, sync_every=sync_every)


# -- order, syncs and the end ----------------------------------------------------------------


def test_steps_finish_in_order():
    c = Coordinator(0, 5, window=3)
    c.start()
    with pytest.raises(ValueError, match="step 2 finished, but step 1 was expected"):
        c.step_done(2, None)
    c.step_done(1, None)
    with pytest.raises(ValueError, match="step 1 finished, but step 2 was expected"):
        c.step_done(1, None)


def test_every_step_recorded_once_in_order():
    d = Driver(Coordinator(0, 12, window=3, sync_every=4)).run()
    assert d.records == list(range(1, 13))
    assert [i.metrics for i in kinds(d.log, Record)] == [{"loss": s} for s in range(1, 13)]


def test_sync_every_k_steps_and_at_the_end():
    d = Driver(Coordinator(0, 23, window=4, sync_every=5)).run()
    assert d.syncs == [5, 10, 15, 20, 23]


def test_no_extra_sync_when_the_end_is_a_multiple():
    d = Driver(Coordinator(0, 20, window=4, sync_every=5)).run()
    assert d.syncs == [5, 10, 15, 20]


def test_record_comes_before_the_sync_of_its_step():
    c = Coordinator(0, 4, window=1, sync_every=2)
    c.start()
    c.step_done(1, None)
    out = c.step_done(2, "m")
    assert out[:2] == [Record(2, "m"), Sync(2)]


def test_finish_only_after_the_last_step_is_synced():
    c = Coordinator(0, 3, window=3, sync_every=10)
    c.start()
    c.step_done(1, None)
    c.step_done(2, None)
    out = c.step_done(3, None)
    assert kinds(out, Sync) == [Sync(3)] and not kinds(out, Finish)
    assert c.synced(3) == [Finish()]
    assert c.host_step == 3


def test_intermediate_sync_does_not_finish():
    c = Coordinator(0, 6, window=2, sync_every=2)
    c.start()
    c.step_done(1, None)
    c.step_done(2, None)
    assert c.synced(2) == [Submit(3), Submit(4)]
    assert c.host_step == 2


def test_nothing_past_a_sync_point_is_submitted_before_the_sync():
    c = Coordinator(0, 20, window=4, sync_every=3)
    assert submitted(c.start()) == [1, 2, 3]
    assert submitted(c.step_done(1, None)) == []
    c.step_done(2, None)
    assert c.step_done(3, None) == [Record(3, None), Sync(3)]
    assert submitted(c.synced(3)) == [4, 5, 6]


def test_nothing_to_do_finishes_at_once():
    assert Coordinator(7, 7).start() == [Finish()]


# -- failures ------------------------------------------------------------------------------


def test_failure_restarts_from_the_last_sync_with_a_new_attempt():
    d = Driver(Coordinator(0, 20, window=3, sync_every=4))
    for _ in range(6):  # steps 1..6 done, synced at 4; 7 and 8 in flight (8 is the next sync point)
        d.finish_one()
    assert d.c.host_step == 4 and d.pending == [7, 8]
    out = d.c.failed(7, RuntimeError("worker lost"))
    assert out[0] == Restart(4, 1)
    assert submitted(out) == [5, 6, 7]  # the window refilled from the synced step
    assert d.c.done == 4 and list(d.c.in_flight) == [5, 6, 7]


def test_each_restart_gets_a_new_attempt_number():
    d = Driver(Coordinator(0, 20, window=2, sync_every=3, max_restarts=5))
    d.finish_one()
    d.fail_oldest()
    d.fail_oldest()
    d.finish_one()
    d.fail_oldest()
    assert [i.attempt for i in kinds(d.log, Restart)] == [1, 2, 3]
    assert all(i.step == 0 for i in kinds(d.log, Restart))
    assert d.c.restarts == 3


def test_redone_steps_are_reported_once():
    d = Driver(Coordinator(0, 12, window=3, sync_every=4))
    for _ in range(7):
        d.finish_one()
    d.fail_oldest()  # back to step 4: 5, 6, 7 are done again
    d.run()
    assert d.records == list(range(1, 13))
    assert submitted(d.log).count(6) == 2
    assert d.finished and d.c.host_step == 12


def test_redone_steps_are_synced_again():
    d = Driver(Coordinator(0, 10, window=2, sync_every=3))
    for _ in range(4):
        d.finish_one()
    d.fail_oldest()
    d.run()
    assert d.syncs == [3, 6, 9, 10]  # 3 once (before the failure), never redone


def test_failure_before_any_sync_restarts_from_the_start_step():
    d = Driver(Coordinator(0, 10, window=2, sync_every=5))
    d.finish_one()
    d.finish_one()
    d.fail_oldest()
    assert kinds(d.log, Restart) == [Restart(0, 1)]
    assert d.pending == [1, 2]
    d.run()
    assert d.records == list(range(1, 11))


def test_failure_while_syncing_the_last_step():
    c = Coordinator(0, 4, window=4, sync_every=2)
    d = Driver(c)
    d.finish_one()
    d.finish_one()  # synced at 2
    c.step_done(3, None)
    c.step_done(4, None)  # Sync(4) handed out, but bringing it home fails
    out = c.failed(4, OSError("connection lost"))
    assert out == [Restart(2, 1), Submit(3), Submit(4)]
    assert c.step_done(3, None) == []  # no second Record
    assert c.step_done(4, None) == [Sync(4)]
    assert c.synced(4) == [Finish()]


def test_too_many_failures_give_a_cluster_error():
    c = Coordinator(0, 10, window=2, max_restarts=2)
    c.start()
    c.failed(1, RuntimeError("one"))
    c.failed(1, RuntimeError("two"))
    with pytest.raises(wb.ClusterError, match=r"failed 3 times; last at step 1: KeyError: .*three") as info:
        c.failed(1, KeyError("three"))
    assert isinstance(info.value.__cause__, KeyError)


def test_no_restarts_allowed():
    c = Coordinator(0, 10, max_restarts=0)
    c.start()
    with pytest.raises(wb.ClusterError, match="failed 1 times"):
        c.failed(1, RuntimeError("x"))


# -- resuming --------------------------------------------------------------------------------


def test_resuming_from_a_checkpoint_step():
    d = Driver(Coordinator(20, 27, window=3, sync_every=5))
    assert submitted(d.log)[:3] == [21, 22, 23]
    d.run()
    assert d.records == list(range(21, 28))
    assert d.syncs == [25, 27]


def test_resumed_run_restarts_from_its_start_step():
    d = Driver(Coordinator(20, 30, window=2, sync_every=10))
    d.finish_one()
    d.fail_oldest()
    assert kinds(d.log, Restart) == [Restart(20, 1)]
    d.run()
    assert d.records == list(range(21, 31))
