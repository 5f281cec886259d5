"""The playground: its data sets and features, the model it trains, and the widget app."""

import re
import time

import numpy as np
import pytest

import workbench as wb
from workbench import datasets
from workbench.widgets.playground import (
    Options,
    Playground,
    PlaygroundModel,
    boundary_image,
    loss_svg,
    png,
)

# -- data sets and features ----------------------------------------------------------------------


@pytest.mark.parametrize("name", datasets.DATASETS)
def test_each_data_set_is_two_balanced_classes_in_the_domain_and_seeded(name):
    x, y = datasets.make_2d(name, samples=200, noise=0.0, seed=3)
    assert x.shape == (200, 2) and x.dtype == np.float32
    assert y.dtype == np.int64 and set(np.unique(y)) == {0, 1}
    assert 0.35 < y.mean() < 0.65
    lo, hi = datasets.DOMAIN
    assert lo <= x.min() and x.max() <= hi
    again, _ = datasets.make_2d(name, samples=200, noise=0.0, seed=3)
    other, _ = datasets.make_2d(name, samples=200, noise=0.0, seed=4)
    np.testing.assert_array_equal(x, again)
    assert not np.array_equal(x, other)


def test_noise_moves_the_points():
    clean, _ = datasets.make_2d("spiral", samples=100, noise=0.0)
    noisy, _ = datasets.make_2d("spiral", samples=100, noise=0.5)
    assert not np.allclose(clean, noisy)


def test_clean_data_sets_follow_their_rule():
    x, y = datasets.make_2d("circle", samples=300)
    np.testing.assert_array_equal(y, np.hypot(x[:, 0], x[:, 1]) < 2.5)
    x, y = datasets.make_2d("xor", samples=300)
    np.testing.assert_array_equal(y, x[:, 0] * x[:, 1] >= 0)
    x, y = datasets.make_2d("gaussian", samples=300)
    assert (x[y == 1].mean(axis=0) > 1).all() and (x[y == 0].mean(axis=0) < -1).all()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("x1", 3.0),
        ("x2", -2.0),
        ("x1^2", 9.0),
        ("x2^2", 4.0),
        ("x1*x2", -6.0),
        ("sin x1", np.sin(3.0)),
        ("sin x2", np.sin(-2.0)),
    ],  # fmt: skip
)
def test_each_feature(name, expected):
    out = datasets.features(np.array([[3.0, -2.0]]), [name])
    assert out.shape == (1, 1) and out.dtype == np.float32
    assert out[0, 0] == pytest.approx(expected, rel=1e-6)


def test_bad_data_options_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown data set 'moons'; use one of circle, xor"):
        datasets.make_2d("moons")
    with pytest.raises(ValueError, match="unknown feature 'cos x1'"):
        datasets.features(np.zeros((1, 2)), ["cos x1"])
    with pytest.raises(ValueError, match="train_fraction"):
        datasets.split(np.zeros((4, 2)), np.zeros(4), 1.0)


def test_split_keeps_every_point_once():
    x, y = datasets.make_2d("xor", samples=100)
    parts = datasets.split(x, y, 0.3)
    assert len(parts.x_train) == 30 and len(parts.x_test) == 70
    np.testing.assert_array_equal(np.concatenate([parts.x_train, parts.x_test]), x)


# -- the model -----------------------------------------------------------------------------------


def test_the_model_is_a_workbench_graph_trained_by_a_session():
    model = PlaygroundModel(hidden=(4, 2))
    assert isinstance(model.graph, wb.Graph) and isinstance(model.session, wb.Session)
    names = {v.name for v in model.graph.trainable_variables}
    assert names == {"layer1/w", "layer1/b", "layer2/w", "layer2/b", "output/w", "output/b"}
    assert model.graph.get("x").shape == (None, 2)


@pytest.mark.parametrize(
    "options",
    [
        dict(dataset="xor", features=("x1", "x2"), hidden=(8,), activation="tanh", learning_rate=0.1),
        dict(dataset="xor", features=("x1*x2",), hidden=()),
        dict(dataset="circle", features=("x1", "x2"), hidden=(8,), activation="relu"),
        dict(dataset="circle", features=("x1^2", "x2^2"), hidden=()),
        dict(dataset="gaussian", hidden=(2,), activation="sigmoid", learning_rate=0.1),
    ],
    ids=["xor-mlp", "xor-product", "circle-mlp", "circle-squares", "gaussian"],
)
def test_training_reaches_low_loss_and_high_accuracy(options):
    model = PlaygroundModel(**options)
    first = model.step(0)
    last = model.step(600)
    assert last["train_loss"] < min(0.3, first["train_loss"])
    assert last["train_accuracy"] > 0.95 and last["test_accuracy"] > 0.95


@pytest.mark.parametrize("feature", list(datasets.FEATURES))
def test_each_feature_alone_builds_and_trains(feature):
    model = PlaygroundModel(dataset="gaussian", features=(feature,), hidden=(3,))
    assert model.graph.get("x").shape == (None, 1)
    record = model.step(5)
    assert np.isfinite(record["train_loss"])


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "linear"])
def test_each_activation(activation):
    model = PlaygroundModel(dataset="gaussian", activation=activation, hidden=(6,), learning_rate=0.1)
    assert model.step(300)["test_accuracy"] > 0.95


def test_step_counts_and_records_each_call():
    model = PlaygroundModel()
    assert model.step_count == 0 and model.history == []
    model.step(3)
    record = model.step(4)
    assert model.step_count == 7 and record["step"] == 7
    assert [r["step"] for r in model.history] == [3, 7]
    assert set(record) == {"step", "train_loss", "test_loss", "train_accuracy", "test_accuracy"}
    assert model.steps_per_epoch == 25 and model.epoch == pytest.approx(7 / 25)


def test_the_same_options_train_the_same_way():
    a, b = PlaygroundModel(dataset="spiral"), PlaygroundModel(dataset="spiral")
    assert a.step(30) == b.step(30)


def test_data_and_model_options_rebuild_and_restart():
    model = PlaygroundModel()
    model.step(10)
    graph, points = model.graph, model.data.x_train
    assert model.set(hidden=(3,)) is True
    assert model.graph is not graph and model.step_count == 0 and model.history == []
    assert [v.name for v in model.graph.trainable_variables] == ["layer1/w", "layer1/b", "output/w", "output/b"]
    np.testing.assert_array_equal(model.data.x_train, points)  # same data, new model
    assert model.set(features=("x1", "x2", "x1*x2")) is True
    assert model.graph.get("x").shape == (None, 3)
    assert model.set(dataset="xor") is True
    assert not np.array_equal(model.data.x_train, points)
    assert model.set(dataset="xor") is False  # unchanged


def test_rates_and_batch_size_change_without_a_restart():
    model = PlaygroundModel()
    model.step(10)
    graph = model.graph
    assert model.set(learning_rate=0.3, batch_size=20, regularization_rate=0.01) is False
    assert model.graph is graph and model.step_count == 10
    w = model.session.variables["output/w"]
    model.step(1)
    assert not np.allclose(w, model.session.variables["output/w"])


def test_a_larger_learning_rate_moves_the_weights_further():
    moved = {}
    for lr in (0.01, 0.1):
        model = PlaygroundModel(learning_rate=lr)
        before = model.session.variables["output/w"]
        model.step(1)
        moved[lr] = np.abs(model.session.variables["output/w"] - before).sum()
    assert moved[0.1] == pytest.approx(10 * moved[0.01], rel=1e-3)


@pytest.mark.parametrize("kind", ["l1", "l2"])
def test_regularization_shrinks_the_weights(kind):
    def weight_norm(**options):
        model = PlaygroundModel(dataset="gaussian", hidden=(4,), **options)
        model.step(300)
        return sum(np.abs(v).sum() for k, v in model.session.variables.items() if k.endswith("/w"))

    assert weight_norm(regularization=kind, regularization_rate=0.1) < 0.7 * weight_norm()


def test_reset_goes_back_to_the_initial_weights():
    model = PlaygroundModel()
    start = model.session.variables
    model.step(20)
    model.reset()
    assert model.step_count == 0 and model.history == []
    for name, value in start.items():
        np.testing.assert_array_equal(model.session.variables[name], value)


def test_predict_grid_is_a_probability_image_oriented_like_the_plot():
    model = PlaygroundModel(dataset="gaussian", hidden=())
    model.step(200)  # label 1 sits at (2, 2): top right
    grid = model.predict_grid(resolution=10)
    assert grid.shape == (10, 10) and ((grid >= 0) & (grid <= 1)).all()
    assert grid[0, -1] > 0.9 and grid[-1, 0] < 0.1
    assert model.predict([[2.0, 2.0], [-2.0, -2.0]]).round().tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(dataset="moons"), "unknown data set 'moons'"),
        (dict(features=()), "features must be some of x1, x2"),
        (dict(features=("x3",)), "features must be some of"),
        (dict(hidden=(4, 0)), "at least one unit, got \\[4, 0\\]"),
        (dict(activation="gelu"), "unknown activation 'gelu'; use one of relu, tanh, sigmoid, linear"),
        (dict(regularization="l3"), "unknown regularization 'l3'"),
        (dict(learning_rate=0.0), "learning_rate must be positive"),
        (dict(batch_size=1000), "batch_size must be between 1 and the number of training points"),
    ],
)
def test_bad_options_are_refused_and_change_nothing(change, message):
    model = PlaygroundModel()
    with pytest.raises(ValueError, match=message):
        model.set(**change)
    assert model.options == Options()
    with pytest.raises(ValueError, match=message):
        PlaygroundModel(**change)


# -- drawing -------------------------------------------------------------------------------------


def test_png_is_a_valid_image():
    import struct
    import zlib

    image = np.zeros((3, 2, 3), np.uint8)
    image[0, 0] = (255, 0, 0)
    data = png(image)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (2, 3)
    idat_len = struct.unpack(">I", data[33:37])[0]
    raw = zlib.decompress(data[41 : 41 + idat_len])
    assert raw[:7] == b"\x00\xff\x00\x00\x00\x00\x00" and len(raw) == 3 * (1 + 2 * 3)


def test_boundary_image_colors_the_classes():
    model = PlaygroundModel(dataset="gaussian", hidden=())
    model.step(200)
    image = boundary_image(model, size=60, resolution=20)
    assert image.shape == (60, 60, 3) and image.dtype == np.uint8
    top_right, bottom_left = image[2, -3].astype(int), image[-3, 2].astype(int)
    assert top_right[2] > top_right[0]  # bluish: label 1
    assert bottom_left[0] > bottom_left[2]  # orange: label 0


def test_loss_svg_draws_both_curves_and_copes_with_nan():
    history = [{"step": s, "train_loss": 1.0 / s, "test_loss": 1.2 / s} for s in range(1, 1000)]
    svg = loss_svg(history, max_points=100)
    assert svg.startswith("<svg") and svg.count("<polyline") == 2
    assert len(svg.split("<polyline")[1].split()) < 120
    assert "nan" not in loss_svg([{"step": 1, "train_loss": float("nan"), "test_loss": 1.0}])
    assert "<polyline" not in loss_svg([])


# -- the widget app ------------------------------------------------------------------------------


def test_playground_draws_on_creation_and_on_step():
    app = Playground(dataset="xor", size=120, resolution=30)
    assert app.image.value[:4] == b"\x89PNG"
    assert "step 0 " in app.status.value
    before = app.image.value
    app.step()  # one epoch
    assert app.model.step_count == app.model.steps_per_epoch
    assert f"step {app.model.step_count} " in app.status.value
    assert app.image.value != before and "<polyline" in app.curves.value


def test_playground_buttons_and_controls():
    app = Playground(size=60, resolution=10)
    buttons = {b.description: b for b in app.children[0].children}
    buttons["Step"].click()
    assert app.model.step_count == 25
    buttons["Reset"].click()
    assert app.model.step_count == 0
    dropdowns = _controls(app, "description")
    dropdowns["data set"].value = "spiral"
    assert app.model.options.dataset == "spiral"
    dropdowns["activation"].value = "relu"
    assert app.model.options.activation == "relu"
    dropdowns["hidden units"].value = "3, 3, 3"
    assert app.model.options.hidden == (3, 3, 3)
    dropdowns["learning rate"].value = 0.3
    assert app.model.options.learning_rate == 0.3
    app._feature_boxes["x1*x2"].value = True
    assert app.model.options.features == ("x1", "x2", "x1*x2")


def test_changes_from_code_show_in_the_controls():
    app = Playground(size=60, resolution=10)
    controls = _controls(app, "description")
    app.set(dataset="spiral", hidden=(8, 8), features=("x1", "sin x1"), learning_rate=0.05, batch_size=40)
    assert controls["data set"].value == "spiral" and controls["hidden units"].value == "8, 8"
    assert [n for n, box in app._feature_boxes.items() if box.value] == ["x1", "sin x1"]
    assert controls["learning rate"].value == 0.05 and controls["batch size"].value == 40
    assert app.model.step_count == 0 and "color:#c00" not in app.status.value


def test_playground_shows_bad_input_instead_of_raising():
    app = Playground(size=60, resolution=10)
    _controls(app, "description")["hidden units"].value = "four"
    assert "hidden units are whole numbers" in app.status.value
    for box in app._feature_boxes.values():
        box.value = False
    assert "features must be some of" in app.status.value
    assert app.model.options.features == ("x2",)  # the last valid choice stays
    app._feature_boxes["x1"].value = True
    assert "color:#c00" not in app.status.value


@pytest.mark.slow
def test_play_trains_in_the_background_and_redraws_at_most_ten_times_a_second():
    app = Playground(size=60, resolution=10)
    draws = app.draws
    started = time.monotonic()
    app.play()
    assert app.playing and app._play_button.description == "Pause"
    deadline = started + 10.0  # at least two chunks, however loaded the machine (0.6 s when quiet)
    while (app.model.step_count < 2 * app.steps_per_chunk or time.monotonic() < started + 0.6) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    app.pause()
    elapsed = time.monotonic() - started
    assert not app.playing and app._play_button.description == "Play"
    assert app.model.step_count >= 2 * app.steps_per_chunk
    redraws = app.draws - draws
    assert 2 <= redraws <= elapsed * app.max_updates_per_s + 2  # the throttle, plus the final draw
    steps = app.model.step_count
    time.sleep(0.1)
    assert app.model.step_count == steps  # paused means stopped


def test_options_can_change_while_playing():
    app = Playground(size=60, resolution=10)
    app.play()
    try:
        app.set(dataset="circle", hidden=(5,))
        time.sleep(0.2)
    finally:
        app.pause()
    assert app.model.options.hidden == (5,) and app.model.step_count > 0
    app.close()


def _controls(app, attr):
    found = {}

    def walk(w):
        if hasattr(w, attr) and hasattr(w, "value"):
            found[getattr(w, attr)] = w
        for child in getattr(w, "children", ()):
            walk(child)

    walk(app)
    return found


# -- regression, the network drawing, layers and neurons ----------------------------------------------


@pytest.mark.parametrize("name", datasets.REGRESSION_DATASETS)
def test_regression_data_sets_are_values_in_minus_one_to_one_and_seeded(name):
    x, y = datasets.make_regression_2d(name, samples=300, seed=2)
    assert x.shape == (300, 2) and y.shape == (300,) and y.dtype == np.float32
    assert -1 <= y.min() < -0.3 and 0.3 < y.max() <= 1
    np.testing.assert_array_equal(x, datasets.make_regression_2d(name, samples=300, seed=2)[0])
    assert not np.array_equal(x, datasets.make_regression_2d(name, samples=300, seed=3)[0])
    with pytest.raises(ValueError, match="unknown regression data set 'circle'; use one of plane, multi_gaussian"):
        datasets.make_regression_2d("circle")


def test_the_plane_follows_x1_plus_x2():
    x, y = datasets.make_regression_2d("plane", samples=200)
    np.testing.assert_allclose(y, np.clip((x[:, 0] + x[:, 1]) / 10, -1, 1), atol=1e-6)


@pytest.mark.parametrize("dataset, hidden, loss", [("plane", (), 0.002), ("multi_gaussian", (8, 8), 0.03)])
def test_regression_trains_to_a_low_squared_error(dataset, hidden, loss):
    model = PlaygroundModel(problem="regression", dataset=dataset, hidden=hidden, learning_rate=0.03)
    assert model.graph.get("y").dtype == "float32"
    first = model.step(0)
    last = model.step(1500 if hidden else 300)
    assert set(last) == {"step", "train_loss", "test_loss"}
    assert last["test_loss"] < min(loss, first["test_loss"])
    grid = model.predict_grid(10)
    assert grid[0, -1] > grid[-1, 0] if dataset == "plane" else np.ptp(grid) > 0.5


def test_choosing_a_problem_type_picks_its_first_data_set():
    model = PlaygroundModel(problem="regression")
    assert model.options.dataset == "plane" and model.accuracy is None
    assert model.set(problem="classification") is True and model.options.dataset == "circle"
    with pytest.raises(ValueError, match="unknown data set 'circle' for regression; use one of plane, multi_gaussian"):
        model.set(problem="regression", dataset="circle")
    with pytest.raises(ValueError, match="unknown problem type 'ranking'"):
        model.set(problem="ranking")


def test_layers_and_neurons_have_the_playgrounds_limits():
    model = PlaygroundModel(hidden=(8,) * 6)
    with pytest.raises(ValueError, match=r"at most 6 hidden layers of at most 8 neurons, got \[8, 8, 8, 8, 8, 8, 8\]"):
        model.add_layer()
    with pytest.raises(ValueError, match="at most 6 hidden layers of at most 8 neurons"):
        model.resize_layer(0, 1)
    model.set(hidden=(1,))
    with pytest.raises(ValueError, match="at least one unit"):
        model.resize_layer(0, -1)
    model.remove_layer()
    with pytest.raises(ValueError, match="there is no hidden layer to remove"):
        model.remove_layer()
    assert model.add_layer() and model.options.hidden == (2,)


def test_neuron_grids_are_what_each_neuron_computes_over_the_plane():
    from workbench.widgets.playground.model import grid_points

    model = PlaygroundModel(dataset="xor", hidden=(3, 2), activation="tanh")
    model.step(50)
    grids = model.neuron_grids(resolution=6)
    assert [g.shape for g in grids["features"]] == [(6, 6), (6, 6)]
    assert [g.shape for g in grids["layers"]] == [(3, 6, 6), (2, 6, 6)] and grids["output"].shape == (6, 6)
    v = model.session.variables
    first = np.tanh(grid_points(6) @ v["layer1/w"] + v["layer1/b"])  # by hand, from the weights
    np.testing.assert_allclose(grids["layers"][0], np.moveaxis(first.reshape(6, 6, 3), -1, 0), atol=1e-5)
    np.testing.assert_allclose(grids["output"], 2 * model.predict_grid(6) - 1, atol=1e-6)
    np.testing.assert_allclose(grids["features"][0][0], grid_points(6)[:6, 0])  # x1 along the top row


def test_network_svg_draws_every_neuron_and_every_weight_by_sign_and_size():
    from workbench.widgets.playground.drawing import network_svg

    model = PlaygroundModel(dataset="xor", hidden=(4, 3), features=("x1", "x2", "x1*x2"))
    model.step(20)
    svg = network_svg(model, resolution=8)
    assert svg.count('class="wb-feature"') == 3 and svg.count('class="wb-neuron"') == 7
    assert svg.count('class="wb-output"') == 1 and svg.count("data:image/png;base64,") == 11
    weights = model.weight_values()
    assert [w.shape for w in weights] == [(3, 4), (4, 3), (3, 1)]
    edges = re.findall(r'data-layer="(\d)" data-from="(\d)" data-to="(\d)" data-sign="(.)" .*? stroke="(#\w+)" '
                       r'stroke-width="([\d.]+)"', svg)  # fmt: skip
    assert len(edges) == 12 + 12 + 3
    for layer, i, j, sign, color, _width in edges:
        value = weights[int(layer)][int(i), int(j)]
        assert sign == ("+" if value > 0 else "-") and color == ("#0877bd" if value > 0 else "#f59322")
    widths = {(int(k), int(i), int(j)): float(w) for k, i, j, _, _, w in edges}
    strongest = max(widths, key=lambda e: abs(weights[e[0]][e[1], e[2]]))
    assert widths[strongest] == max(widths.values()) == pytest.approx(6.0, abs=0.01)


def test_boundary_is_smooth_not_blocky():
    from workbench.widgets.playground.drawing import upsample

    model = PlaygroundModel(dataset="circle", hidden=(4,))
    model.step(100)
    model.data = model.data._replace(x_train=model.data.x_train[:0], y_train=model.data.y_train[:0])  # no points
    image = boundary_image(model, size=120, resolution=12).astype(int)
    changes = (np.abs(np.diff(image, axis=1)).sum(axis=2) > 0).sum(axis=1)
    assert np.median(changes) > 3 * 11  # colours change within cells, not only at the 11 cell borders
    assert np.abs(np.diff(image, axis=1)).max() < 30  # and by small steps
    ramp = upsample(np.array([[0.0, 1.0], [0.0, 1.0]]), 8)
    assert (np.diff(ramp[0]) >= 0).all() and len(np.unique(ramp[0])) == 6 and ramp[0, 0] == 0 and ramp[0, -1] == 1
    np.testing.assert_array_equal(ramp[0], ramp[-1])


def test_loss_chart_has_axes_and_a_legend():
    history = [{"step": s, "train_loss": 1.0 / s, "test_loss": 1.2 / s} for s in range(1, 50)]
    svg = loss_svg(history)
    assert svg.count('class="wb-axis"') == 2 and svg.count('class="wb-legend-item"') == 2
    assert ">train loss<" in svg and ">test loss<" in svg and ">step 49<" in svg and ">1.2<" in svg


def test_playground_plus_minus_buttons_regenerate_and_regression_from_code_and_clicks():
    app = Playground(size=60, resolution=10, hidden=(4, 2))
    layer_row, neuron_row = app.network_bar.children
    plus_layer = [b for b in layer_row.children[0].children if b.description == "+"][0]
    plus_layer.click()
    assert app.model.options.hidden == (4, 2, 2)
    assert app.network.value.count('class="wb-neuron"') == 8
    _, neuron_row = app.network_bar.children  # rebuilt for three layers
    assert len(neuron_row.children) == 1 + 3
    minus_first = [b for b in neuron_row.children[1].children if b.description == "-"][0]
    minus_first.click()
    assert app.model.options.hidden == (3, 2, 2)
    for _ in range(4):
        app.add_layer()
    assert app.model.options.hidden == (3, 2, 2, 2, 2, 2) and "at most 6 hidden layers" in app.status.value
    app.remove_layer()
    assert app.model.options.hidden == (3, 2, 2, 2, 2) and "color:#c00" not in app.status.value
    points = app.model.data.x_train.copy()
    buttons = {b.description: b for b in app.children[0].children}
    buttons["Regenerate"].click()
    assert app.model.options.seed == 1 and not np.array_equal(points, app.model.data.x_train)
    app.set(problem="regression")
    controls = _controls(app, "description")
    assert controls["data set"].options == ("plane", "multi_gaussian") and controls["data set"].value == "plane"
    controls["data set"].value = "multi_gaussian"
    record = app.step(10)
    assert app.model.options.dataset == "multi_gaussian" and "accuracy" not in app.status.value
    assert f"step {record['step']} " in app.status.value and app.network.value.count('class="wb-output"') == 1
