"""Stragglers: delays injected into replicated fits, the same on every run.

``fit(..., replicas=R, stragglers=wb.stragglers.Bernoulli(p=0.3, delay=0.3, seed=0))`` makes each
replica wait after computing its gradient and before handing it in, by the delay its distribution
draws for that (step, replica). A draw depends only on ``(seed, step, replica)``, never on timing or
on how many draws came before, so two runs inject the same delays and a resumed fit the delays of
the steps it resumes at. The models of "Revisiting Distributed Synchronous SGD" (Chen et al.,
2016): a replica late now and then (:class:`Bernoulli`), a heavy-tailed spread of step times
(:class:`LogNormal`), one slow machine (:class:`Fixed`).

Examples
--------
>>> import workbench as wb
>>> late = wb.stragglers.Bernoulli(p=0.5, delay=0.25, seed=3)
>>> late.delays(step=1, replicas=4) == late.delays(step=1, replicas=4)
True
>>> wb.stragglers.Fixed(replica=1, delay=0.2).delays(step=7, replicas=3)
[0.0, 0.2, 0.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.errors import ArgumentError

__all__ = ["Bernoulli", "Fixed", "LogNormal", "Stragglers", "coerce", "step_delays"]

_STREAM = 0x5717A6  # keeps straggler draws apart from every other seeded stream of a fit


class Stragglers:
    """A distribution of injected delays; subclasses define :meth:`delay`."""

    seed: int = 0

    def delay(self, step: int, replica: int) -> float:
        """Seconds replica ``replica`` (0-based) is made late at step ``step`` (1-based)."""
        raise NotImplementedError

    def delays(self, step: int, replicas: int) -> list[float]:
        """The delays of every replica at one step, in replica order."""
        return [self.delay(step, r) for r in range(replicas)]

    def sample(self, size: int, seed: int | None = None) -> np.ndarray:
        """``size`` independent draws of one replica's delay (for models such as the scaling predictor)."""
        draws = self if seed is None else self._with_seed(seed)
        return np.asarray([draws.delay(1 + i, 0) for i in range(size)], dtype=np.float64)

    def mean(self) -> float:
        """The expected delay of one replica at one step."""
        raise NotImplementedError

    def _with_seed(self, seed: int) -> Stragglers:
        raise NotImplementedError

    def _rng(self, step: int, replica: int) -> np.random.Generator:
        return np.random.default_rng([_STREAM, int(self.seed), int(step), int(replica)])


def _check_seconds(name: str, value, cls: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"wb.stragglers.{cls}: {name} must be a number of seconds, not {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ArgumentError(f"wb.stragglers.{cls}: {name} must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def _check_seed(value, cls: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ArgumentError(f"wb.stragglers.{cls}: seed must be an integer >= 0, not {value!r}")
    return int(value)


@dataclass(frozen=True)
class Bernoulli(Stragglers):
    """Each replica, each step, is late by ``delay`` seconds with probability ``p``.

    Parameters
    ----------
    p : float
        The probability, in [0, 1].
    delay : float
        Seconds a late replica waits before handing its gradient in.
    seed : int
        Draws depend only on (seed, step, replica).
    """

    p: float
    delay_seconds: float
    seed: int = 0

    def __init__(self, p: float, delay: float, seed: int = 0):
        try:
            prob = float(p)
        except (TypeError, ValueError):
            raise ArgumentError(f"wb.stragglers.Bernoulli: p must be a probability in [0, 1], not {p!r}") from None
        if not 0.0 <= prob <= 1.0:
            raise ArgumentError(f"wb.stragglers.Bernoulli: p must be a probability in [0, 1], not {p!r}")
        object.__setattr__(self, "p", prob)
        object.__setattr__(self, "delay_seconds", _check_seconds("delay", delay, "Bernoulli"))
        object.__setattr__(self, "seed", _check_seed(seed, "Bernoulli"))

    def delay(self, step: int, replica: int) -> float:
        late = self._rng(step, replica).random() < self.p
        return self.delay_seconds if late else 0.0

    def mean(self) -> float:
        return self.p * self.delay_seconds

    def _with_seed(self, seed: int) -> Bernoulli:
        return Bernoulli(self.p, self.delay_seconds, seed)

    def __repr__(self) -> str:
        return f"Bernoulli(p={self.p:g}, delay={self.delay_seconds:g}, seed={self.seed})"


@dataclass(frozen=True)
class LogNormal(Stragglers):
    """Every replica, every step, is late by a log-normal delay: ``median * exp(sigma * z)``, z ~ N(0, 1).

    Parameters
    ----------
    median : float
        The median delay in seconds.
    sigma : float
        The spread of the delay's logarithm (0: always ``median``).
    seed : int
        Draws depend only on (seed, step, replica).
    """

    median: float
    sigma: float
    seed: int = 0

    def __init__(self, median: float, sigma: float, seed: int = 0):
        object.__setattr__(self, "median", _check_seconds("median", median, "LogNormal"))
        object.__setattr__(self, "sigma", _check_seconds("sigma", sigma, "LogNormal"))
        object.__setattr__(self, "seed", _check_seed(seed, "LogNormal"))

    def delay(self, step: int, replica: int) -> float:
        return self.median * math.exp(self.sigma * float(self._rng(step, replica).standard_normal()))

    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)

    def _with_seed(self, seed: int) -> LogNormal:
        return LogNormal(self.median, self.sigma, seed)

    def __repr__(self) -> str:
        return f"LogNormal(median={self.median:g}, sigma={self.sigma:g}, seed={self.seed})"


@dataclass(frozen=True)
class Fixed(Stragglers):
    """One replica is always late by ``delay`` seconds (a slow machine); the others never are.

    Parameters
    ----------
    replica : int
        The 0-based replica id.
    delay : float
        Seconds it waits every step.
    """

    replica: int
    delay_seconds: float
    seed: int = 0

    def __init__(self, replica: int, delay: float):
        if isinstance(replica, bool) or not isinstance(replica, int | np.integer) or replica < 0:
            raise ArgumentError(f"wb.stragglers.Fixed: replica must be a replica id >= 0, not {replica!r}")
        object.__setattr__(self, "replica", int(replica))
        object.__setattr__(self, "delay_seconds", _check_seconds("delay", delay, "Fixed"))
        object.__setattr__(self, "seed", 0)

    def delay(self, step: int, replica: int) -> float:
        return self.delay_seconds if replica == self.replica else 0.0

    def sample(self, size: int, seed: int | None = None) -> np.ndarray:
        return np.zeros(size)

    def mean(self) -> float:
        return 0.0

    def __repr__(self) -> str:
        return f"Fixed(replica={self.replica}, delay={self.delay_seconds:g})"


def coerce(value, replicas: int | None = None) -> Stragglers | None:
    """``fit(stragglers=...)``'s value checked: None or a :class:`Stragglers`, else ArgumentError.

    With ``replicas``, a :class:`Fixed` replica id must be one of the fit's replicas.
    """
    if value is None:
        return None
    if not isinstance(value, Stragglers):
        raise ArgumentError(
            "fit(stragglers=...) takes wb.stragglers.Bernoulli(p, delay, seed=0), "
            f"wb.stragglers.LogNormal(median, sigma, seed=0) or wb.stragglers.Fixed(replica, delay), not {value!r}"
        )
    if isinstance(value, Fixed) and replicas is not None and value.replica >= replicas:
        raise ArgumentError(f"wb.stragglers.Fixed: replica {value.replica} is not one of the fit's {replicas} replicas")
    return value


def step_delays(stragglers: Stragglers | None, step: int, replicas: int) -> list[float]:
    """Each rank's injected delay at ``step``, in seconds (zeros without stragglers): what every engine
    hands its replicas and records as the step's ``"delays"``."""
    return [0.0] * replicas if stragglers is None else [float(d) for d in stragglers.delays(step, replicas)]
