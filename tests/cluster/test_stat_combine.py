"""Joining the replicas' statistics into the global batch's, without a cluster."""

import numpy as np

from workbench.cluster.collective.stat_combine import StatRule, combine_stats
from workbench.graph.batch_reduction import Reduction


def test_means_and_stds_of_unequal_shards_join_into_the_whole_batchs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(33, 5))
    shards = [x[:17], x[17:]]
    shares = [17 / 33, 16 / 33]
    reported = [[float(s.mean()), float(s.std()), 2.5] for s in shards]  # mean, std, an all-reduced grad norm
    rules = [StatRule("reduce", Reduction("mean")), StatRule("moments", mean_index=0), StatRule("first")]
    mean, std, norm = combine_stats(rules, reported, shares)
    np.testing.assert_allclose([mean, std], [x.mean(), x.std()], rtol=1e-12)
    assert norm == 2.5
    summed = combine_stats([StatRule("reduce", Reduction("sum"))], [[1.5], [2.0]], shares)
    assert summed == [3.5]
