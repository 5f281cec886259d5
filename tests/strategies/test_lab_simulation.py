"""The one-process simulation of the lab: stragglers, backup replicas, asynchronous SGD, the virtual clock."""

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ArgumentError


def _model(lr=0.1, dtype="float64"):
    g = wb.Graph("lab")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype=dtype)
        y = wb.placeholder("y", shape=(None, 1), dtype=dtype)
        w = wb.variable("w", shape=(4, 1), init="zeros", dtype=dtype)
        b = wb.variable("b", shape=(1,), init="zeros", dtype=dtype)
        loss = wb.mean((x @ w + b - y) ** 2)
        train = wb.optimizers.Adam(lr).minimize(loss)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(240, 4)).astype(dtype)
    data = {"x": xs, "y": (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.25).astype(dtype)}
    return g, train, loss, data


def _fit(steps=12, **kw):
    g, train, loss, data = _model()
    kw.setdefault("batch_size", 48)
    history = wb.Session(g, seed=0).fit(train, data, steps=steps, fetches={"loss": loss}, **kw)
    return history


def test_virtual_sync_without_stragglers_is_the_simulation_of_allreduce():
    plain = _fit(replicas=4)
    virtual = _fit(replicas=4, clock="virtual", compute_seconds=0.01)
    np.testing.assert_allclose(virtual["loss"], plain["loss"], rtol=1e-12)
    assert np.allclose(virtual["time"], 0.01) and np.allclose(virtual["elapsed"], 0.01 * np.arange(1, 13))
    assert virtual.records[0]["delays"] == [0.0] * 4 and virtual.records[0]["arrivals"] == [0.01] * 4


def test_virtual_steps_end_at_the_arrival_that_completes_them():
    late = wb.stragglers.Bernoulli(p=0.3, delay=0.5, seed=1)
    hist = _fit(replicas=3, stragglers=late, clock="virtual", compute_seconds=0.1)
    for step, record in enumerate(hist.records, start=1):
        assert record["delays"] == late.delays(step, 3)
        assert record["arrivals"] == [0.1 + d for d in record["delays"]]
        assert record["time"] == max(record["arrivals"])
    np.testing.assert_allclose(hist["elapsed"], np.cumsum(hist["time"]), rtol=1e-12)
    assert "dropped" not in hist.records[0]


def test_backups_drop_the_latest_arrivals():
    late = wb.stragglers.LogNormal(median=0.05, sigma=1.0, seed=3)
    hist = _fit(replicas=3, backup_replicas=2, stragglers=late, clock="virtual", compute_seconds=0.01)
    for record in hist.records:
        arrivals = record["arrivals"]
        assert len(arrivals) == 5 and len(record["dropped"]) == 2
        latest = sorted(range(5), key=lambda r: (arrivals[r], r))[3:]
        assert record["dropped"] == sorted(latest)
        kept = [a for r, a in enumerate(arrivals) if r not in record["dropped"]]
        assert record["time"] == max(kept) == sorted(arrivals)[2]  # the R-th arrival ends the step


def test_backups_ties_drop_the_highest_ids_and_a_fixed_straggler_always():
    ties = _fit(steps=3, replicas=2, backup_replicas=1, clock="virtual", compute_seconds=0.01)
    assert [r["dropped"] for r in ties.records] == [[2]] * 3
    slow = _fit(steps=4, replicas=2, backup_replicas=1, stragglers=wb.stragglers.Fixed(0, 1.0), clock="virtual")
    assert [r["dropped"] for r in slow.records] == [[0]] * 4
    assert all(r["time"] < 1.0 for r in slow.records)  # the straggler does not hold the step


def test_backups_weight_the_rows_used():
    # replica 1 always dropped: the update is the mean gradient of shards 0 and 2 (as one batch of those rows)
    g, train, loss, data = _model(dtype="float64")
    sess = wb.Session(g, seed=0)
    sess.fit(train, data, batch_size=48, steps=1, replicas=2, backup_replicas=1, clock="virtual",
             compute_seconds=0.01, stragglers=wb.stragglers.Fixed(1, 1.0))  # fmt: skip
    rows = next(wb.training.batch_indices(240, 72, 1, seed=(0, 1)))
    used = np.concatenate([np.array_split(rows, 3)[0], np.array_split(rows, 3)[2]])
    reference = wb.Session(g, seed=0)
    reference.run(train, {"x": data["x"][used], "y": data["y"][used]})
    np.testing.assert_allclose(sess.variables["w"], reference.variables["w"], rtol=1e-12)


def test_async_staleness_is_about_r_minus_1_with_equal_replicas():
    hist = _fit(steps=60, replicas=4, strategy="async", clock="virtual", compute_seconds=0.01)
    staleness = hist["staleness"]
    assert list(staleness[:4]) == [0, 1, 2, 3]  # the first round read the initial variables
    assert np.all(staleness[4:] == 3)
    assert list(hist["replica"][:8]) == [0, 1, 2, 3, 0, 1, 2, 3]  # ties by replica id
    assert np.allclose(hist["elapsed"][:8], [0.01] * 4 + [0.02] * 4)
    assert np.isfinite(hist["loss"]).all() and hist["loss"][-1] < hist["loss"][0]


def test_async_applies_in_virtual_arrival_order_under_stragglers():
    late = wb.stragglers.Bernoulli(p=0.3, delay=0.05, seed=2)
    hist = _fit(steps=40, replicas=4, strategy="async", stragglers=late, clock="virtual", compute_seconds=0.01)
    assert np.all(np.diff(hist["elapsed"]) >= 0)
    assert np.mean(hist["staleness"][8:]) == pytest.approx(3, abs=1)
    assert {round(d, 9) for d in hist["delay"]} <= {0.0, 0.05}
    again = _fit(steps=40, replicas=4, strategy="async", stragglers=late, clock="virtual", compute_seconds=0.01)
    assert np.array_equal(hist["loss"], again["loss"]) and np.array_equal(hist["elapsed"], again["elapsed"])


def test_async_first_gradients_use_shards_of_the_first_global_batch():
    # one replica: asynchronous SGD with R = 1 is plain SGD on the same batches
    plain = _fit(steps=6)
    solo = _fit(steps=6, replicas=1, strategy="async", clock="virtual", compute_seconds=0.01)
    np.testing.assert_allclose(solo["loss"], plain["loss"], rtol=1e-12)
    assert list(solo["staleness"]) == [0] * 6


def test_wall_clock_sleeps_the_delays():
    slow = wb.stragglers.Fixed(1, 0.2)
    waited = _fit(steps=3, replicas=2, stragglers=slow)
    assert all(r["time"] >= 0.2 for r in waited.records)
    assert all(r["arrivals"][1] >= 0.2 > r["arrivals"][0] for r in waited.records)
    backed = _fit(steps=3, replicas=2, backup_replicas=1, stragglers=slow)
    assert [r["dropped"] for r in backed.records] == [[1]] * 3
    assert all(r["time"] < 0.2 for r in backed.records)


def test_wall_clock_async_records_staleness():
    hist = _fit(steps=24, replicas=3, strategy="async")
    assert len(hist) == 24 and set(hist["replica"]) <= {0, 1, 2}
    assert np.all(hist["staleness"] >= 0) and np.all(hist["staleness"] <= 23)
    assert np.isfinite(hist["loss"]).all()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"clock": "fast"}, r"clock must be 'wall' or 'virtual', not 'fast'"),
        ({"clock": "virtual", "compute_seconds": -1}, r"compute_seconds must be a finite number of seconds > 0"),
        ({"clock": "virtual", "compute_seconds": "1s"}, r"compute_seconds must be a number of seconds > 0 or None"),
        ({"compute_seconds": 0.1}, r"compute_seconds=0.1 sets the virtual clock's compute time: pass clock='virtual'"),
        ({"strategy": "async", "backup_replicas": 1}, r"strategy='async'\) has no backup replicas"),
        ({"strategy": "local_sgd", "backup_replicas": 1}, r"backup_replicas=1 is trained by strategy 'allreduce'"),
    ],
)
def test_bad_clock_arguments_are_named(kw, match):
    with pytest.raises(ArgumentError, match=match):
        _fit(steps=1, replicas=2, **kw)


def test_a_backup_fit_resumes_from_its_checkpoint(tmp_path):
    g, train, loss, data = _model()
    options = {"batch_size": 48, "replicas": 2, "backup_replicas": 1, "clock": "virtual", "compute_seconds": 0.01,
               "stragglers": wb.stragglers.Bernoulli(p=0.4, delay=0.1, seed=4)}  # fmt: skip
    whole = wb.Session(g, seed=0)
    whole.fit(train, data, steps=8, **options)
    sess = wb.Session(g, seed=0)
    sess.fit(train, data, steps=4, checkpoint_dir=tmp_path, **options)
    resumed = sess.fit(train, data, steps=8, checkpoint_dir=tmp_path, **options)
    assert [r["step"] for r in resumed.records] == [5, 6, 7, 8]
    assert resumed.records[0]["delays"] == options["stragglers"].delays(5, 3)
    for name, value in whole.variables.items():
        np.testing.assert_array_equal(sess.variables[name], value, err_msg=name)


def _variables(**kw):
    g, train, loss, data = _model()
    sess = wb.Session(g, seed=0)
    history = sess.fit(train, data, batch_size=48, steps=12, fetches={"loss": loss}, **kw)
    return sess.variables, history


@pytest.mark.parametrize("strategy", [wb.strategies.local_sgd(3), wb.strategies.diloco(4), "lab_sum_of_weighted"])
def test_a_strategy_function_on_the_virtual_clock_trains_as_without_it(strategy):
    if strategy == "lab_sum_of_weighted" and not wb.strategies.is_strategy(strategy):

        @wb.strategy("lab_sum_of_weighted")
        def lab_sum_of_weighted(r):
            r.apply({v: wb.all_reduce(g * r.weight, op="sum") for v, g in r.gradients.items()})

    late = wb.stragglers.Bernoulli(p=0.3, delay=0.2, seed=5)
    plain, plain_history = _variables(replicas=3, strategy=strategy)
    timed, history = _variables(replicas=3, strategy=strategy, stragglers=late, clock="virtual", compute_seconds=0.1)
    for name, value in plain.items():  # the clock and the delays change the times only
        np.testing.assert_array_equal(timed[name], value, err_msg=name)
    np.testing.assert_array_equal(history["loss"], plain_history["loss"])
    assert [r["delays"] for r in history.records] == [late.delays(step, 3) for step in range(1, 13)]
    again, rerun = _variables(replicas=3, strategy=strategy, stragglers=late, clock="virtual", compute_seconds=0.1)
    for name, value in timed.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    for key in ("loss", "time", "elapsed"):
        assert np.array_equal(rerun[key], history[key]), key
    assert [r["arrivals"] for r in rerun.records] == [r["arrivals"] for r in history.records]


def test_local_steps_do_not_wait_for_a_straggler_on_the_virtual_clock():
    late = wb.stragglers.Bernoulli(p=0.3, delay=0.2, seed=5)
    _, local = _variables(
        replicas=3, strategy=wb.strategies.local_sgd(4), stragglers=late, clock="virtual", compute_seconds=0.1
    )
    _, sync = _variables(replicas=3, stragglers=late, clock="virtual", compute_seconds=0.1)
    # each replica runs its local steps by itself; the average every 4 steps waits for the slowest of them
    delays = np.array([r["delays"] for r in local.records])
    blocks = (0.1 + delays).reshape(3, 4, 3).sum(axis=1).max(axis=1)
    np.testing.assert_allclose(local["elapsed"][3::4], np.cumsum(blocks), rtol=1e-12)
    np.testing.assert_allclose(sync["elapsed"][-1], (0.1 + delays).max(axis=1).sum(), rtol=1e-12)
    assert local["elapsed"][-1] < sync["elapsed"][-1]


def test_a_synchronized_batch_norm_runs_on_the_virtual_clock_with_stragglers():
    g = wb.Graph("bn_lab")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.batch_norm(wb.layers.dense(x, 8), True)
        loss = wb.mean(wb.softmax_cross_entropy(wb.layers.dense(wb.relu(h), 3), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(90, 4)), "y": rng.integers(0, 3, 90)}
    runs = []
    for kw in ({}, {"stragglers": wb.stragglers.Fixed(1, 0.3), "clock": "virtual", "compute_seconds": 0.1}):
        sess = wb.Session(g, seed=0)
        history = sess.fit(train, data, batch_size=16, steps=4, fetches={"loss": loss}, replicas=2, **kw)
        runs.append((sess.variables, history))
    (plain, _), (timed, history) = runs
    for name, value in plain.items():
        np.testing.assert_array_equal(timed[name], value, err_msg=name)
    assert np.allclose(history["time"], 0.4)  # replica 1's delay holds every step
