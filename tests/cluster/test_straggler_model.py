"""The straggler model of the scaling predictor: order statistics of R + b delays (no cluster)."""

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.straggler_model import arrival_statistic, straggled, unstraggled


def test_a_step_waits_for_the_r_th_of_r_plus_b_arrivals():
    assert arrival_statistic([0.0, 0.3, 0.1], applied=3) == 0.3
    assert arrival_statistic([0.0, 0.3, 0.1], applied=2) == 0.1
    slow = wb.stragglers.Fixed(replica=1, delay=0.5)
    assert straggled(0.1, slow, applied=2)["median_step_seconds"] == pytest.approx(0.6)
    assert straggled(0.1, slow, applied=2, backups=1)["median_step_seconds"] == pytest.approx(0.1)


def test_lognormal_order_statistics_match_their_distribution():
    late = wb.stragglers.LogNormal(median=0.2, sigma=0.5, seed=0)
    one = straggled(0.0, late, applied=1)
    assert one["median_step_seconds"] == pytest.approx(0.2, rel=0.05)  # the median of one draw
    four = straggled(0.05, late, applied=4)["median_step_seconds"]
    backed = straggled(0.05, late, applied=4, backups=1)["median_step_seconds"]
    assert 0.05 + 0.2 < backed < four  # the slowest of 4 waits longer than the 4th of 5
    # the median of the maximum of 4 log-normals: exp(sigma * z) with Phi(z) = 0.5 ** (1 / 4)
    from scipy.stats import norm

    expected = 0.05 + 0.2 * np.exp(0.5 * norm.ppf(0.5**0.25))
    assert four == pytest.approx(expected, rel=0.05)
    assert straggled(0.05, late, applied=4) == straggled(0.05, late, applied=4)  # a fixed sample


def test_measured_records_lose_their_waits():
    records = [{"time": 0.5, "delays": [0.0, 0.4, 0.0]}, {"time": 0.1, "delays": [0.0, 0.0, 0.0]}]
    assert [r["time"] for r in unstraggled(records, applied=3)] == pytest.approx([0.1, 0.1])
    assert [r["time"] for r in unstraggled(records, applied=2)] == pytest.approx([0.5, 0.1])
