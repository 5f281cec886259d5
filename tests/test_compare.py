"""wb.compare_strategies: the same start for every run, bit-identical reruns on the virtual clock, the table."""

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ArgumentError
from workbench.widgets.comparison_view import ComparisonView


def _problem():
    g = wb.Graph("cmp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(6, 3), init="glorot_uniform")
        logits = x @ w
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        accuracy = wb.accuracy(logits, y)
        train = wb.optimizers.Adam(0.05).minimize(loss)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(400, 6)).astype("float32")
    ys = np.argmax(xs[:, :3] + 0.3 * xs[:, 3:], axis=1).astype("int64")
    return (
        g,
        train,
        {"loss": loss, "accuracy": accuracy},
        {"x": xs[:300], "y": ys[:300]},
        {"x": xs[300:], "y": ys[300:]},
    )


def _compare(**kw):
    g, train, fetches, data, val = _problem()
    options = {
        "batch_size": 40,
        "steps": 15,
        "replicas": 4,
        "validation": (val, 5),
        "stragglers": wb.stragglers.Bernoulli(p=0.25, delay=0.05, seed=0),
        "compute_seconds": 0.01,
        "fetches": fetches,
        "show": False,
    }
    return wb.compare_strategies(g, train, data, **{**options, **kw})


def test_virtual_clock_comparison_is_bit_identical_on_a_rerun():
    first, second = _compare(), _compare()
    assert list(first.histories) == ["sync", "sync + 2 backups", "async"]
    for label, history in first.histories.items():
        other = second.histories[label]
        for key in ("loss", "elapsed", "time", "val_accuracy", "val_loss"):
            assert np.array_equal(history[key], other[key]), (label, key)
        assert [r.get("arrivals") for r in history.records] == [r.get("arrivals") for r in other.records]
    assert first.configurations["sync + 2 backups"]["backup_replicas"] == 2
    # backups finish sooner under stragglers; async applies R gradients per synchronous step
    assert first.histories["sync + 2 backups"]["elapsed"][-1] < first.histories["sync"]["elapsed"][-1]
    assert len(first.histories["async"]) == 15 * 4
    assert np.mean(first.histories["async"]["staleness"][8:]) == pytest.approx(3, abs=1)


def test_every_run_starts_from_the_same_variables():
    seen = []
    result = _compare(runs={"a": {}, "b": {"replicas": 2}}, steps=1, callback=lambda r: seen.append(r["loss"]))
    # one step from the same start: the same global batch's loss, whatever the split
    assert seen[0] == pytest.approx(seen[1], rel=1e-5)
    assert list(result.histories) == ["a", "b"]


def test_time_to_and_table():
    result = _compare()
    key, below = result.metric()
    assert (key, below) == ("val_accuracy", False)
    target = result.default_target(key, below)
    assert target == min(float(np.max(h["val_accuracy"])) for h in result.histories.values())
    times = result.time_to()
    for label, history in result.histories.items():
        assert times[label] == history.time_to("val_accuracy", target) is not None
    assert result.time_to(2.0) == dict.fromkeys(result.histories)  # never reached
    table = result.table()
    column = f"seconds to val_accuracy >= {target:.4g}"
    assert [row["run"] for row in table.rows] == list(result.histories)
    assert table["sync"][column] == times["sync"]
    assert table["sync"]["steps"] == 15 and table["async"]["steps"] == 60
    sync = result.histories["sync"]
    assert table["sync"]["steps/s"] == pytest.approx(15 / sync["elapsed"][-1])
    assert table["sync"]["final val_accuracy"] == sync["val_accuracy"][-1]
    loss_table = result.table(target=10.0, key="val_loss")
    assert "seconds to val_loss <= 10" in loss_table.columns
    assert "virtual clock" in repr(table) and "<table" in table._repr_mimebundle_()["text/html"]


def test_view_shows_each_run_and_the_arrivals():
    result = _compare()
    view = result.view
    assert isinstance(view, ComparisonView) and view.state["status"] == "done"
    runs = {r["label"]: r for r in view.state["runs"]}
    assert runs["sync"]["points"][-1][0] == result.histories["sync"]["elapsed"][-1]
    assert len(runs["sync + 2 backups"]["kth"]) == 6 and runs["sync + 2 backups"]["needed"] == 4
    assert runs["async"]["kth"] == []
    picture = view.snapshot()
    assert picture.startswith("<svg") and "k-th gradient arrival" in picture
    assert picture.count('class="wb-line"') >= 5  # three accuracy curves and two arrival curves


def test_bad_runs_are_named():
    with pytest.raises(ArgumentError, match=r"runs=...\) maps a label to a dict of fit keywords"):
        _compare(runs={"sync": 3})
    with pytest.raises(ArgumentError, match="needs at least one run"):
        _compare(runs={})
    with pytest.raises(ArgumentError, match="clock must be 'wall' or 'virtual'"):
        _compare(clock="sundial")


def test_shown_live_the_view_follows_every_run(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda view, **kw: shown.append(view))
    result = _compare(runs={"sync": {}, "async": {"strategy": "async"}}, steps=5, show=True)
    assert shown == [result.view] and result.view.state["status"] == "done"
    runs = {r["label"]: r for r in result.view.state["runs"]}
    assert runs["sync"]["steps"] == 5 and runs["async"]["steps"] == 20
    assert all(r["status"] == "done" for r in runs.values())


def test_a_strategy_function_run_is_compared_on_the_virtual_clock():
    runs = {"sync": {}, "local sgd": {"strategy": wb.strategies.local_sgd(5)}}
    first, second = _compare(runs=runs), _compare(runs=runs)
    local = first.histories["local sgd"]
    for key in ("loss", "elapsed", "time", "val_accuracy"):
        assert np.array_equal(local[key], second.histories["local sgd"][key]), key
    assert len(local) == 15 and local.records[0]["arrivals"] == [0.01 + d for d in local.records[0]["delays"]]
    # local steps wait for no straggler: the same delays cost the local run less virtual time
    assert local["elapsed"][-1] < first.histories["sync"]["elapsed"][-1]
    assert first.table()["local sgd"]["steps"] == 15
