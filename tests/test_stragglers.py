"""wb.stragglers: seeded delay distributions, and History's elapsed time and time_to."""

import math

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ArgumentError, WorkbenchError


def test_draws_depend_only_on_seed_step_and_replica():
    late = wb.stragglers.Bernoulli(p=0.3, delay=0.3, seed=0)
    again = wb.stragglers.Bernoulli(p=0.3, delay=0.3, seed=0)
    first = [late.delays(step, 4) for step in range(1, 50)]
    # drawn in another order, from a fresh object: the same values
    backwards = [again.delays(step, 4) for step in range(49, 0, -1)][::-1]
    assert first == backwards
    assert late.delay(17, 2) == first[16][2]
    values = {d for row in first for d in row}
    assert values == {0.0, 0.3}
    other = wb.stragglers.Bernoulli(p=0.3, delay=0.3, seed=1)
    assert [other.delays(s, 4) for s in range(1, 50)] != first


def test_bernoulli_rate_and_mean():
    late = wb.stragglers.Bernoulli(p=0.25, delay=2.0, seed=5)
    draws = np.asarray([late.delay(step, r) for step in range(1, 1001) for r in range(4)])
    assert abs(np.mean(draws > 0) - 0.25) < 0.03  # 4000 draws: 4.5 standard errors
    assert late.mean() == 0.5
    assert wb.stragglers.Bernoulli(p=0.0, delay=1.0).delays(3, 5) == [0.0] * 5
    assert wb.stragglers.Bernoulli(p=1.0, delay=1.0).delays(3, 5) == [1.0] * 5


def test_lognormal_median_and_spread():
    spread = wb.stragglers.LogNormal(median=0.1, sigma=0.5, seed=2)
    draws = spread.sample(4000)
    assert np.all(draws > 0)
    assert abs(np.median(draws) / 0.1 - 1) < 0.05
    assert abs(np.std(np.log(draws)) - 0.5) < 0.03
    assert spread.mean() == pytest.approx(0.1 * math.exp(0.125))
    assert np.array_equal(draws, spread.sample(4000))
    assert not np.array_equal(draws, spread.sample(4000, seed=3))
    assert wb.stragglers.LogNormal(median=0.2, sigma=0).delays(1, 3) == [0.2] * 3


def test_fixed_is_one_slow_replica():
    slow = wb.stragglers.Fixed(1, 0.2)
    assert slow.delays(step=9, replicas=3) == [0.0, 0.2, 0.0]
    assert wb.stragglers.Fixed(replica=0, delay=0.5).delay(1, 0) == 0.5


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: wb.stragglers.Bernoulli(p=1.5, delay=0.1), r"p must be a probability in \[0, 1\], not 1.5"),
        (lambda: wb.stragglers.Bernoulli(p=0.5, delay=-1), r"delay must be a finite number of seconds >= 0"),
        (lambda: wb.stragglers.Bernoulli(p=0.5, delay="soon"), r"delay must be a number of seconds, not 'soon'"),
        (lambda: wb.stragglers.LogNormal(median=0.1, sigma=float("nan")), r"sigma must be a finite"),
        (lambda: wb.stragglers.LogNormal(median=0.1, sigma=1, seed=-2), r"seed must be an integer >= 0"),
        (lambda: wb.stragglers.Fixed(replica=-1, delay=0.1), r"replica must be a replica id >= 0"),
    ],
)
def test_bad_parameters_are_named(make, match):
    with pytest.raises(ArgumentError, match=match):
        make()


def test_coerce():
    assert wb.stragglers.coerce(None) is None
    slow = wb.stragglers.Fixed(2, 0.1)
    assert wb.stragglers.coerce(slow, replicas=3) is slow
    with pytest.raises(ArgumentError, match=r"Fixed: replica 2 is not one of the fit's 2 replicas"):
        wb.stragglers.coerce(slow, replicas=2)
    with pytest.raises(WorkbenchError, match=r"fit\(stragglers=\.\.\.\) takes wb.stragglers.Bernoulli"):
        wb.stragglers.coerce(0.3)


def _fit(steps=30, validation_every=5):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2), dtype="float64")
        y = wb.placeholder("y", shape=(None, 1), dtype="float64")
        w = wb.variable("w", shape=(2, 1), init="zeros", dtype="float64")
        loss = wb.mean((x @ w - y) ** 2)
        train = wb.optimizers.SGD(0.2).minimize(loss)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(256, 2))
    data = {"x": xs, "y": xs @ np.array([[1.0], [-2.0]])}
    sess = wb.Session(g, seed=0)
    return sess.fit(
        train, data, batch_size=32, steps=steps, fetches={"loss": loss}, validation=(data, validation_every)
    )


def test_records_hold_elapsed_and_time_to_finds_the_first_crossing():
    hist = _fit()
    elapsed = hist["elapsed"]
    assert len(elapsed) == 30
    assert np.all(np.diff(elapsed) >= 0) and elapsed[0] >= 0
    assert elapsed[-1] >= np.sum(hist["time"]) * 0.5  # steps' own times fit inside the fit's
    losses = hist["loss"]
    target = float(np.median(losses))
    first = next(i for i, v in enumerate(losses) if v <= target)
    assert hist.time_to("loss", target, below=True) == elapsed[first]
    assert hist.time_to("loss", -1.0, below=True) is None
    steps, val = hist.series("val_loss")
    assert list(steps) == [5, 10, 15, 20, 25, 30]
    hit = next(i for i, v in enumerate(val) if v <= val[2])
    assert hist.time_to("val_loss", float(val[2]), below=True) == elapsed[steps[hit] - 1]
    # rising: the loss starts high, so "reach 0" upward is immediate, "reach 1e9" never
    assert hist.time_to("loss", 0.0) == elapsed[0]
    assert hist.time_to("loss", 1e9) is None
    with pytest.raises(KeyError, match="no field 'val_accuracy'"):
        hist.time_to("val_accuracy", 0.9)
