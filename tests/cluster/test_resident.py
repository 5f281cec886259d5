"""ResidentData without a cluster: what it sends, keeps, sends again and releases (a client double that
answers ``who_has`` from a table, and a scatter that records what it sent where)."""

import itertools
from types import SimpleNamespace

import numpy as np

from workbench.cluster.resident import ResidentData

_keys = itertools.count()


class Held:
    """A future double: its key, its status, whether it was released."""

    def __init__(self, worker):
        self.key, self.worker, self.status, self.released = f"ndarray-{next(_keys)}", worker, "finished", False

    def release(self):
        self.released = True


class Cluster:
    """The scheduler's ``who_has`` from what was scattered (``lose(worker)`` forgets a worker's keys)."""

    def __init__(self):
        self.where, self.sent = {}, []
        self.client = SimpleNamespace(scheduler=SimpleNamespace(who_has=self.who_has), sync=lambda f, **kw: f(**kw))

    def who_has(self, keys, callback_timeout=None):
        return {k: [self.where[k]] if k in self.where else [] for k in keys}

    def scatter(self, values, workers):
        (worker,) = workers
        made = [Held(worker) for _ in values]
        for held, value in zip(made, values):
            self.where[held.key] = worker
            self.sent.append((worker, value.sum().item()))
        return made

    def lose(self, worker):
        self.where = {k: w for k, w in self.where.items() if w != worker}


def place(resident, cluster, arrays, members=("a", "b")):
    return resident.place(cluster.client, arrays, list(members), cluster.scatter)


def test_sends_each_array_once_per_worker_and_again_only_what_changed():
    cluster, resident = Cluster(), ResidentData()
    x, y = np.arange(6.0), np.ones(3)
    first = place(resident, cluster, [x, y, x.copy()])  # the same content twice: one copy
    assert cluster.sent == [("a", 15.0), ("a", 3.0), ("b", 15.0), ("b", 3.0)]
    assert [f.worker for f in first[0]] == ["a"] * 3 and first[0][0] is first[0][2]
    cluster.sent.clear()
    assert place(resident, cluster, [x, y, x]) == first and cluster.sent == []
    x[0] = 10.0  # in place
    again = place(resident, cluster, [x, y, x])
    assert cluster.sent == [("a", 25.0), ("b", 25.0)]
    assert first[0][0].released and not first[0][1].released  # replaced, not kept beside the new one
    assert again[1][1] is first[1][1] and resident.sent == 6 and len(resident.held) == 4


def test_a_worker_that_left_gets_its_copies_again_and_one_not_used_is_released():
    cluster, resident = Cluster(), ResidentData()
    x = np.arange(4.0)
    first = place(resident, cluster, [x])
    cluster.lose("b")
    cluster.sent.clear()
    second = place(resident, cluster, [x], members=("a", "c"))
    assert cluster.sent == [("c", 6.0)] and second[0] == first[0]
    assert first[1][0].released and sorted(w for _, w in resident.held) == ["a", "c"]


def test_another_client_or_release_lets_every_copy_go():
    cluster, resident = Cluster(), ResidentData()
    x = np.arange(4.0)
    first = place(resident, cluster, [x])
    other = Cluster()
    place(resident, other, [x])
    assert all(f.released for fs in first for f in fs) and len(other.sent) == 2
    resident.release()
    assert resident.held == {} and resident.client is None
