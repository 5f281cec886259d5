"""What every training loop shares: the deterministic batch order and the history of steps."""

from __future__ import annotations

from typing import Any
from collections.abc import Iterator

import operator

import numpy as np

from workbench.errors import ArgumentError, FeedError


def batch_indices(num_examples: int, batch_size: int, steps: int, seed, start: int = 0) -> Iterator[np.ndarray]:
    """Indices of each step's batch: shuffled epochs drawn from ``seed``, last partial batch dropped.

    The same arguments give the same batches on any machine and any number of
    workers, which is what makes local and distributed training agree. Each
    epoch's order comes from its own generator, so a run can resume at step
    ``start`` without replaying the ones before it.
    """
    if batch_size < 1:
        raise FeedError(f"batch_size must be positive, got {batch_size}")
    if num_examples < batch_size:
        raise FeedError(f"batch_size {batch_size} is larger than the data ({num_examples} examples)")
    per_epoch = num_examples // batch_size
    seed = [int(s) for s in np.atleast_1d(seed)]
    epoch, order = -1, None
    for step in range(start, steps):
        if step // per_epoch != epoch:
            epoch = step // per_epoch
            order = np.random.default_rng([*seed, 0x5EED, epoch]).permutation(num_examples)
        k = step % per_epoch
        yield np.sort(order[k * batch_size : (k + 1) * batch_size])


def check_fit_arguments(batch_size, steps=None, epochs=None, checkpoint_every=None, replicas=None, stats=None) -> None:
    """ArgumentError naming the first of ``fit``'s counts that is not a positive integer
    (None stands for a default and is accepted, except for ``batch_size``)."""
    counts = {
        "batch_size": batch_size,
        "steps": steps,
        "epochs": epochs,
        "checkpoint_every": checkpoint_every,
        "replicas": replicas,
        "stats": stats,
    }
    for name, value in counts.items():
        if value is None and name != "batch_size":
            continue
        if isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"fit() {name} must be a positive integer, got {value!r}")
        try:
            count = operator.index(value)
        except TypeError:
            raise ArgumentError(
                f"fit() {name} must be a positive integer, got {value!r} ({type(value).__name__})"
            ) from None
        if count < 1:
            raise ArgumentError(f"fit() {name} must be a positive integer, got {count}")


def is_dask_array(value) -> bool:
    """Whether ``value`` is a dask array (checked without importing dask)."""
    return type(value).__module__.startswith("dask.array") and hasattr(value, "chunks")


def check_data(data: dict) -> int:
    """The common length of the arrays in ``data``, or FeedError."""
    if not data:
        raise FeedError("fit() needs data: a dict from placeholder names (or tensors) to arrays")
    lengths = {name: len(value) for name, value in data.items()}
    if len(set(lengths.values())) > 1:
        raise FeedError(f"data arrays differ in length: {lengths}")
    return next(iter(lengths.values()))


_NOT_METRICS = {
    "step",
    "time",
    "elapsed",
    "samples_per_s",
    "replicas",
    "workers",
    "dropped",
    "compute_seconds",
    "reduce_seconds",
    "update_seconds",
    "bytes_moved",
    "bytes_received",
    "bytes_sent",
    "collectives",
    "restarts",
    "tasks",
    "spans",
    "profile",
    "delays",
    "delay",
    "arrivals",
    "staleness",
    "replica",
    "arrival",
}


def _scalar(value):
    """A NumPy scalar or 0-d array as a Python number; other values unchanged."""
    return value.item() if isinstance(value, np.ndarray | np.generic) and np.ndim(value) == 0 else value


class History:
    """What a training run did: one record (a dict) per step.

    Each record holds ``"step"`` (1-based), ``"time"`` (the step's own seconds), ``"elapsed"``
    (seconds since the fit started, when the step ended), ``"samples_per_s"`` and the value of each fetch by its name. With ``fit(..., validation=(data, k))``
    every k-th record also holds ``"val_<label>"`` for each fetch; with
    ``fit(..., stats=k)``, :attr:`stats` maps every k-th step to the model's statistics
    (``{"<op>/<stat>": value}``, see :mod:`workbench.graph.probes`).
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.stats: dict[int, dict[str, float]] = {}

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def __getitem__(self, key: str) -> np.ndarray:
        """The values of one field, as an array: every step's, or for a field recorded every k steps
        (``val_loss``) the steps that have it (:meth:`series` gives those steps too)."""
        return self.series(key)[1]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of the records that hold ``key``; KeyError when none does."""
        held = [(r.get("step", i + 1), r[key]) for i, r in enumerate(self.records) if key in r]
        if not held:
            raise KeyError(f"no field {key!r}; fields are {sorted(self.fields)}")
        return np.asarray([s for s, _ in held]), np.asarray([v for _, v in held])

    def __len__(self) -> int:
        return len(self.records)

    def timeline(self):
        """Where each worker's time went, step by step: a :class:`workbench.timeline.Timeline` of the
        spans the engine recorded (compute, communicate, wait with the worker waited for, update, idle).

        Examples
        --------
        >>> hist = sess.fit(train, data, batch_size=64, steps=50, strategy="allreduce")  # doctest: +SKIP
        >>> hist.timeline().stragglers()[0]  # doctest: +SKIP
        ('tcp://127.0.0.1:40217', 0.198)
        """
        from workbench.timeline import Timeline

        return Timeline(s for r in self.records for s in r.get("spans", ()))

    def profile(self) -> dict[str, float]:
        """``{op name: seconds per step}`` of a ``fit(..., profile=k)``: each op's median over the
        profiled steps, slowest first (empty when no step was profiled)."""
        from workbench.timeline import median_profile

        return median_profile([r["profile"] for r in self.records if "profile" in r])

    def time_to(self, key: str, target: float, below: bool = False) -> float | None:
        """Seconds since the fit started at which ``key`` first reached ``target``, or None if it never did.

        Parameters
        ----------
        key : str
            A recorded series, for example ``"val_accuracy"`` or ``"loss"``.
        target : float
            The value to reach: the first record with ``value >= target`` counts (``value <= target``
            with ``below=True``, for a loss).
        below : bool
            Whether the series has to fall to the target rather than rise to it.

        Returns
        -------
        float or None
            That record's ``"elapsed"`` (virtual seconds under ``clock="virtual"``).

        Examples
        --------
        >>> hist.time_to("val_accuracy", 0.9)  # doctest: +SKIP
        3.72
        >>> hist.time_to("loss", 0.1, below=True)  # doctest: +SKIP
        """
        self.series(key)  # KeyError naming the fields when no record holds it
        for record in self.records:
            if key not in record:
                continue
            value = float(np.asarray(record[key]))
            if value <= target if below else value >= target:
                if "elapsed" not in record:
                    raise KeyError(f"the record of step {record.get('step')} has no 'elapsed' time")
                return float(record["elapsed"])
        return None

    @property
    def fields(self) -> list[str]:
        """Every field some record holds, in the order they first appear."""
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record))
        return list(seen)

    def to_pandas(self):
        """The records as a :class:`pandas.DataFrame` indexed by step (pandas must be installed).

        A field missing from some records (a metric fetched every k steps) is NaN there.
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("History.to_pandas() needs pandas: pip install pandas") from None
        columns = [f for f in self.fields if f not in ("step", "spans", "profile")]  # see timeline(), profile()
        steps = [r.get("step", i + 1) for i, r in enumerate(self.records)]
        rows = [{f: _scalar(r.get(f, np.nan)) for f in columns} for r in self.records]
        return pd.DataFrame(rows, index=pd.Index(steps, name="step"), columns=columns)

    def plot(self, fields=None, ax=None, logy: bool = False):
        """Plot fields against the step with matplotlib (installed separately); returns the axes.

        Parameters
        ----------
        fields : str or list of str, optional
            What to plot; by default every fetched metric (not time or samples/s).
        ax : matplotlib Axes, optional
            Where to draw; a new figure's axes by default.
        logy : bool
            A logarithmic y axis (useful for losses).
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("History.plot() needs matplotlib: pip install matplotlib") from None
        if isinstance(fields, str):
            fields = [fields]
        fields = [f for f in self.fields if f not in _NOT_METRICS] if fields is None else list(fields)
        for f in fields:
            if f not in self.fields:
                raise KeyError(f"no field {f!r}; fields are {sorted(self.fields)}")
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3.5))
        for f in fields:
            points = [(r["step"], r[f]) for r in self.records if f in r and np.ndim(r[f]) == 0]
            ax.plot([p[0] for p in points], [float(p[1]) for p in points], label=f)
        ax.set_xlabel("step")
        if logy:
            ax.set_yscale("log")
        if fields:
            ax.legend()
        return ax

    def __repr__(self) -> str:
        if not self.records:
            return "<History: no steps>"
        last = self.records[-1]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in last.items() if isinstance(v, float) and k != "time")
        return f"<History: {len(self.records)} steps; last: {shown}>"
