"""Stragglers in the scaling model: a synchronous step waits for the ``R``-th of ``R + b`` arrivals.

With ``R`` gradients applied a step and ``b`` backup replicas, each replica's gradient is ready after
its compute plus its injected delay; the step goes on at the ``R``-th arrival, the ``R``-th order
statistic of ``R + b`` draws (the slowest of ``R`` without backups). With the replicas' compute equal,
a step is the step the plain model predicts plus the ``R``-th smallest of ``R + b`` delays, which
:func:`straggled` draws by Monte Carlo from the distribution itself (its draws by step and replica,
so a fixed, repeatable sample), and :func:`unstraggled` takes back out of measured records (their
``"delays"``), so that a profile measured under stragglers describes the cluster without them.

>>> import workbench as wb
>>> late = wb.stragglers.Bernoulli(p=0.3, delay=1.0, seed=0)
>>> plain, backed = straggled(0.1, late, applied=2), straggled(0.1, late, applied=2, backups=1)
>>> plain["median_step_seconds"] > backed["median_step_seconds"]
True
"""

from __future__ import annotations

import numpy as np

#: Monte Carlo draws of a step (one per simulated step).
SAMPLES = 4000


def arrival_statistic(delays, applied: int) -> float:
    """The ``applied``-th smallest of one step's ``delays``: how long that step waited for stragglers."""
    ordered = sorted(float(d) for d in delays)
    return ordered[min(applied, len(ordered)) - 1] if ordered else 0.0


def delay_draws(stragglers, replicas: int, samples: int = SAMPLES) -> np.ndarray:
    """``samples x replicas`` delays: the distribution's draws for steps ``1..samples`` (fixed by its seed)."""
    return np.asarray([stragglers.delays(step, replicas) for step in range(1, samples + 1)], dtype=np.float64)


def straggled(step_seconds: float, stragglers, applied: int, backups: int = 0, samples: int = SAMPLES) -> dict:
    """A step of ``step_seconds`` without stragglers, under ``stragglers`` with ``applied + backups``
    replicas: ``median_step_seconds``, ``step_seconds`` (the mean) and ``p90_step_seconds``."""
    draws = np.sort(delay_draws(stragglers, applied + backups, samples), axis=1)
    steps = step_seconds + draws[:, applied - 1]
    return {
        "median_step_seconds": float(np.median(steps)),
        "step_seconds": float(np.mean(steps)),
        "p90_step_seconds": float(np.quantile(steps, 0.9)),
    }


def unstraggled(records: list[dict], applied: int) -> list[dict]:
    """Measured records with each step's wait for stragglers taken out of its ``"time"``."""
    out = []
    for r in records:
        wait = arrival_statistic(r.get("delays") or (), applied)
        out.append({**r, "time": max(float(r["time"]) - wait, 0.0)})
    return out
