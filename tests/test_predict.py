"""The scaling model (workbench.cluster.predict), without a cluster: formulas, table-driven."""

import math

import pytest

from workbench.cluster.predict import (
    LINKS, Assumptions, Link, Profile, allreduce_seconds, bucket_sizes, exposed_allreduce, hops, predict, seed_case,
    step_time,
)  # fmt: skip
from workbench.errors import ClusterError

LINK = Link("test", bandwidth=1e9, latency=1e-3)


@pytest.mark.parametrize(
    "nbytes, ranks, seconds",
    [
        (1e9, 1, 0.0),  # alone: nothing to exchange
        (1e9, 2, 2 * 1e-3 + 1.0),  # 2 (R-1)/R = 1 model each way
        (1e9, 4, 6 * 1e-3 + 1.5),
        (1e9, 100, 198 * 1e-3 + 1.98),
        (0, 8, 14 * 1e-3),  # latency only
    ],
)
def test_allreduce_costs_latency_per_message_and_two_r_minus_one_over_r_of_the_bytes(nbytes, ranks, seconds):
    assert allreduce_seconds(nbytes, ranks, LINK) == pytest.approx(seconds)


@pytest.mark.parametrize("model, bucket, sizes", [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (3, 4, [3]), (0, 4, [])])
def test_buckets_are_full_then_the_rest(model, bucket, sizes):
    assert bucket_sizes(model, bucket) == sizes


def test_overlap_hides_the_all_reduce_behind_the_backward_pass_but_the_last_bucket():
    # 4 buckets of 1e8 bytes over 2 ranks: 0.102 s each; the backward pass is 2 s
    p = Profile(model_bytes=4e8, batch_size=1, compute_per_sample=3.0, bucket_bytes=int(1e8))
    one = allreduce_seconds(1e8, 2, LINK)
    assert exposed_allreduce(p, 3.0, 2, LINK, overlap=True) == pytest.approx(one)
    assert exposed_allreduce(p, 3.0, 2, LINK, overlap=False) == pytest.approx(4 * one)
    # a short backward pass: the link is the bottleneck, all but the first bucket's wait shows
    short = exposed_allreduce(p, 0.03, 2, LINK, overlap=True)
    assert 4 * one - 0.02 < short <= 4 * one
    assert exposed_allreduce(p, 3.0, 1, LINK) == 0.0


@pytest.mark.parametrize("strategy, workers, count", [
    ("allreduce", 1, 0), ("allreduce", 100, 0),
    ("parameter_server", 1, 2), ("parameter_server", 2, 3), ("parameter_server", 4, 4), ("parameter_server", 100, 9),
])  # fmt: skip
def test_hops_on_the_critical_path(strategy, workers, count):
    assert hops(strategy, workers) == count


def test_parameter_server_step_adds_tree_levels_hops_and_sending_variables_to_every_replica():
    p = Profile(model_bytes=1e8, batch_size=64, compute_per_sample=0.01, compute_fixed=0.1, update_seconds=0.05,
                latency=1e-3, bandwidth=1e9, overhead=0.002, hop=0.004, sum_rate=1e10)  # fmt: skip
    part = step_time(p, "parameter_server", 4)
    transfer = 1e-3 + 0.1
    assert part["compute_seconds"] == pytest.approx(0.1 + 16 * 0.01)
    assert part["overhead_seconds"] == pytest.approx(0.002 + 4 * 0.004)
    assert part["communication_seconds"] == pytest.approx(2 * (transfer + 0.01) + 3 * transfer)
    assert part["step_seconds"] == pytest.approx(sum(part[k] for k in
                                                     ("compute_seconds", "overhead_seconds", "communication_seconds", "update_seconds")))  # fmt: skip


@pytest.mark.parametrize("batch, rows, samples", [("global", 16, 64), ("per_replica", 64, 256)])
def test_the_batch_is_split_or_grows_with_the_workers(batch, rows, samples):
    p = Profile(model_bytes=0, batch_size=64, compute_per_sample=0.01)
    (row,) = predict(p, [4], strategies=["allreduce"], assumptions=Assumptions(batch=batch))
    assert row["compute_seconds"] == pytest.approx(rows * 0.01)
    assert row["samples_per_s"] == pytest.approx(samples / (rows * 0.01))


def test_uneven_shards_wait_for_the_largest():
    p = Profile(model_bytes=0, batch_size=10, compute_per_sample=1.0)
    assert step_time(p, "allreduce", 3)["compute_seconds"] == 4.0


@pytest.mark.parametrize(
    "link, strategy, workers, low, high",
    [
        # the seed's case: 96 MB of gradients, 1 s of compute, per-replica batch fixed
        ("10gbe", "parameter_server", 8, 0.50, 0.60),
        ("10gbe", "parameter_server", 100, 0.08, 0.13),  # the update worker ships 99 x 96 MB
        ("10gbe", "allreduce", 100, 0.90, 1.0),
        ("infiniband", "parameter_server", 100, 0.45, 0.65),
        ("infiniband", "allreduce", 100, 0.95, 1.0),
    ],
)
def test_the_seed_case(link, strategy, workers, low, high):
    (row,) = predict(
        seed_case(), [workers], strategies=[strategy], assumptions=Assumptions(link=link, batch="per_replica")
    )
    assert low <= row["efficiency"] <= high


def test_efficiency_falls_with_the_workers_and_rises_with_the_link():
    p = seed_case()
    for strategy in ("allreduce", "parameter_server"):
        slow = [
            r["efficiency"]
            for r in predict(p, [2, 8, 32, 100], [strategy], Assumptions(link="10gbe", batch="per_replica"))
        ]
        fast = [
            r["efficiency"]
            for r in predict(p, [2, 8, 32, 100], [strategy], Assumptions(link="nvlink", batch="per_replica"))
        ]
        assert slow == sorted(slow, reverse=True)
        assert all(f >= s for f, s in zip(fast, slow))


def test_speedup_is_against_one_worker_of_the_same_strategy_unless_a_base_is_given():
    p = Profile(model_bytes=1e6, batch_size=64, compute_per_sample=1e-3, latency=1e-4, bandwidth=1e9, hop=1e-3)
    rows = predict(p, [1, 4])
    assert [r["speedup"] for r in rows if r["workers"] == 1] == [1.0, 1.0]
    (based,) = predict(p, [4], ["allreduce"], base=(2, 100.0))
    assert based["speedup"] == pytest.approx(based["samples_per_s"] / 100.0 * 2)


def test_assumptions_override_the_link_and_say_so():
    p = Profile(model_bytes=1e6, batch_size=64, compute_per_sample=1e-3, latency=2e-3, bandwidth=5e8, source="here")
    assert Assumptions().link_of(p) == Link("measured", 5e8, 2e-3)
    assert Assumptions(link="10gbe").link_of(p) == LINKS["10gbe"]
    assert Assumptions(link="10gbe", latency=1e-3).link_of(p).latency == 1e-3
    words = "\n".join(Assumptions(link="infiniband", batch="per_replica").describe(p))
    assert "InfiniBand" in words and "12.5 GB/s" in words and "64 rows per worker" in words and "profile: here" in words
    assert "0.5 GB/s per worker, 2,000 µs a message" in Assumptions().describe(p)[0]
    assert math.isinf(Profile(model_bytes=0, batch_size=1, compute_per_sample=0).bandwidth)


@pytest.mark.parametrize("kwargs, message", [
    ({"link": "carrier-pigeon"}, "unknown link 'carrier-pigeon'"),
    ({"batch": "local"}, "batch must be 'global' or 'per_replica'"),
])  # fmt: skip
def test_bad_assumptions_are_named(kwargs, message):
    with pytest.raises(ClusterError, match=message):
        Assumptions(**kwargs)


def test_unknown_strategy_or_count_is_named():
    with pytest.raises(ClusterError, match="no scaling model for strategy 'gossip'"):
        step_time(seed_case(), "gossip", 2)
    with pytest.raises(ClusterError, match="workers must be positive, got 0"):
        step_time(seed_case(), "allreduce", 0)


@pytest.mark.parametrize("strategy, step, overhead, hop", [
    ("parameter_server", 0.050, 0.050 - 0.020 - 2 * 0.005, 0.005),  # room for the measured hops: the rest is overhead
    ("parameter_server", 0.026, 0.0, 0.003),  # less than the hops: smaller hops
    ("allreduce", 0.050, 0.030, 0.005),  # no hop on its critical path
    ("parameter_server", 0.010, 0.0, 0.0),  # faster than its compute: nothing left
])  # fmt: skip
def test_a_profile_is_calibrated_to_the_measured_step(strategy, step, overhead, hop):
    from workbench.scaling import _calibrated

    p = Profile(model_bytes=0, batch_size=10, compute_per_sample=0.002, hop=0.005)
    calibrated = _calibrated(p, strategy, 1, step)
    assert (calibrated.overhead, calibrated.hop) == (pytest.approx(overhead), pytest.approx(hop))
    if step >= 0.02:
        assert step_time(calibrated, strategy, 1)["step_seconds"] == pytest.approx(step)


def test_workers_sharing_cores_slow_compute_and_transfers_beyond_that_many():
    p = Profile(model_bytes=1e8, batch_size=64, compute_per_sample=0.01, update_seconds=0.01, latency=1e-3,
                bandwidth=1e9, hop=0.002)  # fmt: skip
    for strategy in ("allreduce", "parameter_server"):
        alone, shared = step_time(p, strategy, 4), step_time(p, strategy, 4, Assumptions(cores=2))
        for part in ("compute_seconds", "communication_seconds", "update_seconds"):
            assert shared[part] == pytest.approx(2 * alone[part]), (strategy, part)
        assert shared["overhead_seconds"] == alone["overhead_seconds"]
        assert step_time(p, strategy, 2, Assumptions(cores=2)) == step_time(p, strategy, 2)


def test_the_scheduler_costs_per_task():
    p = Profile(model_bytes=0, batch_size=64, compute_per_sample=1e-5, task_seconds=0.001)
    # the parameter server's 2 (R - 1) more tasks sit on the critical path
    assert step_time(p, "parameter_server", 5)["overhead_seconds"] == pytest.approx(8 * 0.001)
    # the all-reduce's R tasks a step do not, but bound its throughput
    assert step_time(p, "allreduce", 100)["step_seconds"] == pytest.approx(0.1)
    assert step_time(p, "allreduce", 2)["step_seconds"] == pytest.approx(0.002)
    assert step_time(p, "allreduce", 2)["compute_seconds"] == pytest.approx(32 * 1e-5)
