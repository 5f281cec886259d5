"""The playground's model: a small network of 2-D points built as a workbench graph, trained step by step.

:class:`PlaygroundModel` needs no front end: it builds the network as a workbench
graph (placeholders, variables, an SGD optimizer whose gradients the graph
computes), trains it with a :class:`~workbench.Session` in small steps and
evaluates it over a grid of the plane.

>>> model = PlaygroundModel(dataset="gaussian", hidden=(), seed=1)
>>> model.step(20)["step"]
20
>>> model.predict_grid(resolution=8).shape
(8, 8)
"""

from __future__ import annotations

import dataclasses

import numpy as np

import workbench as wb
from workbench import datasets

ACTIVATIONS = {"relu": wb.relu, "tanh": wb.tanh, "sigmoid": wb.sigmoid, "linear": wb.identity}
REGULARIZATIONS = ("none", "l1", "l2")
LEARNING_RATES = (0.00001, 0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
REGULARIZATION_RATES = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)

PROBLEMS = {"classification": datasets.DATASETS, "regression": datasets.REGRESSION_DATASETS}
MAX_LAYERS, MAX_NEURONS = 6, 8  # hidden layers, and neurons in each, as TensorFlow Playground allows

# What each option changes: new data (and a new model), a new model, or only the next steps.
DATA_OPTIONS = frozenset({"problem", "dataset", "noise", "samples", "train_fraction", "seed"})
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
    problem: str = "classification"

    def checked(self) -> Options:
        """These options with sequences made tuples, or ValueError naming the bad one."""
        opts = dataclasses.replace(self, features=tuple(self.features), hidden=tuple(int(u) for u in self.hidden))
        if opts.problem not in PROBLEMS:
            raise ValueError(f"unknown problem type {opts.problem!r}; use one of {', '.join(PROBLEMS)}")
        if opts.dataset not in PROBLEMS[opts.problem]:
            names = ", ".join(PROBLEMS[opts.problem])
            raise ValueError(f"unknown data set {opts.dataset!r} for {opts.problem}; use one of {names}")
        if not opts.features or any(f not in datasets.FEATURES for f in opts.features):
            raise ValueError(f"features must be some of {', '.join(datasets.FEATURES)}, got {list(opts.features)}")
        if any(u < 1 for u in opts.hidden):
            raise ValueError(f"every hidden layer needs at least one unit, got {list(opts.hidden)}")
        if len(opts.hidden) > MAX_LAYERS or any(u > MAX_NEURONS for u in opts.hidden):
            raise ValueError(
                f"at most {MAX_LAYERS} hidden layers of at most {MAX_NEURONS} neurons, got {list(opts.hidden)}"
            )
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
    """A network on 2-D points (a classifier, or a regression of a value in [-1, 1]) built as a
    workbench graph and trained step by step.

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
        One record per call of :meth:`step`: ``step``, ``train_loss``, ``test_loss``, and for
        classification ``train_accuracy`` and ``test_accuracy``.
    """

    def __init__(self, **options):
        self.options = Options(**_dataset_for_problem(Options(), options)).checked()
        self._make_data()
        self._build()

    # -- options -------------------------------------------------------------------------
    def set(self, **changes) -> bool:
        """Change options; returns True when that restarted training (new data or a new model).

        The learning rate, regularization rate and batch size take effect at the
        next step without a restart, as in TensorFlow Playground.
        """
        new = dataclasses.replace(self.options, **_dataset_for_problem(self.options, changes)).checked()
        changed = {f.name for f in dataclasses.fields(Options) if getattr(new, f.name) != getattr(self.options, f.name)}
        self.options = new
        if changed & DATA_OPTIONS:
            self._make_data()
        if changed & (DATA_OPTIONS | MODEL_OPTIONS):
            self._build()
            return True
        return False

    def regenerate(self) -> bool:
        """New data of the same kind (the next seed), and a new model to train on it."""
        return self.set(seed=self.options.seed + 1)

    def add_layer(self) -> bool:
        """One more hidden layer (as wide as the last one, or 2 neurons), up to 6."""
        hidden = self.options.hidden
        return self.set(hidden=(*hidden, hidden[-1] if hidden else 2))

    def remove_layer(self) -> bool:
        """Drop the last hidden layer (none left: inputs feed the output directly)."""
        if not self.options.hidden:
            raise ValueError("there is no hidden layer to remove")
        return self.set(hidden=self.options.hidden[:-1])

    def resize_layer(self, layer: int, change: int) -> bool:
        """Add (``change=1``) or remove (``-1``) neurons of hidden layer ``layer`` (0 is the first)."""
        hidden = list(self.options.hidden)
        if not 0 <= layer < len(hidden):
            raise ValueError(f"no hidden layer {layer}; there are {len(hidden)}")
        hidden[layer] += change
        return self.set(hidden=tuple(hidden))

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
        make = datasets.make_regression_2d if o.problem == "regression" else datasets.make_2d
        x, y = make(o.dataset, samples=o.samples, noise=o.noise, seed=o.seed)
        self.data = datasets.split(x, y, o.train_fraction)

    # -- the model -------------------------------------------------------------------------
    def _build(self) -> None:
        o = self.options
        regression = o.problem == "regression"
        self.graph = g = wb.Graph(name="playground")
        with g.as_default():
            self.x = h = wb.placeholder("x", shape=(None, len(o.features)))
            self.y = wb.placeholder("y", shape=(None,), dtype="float32" if regression else "int64")
            self.lr = wb.placeholder("learning_rate", shape=())
            self.reg_rate = wb.placeholder("regularization_rate", shape=())
            self.weights, self.neurons = [], []  # each layer's weight variable; each hidden layer's output
            sizes = [len(o.features), *o.hidden, 1 if regression else 2]
            for i, (fan_in, units) in enumerate(zip(sizes, sizes[1:]), start=1):
                last = i == len(sizes) - 1
                with wb.name_scope("output" if last else f"layer{i}"):
                    w = wb.variable("w", shape=(fan_in, units), init="glorot_uniform")
                    b = wb.variable("b", shape=(units,), init=0.1)  # as the playground: keeps ReLUs alive
                    h = wb.matmul(h, w) + b
                    if not last:
                        h = ACTIVATIONS[o.activation](h)
                        self.neurons.append(h)
                self.weights.append(w)
            self._head(h, regression)
            loss = self.data_loss
            if o.regularization != "none":
                penalty = [wb.sum(wb.abs(w) if o.regularization == "l1" else w * w) for w in self.weights]
                loss = loss + self.reg_rate * _total(penalty)
            self.loss = loss
            self.train = wb.optimizers.SGD(self.lr).minimize(loss, name="train")
        self.reset()

    def _head(self, h, regression: bool) -> None:
        """The prediction, the loss and the accuracy: half the squared error of the value for
        regression; for classification, cross-entropy and accuracy of the probability of label 1."""
        if regression:
            self.prediction = self.value = h[:, 0]
            error = self.value - self.y
            self.data_loss = wb.mean(0.5 * error * error, name="data_loss")
            self.accuracy = None
            return
        self.prediction = wb.softmax(h)[:, 1]  # of label 1
        self.value = 2.0 * self.prediction - 1.0  # on the regression's scale, for the pictures
        self.data_loss = wb.mean(wb.softmax_cross_entropy(h, self.y), name="data_loss")
        self.accuracy = wb.accuracy(h, self.y)

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
        """The data loss (without the penalty) on the training and test points, and for
        classification the accuracy."""
        out = {}
        d = self.data
        metrics = (
            {"loss": self.data_loss} if self.accuracy is None else {"loss": self.data_loss, "accuracy": self.accuracy}
        )
        for part, x, y in [("train", d.x_train, d.y_train), ("test", d.x_test, d.y_test)]:
            values = self.session.run(metrics, {self.x: self._inputs(x), self.y: y})
            out.update({f"{part}_{k}": float(v) for k, v in values.items()})
        return out

    def predict(self, points) -> np.ndarray:
        """At each point (an array of shape (n, 2)): the probability of label 1, or the regression's value."""
        points = np.asarray(points, dtype="float32").reshape(-1, 2)
        return self.session.run(self.prediction, {self.x: self._inputs(points)})

    def neuron_grids(self, resolution: int = 20) -> dict[str, list[np.ndarray]]:
        """What each neuron computes over a grid of the plane (as :meth:`predict_grid` lays it out):
        ``"features"`` (one grid per input feature), ``"layers"`` (per hidden layer, an array of shape
        (neurons, resolution, resolution)) and ``"output"`` (the prediction in [-1, 1])."""
        points = grid_points(resolution)
        inputs = self._inputs(points)
        values = self.session.run([*self.neurons, self.value], {self.x: inputs})
        as_grids = lambda a: np.moveaxis(a.reshape(resolution, resolution, -1), -1, 0)  # noqa: E731
        return {
            "features": list(as_grids(inputs)),
            "layers": [as_grids(v) for v in values[:-1]],
            "output": np.clip(values[-1].reshape(resolution, resolution), -1.0, 1.0),
        }

    def weight_values(self) -> list[np.ndarray]:
        """The current weight matrix of each layer, (fan_in, units), inputs first; the output layer's
        as one column, for a classifier the weights of label 1's logit minus label 0's (which its
        probability follows)."""
        values = [self.session.variables[w.name] for w in self.weights]
        if self.options.problem == "classification":
            values[-1] = values[-1][:, 1:] - values[-1][:, :1]
        return values

    def predict_grid(self, resolution: int = 50) -> np.ndarray:
        """Probabilities over a ``resolution`` x ``resolution`` grid of the domain: row 0 at the top
        (largest x2), column 0 at the left (smallest x1), as an image is drawn."""
        return self.predict(grid_points(resolution)).reshape(resolution, resolution)


def grid_points(resolution: int) -> np.ndarray:
    """The centers of a ``resolution`` x ``resolution`` grid of the domain, row by row from the top
    (largest x2), each row from the left (smallest x1): shape (resolution**2, 2)."""
    lo, hi = datasets.DOMAIN
    ticks = lo + (np.arange(resolution) + 0.5) * (hi - lo) / resolution
    x1, x2 = np.meshgrid(ticks, ticks[::-1])
    return np.stack([x1.ravel(), x2.ravel()], axis=1).astype("float32")


def _dataset_for_problem(current: Options, changes: dict) -> dict:
    """``changes`` with the first data set of a newly chosen problem type when none is named."""
    problem = changes.get("problem", current.problem)
    dataset = changes.get("dataset", current.dataset)
    if "dataset" not in changes and problem in PROBLEMS and dataset not in PROBLEMS[problem]:
        return {**changes, "dataset": PROBLEMS[problem][0]}
    return dict(changes)


def _total(terms):
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total
