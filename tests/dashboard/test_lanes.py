"""The timeline's lanes on the Workbench page: spans forwarded with the summaries, kept for the last steps, drawn."""

from workbench.dashboard.forward import TOPIC, Forwarder
from workbench.dashboard.monitor import TIMELINE_STEPS, TrainingMonitor
from workbench.dashboard.page import TrainingPage
from workbench.events import FitFinished, FitStarted, Step


class FakeScheduler:
    def __init__(self, monitor):
        self.plugins = {"workbench-training": monitor}


def spans(k):
    t = float(k)
    return [
        {"worker": "tcp://a:1", "replica": 0, "step": k, "phase": "compute", "start": t, "end": t + 0.25},
        {"worker": "tcp://a:1", "replica": 0, "step": k, "phase": "wait", "start": t + 0.25, "end": t + 0.5,
         "waiting_for": "tcp://b:1"},
        {"worker": "tcp://b:1", "replica": 1, "step": k, "phase": "compute", "start": t, "end": t + 0.5},
    ]  # fmt: skip


def test_the_page_draws_the_lanes_of_the_last_steps_with_each_wait_pointing_at_whom_it_waited_for():
    sent, now = [], [0.0]
    forwarder = Forwarder(interval=0.25, clock=lambda: now[0], send=lambda client, msg: sent.append(msg),
                          find_client=lambda address: "client")  # fmt: skip
    forwarder(
        FitStarted(session="s1", graph_name="mlp", scheduler="tcp://s:1", steps=30, batch_size=8, fetches=("loss",))
    )
    for k in range(1, 31):
        now[0] += 0.1
        forwarder(Step(session="s1", step=k, time=0.1, fetches={"loss": 1.0 / k}, metrics={"spans": spans(k)}))
    forwarder(FitFinished(session="s1", steps=30))
    assert all(len({s[1] for s in msg.get("spans", [])}) <= 8 for msg in sent)  # a bounded message
    monitor = TrainingMonitor()
    for msg in sent:
        monitor.log_event(TOPIC, msg)
    (fit,) = monitor.fits()
    assert sorted({s[1] for s in fit["spans"]}) == list(range(31 - TIMELINE_STEPS, 31))
    page = TrainingPage(FakeScheduler(monitor))
    page.update()
    lanes = page.panels["mlp"].lanes
    assert list(lanes.figure.y_range.factors) == ["tcp://a:1", "tcp://b:1"]
    data = lanes.source.data
    assert set(data["phase"]) == {"compute", "wait"} and "tcp://b:1" in data["waiting_for"]
    assert lanes.arrows.data["y0"][0] == "tcp://a:1" and lanes.arrows.data["y1"][0] == "tcp://b:1"
