"""Small 2-D classification data sets and input features, in the style of TensorFlow Playground.

Every set is generated with NumPy from a seed (no downloads). Points lie in
about [-6, 6] x [-6, 6]; labels are 0 and 1.

>>> from workbench import datasets
>>> x, y = datasets.make_2d("xor", samples=4, seed=0)
>>> x.shape, x.dtype.name, y.dtype.name
((4, 2), 'float32', 'int64')
>>> datasets.features(x[:1] * 0 + 2.0, ["x1", "x1^2", "x1*x2"]).tolist()
[[2.0, 4.0, 4.0]]
"""

from __future__ import annotations

from typing import NamedTuple
from collections.abc import Callable, Sequence

import numpy as np

DATASETS = ("circle", "xor", "gaussian", "spiral")

#: Regression sets: a value in [-1, 1] at each point instead of a class.
REGRESSION_DATASETS = ("plane", "multi_gaussian")

#: The extent of the data: points (before noise) and the decision-boundary grid lie within it.
DOMAIN = (-6.0, 6.0)

RADIUS = 5.0  # circle and spiral radius, xor half-width

FEATURES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "x1": lambda x1, x2: x1,
    "x2": lambda x1, x2: x2,
    "x1^2": lambda x1, x2: x1 * x1,
    "x2^2": lambda x1, x2: x2 * x2,
    "x1*x2": lambda x1, x2: x1 * x2,
    "sin x1": lambda x1, x2: np.sin(x1),
    "sin x2": lambda x1, x2: np.sin(x2),
}


class Split(NamedTuple):
    """Points and labels of a data set, split into training and test parts."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def make_2d(name: str, samples: int = 500, noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` points of data set ``name`` and their labels, half of each class.

    Parameters
    ----------
    name : {"circle", "xor", "gaussian", "spiral"}
    samples : int
        Number of points (an even number gives equal classes).
    noise : float
        From 0 (clean) to 0.5 (classes overlap), as the playground's noise slider.
    seed : int
        The same seed gives the same points.

    Returns
    -------
    x : float32 array of shape (samples, 2)
    y : int64 array of shape (samples,), 0 or 1
    """
    if name not in _GENERATORS:
        raise ValueError(f"unknown data set {name!r}; use one of {', '.join(DATASETS)}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be between 0 and 1, got {noise}")
    if samples < 2:
        raise ValueError(f"need at least 2 samples, got {samples}")
    rng = np.random.default_rng([seed, DATASETS.index(name)])
    x, y = _GENERATORS[name](rng, samples, float(noise))
    order = rng.permutation(samples)
    return x[order].astype("float32"), y[order].astype("int64")


def make_regression_2d(name: str, samples: int = 500, noise: float = 0.0, seed: int = 0):
    """``samples`` uniform points of the domain and a value in [-1, 1] at each, as TensorFlow Playground's
    regression sets: ``"plane"`` (the value grows along x1 + x2) or ``"multi_gaussian"`` (six bumps,
    alternately positive and negative). ``noise`` moves the points (the value stays that of the clean point).

    Returns
    -------
    x : float32 array of shape (samples, 2)
    y : float32 array of shape (samples,), in [-1, 1]
    """
    if name not in REGRESSION_DATASETS:
        raise ValueError(f"unknown regression data set {name!r}; use one of {', '.join(REGRESSION_DATASETS)}")
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be between 0 and 1, got {noise}")
    rng = np.random.default_rng([seed, len(DATASETS) + REGRESSION_DATASETS.index(name)])
    x = rng.uniform(-RADIUS, RADIUS, (samples, 2))
    if name == "plane":
        y = (x[:, 0] + x[:, 1]) / (2 * RADIUS)
    else:
        centers = np.array([[-4, 2.5], [0, 2.5], [4, 2.5], [-4, -2.5], [0, -2.5], [4, -2.5]])
        signs = np.array([1, -1, 1, -1, 1, -1])
        bumps = np.exp(-((x[:, None, :] - centers) ** 2).sum(axis=2) / (2 * 1.2**2))
        y = (bumps * signs).sum(axis=1)
    x = x + rng.uniform(-RADIUS, RADIUS, x.shape) * noise
    return x.astype("float32"), np.clip(y, -1.0, 1.0).astype("float32")


def split(x: np.ndarray, y: np.ndarray, train_fraction: float = 0.5) -> Split:
    """The first ``train_fraction`` of the (already shuffled) points for training, the rest for testing."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be between 0 and 1 (exclusive), got {train_fraction}")
    n = min(max(int(round(len(x) * train_fraction)), 1), len(x) - 1)
    return Split(x[:n], y[:n], x[n:], y[n:])


def features(x: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """The columns ``names`` (keys of :data:`FEATURES`) computed from points ``x`` of shape (n, 2)."""
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"unknown feature {unknown[0]!r}; use some of {', '.join(FEATURES)}")
    if not names:
        raise ValueError("choose at least one input feature")
    x = np.asarray(x, dtype="float32")
    x1, x2 = x[:, 0], x[:, 1]
    return np.stack([FEATURES[n](x1, x2) for n in names], axis=1).astype("float32")


# -- generators: (rng, samples, noise) -> (x, y) ---------------------------------------------


def _circle(rng, samples, noise):
    n_in = samples // 2
    radius = np.concatenate([rng.uniform(0, RADIUS * 0.5, n_in), rng.uniform(RADIUS * 0.7, RADIUS, samples - n_in)])
    angle = rng.uniform(0, 2 * np.pi, samples)
    x = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)
    x += rng.uniform(-RADIUS, RADIUS, x.shape) * noise
    # as in the playground, the label follows the noisy point, so noise blurs the ring, not the labels
    y = np.hypot(x[:, 0], x[:, 1]) < RADIUS * 0.5
    return x, y


def _xor(rng, samples, noise):
    x = rng.uniform(-RADIUS, RADIUS, (samples, 2))
    x += np.where(x > 0, 0.3, -0.3)  # keep points off the axes
    noisy = x + rng.uniform(-RADIUS, RADIUS, x.shape) * noise
    y = noisy[:, 0] * noisy[:, 1] >= 0
    return x, y


def _gaussian(rng, samples, noise):
    spread = 0.5 + 3.5 * min(noise, 0.5) / 0.5  # the playground's variance scale: 0.5 to 4
    n_pos = samples // 2
    centers = np.concatenate([np.full((n_pos, 2), 2.0), np.full((samples - n_pos, 2), -2.0)])
    x = centers + rng.normal(0.0, np.sqrt(spread), (samples, 2))
    y = np.arange(samples) < n_pos
    return x, y


def _spiral(rng, samples, noise):
    half = samples // 2
    parts, labels = [], []
    for label, (n, delta) in enumerate([(samples - half, np.pi), (half, 0.0)]):
        i = np.arange(n) / max(n, 1)
        r = i * RADIUS
        t = 1.75 * i * 2 * np.pi + delta
        parts.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1) + rng.uniform(-1, 1, (n, 2)) * noise)
        labels.append(np.full(n, label))
    return np.concatenate(parts), np.concatenate(labels).astype(bool)


_GENERATORS = {"circle": _circle, "xor": _xor, "gaussian": _gaussian, "spiral": _spiral}


def digits(seed: int = 0, test_fraction: float = 0.25) -> Split:
    """scikit-learn's bundled 8x8 digits (no download), scaled to [0, 1] as float32 rows of 64,
    with int64 labels, split with a stratified, seeded shuffle (1347 training, 450 test images):
    the split ``make demo`` and :mod:`workbench.models` train on."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = (bunch.data / 16.0).astype("float32")
    y = bunch.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return Split(x_train, y_train, x_test, y_test)
