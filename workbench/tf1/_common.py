"""What the TensorFlow 1.x names share: argument spellings, random constants, unsupported names."""

from __future__ import annotations

import weakref

import numpy as np

from workbench.errors import ArgumentError, WorkbenchError
from workbench.graph.core import Graph, get_default_graph


class UnsupportedError(WorkbenchError, NotImplementedError):
    """A TensorFlow 1.x name that workbench has no equivalent for; the message says what to use."""


def unsupported(name: str, instead: str):
    """A function that raises :class:`UnsupportedError` for ``tf.<name>``, saying what to use instead."""

    def refuse(*args, **kwargs):
        raise UnsupportedError(f"tf.{name} has no workbench equivalent: {instead}")

    refuse.__name__ = name.rsplit(".", 1)[-1]
    refuse.__qualname__ = refuse.__name__
    refuse.__doc__ = f"Not available in workbench: {instead}"
    return refuse


def one_of(new, old, new_name: str, old_name: str):
    """The value of an argument TensorFlow spells two ways (``axis`` / ``reduction_indices``)."""
    if new is not None and old is not None:
        raise ArgumentError(f"give {new_name} or its old spelling {old_name}, not both")
    return old if new is None else new


def axis_arg(axis):
    """TensorFlow's axis argument (an int, a list of ints or None) as workbench takes it."""
    if axis is None or isinstance(axis, (int, np.integer)):
        return None if axis is None else int(axis)
    axes = tuple(int(a) for a in axis)
    return axes[0] if len(axes) == 1 else axes


def shape_arg(shape) -> tuple:
    """A shape given as an int, a list or a tuple."""
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


# -- seeds: tf.set_random_seed and op seeds --------------------------------------------

_graph_seeds: weakref.WeakKeyDictionary[Graph, list] = weakref.WeakKeyDictionary()


def set_random_seed(seed: int) -> None:
    """The default graph's seed: random constants (``truncated_normal`` ...) made after it repeat."""
    _graph_seeds[get_default_graph()] = [int(seed), 0]


def generator(seed) -> np.random.Generator:
    """A generator for one random constant: from the graph's seed and ``seed`` (or a per-graph count).

    Unlike TensorFlow, values never depend on the process: the same program draws the same values.
    """
    state = _graph_seeds.setdefault(get_default_graph(), [0, 0])
    state[1] += 1
    return np.random.default_rng([state[0], state[1] if seed is None else int(seed) + (1 << 31)])
