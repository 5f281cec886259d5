"""The one plan compiler, its cache, and the device seam (CPU, and the GPU emulated on NumPy)."""

import time

import numpy as np
import pytest

import workbench as wb
from workbench.graph.compile import PlanCache, PlanKey, compile_plan
from workbench.graph.device import CPU, Device


@pytest.fixture
def model():
    g = wb.Graph(name="m")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        w = wb.variable("w", shape=(3, 2), init=0.5)
        h = wb.relu(wb.matmul(x, w) + 1.0)
        y = wb.sum(wb.tanh(h) * 2.0, axis=1)
        unused = wb.placeholder("unused", shape=(None,))
    return g, x, w, y, unused


def test_compile_prunes_and_knows_its_feeds(model):
    g, x, w, y, unused = model
    plan = compile_plan(g, [y.name], ["x", "unused"], state={"w": np.full((3, 2), 0.5, np.float32)})
    assert plan.feed_names == ("x",) and plan.fetch_names == (y.name,)
    assert "unused" not in plan.graph
    (value,) = plan.run([np.ones((2, 3), np.float32)])
    np.testing.assert_allclose(value, 4 * np.tanh(2.5), rtol=1e-6)


def test_compile_names_the_missing_placeholder(model):
    g, x, w, y, unused = model
    with pytest.raises(
        wb.FeedError, match=r"placeholder 'x' \(shape \(None, 3\), float32\) must be fed to compute 'sum'"
    ):
        compile_plan(g, [y.name], [])


def test_the_device_rewrites_the_graph_and_brings_its_compilers(model):
    g, x, w, y, unused = model
    gpu = wb.Session(g, device="gpu", emulate=True).device
    assert isinstance(gpu, Device) and isinstance(CPU(), Device)
    fused = compile_plan(g, [y.name], ["x"], gpu)
    plain = compile_plan(g, [y.name], ["x"], CPU())
    assert "fused_elementwise" in {op.type for op in fused.graph.operations}
    assert len(fused) < len(plain)
    calls = []

    def compiler(xp, program, arrays):
        calls.append(len(program))
        return None  # cannot: the kernel runs the program step by step

    class Counting(CPU):
        name = "counting"
        fused_compilers = (compiler,)

        def rewrite(self, graph, fetches):
            return gpu.rewrite(graph, fetches)

    state = {"w": np.full((3, 2), 0.5, np.float32)}
    counted = compile_plan(g, [y.name], ["x"], Counting(), state=state)
    np.testing.assert_allclose(counted.run([np.ones((2, 3), np.float32)])[0], 4 * np.tanh(2.5), rtol=1e-6)
    assert calls  # the plan handed the device's compilers to the fused kernel


def test_plan_cache_is_lru_and_keys_on_graph_version_feeds_and_device(model):
    g, x, w, y, unused = model
    cache = PlanCache(maxsize=2)
    feeds = {"x": np.ones((1, 3), np.float32)}
    key = PlanKey.of(g, [y.name], feeds, CPU())
    assert PlanKey.of(g, [y.name], {"x": np.ones((9, 3), np.float32)}, CPU()) == key  # shapes do not matter
    assert PlanKey.of(g, [y.name], {"x": np.ones((1, 3), np.float64)}, CPU()) != key  # dtypes do
    gpu = wb.Session(g, device="gpu", emulate=True).device
    assert PlanKey.of(g, [y.name], feeds, gpu) != key
    other = wb.Graph(name="m")
    assert PlanKey.of(other, [y.name], feeds, CPU()) != key  # another graph, whatever its name
    made = []
    for k in ("a", "b", "a", "c", "b"):
        cache.get(k, lambda k=k: made.append(k) or k)
    assert made == ["a", "b", "c", "b"] and list(cache.keys()) == ["c", "b"] and cache.compiled == 4
    with g.as_default():
        wb.exp(y)  # a new version of the graph
    assert PlanKey.of(g, [y.name], feeds, CPU()) != key


def test_plan_context_is_an_argument_and_snapshots_restore(model):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        d = wb.dropout(x, 0.5, seed=3)
        v = wb.variable("v", shape=(), init=0.0)
        bump = wb.assign_add(v, 1.0)
    plan = compile_plan(g, [d.name], ["x"])
    ones = np.ones((6, 4))
    first = plan.run([ones], step=7)[0]
    np.testing.assert_array_equal(plan.run([ones], step=7)[0], first)  # the step keys the draw
    np.testing.assert_array_equal(plan.run([ones[2:]], step=7, row_offset=2)[0], first[2:])  # and the global row
    assert plan.runs == 3
    state = {"v": np.asarray(0.0)}
    counter = compile_plan(g, [bump.op.name], [], state=state, own_state=True)
    counter.run([])
    held = state["v"]
    saved = counter.snapshot()  # which arrays the variables are (not copies of their values)
    state["v"] = np.asarray(10.0)  # a run that replaced the array (as a failed capture may)
    counter.run([])
    assert float(state["v"]) == 11.0 and counter.runs == 2
    counter.restore(saved)
    assert state["v"] is held and float(held) == 1.0 and counter.runs == 1


def test_a_plan_reports_each_watched_fetch_as_soon_as_it_is_computed():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None,))
        a = x * 2.0
        b = wb.sum(a + 1.0)
        c = wb.sum(a * a)
    plan = compile_plan(g, [c.name, x.name, b.name], ["x"])
    made = plan.producers()
    assert made[1] == -1 and 0 <= made[0] and 0 <= made[2]  # a fed value is there before any kernel call
    seen = []
    plan.watch([0, 1, 2], lambda k, value: seen.append((k, float(value), plan.runs)))
    values = plan.run([np.array([1.0, 2.0])])
    assert sorted(seen) == [(0, 20.0, 0), (2, 8.0, 0)]  # during the run, before it counts as done
    assert [k for k, _, _ in seen] == sorted([0, 2], key=made.__getitem__)  # in the order they are made
    assert float(values[0]) == 20.0 and float(values[2]) == 8.0


def test_a_plan_notes_when_its_backward_pass_began(model):
    g, x, w, y, unused = model
    with g.as_default():
        loss = wb.mean(y)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    state = {"w": np.full((3, 2), 0.5, np.float32)}
    plan = compile_plan(g, [train.name, loss.name], ["x"], state=state)
    ops = plan.step_ops
    assert ops[plan.backward].name.startswith("gradients/")
    assert not any(op.name.startswith("gradients/") for op in ops[: plan.backward])
    before = time.time()
    plan.run([np.ones((2, 3), np.float32)])
    assert before <= plan.backward_began <= time.time()
    plan.count_run()  # a replayed capture ran none of the plan's steps: no time to tell
    assert plan.backward_began is None
    forward = compile_plan(g, [loss.name], ["x"], state=state)
    forward.run([np.ones((2, 3), np.float32)])
    assert forward.backward is None and forward.backward_began is None
