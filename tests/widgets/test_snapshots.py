"""Static pictures: every view's mime bundle carries an SVG of its state, refreshed when the view finishes."""

import base64
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from workbench.events import EventStream, RunFailed, RunStarted
from workbench.widgets import ClusterView, GraphView, ScalingView, TrainingView
from workbench.widgets._base import SVG_MIME
from workbench.widgets.playground import Playground

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
NS = {"svg": "http://www.w3.org/2000/svg"}


def bundle_svg(view) -> ET.Element:
    """The view's mime bundle: the widget and a well-formed SVG picture next to it."""
    data, _ = view._repr_mimebundle_()
    assert data[WIDGET_MIME]["model_id"] == view.model_id
    root = ET.fromstring(data[SVG_MIME])
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and float(root.get("width")) > 0
    return root


def texts(root: ET.Element) -> str:
    return "\n".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))


def fit_events(session=1, steps=3, **extra):
    yield {"kind": "fit_started", "session": session, "steps": steps, "batch_size": 8, "fetches": ["loss"]}
    for i in range(1, steps + 1):
        yield {
            "kind": "step",
            "session": session,
            "step": i,
            "time": 0.1,
            "samples_per_s": 80.0,
            "loss": 2.0 / i,
            **extra,
        }
    yield {"kind": "fit_finished", "session": session, "steps": steps}


@pytest.fixture
def updates(monkeypatch):
    """The display updates the views send (as in a kernel), by display id."""
    sent = []
    monkeypatch.setattr("IPython.display.update_display",
                        lambda data, display_id, **kw: sent.append((display_id, data[SVG_MIME])))  # fmt: skip
    return sent


def shown(view, display_id="d1"):
    """Mark ``view`` as displayed in a kernel, as ``_ipython_display_`` does."""
    view._display_id = display_id
    view._repr_mimebundle_()
    return view


def test_graph_view_picture_shows_every_visible_node_and_run_states(mlp):
    view = GraphView(mlp)
    root = bundle_svg(view)
    nodes = root.findall(".//svg:g[@data-id]", NS)
    assert len(nodes) == len(view.layout["nodes"]) == 10
    params = sum(int(np.prod(v.shape)) for v in mlp.trainable_variables)
    assert f"graph mlp · 10 nodes · {params:,} parameters · 2 scopes folded" in texts(root)
    assert {"x", "w", "matmul", "gradients"} <= {n.get("data-id") for n in nodes}
    view.feed(
        [RunStarted(graph=mlp.token, ops=("x", "w", "matmul")), RunFailed(graph=mlp.token, op="matmul", error="boom")]
    )
    states = {n.get("data-id"): n.get("data-state") for n in bundle_svg(view).findall(".//svg:g[@data-id]", NS)}
    assert states["matmul"] == "error" and states["x"] == "done"


def test_training_view_picture_is_refreshed_once_when_the_fit_ends(updates):
    stream = EventStream()
    view = shown(TrainingView(title="training · 3 steps").follow(stream, session=1))
    assert "training · 3 steps · waiting" in texts(bundle_svg(view))
    for event in fit_events():
        stream.emit(event.pop("kind"), **event)
    assert len(updates) == 1 and updates[0][0] == "d1"
    final = ET.fromstring(updates[0][1])
    assert "step 3 / 3 (100%)" in texts(final) and "training · 3 steps · done · batch 8" in texts(final)
    assert final.find(".//svg:g[@data-curve='loss']/svg:path", NS) is not None


def test_graph_view_sends_a_new_picture_only_when_it_changes(mlp, updates):
    stream = EventStream(graph=mlp.token)
    shown(GraphView(mlp).follow(stream))
    ops = ["x", "w", "matmul"]
    for _ in range(50):  # the same ops run again and again: one picture
        stream.emit("run_started", ops=ops)
        stream.emit("run_finished")
    assert len(updates) == 1
    stream.emit("run_started", ops=ops)
    stream.emit("run_failed", op="matmul", error="NaN")
    assert len(updates) == 2 and 'data-state="error"' in updates[1][1]


def test_views_never_displayed_send_no_updates(updates):
    stream = EventStream()
    TrainingView().follow(stream, session=1)
    for event in fit_events():
        stream.emit(event.pop("kind"), **event)
    assert updates == []


def test_scaling_view_picture_has_the_table_and_both_charts():
    view = ScalingView()
    rows = [
        dict(workers=n, samples_per_s=s, speedup=s / 100, efficiency=s / 100 / n) for n, s in ((1, 100.0), (2, 185.0))
    ]
    view.feed([{"kind": "scaling_started", "workers": [1, 2]}, *({"kind": "scaling_point", **r} for r in rows),
               {"kind": "scaling_finished", "rows": rows}])  # fmt: skip
    root = bundle_svg(view)
    assert "scaling study · done · 2 of 2 worker counts" in texts(root)
    assert "92%" in texts(root) and "1.85×" in texts(root)
    assert len(root.findall(".//svg:g[@class='wb-chart']", NS)) == 2


def test_cluster_view_picture_lists_workers_and_why_the_dashboard_is_missing():
    info = {"scheduler": "tcp://127.0.0.1:8786", "dashboard": "",
            "dashboard_note": "no dashboard: bokeh is not installed on the scheduler",
            "workers": [{"address": "tcp://127.0.0.1:4001", "name": "w0", "threads": 2, "memory": 2**31, "gpus": 0}]}  # fmt: skip
    text = texts(bundle_svg(ClusterView(info)))
    assert "1 workers · 2 threads · 2.0 GiB" in text and "tcp://127.0.0.1:4001" in text
    assert "bokeh is not installed" in text
    assert "no default cluster" in texts(bundle_svg(ClusterView(None)))


def test_playground_picture_embeds_the_boundary_and_follows_steps(updates):
    app = shown(Playground(size=60, resolution=10, dataset="xor", hidden=(3,)))
    root = bundle_svg(app)
    image = root.find("svg:image", NS)
    assert base64.b64decode(image.get("href").split(",", 1)[1]) == app.image.value
    assert "step 0 (epoch 0.0)" in texts(root)
    app.step(5)
    assert len(updates) == 1 and "step 5 (epoch" in texts(ET.fromstring(updates[0][1]))
    app.close()


def test_a_control_character_in_an_op_name_keeps_the_picture_well_formed():
    import workbench as wb

    g = wb.Graph(name="odd")
    with g.as_default():
        x = wb.placeholder("x\x07bell", shape=(None, 2))
        wb.relu(x, name="r\x1bescape")
    root = bundle_svg(GraphView(g))  # parses: no control character reached the XML
    assert "x\\x07bell" in texts(root) or "r\\x1bescape" in texts(root)


def test_the_training_state_lists_its_charts_so_a_saved_state_with_sorted_keys_draws_the_same():
    import json

    from workbench.events import FitFinished, FitStarted, Step, Validated
    from workbench.widgets import snapshots

    view = TrainingView()
    view.feed([FitStarted(steps=2, batch_size=8, fetches=("loss", "acc")),
               *[Step(step=k, time=0.1, samples_per_s=80.0, fetches={"loss": 2.0 / k, "acc": 0.4 * k}) for k in (1, 2)],
               Validated(step=2, fetches={"loss": 1.5, "acc": 0.7}, examples=10),
               FitFinished(steps=2)])  # fmt: skip
    charts = view.state["charts"]
    assert [(c["label"], c["validation"]) for c in charts] == [("loss", "val_loss"), ("acc", "val_acc")]
    assert charts[0]["color"] != charts[1]["color"]
    saved = json.loads(json.dumps(view.state, sort_keys=True))  # as a notebook file holds widget state
    assert list(saved["curves"]) == ["acc", "loss", "val_acc", "val_loss"]
    assert snapshots.training_svg(view.title, saved) == snapshots.training_svg(view.title, view.state)
    older = {k: v for k, v in saved.items() if k != "charts"}  # a state saved before it listed its charts
    assert "acc" in snapshots.training_svg(view.title, older)
