"""The scaling predictor on a real cluster of 3 worker processes: the probe, and predictions
from one worker's profile against what 2 and 3 workers measure.

The bounds are loose (within a factor of 2: a 2-core machine shared with other work moves
every timing, and 3 workers share its 2 cores); bench/predict.py reports the errors precisely.
"""

import math
import os
import re
import statistics

import pytest

import workbench as wb
from workbench.cluster import predict as model
from workbench.cluster import probe
from workbench.events import ROOT
from workbench.scaling import measure_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def workers_of(client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


def test_the_link_measured_at_two_ranks_predicts_the_all_reduce_at_three(client3):
    workers = workers_of(client3)
    link = probe.measure_link(client3, workers[:2], repeats=5)
    assert 0 <= link["latency"] < 0.05 and 1e7 < link["bandwidth"] < 1e12
    assert [s for s, _ in link["samples"]] == list(probe.SIZES)
    ((size, measured),) = probe.measure_allreduce(client3, workers, sizes=(4 << 20,), repeats=5)
    predicted = model.allreduce_seconds(size, 3, model.Link("measured", link["bandwidth"], link["latency"]))
    assert predicted == pytest.approx(measured, rel=0.6)


def test_hop_and_sum_rate_are_timed_on_a_worker(client3):
    worker = workers_of(client3)[0]
    assert 1e-5 < probe.measure_hop(client3, worker, hops=10) < 1.0
    assert probe.measure_sum_rate(client3, worker, nbytes=4 << 20) > 1e7


def _steps(client, graph, train, data, batch, k, steps=12, warmup=3):
    sess = wb.Session(graph, cluster=client)
    history = sess.fit(train, data, batch_size=batch, steps=warmup + steps, replicas=k, workers=workers_of(client)[:k],
                       sync_every=warmup + steps, strategy="parameter_server")  # fmt: skip
    return history.records[warmup:], sess


def test_a_profile_from_one_worker_predicts_two_and_three(client3, kit):
    m, data = kit.mlp(hidden=64, dtype="float32", features=32), kit.blobs(n=512, features=32, dtype="float32")
    batch = 192
    one, sess = _steps(client3, m["graph"], m["train"], data, batch, 1)
    compute = [(math.ceil(batch / k), statistics.median(r["compute_seconds"] for r in _steps(
        client3, m["graph"], m["train"], data, math.ceil(batch / k), 1)[0])) for k in (2, 3)]  # fmt: skip
    model_bytes = sum(v.nbytes for n, v in sess.variables.items() if re.fullmatch(r"[wb]\d", n))  # not Adam's slots
    profile = measure_profile(client3, workers_of(client3), {1: one}, batch, "parameter_server", model_bytes,
                              compute=compute)  # fmt: skip
    assert profile.hop > 0 and profile.latency >= 0 and profile.bandwidth < math.inf and profile.compute(batch) > 0
    shared = model.Assumptions(cores=len(os.sched_getaffinity(0)))  # the 3 workers share this machine
    predicted = {r["workers"]: r for r in model.predict(profile, [1, 2, 3], ["parameter_server"], shared)}
    # calibrated at one worker: the prediction there is the measurement (its mean step)
    assert predicted[1]["step_seconds"] == pytest.approx(statistics.fmean(r["time"] for r in one), rel=0.05)
    for k in (2, 3):
        measured = statistics.median(r["time"] for r in _steps(client3, m["graph"], m["train"], data, batch, k)[0])
        assert 0.5 < predicted[k]["step_seconds"] / measured < 2.0, (k, predicted[k], measured)


def test_scaling_study_predicts_each_strategy_and_says_what_it_assumes(client, kit):
    m, data = kit.mlp(hidden=32, dtype="float32"), kit.blobs(n=256, dtype="float32")
    events = []
    unsubscribe = ROOT.subscribe(lambda e: events.append(e) if e["kind"] == "scaling_finished" else None)
    try:
        study = wb.scaling_study(m["graph"], m["train"], data, batch_size=64, steps=4, workers=[1, 2], cluster=client,
                                 strategy="parameter_server", predict=[8, 100], assumptions="10gbe")  # fmt: skip
    finally:
        unsubscribe()
    assert {(r["strategy"], r["workers"]) for r in study.predictions} == {
        (s, k) for s in ("allreduce", "parameter_server") for k in (1, 2, 8, 100)
    }
    weights = {
        n: v for n, v in wb.Session(m["graph"]).variables.items() if re.fullmatch(r"[wb]\d", n)
    }  # not Adam's slots
    assert len(weights) == 4 and study.profile.model_bytes == sum(v.nbytes for v in weights.values())
    assert any("10 GbE" in a for a in study.assumptions) and "(predicted)" in study.table()
    ps = [study.predicted("parameter_server", k)["efficiency"] for k in (2, 8, 100)]
    assert ps == sorted(ps, reverse=True)
    (finished,) = events
    assert finished.predictions == tuple(study.predictions) and finished.assumptions == tuple(study.assumptions)
    with pytest.raises(wb.ClusterError, match=r"predict must be worker counts such as \[8, 32, 100\], got 'many'"):
        wb.scaling_study(m["graph"], m["train"], data, batch_size=64, workers=[1], cluster=client, predict="many")
