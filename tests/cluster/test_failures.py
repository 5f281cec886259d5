"""The one translation of cluster failures (no cluster needed: stand-in clients)."""

from types import SimpleNamespace

import pytest
from distributed import KilledWorker
from distributed.comm.core import CommClosedError

from workbench.cluster import failures
from workbench.cluster.health import FIRST_STEP_SECONDS, FLOOR_SECONDS, StepDeadline
from workbench.cluster.options import ClusterOptions
from workbench.errors import ClusterError, FeedError


class Client:
    def __init__(self, status="running", memory_limit=2**30):
        self.status, self.memory_limit = status, memory_limit
        self.scheduler = type("Comm", (), {"address": "tcp://10.0.0.1:8786"})()

    def scheduler_info(self):
        return {"workers": {"tcp://10.0.0.2:1": {"memory_limit": self.memory_limit}}}


@pytest.mark.parametrize(
    ("error", "client", "data_bytes", "says"),
    [
        (OSError("Timed out trying to connect"), Client("connecting"), 0, "lost the Dask scheduler at tcp://10.0.0.1:8786 after step 7"),
        (AttributeError("'NoneType' object has no attribute 'scatter'"), Client("closed"), 0, "client was closed while the fit ran"),
        (CommClosedError("in <TCP>"), Client(), 2**30, r"training data \(1,024 MiB\) does not fit .* limit is 1,024 MiB.*dask array"),
        (KilledWorker("task", SimpleNamespace(address="tcp://10.0.0.2:1"), 3), Client(), 0, "workers running a task of the fit died after step 7"),
        (TimeoutError("no progress"), Client(), 0, "no progress after step 7 within its step_timeout"),
        (ValueError("odd"), Client(), 0, "the fit failed on the cluster after step 7: ValueError: odd"),
    ],
)  # fmt: skip
def test_every_failure_becomes_a_cluster_error_with_advice_and_its_cause(error, client, data_bytes, says):
    translated = failures.cluster_error(error, client, step=7, data_bytes=data_bytes)
    assert isinstance(translated, ClusterError) and translated.__cause__ is error
    with pytest.raises(ClusterError, match=says):
        raise translated


def test_workbench_errors_pass_as_they_are_and_guarded_engines_translate():
    error = FeedError("data lacks the placeholders ['x']")
    assert failures.cluster_error(error, Client()) is error

    class Broken:
        strategy, replicas, workers, restarts = "broken", 1, 1, 0

        def start(self, variables, step):
            raise OSError("Timed out")

        def run(self, first, last, sync_at):
            yield from ()

    engine = failures.guard(Broken(), Client("connecting"), {})
    assert engine.strategy == "broken"
    with pytest.raises(ClusterError, match="lost the Dask scheduler") as raised:
        engine.start({}, 0)
    assert isinstance(raised.value.__cause__, OSError)


def test_an_engines_step_failure_under_a_closed_client_says_the_client_was_closed():
    cause = RuntimeError("IOLoop is closed")
    step_failed = ClusterError("step 11 failed on the cluster: RuntimeError: IOLoop is closed")
    step_failed.__cause__ = cause
    translated = failures.cluster_error(step_failed, Client("closed"), step=11, address="inproc://scheduler")
    assert translated.__cause__ is cause
    with pytest.raises(ClusterError, match="client was closed while the fit ran after step 11.*create a new Session"):
        raise translated
    assert failures.cluster_error(step_failed, Client(), step=11) is step_failed  # a running client: as it is
    named = ClusterError("no worker is left")  # an engine's own verdict, with no outside cause, stays
    assert failures.cluster_error(named, Client("closed"), step=11, address="inproc://scheduler") is named


class Held:
    def __init__(self):
        self.released = 0

    def release(self):
        self.released += 1


class Cancelling(Client):
    def __init__(self, status, loop_closed=False):
        super().__init__(status)
        self.cancelled, self.loop_closed = [], loop_closed

    def cancel(self, futures):
        if self.status != "running":
            raise AssertionError("Client.cancel waits on the loop a close() stops: it must not be called")
        if self.loop_closed:
            raise RuntimeError("IOLoop is closed")
        self.cancelled.extend(futures)


@pytest.mark.parametrize("status", ["closing", "closed"])
def test_drop_never_waits_on_a_client_being_closed(status):
    client, held = Cancelling(status), [Held(), Held()]
    failures.drop(client, [*held, None])
    assert [h.released for h in held] == [1, 1] and client.cancelled == []


def test_drop_cancels_on_a_running_client_and_releases_when_its_loop_closed_meanwhile():
    client, held = Cancelling("running"), [Held(), Held()]
    failures.drop(client, held)
    assert client.cancelled == held and [h.released for h in held] == [0, 0]
    client = Cancelling("running", loop_closed=True)
    failures.drop(client, held)
    assert [h.released for h in held] == [1, 1]


def test_the_default_step_timeout_follows_the_measured_step_time():
    deadline = StepDeadline()
    assert deadline.seconds == FIRST_STEP_SECONDS  # the first step compiles
    deadline.progressed(30.0)
    deadline.progressed(0.002)
    assert deadline.seconds == FLOOR_SECONDS  # steps of milliseconds: 10 s, never minutes
    deadline.progressed(4.0)
    assert deadline.seconds == 40.0
    deadline.restarted()
    assert deadline.seconds == FIRST_STEP_SECONDS
    assert StepDeadline(3.0).seconds == 3.0
    with pytest.raises(ClusterError, match="step_timeout must be a positive"):
        ClusterOptions(step_timeout=0)
