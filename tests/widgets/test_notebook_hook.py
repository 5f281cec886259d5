import sys

import numpy as np
import pytest

import workbench as wb
from workbench import notebook
from workbench.events import ROOT, EventStream, FitStarted, ScalingFinished, ScalingPoint, ScalingStarted
from workbench.widgets import ScalingView, TrainingView


@pytest.fixture
def shown():
    shown = []
    notebook.install(display=shown.append)
    yield shown
    notebook.uninstall()


def tiny_fit(linear, steps=20):
    g, train, loss = linear
    sess = wb.Session(g)
    sess.fit(train, {"x": np.ones((8, 2), "float32")}, batch_size=4, steps=steps, fetches={"loss": loss})
    return sess


def test_fit_shows_a_training_view_that_follows_its_session(shown, linear):
    sess = tiny_fit(linear)
    (view,) = shown
    assert isinstance(view, TrainingView)
    assert view.state["status"] == "done" and view.state["step"] == 20 and view.state["steps"] == 20
    assert "loss" in view.state["curves"] and not view.following
    tiny_fit(linear, steps=3)
    assert len(shown) == 2 and shown[1].state["step"] == 3
    assert shown[0].state["step"] == 20  # the first view kept its own run
    assert sess.token != shown[1]._session and shown[1]._session.startswith("session-")


def test_scaling_study_events_show_a_scaling_view(shown):
    study = {"session": "study-1"}
    ROOT.emit(ScalingStarted(**study, workers=(1, 2)))
    ROOT.emit(ScalingPoint(**study, workers=1, samples_per_s=10.0, speedup=1.0, efficiency=1.0))
    row = {"workers": 1, "samples_per_s": 10.0, "speedup": 1.0, "efficiency": 1.0}
    ROOT.emit(ScalingFinished(**study, rows=(row,)))
    (view,) = shown
    assert isinstance(view, ScalingView) and view.state["status"] == "done"


def test_the_fits_of_a_scaling_study_show_no_views_of_their_own(shown, linear):
    from workbench.events import current_study

    marked = current_study.set("study-2")  # what scaling_study does around its runs
    try:
        tiny_fit(linear, steps=2)
    finally:
        current_study.reset(marked)
    assert shown == []
    tiny_fit(linear, steps=2)  # a fit of its own, after the study
    assert len(shown) == 1 and isinstance(shown[0], TrainingView)


def test_install_is_idempotent_and_uninstall_stops_it():
    stream, shown = EventStream(), []
    notebook.install(stream, display=shown.append)
    notebook.install(stream, display=shown.append)
    stream.emit(FitStarted(session="s1", steps=1, batch_size=1))
    assert len(shown) == 1
    notebook.uninstall()
    stream.emit(FitStarted(session="s2", steps=1, batch_size=1))
    assert len(shown) == 1 and not notebook.installed()


@pytest.mark.slow
def test_outside_a_kernel_nothing_is_installed_and_no_widgets_are_imported():
    import subprocess

    code = "import sys, workbench, workbench.notebook as n; print(n.installed(), 'ipywidgets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
