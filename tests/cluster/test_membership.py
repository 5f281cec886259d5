"""The workers of a cluster fit (:class:`~workbench.cluster.membership.Membership`), against a stand-in
for the scheduler: no cluster."""

from types import SimpleNamespace

import pytest

from workbench.cluster.health import StepDeadline
from workbench.cluster.membership import Membership
from workbench.errors import ClusterError


class Scheduler:
    """What the membership asks a Dask client: the scheduler's workers and how long each was silent."""

    status = "running"

    def __init__(self, workers, silence=None):
        self.workers, self.silence = list(workers), dict(silence or {})
        self.scheduler = SimpleNamespace(address="tcp://scheduler:8786", identity=None)

    def sync(self, _fn, **_kwargs):
        return {"workers": {w: {} for w in self.workers}}

    def run_on_scheduler(self, _fn, addresses, callback_timeout):
        return {a: self.silence.get(a, 0.5) for a in addresses if a in self.workers}


def test_the_workers_are_those_asked_for_that_the_scheduler_lists_less_those_left_out():
    client = Scheduler(["a", "b", "c"])
    assert Membership(client).workers() == ["a", "b", "c"]
    m = Membership(client, asked=["c", "a", "gone"])
    assert m.workers() == ["c", "a"]  # in the order asked; a dead one is not listed
    assert m.workers(listed=False) == ["c", "a", "gone"]  # where the scheduler may place around it
    m.leave_out(["c"], {"c": 40.0})
    assert m.workers() == ["a"] and m.left_out == {"c": 40.0}


def test_silent_members_are_found_then_left_out_for_the_rest_of_the_fit():
    client = Scheduler(["a", "b"], silence={"b": 25.0})
    m = Membership(client, deadline=StepDeadline(20.0))
    assert m.silent(["a", "b"], waited=20.0) == {"b": 25.0}  # silent for more than half the wait
    assert m.left_out == {}
    assert m.leave_out_silent(["a", "b"], waited=20.0) == {"b": 25.0}
    assert m.silent(["a", "b"], waited=20.0) == {}  # asked once: already left out
    assert m.choose(None) == ["a"]


def test_choose_takes_the_first_count_and_says_why_when_none_is_left():
    client = Scheduler(["a", "b", "c"])
    m = Membership(client)
    assert m.choose(2) == ["a", "b"]
    m.leave_out(["a", "b", "c"])
    with pytest.raises(ClusterError, match="no worker is left: a, b, c stopped answering"):
        m.choose(None)
    with pytest.raises(ClusterError, match=r"no workers left to train on \(asked for \['x'\]\)"):
        Membership(client, asked=["x"]).choose(None)


def test_placement_is_anywhere_until_a_worker_is_left_out():
    client = Scheduler(["a", "b"])
    m = Membership(client)
    assert m.placement() is None
    assert Membership(client, asked=["b"]).placement() == ("b",)
    m.leave_out(["b"])
    assert m.placement() == ("a",)
    m.leave_out(["a"])
    with pytest.raises(ClusterError, match="no worker is left"):
        m.placement()


def test_departed_members_are_those_the_scheduler_no_longer_lists():
    client = Scheduler(["a", "b"])
    m = Membership(client)
    assert m.departed(["a", "b"]) == set()
    client.workers.remove("b")
    assert m.departed(["a", "b"]) == {"b"}
    assert m.wait_for_departures(["a", "b"], seconds=1.0) is True
    assert m.wait_for_departures(["a"], seconds=0.2) is False
