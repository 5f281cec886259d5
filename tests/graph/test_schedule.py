"""The plan's collective schedule: starts moved up with the ops that only feed them, dones down, and
sum/mean all-reduces bucketed into flat arrays in the order their inputs are made (the all-reduce
engine's buckets), with the bits of unbucketed ones."""

import threading

import numpy as np
import pytest

import workbench as wb
from workbench.graph.compile import compile_plan
from workbench.graph.schedule import schedule_collectives
from workbench.ops import collective
from workbench.simulation import InProcessGroup
from workbench.strategies.program import UPDATE, ReplicaProgram


def _mlp(sizes=(6, 8, 8, 3)):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, sizes[0]))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = x
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            h = wb.matmul(h, wb.variable(f"w{i}", shape=(a, b))) + wb.variable(f"b{i}", shape=(b,), init="zeros")
            if i < len(sizes) - 2:
                h = wb.relu(h)
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = wb.optimizers.Momentum(0.1, 0.9).minimize(loss)
    return g, train


def _replica_plans(strategy, replicas, bucket_bytes, g=None, train=None):
    if g is None:
        g, train = _mlp()
    program = ReplicaProgram.build(g, train.name, strategy, replicas)
    variant = program.variant(frozenset(program.periods))
    start = {n: np.asarray(v) for n, v in wb.Session(g, seed=0).variables.items()}
    fed = ["x", "y", *program.inputs.values()]
    plans = []
    for _ in range(replicas):
        state = {n: v.copy() for n, v in start.items()}
        for name in program.state_variables():
            state.setdefault(name, np.zeros(variant.get(name).shape, variant.get(name).dtype))
        plans.append(
            compile_plan(variant, [UPDATE], fed, state=state, seed=0, own_state=True, bucket_bytes=bucket_bytes)
        )
    return program, plans


def _train(program, plans, steps=3, rows=12):
    """``steps`` steps of every replica's plan in threads of an InProcessGroup; each replica's state."""
    size = len(plans)
    group = InProcessGroup(size, timeout=20)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(rows, 6)).astype("float32"), rng.integers(0, 3, rows)
    inputs, errors = program.inputs, []

    def work(rank):
        member, plan = group.members[rank], plans[rank]
        shard = np.array_split(np.arange(rows), size)[rank]
        try:
            for step in range(1, steps + 1):
                member.begin(step)
                feeds = {"x": x[shard], "y": y[shard], inputs["id"]: np.array(rank), inputs["step"]: np.array(step)}
                feeds[inputs["weight"]] = np.array(len(shard) / rows, dtype="float32")
                plan.run([feeds[n] for n in plan.feed_names], step=step - 1, comm=member)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            group.abort(str(e))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return [dict(p.state) for p in plans], group


def _starts(plan):
    return [op for i, op in enumerate(plan.step_ops) if i in plan._starts]


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("strategy", ["allreduce", wb.strategies.local_sgd(every=1)])
def test_bucketed_all_reduces_give_the_bits_of_one_per_op(replicas, strategy):
    program, single = _replica_plans(strategy, replicas, None)
    _, bucketed = _replica_plans(strategy, replicas, 1 << 20)
    assert len(_starts(bucketed[0])) == 1 < len(_starts(single[0]))  # the whole model in one bucket
    one, one_group = _train(program, single)
    many, many_group = _train(program, bucketed)
    for a, b in zip(one, many, strict=True):
        assert set(a) == set(b)
        for name in a:
            assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), name
    # the same collective ops ran, the same bytes moved
    assert [m.collectives for m in many_group.members] == [m.collectives for m in one_group.members]
    if replicas == 2:
        assert [m.bytes_sent for m in many_group.members] == [m.bytes_sent for m in one_group.members]


def test_buckets_follow_the_backward_pass_and_close_at_the_size_like_the_engines():
    g, train = _mlp((200, 300, 300, 10))
    program, (plan,) = _replica_plans("allreduce", 1, 300 * 300 * 4, g, train)
    starts = sorted(plan._starts)
    entries = plan.step_ops
    # every start sits inside the backward pass: some gradient matmul still runs after it
    last_matmul = max(i for i, op in enumerate(entries) if op.type == "matmul")
    assert starts[0] < last_matmul
    # r.weight multiplies each gradient on its way into the bucket (one pass over it, as the engine's)
    assert not [op.name for op in entries if op.name.startswith("allreduce/multiply")]
    # the engine's rule: gradients in the order the backward pass makes them, a bucket closes once
    # it holds bucket_bytes: [b2, w2, b1, w1] then [b0, w0]
    from workbench.cluster.worker_plans import plan_buckets

    shapes = [(10,), (300, 10), (300,), (300, 300), (300,), (200, 300)]
    engine = plan_buckets(range(6), shapes, ["float32"] * 6, 300 * 300 * 4)
    assert [len(b.gradients) for b in engine] == [4, 2]
    buckets = sorted(plan_buckets_of(plan), key=len, reverse=True)
    assert buckets == [
        [(10,), (300, 10), (300,), (300, 300)],
        [(300,), (200, 300)],
    ]


def plan_buckets_of(plan):
    """The shapes of each start's members: a bucket's, or the one op's."""
    return [
        list(plan.buckets[i].shapes) if i in plan.buckets else [tuple(plan.step_ops[i].inputs[0].shape)]
        for i in sorted(plan._starts)
    ]


def test_a_collective_of_another_collectives_result_is_not_bucketed_with_it(graph):
    x = wb.placeholder("x", shape=(3,))
    with collective.replicas(2):
        a = wb.all_reduce(x)
        b = wb.all_reduce(a * 2.0)  # needs a's result: in a's bucket it would wait for itself
        c = wb.all_reduce(x * 3.0)
        m = wb.all_reduce(x, op="mean")  # another reduction: its own bucket
        h = wb.all_reduce(wb.cast(x, "float64"))  # another dtype: its own bucket
    fetches = [b.name, c.name, m.name, h.name]
    plans = [compile_plan(graph, fetches, ["x"], bucket_bytes=1 << 20) for _ in range(2)]
    assert len(plans[0]._starts) == 4  # {a, c}, {b}, {m}, {h}
    assert [len(bucket.ops) for bucket in plans[0].buckets.values()] == [2]
    results, errors = [None, None], []
    group = InProcessGroup(2, timeout=10)

    def work(rank):
        try:
            group.members[rank].begin(1)
            results[rank] = plans[rank].run([np.full(3, rank + 1.0, np.float32)], comm=group.members[rank])
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            group.abort(str(e))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    for got in results:
        assert [v.tolist() for v in got] == [[12.0] * 3, [9.0] * 3, [1.5] * 3, [3.0] * 3]
        assert got[3].dtype == np.float64
    assert [mem.collectives for mem in group.members] == [5, 5]


def test_without_collectives_the_schedule_is_the_graphs(graph):
    x = wb.placeholder("x", shape=(3,))
    y = wb.exp(x) * 2.0
    plan = compile_plan(graph, [y.name], ["x"], bucket_bytes=1 << 20)
    assert [op.type for op in plan.step_ops] == ["exp", "multiply"]
    assert schedule_collectives([], 1 << 20) == ([], set(), {})
