"""The clock a one-process simulation of replicas keeps: ``fit(..., clock=..., compute_seconds=...)``.

- ``clock="wall"`` (the default): replicas run in threads, injected delays are slept, times are measured.
- ``clock="virtual"``: nothing sleeps. Each replica's step takes ``compute_seconds`` virtual seconds (or
  the compute time measured for it when ``compute_seconds`` is None) plus its injected delay; a
  synchronous step ends at the arrival that completes it, asynchronous updates are applied in virtual
  arrival order. With a number for ``compute_seconds`` a rerun gives the same results and the same
  times, bit for bit, on any machine: how "Revisiting Distributed Synchronous SGD" (Chen et al., 2016)
  can be replayed with 100 replicas on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.errors import ArgumentError

CLOCKS = ("wall", "virtual")


@dataclass(frozen=True)
class Clock:
    """A checked ``clock`` and ``compute_seconds`` pair.

    Attributes
    ----------
    kind : {"wall", "virtual"}
    compute_seconds : float or None
        Virtual seconds of one replica's compute (None: the measured time); only with ``"virtual"``.
    """

    kind: str = "wall"
    compute_seconds: float | None = None

    @property
    def virtual(self) -> bool:
        return self.kind == "virtual"

    def compute(self, measured: float) -> float:
        """The seconds one replica's compute counts for: the fixed virtual time, else what was measured."""
        return measured if self.compute_seconds is None else self.compute_seconds


#: The default: replicas in threads, delays slept, times measured.
WALL = Clock()


def check(clock="wall", compute_seconds=None) -> Clock:
    """``fit``'s ``clock`` and ``compute_seconds`` checked (ArgumentError naming the bad one).

    Examples
    --------
    >>> check("virtual", 0.01)
    Clock(kind='virtual', compute_seconds=0.01)
    """
    if not isinstance(clock, str) or clock not in CLOCKS:
        raise ArgumentError(f"fit() clock must be 'wall' or 'virtual', not {clock!r}")
    if compute_seconds is None:
        return Clock(clock, None)
    if isinstance(compute_seconds, bool):
        raise ArgumentError(f"fit() compute_seconds must be a number of seconds > 0 or None, not {compute_seconds!r}")
    try:
        seconds = float(compute_seconds)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"fit() compute_seconds must be a number of seconds > 0 or None, not {compute_seconds!r}"
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ArgumentError(f"fit() compute_seconds must be a finite number of seconds > 0, not {compute_seconds!r}")
    if clock != "virtual":
        raise ArgumentError(
            f"fit() compute_seconds={compute_seconds!r} sets the virtual clock's compute time: "
            "pass clock='virtual' with it (the wall clock measures compute)"
        )
    return Clock(clock, seconds)
