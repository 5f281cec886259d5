"""What every training loop shares: the deterministic batch order and the history of steps."""

from __future__ import annotations

from typing import Any, Iterator

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


def check_fit_arguments(batch_size, steps=None, epochs=None, checkpoint_every=None, replicas=None) -> None:
    """ArgumentError naming the first of ``fit``'s counts that is not a positive integer
    (None stands for a default and is accepted, except for ``batch_size``)."""
    counts = {"batch_size": batch_size, "steps": steps, "epochs": epochs,
              "checkpoint_every": checkpoint_every, "replicas": replicas}  # fmt: skip
    for name, value in counts.items():
        if value is None and name != "batch_size":
            continue
        if isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"fit() {name} must be a positive integer, got {value!r}")
        try:
            count = operator.index(value)
        except TypeError:
            raise ArgumentError(f"fit() {name} must be a positive integer, got {value!r} ({type(value).__name__})") from None
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


class History:
    """What a training run did: one record (a dict) per step.

    Each record holds ``"step"`` (1-based), ``"time"`` (seconds), ``"samples_per_s"``
    and the value of each fetch by its name.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def __getitem__(self, key: str) -> np.ndarray:
        """All steps' values of one field, as an array."""
        if not self.records or key not in self.records[-1]:
            raise KeyError(f"no field {key!r}; fields are {sorted(self.records[-1]) if self.records else []}")
        return np.asarray([r[key] for r in self.records])

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        if not self.records:
            return "<History: no steps>"
        last = self.records[-1]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in last.items() if isinstance(v, float) and k != "time")
        return f"<History: {len(self.records)} steps; last: {shown}>"
