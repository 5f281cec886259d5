"""A neural-network playground in the spirit of TensorFlow Playground, on workbench graphs.

:class:`PlaygroundModel` holds the logic and needs no front end: it builds a
classifier of 2-D points as a workbench graph (placeholders, variables, an SGD
optimizer whose gradients the graph computes), trains it with a
:class:`~workbench.Session` in small steps and predicts over a grid.
:class:`Playground` is the ipywidgets app around it: data set, noise, features,
layers, activation, learning rate and regularization; play, pause and step;
the decision boundary (a PNG heat map) and the loss curves (SVG), redrawn
while it trains at most ``max_updates_per_s`` times a second.

>>> model = PlaygroundModel(dataset="gaussian", hidden=(), seed=1)
>>> model.step(20)["step"]
20
>>> model.predict_grid(resolution=8).shape
(8, 8)
"""

from __future__ import annotations

import dataclasses
import html
import struct
import threading
import time
import zlib

import ipywidgets as widgets
import numpy as np

import workbench as wb
from workbench import datasets
from workbench.widgets import snapshots
from workbench.widgets._base import Snapshot
from workbench.widgets.throttle import Throttle

ACTIVATIONS = {"relu": wb.relu, "tanh": wb.tanh, "sigmoid": wb.sigmoid, "linear": wb.identity}
REGULARIZATIONS = ("none", "l1", "l2")
LEARNING_RATES = (0.00001, 0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
REGULARIZATION_RATES = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)

# What each option changes: new data (and a new model), a new model, or only the next steps.
DATA_OPTIONS = frozenset({"dataset", "noise", "samples", "train_fraction", "seed"})
MODEL_OPTIONS = frozenset({"features", "hidden", "activation", "regularization"})


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything the playground lets one choose; the defaults are TensorFlow Playground's."""

    dataset: str = "circle"
    noise: float = 0.0
    samples: int = 500
    train_fraction: float = 0.5
    features: tuple[str, ...] = ("x1", "x2")
    hidden: tuple[int, ...] = (4, 2)
    activation: str = "tanh"
    learning_rate: float = 0.03
    regularization: str = "none"
    regularization_rate: float = 0.0
    batch_size: int = 10
    seed: int = 0

    def checked(self) -> Options:
        """These options with sequences made tuples, or ValueError naming the bad one."""
        opts = dataclasses.replace(self, features=tuple(self.features), hidden=tuple(int(u) for u in self.hidden))
        if opts.dataset not in datasets.DATASETS:
            raise ValueError(f"unknown data set {opts.dataset!r}; use one of {', '.join(datasets.DATASETS)}")
        if not opts.features or any(f not in datasets.FEATURES for f in opts.features):
            raise ValueError(f"features must be some of {', '.join(datasets.FEATURES)}, got {list(opts.features)}")
        if any(u < 1 for u in opts.hidden):
            raise ValueError(f"every hidden layer needs at least one unit, got {list(opts.hidden)}")
        if opts.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {opts.activation!r}; use one of {', '.join(ACTIVATIONS)}")
        if opts.regularization not in REGULARIZATIONS:
            raise ValueError(f"unknown regularization {opts.regularization!r}; use one of {', '.join(REGULARIZATIONS)}")
        if opts.learning_rate <= 0 or opts.regularization_rate < 0:
            raise ValueError(
                f"learning_rate must be positive and regularization_rate not negative, "
                f"got {opts.learning_rate} and {opts.regularization_rate}"
            )
        if not 1 <= opts.batch_size <= opts.samples * opts.train_fraction:
            raise ValueError(f"batch_size must be between 1 and the number of training points, got {opts.batch_size}")
        return opts


class PlaygroundModel:
    """A classifier of 2-D points built as a workbench graph and trained step by step.

    Parameters
    ----------
    **options
        Fields of :class:`Options` (``dataset``, ``noise``, ``features``, ``hidden``,
        ``activation``, ``learning_rate``, ``regularization``, ...).

    Attributes
    ----------
    data : datasets.Split
        The points and labels (the test part is never trained on).
    graph, session :
        The current model and the session that trains it.
    history : list of dict
        One record per call of :meth:`step`: ``step``, ``train_loss``, ``test_loss``,
        ``train_accuracy`` and ``test_accuracy``.
    """

    def __init__(self, **options):
        self.options = Options(**options).checked()
        self._make_data()
        self._build()

    # -- options -------------------------------------------------------------------------
    def set(self, **changes) -> bool:
        """Change options; returns True when that restarted training (new data or a new model).

        The learning rate, regularization rate and batch size take effect at the
        next step without a restart, as in TensorFlow Playground.
        """
        new = dataclasses.replace(self.options, **changes).checked()
        changed = {f.name for f in dataclasses.fields(Options) if getattr(new, f.name) != getattr(self.options, f.name)}
        self.options = new
        if changed & DATA_OPTIONS:
            self._make_data()
        if changed & (DATA_OPTIONS | MODEL_OPTIONS):
            self._build()
            return True
        return False

    def reset(self) -> None:
        """Start training again from the initial weights (the seed makes them the same)."""
        # cluster=False: train in this process even when %flow_cluster has set a default cluster
        self.session = wb.Session(self.graph, seed=self.options.seed, cluster=False)
        self._batch_rng = np.random.default_rng([self.options.seed, 1])
        self._order, self._cursor = np.arange(0), 0
        self.step_count = 0
        self.history: list[dict[str, float]] = []

    @property
    def steps_per_epoch(self) -> int:
        """Steps that together see every training point once."""
        return -(-len(self.data.y_train) // self.options.batch_size)

    @property
    def epoch(self) -> float:
        return self.step_count / self.steps_per_epoch

    def _make_data(self) -> None:
        o = self.options
        x, y = datasets.make_2d(o.dataset, samples=o.samples, noise=o.noise, seed=o.seed)
        self.data = datasets.split(x, y, o.train_fraction)

    # -- the model -------------------------------------------------------------------------
    def _build(self) -> None:
        o = self.options
        self.graph = g = wb.Graph(name="playground")
        with g.as_default():
            self.x = h = wb.placeholder("x", shape=(None, len(o.features)))
            self.y = wb.placeholder("y", shape=(None,), dtype="int64")
            self.lr = wb.placeholder("learning_rate", shape=())
            self.reg_rate = wb.placeholder("regularization_rate", shape=())
            weights = []
            sizes = [len(o.features), *o.hidden, 2]
            for i, (fan_in, units) in enumerate(zip(sizes, sizes[1:]), start=1):
                last = i == len(sizes) - 1
                with wb.name_scope("output" if last else f"layer{i}"):
                    w = wb.variable("w", shape=(fan_in, units), init="glorot_uniform")
                    b = wb.variable("b", shape=(units,), init=0.1)  # as the playground: keeps ReLUs alive
                    h = wb.matmul(h, w) + b
                    h = h if last else ACTIVATIONS[o.activation](h)
                weights.append(w)
            self.probability = wb.softmax(h)[:, 1]  # of label 1
            self.data_loss = wb.mean(wb.softmax_cross_entropy(h, self.y), name="data_loss")
            predicted = wb.cast(wb.greater(self.probability, 0.5), "int64")
            self.accuracy = wb.mean(wb.cast(wb.equal(predicted, self.y), "float32"), name="accuracy")
            loss = self.data_loss
            if o.regularization != "none":
                penalty = [wb.sum(wb.abs(w) if o.regularization == "l1" else w * w) for w in weights]
                loss = loss + self.reg_rate * _total(penalty)
            self.loss = loss
            self.train = wb.optimizers.SGD(self.lr).minimize(loss, name="train")
        self.reset()

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        return datasets.features(x, self.options.features)

    # -- training ----------------------------------------------------------------------------
    def step(self, n: int = 1) -> dict[str, float]:
        """Run ``n`` SGD steps on shuffled batches of the training points, then record the losses."""
        if n < 0:
            raise ValueError(f"step count must not be negative, got {n}")
        o = self.options
        inputs, labels = self._inputs(self.data.x_train), self.data.y_train
        rates = {self.lr: o.learning_rate, self.reg_rate: o.regularization_rate}
        for _ in range(n):
            idx = self._next_batch(len(labels), o.batch_size)
            self.session.run(self.train, {self.x: inputs[idx], self.y: labels[idx], **rates})
        self.step_count += n
        record = {"step": self.step_count, **self.losses()}
        self.history.append(record)
        return record

    def _next_batch(self, n: int, size: int) -> np.ndarray:
        # shuffled epochs; a batch that would run past the end starts a new epoch
        if self._cursor + size > len(self._order):
            self._order, self._cursor = self._batch_rng.permutation(n), 0
        idx = self._order[self._cursor : self._cursor + size]
        self._cursor += size
        return idx

    def losses(self) -> dict[str, float]:
        """Mean cross-entropy (without the penalty) and accuracy on the training and test points."""
        out = {}
        d = self.data
        for part, x, y in [("train", d.x_train, d.y_train), ("test", d.x_test, d.y_test)]:
            loss, acc = self.session.run([self.data_loss, self.accuracy], {self.x: self._inputs(x), self.y: y})
            out[f"{part}_loss"], out[f"{part}_accuracy"] = float(loss), float(acc)
        return out

    def predict(self, points) -> np.ndarray:
        """The probability of label 1 at each point (an array of shape (n, 2))."""
        points = np.asarray(points, dtype="float32").reshape(-1, 2)
        return self.session.run(self.probability, {self.x: self._inputs(points)})

    def predict_grid(self, resolution: int = 50) -> np.ndarray:
        """Probabilities over a ``resolution`` x ``resolution`` grid of the domain: row 0 at the top
        (largest x2), column 0 at the left (smallest x1), as an image is drawn."""
        lo, hi = datasets.DOMAIN
        ticks = lo + (np.arange(resolution) + 0.5) * (hi - lo) / resolution  # cell centers
        x1, x2 = np.meshgrid(ticks, ticks[::-1])
        return self.predict(np.stack([x1.ravel(), x2.ravel()], axis=1)).reshape(resolution, resolution)


def _total(terms):
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


# -- drawing: NumPy to PNG, history to SVG ------------------------------------------------------

NEGATIVE = np.array([245, 147, 34], dtype=float)  # label 0, orange
POSITIVE = np.array([8, 119, 189], dtype=float)  # label 1, blue
WHITE = np.array([255, 255, 255], dtype=float)


def boundary_image(model: PlaygroundModel, size: int = 300, resolution: int = 60, show_test: bool = False):
    """An RGB image (uint8, size x size) of the decision boundary with the data points on it."""
    p = model.predict_grid(resolution)[..., None]
    # light tints away from 0.5, white on the boundary; colored per cell, then scaled up
    colors = WHITE + (np.where(p > 0.5, POSITIVE, NEGATIVE) - WHITE) * (np.abs(2.0 * p - 1.0) * 0.6)
    cells = (np.arange(size) * resolution) // size
    image = colors[np.ix_(cells, cells)]
    parts = [(model.data.x_train, model.data.y_train, WHITE)]
    if show_test:
        parts.append((model.data.x_test, model.data.y_test, np.zeros(3)))
    for x, y, outline in parts:
        _draw_points(image, x, y, outline)
    return image.round().astype(np.uint8)


def _draw_points(image: np.ndarray, x: np.ndarray, y: np.ndarray, outline: np.ndarray, radius: float = 3.0) -> None:
    """Discs of the class colors with an ``outline`` ring, all points at once."""
    size = image.shape[0]
    lo, hi = datasets.DOMAIN
    cols = (x[:, 0] - lo) / (hi - lo) * size
    rows = (hi - x[:, 1]) / (hi - lo) * size
    r = int(np.ceil(radius)) + 1
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1].reshape(2, 1, -1)
    py, px = rows.astype(int)[:, None] + dy, cols.astype(int)[:, None] + dx  # (points, pixels of a stamp)
    dist = np.hypot(py + 0.5 - rows[:, None], px + 0.5 - cols[:, None])
    inside = (py >= 0) & (py < size) & (px >= 0) & (px < size)
    ring = inside & (dist > radius) & (dist <= radius + 1)
    disc = inside & (dist <= radius)
    fill = np.broadcast_to(np.where(y[:, None, None] == 1, POSITIVE, NEGATIVE), (*py.shape, 3))
    image[py[ring], px[ring]] = outline
    image[py[disc], px[disc]] = fill[disc]


def png(image: np.ndarray) -> bytes:
    """PNG bytes of an RGB uint8 image (height, width, 3), written with zlib alone."""
    height, width, _ = image.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, width * 3)], axis=1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    data = zlib.compress(rows.tobytes(), 1)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def loss_svg(history: list[dict[str, float]], width: int = 300, height: int = 90, max_points: int = 300) -> str:
    """An SVG of the training (dark) and test (orange) loss against the step."""
    lines = []
    if history:
        stride = max(1, -(-len(history) // max_points))
        shown = history[::stride] if history[-1] is history[::stride][-1] else [*history[::stride], history[-1]]
        steps = np.array([r["step"] for r in shown], dtype=float)
        values = {key: np.array([r[key] for r in shown], dtype=float) for key in ("train_loss", "test_loss")}
        finite = np.concatenate([v[np.isfinite(v)] for v in values.values()])
        top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        span = max(steps[-1] - steps[0], 1.0)
        for key, color in [("test_loss", "#f59322"), ("train_loss", "#333333")]:
            xs = (steps - steps[0]) / span * (width - 2) + 1
            ys = height - 1 - np.nan_to_num(values[key], nan=top, posinf=top).clip(0, top) / top * (height - 2)
            points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(xs, ys))
            lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="wb-playground-loss">'
        f'<rect width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>{"".join(lines)}</svg>'
    )


# -- the app ---------------------------------------------------------------------------------------


class Playground(Snapshot, widgets.VBox):
    """The playground app: controls on the left, the decision boundary and loss curves on the right.

    Parameters
    ----------
    size : int
        Width and height of the decision-boundary image, in pixels.
    resolution : int
        Grid cells along each side of the image at which the model is evaluated.
    **options
        Initial :class:`Options` (``dataset="xor"``, ``hidden=(4,)``, ...).

    Play trains in a background thread, ``steps_per_chunk`` steps at a time, and
    redraws at most ``max_updates_per_s`` times a second, so the notebook stays
    responsive; Step runs one epoch. Everything the buttons do is also a method
    (:meth:`play`, :meth:`pause`, :meth:`step`, :meth:`reset`), and
    :attr:`model` is the :class:`PlaygroundModel` being trained.
    """

    steps_per_chunk = 10
    max_updates_per_s = 10.0

    def __init__(self, size: int = 300, resolution: int = 100, **options):
        super().__init__()
        self.model = PlaygroundModel(**options)
        self.size, self.resolution = int(size), int(resolution)
        self.draws = 0
        self._lock = threading.RLock()  # guards the model: the training thread and the widgets share it
        self._draw_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._message = ""
        self._syncing = False  # True while the controls are set from the model's options
        self.image = widgets.Image(format="png", width=self.size, height=self.size)
        self.curves = widgets.HTML()
        self.status = widgets.HTML()
        plots = widgets.VBox([self.image, self.curves])
        self.children = [self._buttons(), widgets.HBox([self._controls(), plots]), self.status]
        self.add_class("wb-playground")
        self.redraw()

    # -- actions -----------------------------------------------------------------------------
    @property
    def playing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def play(self) -> None:
        """Train continuously in the background until :meth:`pause`."""
        if self.playing:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._train, name="workbench-playground", daemon=True)
        self._thread.start()
        self._play_button.description, self._play_button.icon = "Pause", "pause"

    def pause(self, timeout: float = 10.0) -> None:
        """Stop training after the current chunk of steps."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._play_button.description, self._play_button.icon = "Play", "play"
        self.refresh_snapshot()

    def step(self, n: int | None = None) -> dict[str, float]:
        """Run ``n`` training steps (one epoch by default) and redraw."""
        with self._lock:
            record = self.model.step(self.model.steps_per_epoch if n is None else n)
        self.redraw()
        return record

    def reset(self) -> None:
        """Start training again from the initial weights."""
        with self._lock:
            self.model.reset()
        self.redraw()

    def set(self, **changes) -> bool:
        """Change options as the controls do; a bad value is shown in the status line, not raised."""
        try:
            with self._lock:
                restarted = self.model.set(**changes)
        except ValueError as e:
            self._message = str(e)
            self.redraw()
            return False
        self._message = ""
        self._show_options()
        self.redraw()
        return restarted

    def _set_from_control(self, option: str, convert, value) -> None:
        if self._syncing:
            return
        try:
            value = convert(value)
        except ValueError as e:
            self._message = str(e)
            self.redraw()
            return
        self.set(**{option: value})

    def close(self) -> None:
        self.pause()
        super().close()

    def _train(self) -> None:
        throttle = Throttle(self.redraw, max_rate=self.max_updates_per_s)
        try:
            while not self._stop.is_set():
                with self._lock:
                    self.model.step(self.steps_per_chunk)
                throttle.request()
                time.sleep(0.001)  # let the kernel's own thread take the GIL and handle messages
        except Exception as e:  # shown to the user, who can change options and play again
            self._message = f"training stopped: {type(e).__name__}: {e}"
            self._stop.set()
        self.redraw()

    # -- drawing -----------------------------------------------------------------------------
    def redraw(self) -> None:
        """Draw the boundary, the loss curves and the status line from the model as it is now."""
        with self._draw_lock:
            with self._lock:
                image = boundary_image(self.model, self.size, self.resolution, self._show_test.value)
                history = list(self.model.history)
                record = history[-1] if history else {"step": 0, **self.model.losses()}
                epoch = self.model.epoch
            self.image.value = png(image)
            self.curves.value = loss_svg(history, width=self.size)
            self.status.value = _status_html(record, epoch, self._message)
            self.draws += 1
        if not self.playing:  # not from the training thread: the saved picture follows
            self.refresh_snapshot()

    def snapshot_state(self):
        return self.image.value, self.curves.value, self.status.value

    def render_snapshot(self, state) -> str:
        return snapshots.playground_svg(state[0], self.size, *state[1:])

    # -- controls ----------------------------------------------------------------------------
    def _buttons(self) -> widgets.HBox:
        self._play_button = widgets.Button(description="Play", icon="play", button_style="primary")
        self._play_button.on_click(lambda _: self.pause() if self.playing else self.play())
        step = widgets.Button(description="Step", icon="step-forward", tooltip="train one epoch")
        step.on_click(lambda _: self.step())
        reset = widgets.Button(description="Reset", icon="undo", tooltip="start again from the initial weights")
        reset.on_click(lambda _: self.reset())
        return widgets.HBox([self._play_button, step, reset])

    def _controls(self) -> widgets.VBox:
        o = self.model.options
        style = {"description_width": "110px"}
        self._inputs: dict[str, widgets.ValueWidget] = {}

        def control(option, make, description, convert=lambda v: v, **kwargs):
            widget = make(value=_shown(o, option), description=description, style=style, **kwargs)
            widget.observe(lambda change: self._set_from_control(option, convert, change["new"]), names="value")
            self._inputs[option] = widget
            return widget

        self._feature_boxes = {
            name: widgets.Checkbox(value=name in o.features, description=name, indent=False, layout={"width": "80px"})
            for name in datasets.FEATURES
        }
        for box in self._feature_boxes.values():
            box.observe(lambda _: self._set_from_control("features", _checked, self._feature_boxes), names="value")
        self._show_test = widgets.Checkbox(value=False, description="show test data", style=style)
        self._show_test.observe(lambda _: self.redraw(), names="value")
        grid = {"grid_template_columns": "repeat(4, 80px)"}
        features = widgets.GridBox(list(self._feature_boxes.values()), layout=grid)
        rows = [
            widgets.HTML("<b>Data</b>"),
            control("dataset", widgets.Dropdown, "data set", options=datasets.DATASETS),
            control("noise", widgets.FloatSlider, "noise", min=0, max=0.5, step=0.05),
            control("train_fraction", widgets.FloatSlider, "training part", min=0.1, max=0.9, step=0.1),
            self._show_test,
            widgets.HTML("<b>Features</b>"),
            features,
            widgets.HTML("<b>Network</b>"),
            control("hidden", widgets.Text, "hidden units", _parse_units, placeholder="e.g. 4, 2",
                    continuous_update=False),  # fmt: skip
            control("activation", widgets.Dropdown, "activation", options=list(ACTIVATIONS)),
            widgets.HTML("<b>Training</b>"),
            control("learning_rate", widgets.Dropdown, "learning rate",
                    options=_choices(LEARNING_RATES, o.learning_rate)),  # fmt: skip
            control("regularization", widgets.Dropdown, "regularization", options=REGULARIZATIONS),
            control("regularization_rate", widgets.Dropdown, "reg. rate",
                    options=_choices(REGULARIZATION_RATES, o.regularization_rate)),  # fmt: skip
            control("batch_size", widgets.IntSlider, "batch size", min=1, max=max(30, o.batch_size)),
        ]
        return widgets.VBox(rows, layout={"width": "360px"})

    def _show_options(self) -> None:
        """Make the controls show the model's options (after a change from code)."""
        o = self.model.options
        self._syncing = True
        try:
            for option, widget in self._inputs.items():
                value = _shown(o, option)
                rate = option in ("learning_rate", "regularization_rate")
                if rate and value not in [v for _, v in widget.options]:  # a rate set from code joins the list
                    rates = LEARNING_RATES if option == "learning_rate" else REGULARIZATION_RATES
                    widget.options = _choices(rates, value)
                if isinstance(widget, widgets.IntSlider):
                    widget.max = max(widget.max, value)
                widget.value = value
            for name, box in self._feature_boxes.items():
                box.value = name in o.features
        finally:
            self._syncing = False


def _shown(options: Options, option: str):
    """An option's value as its control shows it."""
    value = getattr(options, option)
    return ", ".join(map(str, value)) if option == "hidden" else value


def _checked(boxes: dict[str, widgets.Checkbox]) -> list[str]:
    return [name for name, box in boxes.items() if box.value]


def _parse_units(text: str) -> tuple[int, ...]:
    """"4, 2" -> (4, 2); "" -> () (no hidden layer)."""
    parts = text.replace(",", " ").split()
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"hidden units are whole numbers separated by commas, like 4, 2; got {text!r}")
    return tuple(int(p) for p in parts)


def _choices(values, current) -> list[tuple[str, float]]:
    values = sorted({*values, current})
    return [(f"{v:g}", v) for v in values]


def _status_html(record: dict[str, float], epoch: float, message: str) -> str:
    text = (
        f"step {record['step']:,} (epoch {epoch:.1f}) &middot; train loss {record['train_loss']:.3f} "
        f"&middot; test loss {record['test_loss']:.3f} &middot; test accuracy {record['test_accuracy']:.1%}"
    )
    if message:
        text += f'<br><span style="color:#c00">{html.escape(message)}</span>'
    return f'<div class="wb-playground-status" style="font-family:monospace">{text}</div>'
