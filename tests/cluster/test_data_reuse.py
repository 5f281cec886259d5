"""A session's NumPy data stay on its workers between fits: sent once while unchanged (by content, not
identity), sent again where they changed or a worker left, and released when the session closes."""

import os
import signal
import time

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.resident import content_digest

OWN_CLUSTER = True  # its tests kill a worker and count what the workers hold

STEPS = 6


def test_the_digest_is_of_the_content_not_the_object():
    a = np.arange(12, dtype="float64").reshape(3, 4)
    assert content_digest(a) == content_digest(a.copy())
    assert content_digest(a[:, ::2]) == content_digest(np.ascontiguousarray(a[:, ::2]))
    assert content_digest(a) != content_digest(a.reshape(4, 3))  # same bytes, another shape
    assert content_digest(a) != content_digest(a.view("int64"))  # same bytes, another dtype
    before = content_digest(a)
    a[2, 3] += 1.0
    assert content_digest(a) != before
    assert content_digest(np.array([None, 1], dtype=object)) is None  # pointers: not a content


def record_scatters(client, monkeypatch) -> list:
    """Each ``client.scatter`` of the fits from now on: ``(bytes of the NumPy arrays sent, workers)``."""
    scatter, calls = client.scatter, []

    def counted(data, *args, **kwargs):
        values = data.values() if isinstance(data, dict) else data if isinstance(data, (list, tuple)) else [data]
        sent = sum(v.nbytes for v in values if isinstance(v, np.ndarray))
        calls.append((sent, kwargs.get("workers")))
        return scatter(data, *args, **kwargs)

    monkeypatch.setattr(client, "scatter", counted)
    return calls


def held_data(client, expected: int | None = None, seconds: float = 20.0) -> dict:
    """Each worker's keys in memory (once each holds ``expected`` of them, or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        held = client.run(lambda dask_worker: sorted(map(str, dask_worker.data)))
        if expected is None or all(len(k) == expected for k in held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def data_bytes(data: dict) -> int:
    return sum(v.nbytes for v in data.values())


def two_fits(client, kit, first: dict, second: dict, monkeypatch=None):
    """A session's fit of 1 step on ``first``, then, from the same start, one of ``STEPS`` on ``second``:
    ``(session, the second fit's history, the bytes of NumPy data each fit sent)``."""
    m = kit.mlp(name="reused")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    start = sess.variables
    calls = record_scatters(client, monkeypatch) if monkeypatch is not None else []
    sess.fit(m["train"], first, batch_size=32, steps=1)
    sent_first = sum(s for s, _ in calls)
    sess.set_variables(start)
    history = sess.fit(m["train"], second, batch_size=32, steps=STEPS, fetches={"loss": m["loss"]}, sync_every=2)
    return sess, history, (sent_first, sum(s for s, _ in calls) - sent_first)


def assert_same_bits(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_second_fit_sends_no_data_and_trains_to_the_same_bits(client, kit, monkeypatch):
    data, other = kit.blobs(n=512), kit.blobs(n=512, seed=1)
    reused, history, (first, second) = two_fits(client, kit, data, data, monkeypatch)
    assert first == 2 * data_bytes(data)  # each of the 2 workers got its copy
    assert second == 0
    held = held_data(client, expected=2)  # x and y, on each worker: nothing else stays
    assert all(len(keys) == 2 for keys in held.values()), held
    monkeypatch.undo()
    # the same fit where the data of the second fit are new to the session: sent, and the same bits
    fresh, fresh_history, (_, sent) = two_fits(client, kit, other, data, monkeypatch)
    assert sent == 2 * data_bytes(data)
    assert_same_bits(reused.variables, fresh.variables)
    assert history["loss"].tobytes() == fresh_history["loss"].tobytes()
    reused.close()
    fresh.close()
    assert held_data(client, expected=0) == {w: [] for w in held}  # closed: the workers keep nothing


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_array_changed_in_place_is_sent_again_and_trains(client, kit, monkeypatch):
    data = kit.blobs(n=512)
    m = kit.mlp(name="reused")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    start = sess.variables
    calls = record_scatters(client, monkeypatch)
    sess.fit(m["train"], data, batch_size=32, steps=1)
    before = held_data(client, expected=2)
    data["x"][::2] *= -1.0  # the same array object, other values
    del calls[:]
    sess.set_variables(start)
    history = sess.fit(m["train"], data, batch_size=32, steps=STEPS, fetches={"loss": m["loss"]}, sync_every=2)
    assert sum(s for s, _ in calls) == 2 * data["x"].nbytes  # y did not change: not sent again
    after = held_data(client, expected=2)  # the old x replaced, not kept beside the new one
    for worker, keys in after.items():
        assert len(keys) == 2 and len(set(keys) & set(before[worker])) == 1, (before, after)
    monkeypatch.undo()
    fresh, fresh_history, _ = two_fits(client, kit, kit.blobs(n=512, seed=1), {k: v.copy() for k, v in data.items()})
    assert_same_bits(sess.variables, fresh.variables)
    assert history["loss"].tobytes() == fresh_history["loss"].tobytes()
    sess.close()
    fresh.close()


def worker_pids(client) -> dict:
    return client.run(os.getpid)


def wait_for_replacement(client, gone: str, seconds: float = 60.0) -> list:
    """The workers once the nanny replaced ``gone`` (2 of them, ``gone`` not among them)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        workers = sorted(client.scheduler_info()["workers"])
        if len(workers) == 2 and gone not in workers:
            return workers
        time.sleep(0.2)
    raise AssertionError(f"{gone} was not replaced within {seconds:g} s")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_killed_worker_gets_its_copy_again_and_a_restart_in_the_fit_still_trains(client, kit, monkeypatch):
    data = kit.blobs(n=512)
    m = kit.mlp(name="reused")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    local = wb.Session(m["graph"], seed=0, cluster=False)
    sess.fit(m["train"], data, batch_size=32, steps=1)
    local.fit(m["train"], data, batch_size=32, steps=1)
    pids = worker_pids(client)
    victim = sorted(pids)[-1]
    os.kill(pids[victim], signal.SIGKILL)
    workers = wait_for_replacement(client, victim)
    calls = record_scatters(client, monkeypatch)
    sess.fit(m["train"], data, batch_size=32, steps=2)
    local.fit(m["train"], data, batch_size=32, steps=2)
    assert sum(s for s, _ in calls) == data_bytes(data)  # to the new worker only
    assert [w for s, w in calls if s] == [[w] for w in workers if w not in pids]

    # a worker dies during a fit: the fit restarts from its last sync, on what is left, and trains on
    pids = worker_pids(client)
    victim = sorted(pids)[0]

    def kill(record):
        if record["step"] == 6:
            os.kill(pids[victim], signal.SIGKILL)

    history = sess.fit(m["train"], data, batch_size=32, steps=30, sync_every=5, callback=kill)
    local.fit(m["train"], data, batch_size=32, steps=30, sync_every=5)
    assert [r["step"] for r in history.records] == list(range(1, 31))
    assert history.records[-1]["restarts"] >= 1
    kit.assert_same_variables(local.variables, sess.variables, rtol=1e-9)
    wait_for_replacement(client, victim)
    sess.close()
