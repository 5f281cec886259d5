"""The playground app: ipywidgets controls around a :class:`PlaygroundModel` and its pictures."""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as widgets

from workbench import datasets
from workbench.widgets.playground.drawing import COLUMN_W, boundary_image, loss_svg, network_svg, png
from workbench.widgets.playground.model import (
    ACTIVATIONS,
    LEARNING_RATES,
    PROBLEMS,
    REGULARIZATION_RATES,
    REGULARIZATIONS,
    Options,
    PlaygroundModel,
)
from workbench.widgets import snapshots
from workbench.widgets._base import Snapshot
from workbench.widgets.throttle import Throttle


class Playground(Snapshot, widgets.VBox):
    """The playground app: controls on the left; the network in the middle, drawn as features ->
    neurons -> output with a heat map per neuron and an edge per weight, with +/- buttons for
    layers and neurons; the model's output over the plane and the loss chart on the right.

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
    (:meth:`play`, :meth:`pause`, :meth:`step`, :meth:`reset`, :meth:`regenerate`,
    :meth:`add_layer`, :meth:`remove_layer`, :meth:`add_neuron`, :meth:`remove_neuron`,
    :meth:`set`), and :attr:`model` is the :class:`PlaygroundModel` being trained.
    """

    steps_per_chunk = 10
    max_updates_per_s = 10.0
    network_resolution = 20  # grid cells along each side of a neuron's heat map

    def __init__(self, size: int = 300, resolution: int = 50, **options):
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
        self.network = widgets.HTML()
        self.network_bar = widgets.VBox()
        self._drawn_hidden: tuple[int, ...] | None = None
        plots = widgets.VBox([self.image, self.curves])
        middle = widgets.VBox([self.network_bar, self.network], layout={"margin": "0 12px"})
        panels = widgets.HBox([self._controls(), middle, plots], layout={"flex_flow": "row wrap"})
        self.children = [self._buttons(), panels, self.status]
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
        return self._change(lambda: self.model.set(**changes))

    def regenerate(self) -> bool:
        """New data of the same kind, and a new model to train on it (the "regenerate" button)."""
        return self._change(self.model.regenerate)

    def add_layer(self) -> bool:
        """One more hidden layer, up to 6 (the + by "hidden layers")."""
        return self._change(self.model.add_layer)

    def remove_layer(self) -> bool:
        """Drop the last hidden layer."""
        return self._change(self.model.remove_layer)

    def add_neuron(self, layer: int) -> bool:
        """One more neuron in hidden layer ``layer`` (0 is the first), up to 8."""
        return self._change(lambda: self.model.resize_layer(layer, 1))

    def remove_neuron(self, layer: int) -> bool:
        """One neuron fewer in hidden layer ``layer`` (at least one stays)."""
        return self._change(lambda: self.model.resize_layer(layer, -1))

    def _change(self, change) -> bool:
        """Apply a change of options (True when it restarted training); a refused one is shown."""
        try:
            with self._lock:
                restarted = change()
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
                network = network_svg(self.model, self.network_resolution)
                hidden = self.model.options.hidden
            self.image.value = png(image)
            self.curves.value = loss_svg(history, width=self.size)
            self.network.value = network
            if hidden != self._drawn_hidden:
                self.network_bar.children = self._network_controls(hidden)
                self._drawn_hidden = hidden
            self.status.value = _status_html(record, epoch, self._message)
            self.draws += 1
        if not self.playing:  # not from the training thread: the saved picture follows
            self.refresh_snapshot()

    def snapshot_state(self):
        return self.network.value, self.image.value, self.curves.value, self.status.value

    def render_snapshot(self, state) -> str:
        network, image, curves, status = state
        return snapshots.playground_svg(image, self.size, curves, status, network_svg=network)

    # -- controls ----------------------------------------------------------------------------
    def _buttons(self) -> widgets.HBox:
        self._play_button = widgets.Button(description="Play", icon="play", button_style="primary")
        self._play_button.on_click(lambda _: self.pause() if self.playing else self.play())
        step = widgets.Button(description="Step", icon="step-forward", tooltip="train one epoch")
        step.on_click(lambda _: self.step())
        reset = widgets.Button(description="Reset", icon="undo", tooltip="start again from the initial weights")
        reset.on_click(lambda _: self.reset())
        regenerate = widgets.Button(description="Regenerate", icon="refresh", tooltip="new data of the same kind")
        regenerate.on_click(lambda _: self.regenerate())
        return widgets.HBox([self._play_button, step, reset, regenerate])

    def _network_controls(self, hidden: tuple[int, ...]) -> list[widgets.Widget]:
        """The +/- buttons: for the number of hidden layers, and under it, above each hidden
        layer's column of the drawing, for its neurons."""

        def pair(tooltip: str, minus, plus, width: str) -> widgets.HBox:
            buttons = []
            for text, action in (("-", minus), ("+", plus)):
                b = widgets.Button(
                    description=text,
                    tooltip=f"{'remove' if text == '-' else 'add'} {tooltip}",
                    layout={"width": "30px", "padding": "0"},
                )
                b.on_click(lambda _, action=action: action())
                b.add_class("wb-playground-" + ("minus" if text == "-" else "plus"))
                buttons.append(b)
            return widgets.HBox(buttons, layout={"width": width, "justify_content": "center"})

        layers = pair("a hidden layer", self.remove_layer, self.add_layer, "auto")
        label = widgets.HTML(f"<b>{len(hidden)} hidden layer{'s' if len(hidden) != 1 else ''}</b>")
        neurons = [widgets.Box(layout={"width": f"{COLUMN_W + 40}px"})]  # over the features column
        for k in range(len(hidden)):
            box = pair(
                f"a neuron of layer {k + 1}",
                lambda k=k: self.remove_neuron(k),
                lambda k=k: self.add_neuron(k),
                f"{COLUMN_W}px",
            )
            box.add_class("wb-playground-layer-buttons")
            neurons.append(box)
        return [widgets.HBox([layers, label]), widgets.HBox(neurons)]

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
            control("problem", widgets.Dropdown, "problem type", options=list(PROBLEMS)),
            control("dataset", widgets.Dropdown, "data set", options=PROBLEMS[o.problem]),
            control("noise", widgets.FloatSlider, "noise", min=0, max=0.5, step=0.05),
            control("train_fraction", widgets.FloatSlider, "training part", min=0.1, max=0.9, step=0.1),
            self._show_test,
            widgets.HTML("<b>Features</b>"),
            features,
            widgets.HTML("<b>Network</b>"),
            control(
                "hidden", widgets.Text, "hidden units", _parse_units, placeholder="e.g. 4, 2", continuous_update=False
            ),
            control("activation", widgets.Dropdown, "activation", options=list(ACTIVATIONS)),
            widgets.HTML("<b>Training</b>"),
            control(
                "learning_rate", widgets.Dropdown, "learning rate", options=_choices(LEARNING_RATES, o.learning_rate)
            ),
            control("regularization", widgets.Dropdown, "regularization", options=REGULARIZATIONS),
            control(
                "regularization_rate",
                widgets.Dropdown,
                "reg. rate",
                options=_choices(REGULARIZATION_RATES, o.regularization_rate),
            ),
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
                if option == "dataset":
                    widget.options = PROBLEMS[o.problem]
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
    """ "4, 2" -> (4, 2); "" -> () (no hidden layer)."""
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
        f"&middot; test loss {record['test_loss']:.3f}"
    )
    if "test_accuracy" in record:
        text += f" &middot; test accuracy {record['test_accuracy']:.1%}"
    if message:
        text += f'<br><span style="color:#c00">{html.escape(message)}</span>'
    return f'<div class="wb-playground-status" style="font-family:monospace">{text}</div>'
