"""The training monitor without a cluster: events to summaries, summaries and task timings to the page and metrics."""

import pytest
from bokeh.models import ColumnDataSource, Div
from prometheus_client import CollectorRegistry, generate_latest

from workbench.events import FitFinished, FitStarted, RunStarted, Step, Validated
from workbench.dashboard.forward import TOPIC, Forwarder, training_update
from workbench.dashboard.monitor import MAX_POINTS, NAME, TIMELINE_STEPS, TrainingMonitor, metric_families
from workbench.dashboard.page import NOT_LOADED, PAGE, TrainingPage, register_page


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def started(session="s1", graph="mlp", scheduler="tcp://127.0.0.1:8786", steps=1000, fetches=("loss",)):
    return FitStarted(session=session, graph_name=graph, scheduler=scheduler, steps=steps, batch_size=64,
                      fetches=tuple(fetches), replicas=2)  # fmt: skip


def step(i, session="s1", **values):
    return Step(session=session, step=i, time=0.01, samples_per_s=6400.0, fetches={"loss": 1.0 / i, **values},
                metrics={"workers": {"tcp://w:1": 0.004}})  # fmt: skip


def finished(session="s1", steps=1000):
    return FitFinished(session=session, steps=steps)


@pytest.fixture
def forwarded():
    """A forwarder on a fake clock whose summaries are kept (client lookups always succeed)."""
    clock, sent = Clock(), []
    forwarder = Forwarder(interval=0.25, clock=clock, send=lambda client, msg: sent.append((client, msg)),
                          find_client=lambda address: f"client of {address}")  # fmt: skip
    return forwarder, clock, sent


def test_training_update_reads_the_events_of_a_fit():
    assert training_update(started())["labels"] == ["loss"]
    assert training_update(step(3, accuracy=0.5))["values"]["accuracy"] == 0.5
    assert training_update(finished())["status"] == "done"
    assert training_update(RunStarted(ops=())) is None


def test_summaries_are_throttled_whatever_the_step_rate(forwarded):
    forwarder, clock, sent = forwarded
    forwarder(started())
    for i in range(1, 1001):  # 1,000 steps in 10 s
        clock.now += 0.01
        forwarder(step(i))
    forwarder(finished())
    statuses = [msg["status"] for _, msg in sent]
    assert statuses[0] == "started" and statuses[-1] == "done"
    assert 38 <= statuses.count("running") <= 41  # at most 4 a second
    assert all(client == "client of tcp://127.0.0.1:8786" for client, _ in sent)
    points = [p for _, msg in sent for p in msg["points"]]
    assert [p[0] for p in points] == list(range(1, 1001))  # every loss reaches the scheduler once
    running = [msg for _, msg in sent if msg["status"] == "running"]
    assert running[-1]["steps_per_s"] == pytest.approx(100.0) and running[-1]["samples_per_s"] == pytest.approx(6400.0)


def test_local_fits_and_other_sessions_are_not_forwarded(forwarded):
    forwarder, clock, sent = forwarded
    forwarder(started(scheduler=None))  # a local fit: no scheduler to tell
    forwarder(step(1))
    forwarder(step(1, session="s2"))
    assert sent == []


def test_a_failing_send_stops_forwarding_that_fit_only(forwarded):
    forwarder, clock, sent = forwarded
    forwarder.send = lambda client, msg: (_ for _ in ()).throw(OSError("scheduler gone"))
    forwarder(started())
    assert forwarder.fits == {}
    clock.now += 1
    forwarder(step(1))  # nothing raised into training


def test_monitor_keeps_each_fit_and_bounds_its_curve():
    monitor = TrainingMonitor(clock=Clock())
    monitor.log_event(
        TOPIC, {"graph": "mlp", "session": 1, "status": "started", "step": 0, "steps": 5000, "points": []}
    )
    for i in range(1, 5001, 10):
        monitor.log_event(TOPIC, {"graph": "mlp", "session": 1, "status": "running", "step": i + 9, "steps_per_s": 50.0,
                                  "loss": 1.0 / i, "points": [[i + k, 1.0 / (i + k)] for k in range(10)]})  # fmt: skip
    monitor.log_event("other-topic", {"graph": "x"})
    (fit,) = monitor.fits()
    assert fit["step"] == 5000 and fit["steps_per_s"] == 50.0
    assert MAX_POINTS // 2 <= len(fit["points"]) <= MAX_POINTS and fit["points"][0][0] == 1.0
    steps = [p[0] for p in fit["points"]]
    assert steps == sorted(steps)


def test_monitor_keeps_the_phases_of_the_last_steps_per_worker():
    monitor = TrainingMonitor()
    for s in range(1, 21):
        for phase, rest, worker in [("grad", "-r0", "tcp://a:1"), ("grad", "-r1", "tcp://b:1"), ("reduce", "-1-0", "tcp://a:1"),
                                    ("update", "", "tcp://a:1"), ("metrics", "", "tcp://b:1")]:  # fmt: skip
            monitor.transition((f"mlp-{phase}-{s}{rest}", "9f2c41d7"), "processing", "memory", stimulus_id="x",
                               worker=worker, startstops=[{"action": "compute", "start": s + 0.1, "stop": s + 0.2}])  # fmt: skip
    monitor.transition(("mlp-grad-21-r0", "9f2c41d7"), "waiting", "processing", stimulus_id="x")  # not finished
    monitor.transition(("data-ab12", "x"), "processing", "memory", stimulus_id="x", worker="tcp://a:1",
                       startstops=[{"action": "compute", "start": 1.0, "stop": 2.0}])  # fmt: skip
    (fit,) = monitor.fits()
    assert {t["step"] for t in fit["tasks"]} == set(range(21 - TIMELINE_STEPS, 21))
    assert {t["phase"] for t in fit["tasks"]} == {"grad", "reduce", "update", "metrics"}
    assert {t["worker"] for t in fit["tasks"] if t["phase"] == "grad"} == {"tcp://a:1", "tcp://b:1"}


def test_metrics_name_each_graph():
    monitor = TrainingMonitor()
    monitor.log_event(TOPIC, {"graph": "mlp", "session": 1, "status": "running", "step": 12, "steps_per_s": 4.0,
                              "samples_per_s": 256.0, "loss": 0.25, "points": []})  # fmt: skip
    registry = CollectorRegistry()

    class Collector:
        def collect(self):
            return metric_families(monitor.fits())

    registry.register(Collector())
    text = generate_latest(registry).decode()
    for line in ['workbench_training_steps_total{graph="mlp"} 12.0', 'workbench_training_steps_per_second{graph="mlp"} 4.0',
                 'workbench_training_samples_per_second{graph="mlp"} 256.0', 'workbench_training_loss{graph="mlp"} 0.25',
                 'workbench_training_running{graph="mlp"} 1.0']:  # fmt: skip
        assert line in text


class FakeScheduler:
    def __init__(self, monitor=None):
        self.plugins = {NAME: monitor} if monitor is not None else {}


def test_page_shows_each_fit_with_its_curve_and_timeline():
    monitor = TrainingMonitor()
    monitor.log_event(TOPIC, {"graph": "mlp", "session": 1, "status": "running", "step": 2, "steps": 10, "steps_per_s": 4.0,
                              "samples_per_s": 256.0, "loss": 0.5, "loss_name": "loss", "points": [[1, 1.0], [2, 0.5]]})  # fmt: skip
    monitor.transition(("mlp-grad-2-r0", "t"), "processing", "memory", stimulus_id="x", worker="tcp://a:1",
                       startstops=[{"action": "compute", "start": 5.0, "stop": 5.5}])  # fmt: skip
    page = TrainingPage(FakeScheduler(monitor))
    page.update()
    titles = [d.text for d in page.root.select({"type": Div}) if "wb-fit-title" in d.text]
    assert titles and "<b>mlp</b> · running · step 2 / 10 · 4.0 steps/s · 256 samples/s · loss 0.5" in titles[0]
    sources = {tuple(sorted(s.data)): s.data for s in page.root.select({"type": ColumnDataSource})}
    panel = page.panels["mlp"]
    assert panel.loss_source.data["loss"] == [1.0, 0.5] and panel.val_source.data["loss"] == []
    timeline = next(d for k, d in sources.items() if "phase" in k and "waiting_for" not in k)  # not the lanes
    assert timeline["phase"] == ["grad"] and timeline["right"] == [0.5] and timeline["worker"] == ["tcp://a:1"]
    monitor.log_event(TOPIC, {"graph": "cnn", "session": 2, "status": "started", "step": 0, "points": []})
    page.update()
    assert page.order == ["cnn", "mlp"]  # the newest first


def test_the_validation_curve_reaches_the_page(forwarded):
    forwarder, clock, sent = forwarded
    forwarder(started())
    for i in range(1, 21):
        clock.now += 0.01
        forwarder(step(i))
        if i % 10 == 0:
            forwarder(Validated(session="s1", step=i, fetches={"loss": 2.0 / i}, examples=100))
    forwarder(finished())
    val = [p for _, msg in sent for p in msg.get("val_points", [])]
    assert val == [[10, 0.2], [20, 0.1]]  # each validation once, sent when it happens
    monitor = TrainingMonitor()
    for _, msg in sent:
        monitor.log_event(TOPIC, msg)
    (fit,) = monitor.fits()
    assert fit["val_points"] == [[10.0, 0.2], [20.0, 0.1]] and len(fit["points"]) == 20
    page = TrainingPage(FakeScheduler(monitor))
    page.update()
    assert page.panels["mlp"].val_source.data == {"step": [10.0, 20.0], "loss": [0.2, 0.1]}
    assert [item.label["value"] for item in page.panels["mlp"].loss.legend.items] == ["train", "validation"]


def test_page_says_when_the_monitor_is_not_loaded():
    page = TrainingPage(FakeScheduler())
    page.update()
    assert page.note.text == NOT_LOADED and "--preload workbench.dashboard.preload" in NOT_LOADED


def test_the_page_is_an_individual_dashboard_application():
    from distributed.dashboard import scheduler as dashboard

    assert register_page()
    assert PAGE == "/individual-workbench" and PAGE in dashboard.applications
