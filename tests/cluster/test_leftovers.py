"""A cluster fit that ends early leaves nothing behind: an interrupt (the notebook's, SIGINT) while it
places its data ends it with ``FitInterrupted``, a failed step ends it with its error, and either way the
scheduler and the workers keep nothing of it but the session's data (the copies of its NumPy arrays
that the all-reduce fits keep on the workers for the session's next fit), and those go when the
session closes."""

import os
import signal
import time

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.collective.replica import held_runs
from workbench.events import FitInterrupted

OWN_CLUSTER = True  # its tests kill, stop or close workers, or count what the cluster holds


def leftovers(client) -> dict:
    """What the cluster still holds: keys on the scheduler, data and replicas on each worker."""
    tasks = client.run_on_scheduler(lambda dask_scheduler: sorted(map(str, dask_scheduler.tasks)))
    data = {w: n for w, n in client.run(lambda dask_worker: len(dask_worker.data)).items() if n}
    runs = {w: r for w, r in client.run(held_runs).items() if r}
    return {k: v for k, v in {"tasks": tasks, "data": data, "replicas": runs}.items() if v}


def wait_until_clean(client, seconds: float = 30.0, feeds: int = 0) -> dict:
    """What the cluster holds once it settled; with ``feeds``, the session's data (at most ``feeds``
    arrays on each worker, and no other key) are not counted."""
    deadline = time.monotonic() + seconds
    while (left := beyond_data(leftovers(client), feeds)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def beyond_data(left: dict, feeds: int) -> dict:
    """``left`` without a session's data: arrays scattered (the keys ``ndarray-...``), at most ``feeds`` a worker."""
    arrays = [k for k in left.get("tasks", []) if k.startswith("ndarray-")]
    held = left.get("data", {})
    if not feeds or sum(held.values()) != len(arrays) or any(n > feeds for n in held.values()):
        return left
    rest = {"tasks": [k for k in left.get("tasks", []) if k not in arrays], "replicas": left.get("replicas")}
    return {k: v for k, v in rest.items() if v}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "strategy, nth",
    [("allreduce", 1), ("parameter_server", 1), ("parameter_server", 3)],  # its program, its state, x, y
)
def test_an_interrupt_during_the_scatter_ends_the_fit_and_leaves_nothing_on_the_workers(
    client, kit, monkeypatch, strategy, nth
):
    assert wait_until_clean(client) == {}
    m = kit.mlp(name="scattered")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    events = []
    sess.events.subscribe(events.append)
    scatter, scattering = client.scatter, []

    def interrupted_scatter(*args, **kwargs):  # one SIGINT, from the client's event loop as the nth scatter starts
        scattering.append(True)
        if len(scattering) == nth:
            client.loop.add_callback(os.kill, os.getpid(), signal.SIGINT)
        return scatter(*args, **kwargs)

    monkeypatch.setattr(client, "scatter", interrupted_scatter)
    with pytest.raises(KeyboardInterrupt):
        sess.fit(m["train"], kit.blobs(n=256), batch_size=32, steps=50, strategy=strategy)
    monkeypatch.undo()
    assert len(scattering) >= nth
    ended = [e for e in events if isinstance(e, FitInterrupted)]
    assert len(ended) == 1 and ended[0].reason == "interrupted" and ended[0].step == 0, events
    assert sess.last_history.records == []
    assert wait_until_clean(client, feeds=2) == {}
    history = sess.fit(m["train"], kit.blobs(n=256), batch_size=32, steps=3, strategy=strategy)  # and it trains on
    assert [r["step"] for r in history.records] == [1, 2, 3]
    assert wait_until_clean(client, feeds=2) == {}
    sess.close()
    assert wait_until_clean(client) == {}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_failed_parameter_server_fit_leaves_no_erred_task_on_the_scheduler(client, kit):
    assert wait_until_clean(client) == {}
    m = kit.mlp(name="failing")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    data = kit.blobs(n=256)
    data["x"][100:] = np.nan
    with pytest.raises(wb.errors.NumericsError, match="matmul.*NaN") as failed:
        sess.fit(m["train"], data, batch_size=32, steps=20, strategy="parameter_server", check_numerics=True)
    # the error is still held (a notebook keeps the last one), and still nothing stays
    assert failed.value is not None and wait_until_clean(client) == {}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_an_interrupt_while_results_come_home_leaves_the_client_whole(client, kit, monkeypatch, strategy):
    from distributed import Future

    m = kit.mlp(name="fetched")
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    result, fetches = Future.result, []

    def interrupted_result(self, *args, **kwargs):  # one SIGINT as the fifth result is fetched
        fetches.append(True)
        if len(fetches) == 5:
            client.loop.add_callback(os.kill, os.getpid(), signal.SIGINT)
        return result(self, *args, **kwargs)

    monkeypatch.setattr(Future, "result", interrupted_result)
    with pytest.raises(KeyboardInterrupt):
        sess.fit(m["train"], kit.blobs(n=256), batch_size=32, steps=1_000, strategy=strategy)
    monkeypatch.undo()
    assert 5 <= len(fetches) and len(sess.last_history.records) < 1_000  # ended early (at its last host copy)
    # a gather cut short would have broken the client's next fetches (UnboundLocalError from distributed's sync)
    history = sess.fit(m["train"], kit.blobs(n=256), batch_size=32, steps=3, strategy=strategy)
    assert [r["step"] for r in history.records] == [1, 2, 3]
    assert wait_until_clean(client, feeds=2) == {}
    sess.close()
    assert wait_until_clean(client) == {}
