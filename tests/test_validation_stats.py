"""fit(validation=(data, k)) and fit(stats=k): held-out curves, and statistics computed by the graph."""

import numpy as np
import pytest

import workbench as wb
from workbench.events import Step, Validated
from workbench.fitloop import FitLoop, FitRequest, StepOutcome
from workbench.graph.probes import probes


def mlp():
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        with wb.name_scope("layer1"):
            h = wb.relu(
                wb.matmul(x, wb.variable("w", shape=(4, 8), init="glorot_uniform")) + wb.variable("b", shape=(8,))
            )
        with wb.name_scope("out"):
            logits = wb.matmul(h, wb.variable("w", shape=(8, 3), init="glorot_uniform"))
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        acc = wb.accuracy(logits, y)
        train = wb.optimizers.SGD(0.5).minimize(loss)
    return g, train, loss, acc, h


def data(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    x = (np.eye(3, 4)[y] * 2 + rng.normal(size=(n, 4))).astype("float32")
    return {"x": x, "y": y}


def test_validation_every_k_steps_records_val_fields_and_events():
    g, train, loss, acc, _ = mlp()
    sess = wb.Session(g, seed=1)
    held_out, seen, calls = data(40, 1), [], []
    sess.events.subscribe(seen.append)
    history = sess.fit(train, data(96, 0), batch_size=16, steps=12, fetches={"loss": loss, "accuracy": acc},
                       validation=(held_out, 4), callback=calls.append)  # fmt: skip
    steps, values = history.series("val_loss")
    assert steps.tolist() == [4, 8, 12] and history["val_accuracy"].shape == (3,)
    assert "val_loss" in calls[3] and "val_loss" not in calls[4]  # the callback sees the record with it
    # the last one is the held-out loss of the final variables, over all 40 examples at once
    final = sess.run([loss, acc], held_out)
    assert values[-1] == pytest.approx(float(final[0]), rel=1e-6)
    assert history["val_accuracy"][-1] == pytest.approx(float(final[1]))
    validated = [e for e in seen if isinstance(e, Validated)]
    assert [e.step for e in validated] == [4, 8, 12] and validated[0].examples == 40
    assert validated[0].session == sess.token and validated[0].graph == g.token
    assert set(validated[0].fetches) == {"loss", "accuracy"}
    order = [(type(e).__name__, e.step) for e in seen if isinstance(e, (Step, Validated))]
    assert order[3:5] == [("Step", 4), ("Validated", 4)]
    frame = history.to_pandas()
    assert np.isnan(frame.loc[5, "val_loss"]) and frame.loc[8, "val_loss"] == pytest.approx(values[1])
    assert history["loss"].shape == (12,)  # a field of every step is unchanged


@pytest.mark.parametrize(
    "validation, error, match",
    [
        ({"x": 1}, wb.ArgumentError, r"validation must be a tuple \(data, every_k_steps\), got \{'x': 1\}"),
        (({"x": 1}, 2, 3), wb.ArgumentError, r"got a tuple of 3"),
        (({"x": 1}, 0), wb.ArgumentError, r"every_k_steps must be a positive integer, got 0"),
        (({"x": 1}, 2.5), wb.ArgumentError, r"every_k_steps must be a positive integer, got 2.5"),
        (({"x": 1}, True), wb.ArgumentError, r"every_k_steps must be a positive integer, got True"),
        (([1, 2], 2), wb.FeedError, r"validation data must be a non-empty dict"),
        (({"x": np.zeros((5, 4), "float32")}, 2), wb.FeedError,
         r"validation data lacks placeholder 'y' \(shape \(None,\), int64\), needed to compute 'loss'"),
        (({"x": np.zeros((5, 3), "float32"), "y": np.zeros(5, "int64")}, 2), wb.FeedError,
         r"validation data: placeholder 'x' expects shape \(None, 4\), got data of shape \(5, 3\)"),
        (({"x": np.zeros((5, 4), "float32"), "y": np.zeros(4, "int64")}, 2), wb.FeedError, r"validation data: data arrays differ in length"),
        (({"z": np.zeros(5)}, 2), wb.FeedError, r"validation data: graph 'mlp' has no placeholder named 'z'"),
    ],
)  # fmt: skip
def test_bad_validation_arguments_are_named_before_training(validation, error, match):
    g, train, loss, _, _ = mlp()
    sess = wb.Session(g)
    before = sess.variables
    with pytest.raises(error, match=match):
        sess.fit(train, data(32, 0), batch_size=8, steps=4, fetches={"loss": loss}, validation=validation)
    assert all(np.array_equal(before[k], v) for k, v in sess.variables.items())  # nothing trained


def test_validation_needs_fetches():
    g, train, _, _, _ = mlp()
    with pytest.raises(wb.ArgumentError, match="validation evaluates the fetches on the held-out data: give fetches="):
        wb.Session(g).fit(train, data(32, 0), batch_size=8, steps=2, validation=(data(8, 1), 1))


class CountingEngine:
    """A stand-in cluster engine whose host copy is only refreshed where ``sync_at`` asks."""

    strategy, replicas, workers, restarts = "counting", 2, 2, 0

    def start(self, variables, step):
        self.w, self.host, self.synced = np.array(variables["out/w"]), (dict(variables), step), []

    def run(self, first, last, sync_at):
        for step in range(first, last + 1):
            self.w = self.w + 1.0
            if sync_at(step):
                self.host = ({**self.host[0], "out/w": self.w.copy()}, step)
                self.synced.append(step)
            yield StepOutcome(step, {"loss": 0.0})

    def variables(self):
        return self.host

    def close(self):
        pass


class SeenVariables:
    """A validation that records the step and the engine's variables it was given."""

    every = 3

    def __init__(self):
        self.seen = []

    def evaluate(self, engine, step):
        variables, at = engine.variables()
        self.seen.append((step, at, float(variables["out/w"][0, 0])))
        return {"step": step, "fetches": {"loss": float(step)}, "examples": 1}


def test_the_loop_brings_the_variables_of_validation_steps_home():
    g, train, loss, _, _ = mlp()
    sess = wb.Session(g)
    request = FitRequest(g, train.name, data(16, 0), 8, 7, {"loss": loss.name}, (0, 1), 0, sess.device)
    engine, validation = CountingEngine(), SeenVariables()
    start = float(sess.variables["out/w"][0, 0])
    history, _ = FitLoop(request, sess.events, validation=validation).run(engine, sess.variables)
    assert engine.synced == [3, 6]  # no checkpoints: only the validation steps come home
    assert [(s, at) for s, at, _ in validation.seen] == [(3, 3), (6, 6)]
    assert [round(w - start) for _, _, w in validation.seen] == [3, 6]
    assert history.series("val_loss")[1].tolist() == [3.0, 6.0]


def test_stats_are_graph_ops_fetched_every_k_steps_with_the_step():
    g, train, loss, _, h = mlp()
    sess = wb.Session(g, seed=3)
    train_data = data(32, 0)
    before = sess.variables
    seen = []
    sess.events.subscribe(seen.append)
    history = sess.fit(train, train_data, batch_size=32, steps=3, fetches={"loss": loss}, stats=1)
    assert sorted(history.stats) == [1, 2, 3]
    first = history.stats[1]
    # the gradient norm of step 1, from SGD's update: w1 = w0 - 0.5 * grad
    after = wb.Session(g, seed=3)
    after.fit(train, train_data, batch_size=32, steps=1)
    grad = (before["out/w"] - after.variables["out/w"]) / 0.5
    assert first["out/w/grad_norm"] == pytest.approx(float(np.linalg.norm(grad)), rel=1e-4)
    relu = wb.Session(g, seed=3).run(h, train_data)  # the whole data is step 1's batch
    assert first["layer1/relu/mean"] == pytest.approx(float(relu.mean()), rel=1e-5)
    assert first["layer1/relu/std"] == pytest.approx(float(relu.std()), rel=1e-4)
    assert first["loss/mean"] == pytest.approx(history["loss"][0], rel=1e-6)
    assert {"layer1/w/grad_norm", "layer1/b/grad_norm", "layer1/matmul/mean", "out/matmul/std"} <= set(first)
    assert not any(k.startswith("stats/") or k.startswith("accuracy") for k in first)  # no stats of stats
    steps = [e for e in seen if isinstance(e, Step)]
    assert steps[0].stats == first and "out/w/grad_norm" not in history.records[0]
    # the ops live in the graph, under the stats scope, and a second fit reuses them
    count = len(g.operations)
    assert g.get("stats/out/w/grad_norm").shape == ()
    history = sess.fit(train, train_data, batch_size=8, steps=4, stats=2)
    assert sorted(history.stats) == [2, 4] and len(g.operations) == count


def test_watch_picks_statistics_and_names_mistakes():
    g, train, loss, _, _ = mlp()
    found = wb.watch(train, stats="grad_norm")
    assert [p.label for p in found] == ["layer1/w/grad_norm", "layer1/b/grad_norm", "out/w/grad_norm"]
    assert wb.watch(train, stats="grad_norm") == found and probes(g) == found  # once
    history = wb.Session(g).fit(train, data(16, 0), batch_size=8, steps=2, stats=1)
    assert set(history.stats[2]) == {p.label for p in found}  # fit uses the graph's own choice
    with pytest.raises(wb.ArgumentError, match="unknown statistic 'norm'; statistics are grad_norm, mean, std"):
        wb.watch(train, stats=["norm"])
    with pytest.raises(wb.GraphError, match="'loss' is not an optimizer's update"):
        wb.watch(loss)
    with pytest.raises(wb.ArgumentError, match="fit\\(\\) stats must be a positive integer, got 0"):
        wb.Session(g).fit(train, data(16, 0), batch_size=8, steps=2, stats=0)
