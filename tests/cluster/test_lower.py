"""Lowering to Dask: partitioned task graphs, readable keys, the fixed reduction tree, results like local."""

import dask
import numpy as np
import pytest
from dask.task_spec import Task, TaskRef
from dask.utils import key_split

import workbench as wb
from workbench.cluster.lower import key_label, parse_key, shards, step_tasks

SEED = 3


def lowered(kit, layers=2, replicas=2, steps=3, batch_size=12, **kw):
    m = kit.mlp(layers)
    return kit.lower_model(m, replicas=replicas, steps=steps, batch_size=batch_size, **kw), m


@pytest.fixture(scope="module")
def kit(kit):
    def lower_model(m, replicas, steps, batch_size=12, **kw):
        return wb.cluster.lower(
            m["graph"], m["train"], kit.blobs(), batch_size=batch_size, replicas=replicas, steps=steps, **kw
        )

    kit.lower_model = lower_model
    return kit


def step_of(dsk, step):
    return {k: t for k, t in dsk.items() if isinstance(t, Task) and parse_key(k) and parse_key(k).step == step}


def short(key) -> str:
    """A step's task key without the graph and the step: ``grad-r0``, ``reduce-1-0``, ``update``."""
    name = parse_key(key)
    return f"{name.phase}-{name.rest}" if name.rest else name.phase


# -- partitioned, not exploded ----------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_tasks_per_step_grow_with_replicas_not_ops(kit, replicas):
    small, m2 = lowered(kit, layers=2, replicas=replicas)
    big, m6 = lowered(kit, layers=6, replicas=replicas)
    assert len(m6["graph"].operations) > 2 * len(m2["graph"].operations)
    assert small.tasks_per_step == big.tasks_per_step == 2 * replicas + 1
    assert len(small) == len(big)
    for step in (1, 2, 3):
        assert len(step_of(small.dsk, step)) == 2 * replicas + 1


def test_graph_size_is_linear_in_steps(kit):
    one, _ = lowered(kit, steps=1)
    four, _ = lowered(kit, steps=4)
    assert len(four) - len(one) == 3 * one.tasks_per_step


def test_keys_read_like_the_model(kit):
    low, _ = lowered(kit, replicas=2, steps=3)
    names = {key_label(k) for k in low.dsk if isinstance(k, tuple)}
    for step in (1, 2, 3):
        assert {f"mlp-grad-{step}-r0", f"mlp-grad-{step}-r1", f"mlp-reduce-{step}-1-0",
                f"mlp-update-{step}", f"mlp-metrics-{step}"} <= names  # fmt: skip
    assert key_label(low.state_key) == "mlp-update-3"
    assert [key_label(k) for k in low.metric_keys] == ["mlp-metrics-1", "mlp-metrics-2", "mlp-metrics-3"]


def test_each_phase_is_its_own_dask_key_prefix(kit):
    low, _ = lowered(kit, replicas=4, steps=3)
    prefixes = {key_split(k) for k, t in low.dsk.items() if isinstance(t, Task)}
    assert prefixes == {"mlp-grad", "mlp-reduce", "mlp-update", "mlp-metrics"}
    # the step and the replica are in the rest of the key
    assert parse_key(low.state_key) == ("mlp", "update", 3, "")
    assert {parse_key(k).rest for k in step_of(low.dsk, 2) if parse_key(k).phase == "grad"} == {"r0", "r1", "r2", "r3"}


def test_each_lowering_has_its_own_token(kit):
    a, _ = lowered(kit)
    b, _ = lowered(kit)
    assert key_label(a.state_key) == key_label(b.state_key) and a.state_key != b.state_key
    assert not set(a.dsk) & set(b.dsk)


def test_steps_chain_through_the_update(kit):
    low, _ = lowered(kit, replicas=2, steps=2)
    step2 = step_of(low.dsk, 2)
    grad = next(t for k, t in step2.items() if key_label(k) == "mlp-grad-2-r0")
    update1 = next(k for k in low.dsk if key_label(k) == "mlp-update-1")
    assert update1 in grad.dependencies


# -- the reduction tree ------------------------------------------------------------------------


def reductions(tasks):
    """reduce key -> the (short names of the) two things it adds, in order."""
    out = {}
    for key, task in tasks.items():
        if parse_key(key).phase == "reduce":
            out[short(key)] = tuple(short(a.key) for a in task.args if isinstance(a, TaskRef))
    return out


TREES = {
    1: {},
    2: {"reduce-1-0": ("grad-r0", "grad-r1")},
    3: {"reduce-1-0": ("grad-r0", "grad-r1"), "reduce-2-0": ("reduce-1-0", "grad-r2")},
    4: {
        "reduce-1-0": ("grad-r0", "grad-r1"),
        "reduce-1-1": ("grad-r2", "grad-r3"),
        "reduce-2-0": ("reduce-1-0", "reduce-1-1"),
    },
    5: {
        "reduce-1-0": ("grad-r0", "grad-r1"),
        "reduce-1-1": ("grad-r2", "grad-r3"),
        "reduce-2-0": ("reduce-1-0", "reduce-1-1"),
        "reduce-3-0": ("reduce-2-0", "grad-r4"),
    },
}
ROOTS = {1: "grad-r0", 2: "reduce-1-0", 3: "reduce-2-0", 4: "reduce-2-0", 5: "reduce-3-0"}


@pytest.mark.parametrize("replicas", sorted(TREES))
def test_fixed_reduction_tree(kit, replicas):
    low, _ = lowered(kit, replicas=replicas, steps=1)
    tasks = step_of(low.dsk, 1)
    assert reductions(tasks) == TREES[replicas]
    update = next(t for k, t in tasks.items() if key_label(k) == "mlp-update-1")
    root = [short(a.key) for a in update.args if isinstance(a, TaskRef) and parse_key(a.key)]
    assert root == [ROOTS[replicas]]


def test_tree_is_the_same_every_time(kit):
    a, _ = lowered(kit, replicas=5, steps=2)
    b, _ = lowered(kit, replicas=5, steps=2)
    for step in (1, 2):
        assert reductions(step_of(a.dsk, step)) == reductions(step_of(b.dsk, step)) == TREES[5]


def test_shards_are_contiguous_and_cover_the_batch():
    index = np.arange(10) * 3
    parts = shards(index, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    np.testing.assert_array_equal(np.concatenate(parts), index)


def test_shard_weights_are_each_shares_of_the_batch():
    tasks, keys = step_tasks("program", "state", ["x", "y"], np.arange(10), 4, "mlp", 1, "t")
    weights = [tasks[k].args[3] for k in keys["grads"]]
    assert weights == [0.3, 0.3, 0.2, 0.2]


def test_shards_know_where_they_start_in_the_batch():
    tasks, keys = step_tasks("program", "state", ["x", "y"], np.arange(10) * 2, 4, "mlp", 1, "t")
    assert [tasks[k].args[4] for k in keys["grads"]] == [0, 3, 6, 8]


# -- results -----------------------------------------------------------------------------------


def local_fit(kit, m, steps, batch_size=12):
    sess = wb.Session(m["graph"], seed=SEED, cluster=False)
    hist = sess.fit(m["train"], kit.blobs(), batch_size=batch_size, steps=steps, fetches=[m["loss"]])
    return sess.variables, hist


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_dask_get_matches_a_local_fit(kit, replicas):
    m = kit.mlp()
    # a session's first fit draws its batches from (seed, 1)
    low = kit.lower_model(m, replicas=replicas, steps=6, fetches=[m["loss"]], seed=SEED, batch_seed=(SEED, 1))
    state, *metrics = dask.get(low.dsk, [low.state_key, *low.metric_keys], scheduler="sync")
    expected, hist = local_fit(kit, m, steps=6)
    assert state["step"] == 6
    kit.assert_same_variables(expected, state["variables"], rtol=1e-9)
    losses = [mt["fetches"][0] for mt in metrics]
    np.testing.assert_allclose(losses, hist[m["loss"].name], rtol=1e-9)
    assert [mt["shards"] for mt in metrics] == [replicas] * 6


def test_dask_threaded_scheduler_gives_the_same_state(kit):
    m = kit.mlp()
    low = kit.lower_model(m, replicas=4, steps=4, seed=SEED, batch_seed=(SEED, 1))
    sync = dask.get(low.dsk, [low.state_key])[0]
    threaded = dask.threaded.get(low.dsk, [low.state_key])[0]
    kit.assert_same_variables(sync["variables"], threaded["variables"], rtol=0)


def test_starting_variables_can_be_given(kit):
    m = kit.mlp()
    zeros = {op.name: np.zeros(op.outputs[0].shape) for op in m["graph"].operations if op.type == "variable"}
    low = kit.lower_model(m, replicas=2, steps=0, variables=zeros)
    assert low.metric_keys == []
    state = dask.get(low.dsk, [low.state_key])[0]
    assert all(not v.any() for v in state["variables"].values())


# -- errors ------------------------------------------------------------------------------------


def test_train_must_be_an_optimizer_update(kit):
    m = kit.mlp()
    with pytest.raises(wb.ClusterError, match=r"not an optimizer update.*minimize\(\)"):
        wb.cluster.TrainingProgram.from_graph(m["graph"], m["loss"])
    with pytest.raises(wb.ClusterError, match="not an optimizer update"):
        wb.cluster.lower(m["graph"], m["loss"], kit.blobs(), batch_size=8)


def test_a_hand_written_update_is_refused(kit):
    g = wb.Graph(name="manual")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        w = wb.variable("w", shape=(2,), init="zeros")
        loss = wb.mean(wb.sum(x * w, axis=1) ** 2)
        (grad,) = wb.gradients(loss, [w])
        step = wb.assign_sub(w, grad * 0.1)
    with pytest.raises(wb.ClusterError, match=r"is not an optimizer update"):
        wb.cluster.TrainingProgram.from_graph(g, step)


def test_missing_data_is_named(kit):
    m = kit.mlp()
    with pytest.raises(wb.ClusterError, match=r"lacks the placeholders \['y'\]"):
        wb.cluster.lower(m["graph"], m["train"], {"x": kit.blobs()["x"]}, batch_size=8)


def test_more_replicas_than_examples(kit):
    m = kit.mlp()
    with pytest.raises(wb.ClusterError, match="a batch of 2 examples cannot be split across 3 replicas"):
        wb.cluster.lower(m["graph"], m["train"], kit.blobs(), batch_size=2, replicas=3)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_dropout_matches_local(kit, replicas):
    g = wb.Graph(name="drop")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(6, 3), dtype="float64")
        loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(wb.dropout(x, 0.5), w), y))
        train = wb.optimizers.SGD(0.1).minimize(loss)
    local = wb.Session(g, seed=SEED, cluster=False)
    local.fit(train, kit.blobs(), batch_size=12, steps=4)
    low = wb.cluster.lower(
        g, train, kit.blobs(), batch_size=12, replicas=replicas, steps=4, seed=SEED, batch_seed=(SEED, 1)
    )
    state = dask.get(low.dsk, [low.state_key])[0]
    kit.assert_same_variables(local.variables, state["variables"], rtol=1e-9)


def test_the_allreduce_strategy_lowers_to_r_tasks_a_step_that_read_like_the_model(kit):
    from workbench.cluster.collective.replica import run_step, start_replica

    m = kit.mlp()
    data = kit.blobs()
    low = wb.cluster.lower(m["graph"], m["train"], data, batch_size=12, replicas=3, steps=4, strategy="allreduce")
    tasks = {k: t for k, t in low.dsk.items() if isinstance(t, Task)}
    assert low.tasks_per_step == 3 and len(tasks) == 3 * 4 + 3  # and one start task per replica
    assert {key_split(k) for k in tasks} == {"mlp-allreduce", "mlp-allreduce-start"}
    steps = [k for k in tasks if parse_key(k)]
    assert sorted((parse_key(k).step, parse_key(k).rest) for k in steps) == [
        (s, f"r{i}") for s in range(1, 5) for i in range(3)
    ]
    assert all(tasks[k].func is run_step for k in steps) and low.state_key == steps[-3]
    starts = [k for k in tasks if not parse_key(k)]
    assert [key_label(k) for k in starts] == [
        "mlp-allreduce-start-r0",
        "mlp-allreduce-start-r1",
        "mlp-allreduce-start-r2",
    ]
    assert all(tasks[k].func is start_replica for k in starts)
    for k in steps:  # a step depends on its rank's start task only: no gradient or variable passes between tasks
        assert tasks[k].dependencies == {starts[int(parse_key(k).rest[1:])]}
    rows = np.concatenate([tasks[k].args[2] for k in steps if parse_key(k).step == 2])
    assert len(rows) == 12 and len(set(rows.tolist())) == 12
    with pytest.raises(wb.ClusterError, match="cannot lower strategy 'ring'"):
        wb.cluster.lower(m["graph"], m["train"], data, batch_size=12, strategy="ring")
