"""The training loop and the step-engine seam, without a cluster: a stub engine stands in for one."""

import os
import signal
import time

import numpy as np
import pytest

import workbench as wb
from workbench import checkpoint
from workbench.events import FitFailed, FitFinished, FitInterrupted, FitStarted, Step
from workbench.fitloop import FitLoop, FitRequest, LocalSteps, StepEngine, StepOutcome


def linear():
    g = wb.Graph(name="lin")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        w = wb.variable("w", shape=(2,), init="zeros")
        loss = wb.mean((wb.sum(x * w, axis=1) - 1.0) ** 2, name="loss")
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, train, loss


class CountingEngine:
    """A stand-in cluster engine: ``w`` gains 1 a step; host copies only where asked."""

    strategy, replicas, workers, restarts = "counting", 2, 2, 0

    def __init__(self):
        self.calls, self.synced = [], []

    def start(self, variables, step):
        self.calls.append(("start", step))
        self.w, self.host = np.array(variables["w"]), (dict(variables), step)

    def run(self, first, last, sync_at):
        for step in range(first, last + 1):
            self.w = self.w + 1.0
            if sync_at(step):
                self.host = ({"w": self.w.copy()}, step)
                self.synced.append(step)
            yield StepOutcome(
                step, {"time": float(step), "workers": -1.0}, {"workers": {"tcp://a": 0.5}, "replicas": 2}
            )

    def variables(self):
        return self.host if self.host[1] else ({"w": self.w.copy()}, 0)

    def close(self):
        self.calls.append(("close",))


def request(g, train, steps=6):
    return FitRequest(g, train.name, {"x": np.ones((8, 2), "float32")}, 4, steps, {"time": "loss", "workers": "loss"},
                      (0, 1), 0, wb.Session(g).device)  # fmt: skip


def test_the_loop_records_emits_and_checkpoints_at_its_cadence(tmp_path):
    g, train, loss = linear()
    sess = wb.Session(g)
    events = []
    sess.events.subscribe(events.append)
    engine = CountingEngine()
    assert isinstance(engine, StepEngine) and isinstance(LocalSteps(sess, request(g, train)), StepEngine)
    loop = FitLoop(request(g, train), sess.events, checkpoint_dir=tmp_path, checkpoint_every=4)
    history, final = loop.run(engine, sess.variables)
    assert engine.synced == [4, 6] and engine.calls == [("start", 0), ("close",)]
    assert [r["step"] for r in history.records] == [1, 2, 3, 4, 5, 6]
    assert history.records[2]["workers"] == {"tcp://a": 0.5}  # a record flattens fetches, then the engine's metrics
    steps = [e for e in events if isinstance(e, Step)]
    assert steps[2].fetches == {"time": 3.0, "workers": -1.0}  # a fetch may be called anything
    assert steps[2].metrics["workers"] == {"tcp://a": 0.5} and steps[2].session == sess.token
    started, finished = events[0], events[-1]
    assert isinstance(started, FitStarted) and started.strategy == "counting" and started.replicas == 2
    assert isinstance(finished, FitFinished) and finished.graph == g.token
    variables, step = checkpoint.latest(tmp_path)
    assert step == 6 and variables["w"].tolist() == [6.0, 6.0] and final["w"].tolist() == [6.0, 6.0]
    again = CountingEngine()  # a new fit resumes from the checkpoint of step 6: nothing left to do
    loop = FitLoop(request(g, train, steps=8), sess.events, checkpoint_dir=tmp_path, checkpoint_every=4)
    history, final = loop.run(again, sess.variables)
    assert again.calls[0] == ("start", 6) and [r["step"] for r in history.records] == [7, 8]
    assert final["w"].tolist() == [8.0, 8.0]


class AheadEngine(CountingEngine):
    """Brings step 4's variables home (with its outcome) before step 3 is yielded, as a cluster engine
    whose results came together: an interrupt in between leaves step 4's outcome unreported."""

    def run(self, first, last, sync_at):
        outcome = lambda step: StepOutcome(step, {"time": float(step), "workers": -1.0}, {"replicas": 2})  # noqa: E731
        self.unyielded = []
        for step in range(first, last + 1):
            if step == 3:
                self.host = ({"w": self.w + 2.0}, 4)
                self.unyielded = [outcome(4)]
            if step != 4:
                self.w = self.w + 1.0
                yield outcome(step)
            else:
                self.w, self.unyielded = self.w + 1.0, []
                yield outcome(4)

    def unreported(self, step, upto):
        return [o for o in self.unyielded if step < o.step <= upto]


def test_an_interrupt_after_a_sync_came_home_records_the_steps_it_brought():
    g, train, loss = linear()
    sess = wb.Session(g)
    events = []
    sess.events.subscribe(events.append)
    engine = AheadEngine()

    def interrupt(record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    loop = FitLoop(request(g, train, steps=8), sess.events, callback=interrupt)
    with pytest.raises(KeyboardInterrupt):
        loop.run(engine, sess.variables)
    # the variables are step 4's (home with step 3's results): the history and the event say step 4 too
    assert [r["step"] for r in loop.history.records] == [1, 2, 3, 4]
    assert loop.final["w"].tolist() == [4.0, 4.0] and loop.stopped_at == 4
    assert isinstance(events[-1], FitInterrupted) and events[-1].step == 4


def test_a_loop_refuses_an_engine_that_does_not_bring_a_checkpoint_step_home(tmp_path):
    g, train, loss = linear()

    class Forgetful(CountingEngine):
        def variables(self):
            return {"w": self.w}, 0

    loop = FitLoop(request(g, train), wb.Session(g).events, checkpoint_dir=tmp_path, checkpoint_every=2)
    with pytest.raises(RuntimeError, match="holds step 0's variables, not step 2's"):
        loop.run(Forgetful(), wb.Session(g).variables)


def test_local_fit_accepts_only_the_local_strategy():
    g, train, loss = linear()
    sess = wb.Session(g, cluster=False)
    data = {"x": np.ones((8, 2), "float32")}
    hist = sess.fit(train, data, batch_size=4, steps=2, fetches={"loss": loss}, strategy="local")
    assert len(hist) == 2
    with pytest.raises(wb.ClusterError, match="strategy='parameter_server' needs a cluster"):
        sess.fit(train, data, batch_size=4, steps=2, strategy="parameter_server")


def mlp_and_data():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(4, 3))
        loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w), y), name="loss")
        train = wb.optimizers.Adam(0.05).minimize(loss)
    rng = np.random.default_rng(0)
    return g, train, loss, {"x": rng.normal(size=(64, 4)).astype("float32"), "y": rng.integers(0, 3, 64)}


def trained_for(steps):
    g, train, loss, data = mlp_and_data()
    sess = wb.Session(g, seed=0)
    sess.fit(train, data, batch_size=8, steps=steps)
    return sess.variables


def test_a_stop_request_ends_the_fit_after_the_current_step_with_its_variables():
    g, train, loss, data = mlp_and_data()
    sess = wb.Session(g, seed=0)
    seen = []
    sess.events.subscribe(seen.append)
    history = sess.fit(train, data, batch_size=8, steps=40, fetches=[loss],
                       callback=lambda r: sess.request_stop() if r["step"] == 7 else None)  # fmt: skip
    assert [r["step"] for r in history.records] == list(range(1, 8)) and sess.last_history is history
    end = seen[-1]
    assert isinstance(end, FitInterrupted) and (end.step, end.steps, end.reason) == (7, 40, "stopped")
    np.testing.assert_array_equal(sess.variables["w"], trained_for(7)["w"])
    assert not sess.request_stop()  # nothing runs now; the next fit runs to its end
    assert len(sess.fit(train, data, batch_size=8, steps=3).records) == 3


def test_an_interrupt_ends_the_fit_at_a_step_boundary_keeping_that_step(monkeypatch):
    g, train, loss, data = mlp_and_data()
    sess = wb.Session(g, seed=0)
    seen = []
    sess.events.subscribe(seen.append)

    def interrupt(record):  # SIGINT during step 5's callback, as the notebook's interrupt sends it
        if record["step"] == 5:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now

    with pytest.raises(KeyboardInterrupt) as raised:
        sess.fit(train, data, batch_size=8, steps=40, fetches=[loss], callback=interrupt)
    assert [r["step"] for r in raised.value.history.records] == list(range(1, 6))
    assert sess.last_history.records == raised.value.history.records
    assert isinstance(seen[-1], FitInterrupted) and (seen[-1].step, seen[-1].reason) == (5, "interrupted")
    np.testing.assert_array_equal(sess.variables["w"], trained_for(5)["w"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert len(sess.fit(train, data, batch_size=8, steps=3).records) == 3


def test_a_failed_fit_ends_with_a_typed_event_and_keeps_its_partial_history():
    g, train, loss, data = mlp_and_data()
    sess = wb.Session(g, seed=0)
    seen = []
    sess.events.subscribe(seen.append)

    def fail(record):
        if record["step"] == 3:
            raise ValueError("callback broke")

    with pytest.raises(ValueError, match="callback broke"):
        sess.fit(train, data, batch_size=8, steps=10, callback=fail)
    assert isinstance(seen[-1], FitFailed) and seen[-1].step == 3 and "callback broke" in seen[-1].error
    assert len(sess.last_history.records) == 3
