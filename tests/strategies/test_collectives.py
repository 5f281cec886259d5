"""Collective ops: their rules, R = 1 outside a replicated fit, the in-process group's results and
bytes, the fixed sum order, and the plan's start/done split."""

import threading

import numpy as np
import pytest

import workbench as wb
from workbench.cluster.collective.communicator import tree_sum
from workbench.graph.compile import compile_plan
from workbench.ops import collective
from workbench.simulation import InProcessGroup


def test_outside_a_replicated_fit_collectives_act_as_one_replica(graph):
    x = wb.placeholder("x", shape=(3,))
    fetched = [wb.all_reduce(x), wb.all_reduce(x, op="mean"), wb.all_reduce(x, op="max"), wb.all_gather(x)]
    fetched.append(wb.broadcast(x, root=0))
    values = wb.Session(graph).run(fetched, {x: [1.0, -2.0, 3.0]})
    for v in values[:3] + values[4:]:
        assert v.tolist() == [1.0, -2.0, 3.0]
    assert values[3].shape == (1, 3) and values[3].tolist() == [[1.0, -2.0, 3.0]]


def test_rules_refuse_shapes_that_depend_on_the_replica_and_unknown_reductions(graph):
    x = wb.placeholder("x", shape=(None, 3))
    with pytest.raises(wb.ShapeError, match=r"all_reduce needs the same shape on every replica; shape \(None, 3\)"):
        wb.all_reduce(x)
    with pytest.raises(wb.ShapeError, match="all_gather needs the same shape"):
        wb.all_gather(x)
    y = wb.placeholder("y", shape=(3,))
    with pytest.raises(wb.ShapeError, match="unknown reduction 'prod'"):
        wb.all_reduce(y, op="prod")
    with pytest.raises(wb.ShapeError, match="broadcast root 2 is not a replica of 1"):
        wb.broadcast(y, root=2)
    with collective.replicas(4):
        assert wb.all_gather(y).shape == (4, 3)
        assert wb.broadcast(y, root=3).shape == (3,)


def test_collectives_are_declared_non_differentiable_and_never_folded(graph):
    for name in ("all_reduce", "all_gather", "broadcast"):
        opdef = wb.ops.get_op(name)
        assert opdef.collective and not opdef.differentiable and "collective" in opdef.nondiff
    c = wb.constant([1.0, 2.0])
    y = wb.all_reduce(c) * 2.0
    plan = compile_plan(graph, [y.name], [])
    assert [op.type for op in plan.step_ops].count("all_reduce") == 2  # its start and its done, still there


def test_pairwise_sum_is_the_clusters_order_bit_for_bit(rng):
    for count in (1, 2, 3, 5, 8):
        parts = [rng.normal(size=1000).astype(np.float32) * 10.0 ** rng.integers(-3, 4) for _ in range(count)]
        ours = collective.pairwise_sum(parts)
        theirs = tree_sum(parts)
        assert ours.tobytes() == np.asarray(theirs).tobytes()


def _in_threads(size, fn):
    """``fn(member)`` for every rank of a group, each in its own thread; results in rank order."""
    group = InProcessGroup(size, timeout=10)
    results, errors = [None] * size, []

    def work(rank):
        try:
            member = group.members[rank]
            member.begin(1)
            results[rank] = fn(member)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            group.abort(str(e))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, group


def test_the_in_process_group_reduces_gathers_and_broadcasts_in_rank_order(rng):
    parts = [rng.normal(size=(2, 3)) for _ in range(3)]

    def each(member):
        mine = parts[member.rank]
        out = {}
        for op in ("sum", "mean", "max", "min"):
            out[op] = member.start("all_reduce", np, mine, op=op, replicas=3).wait()
        out["gather"] = member.start("all_gather", np, mine, replicas=3).wait()
        out["broadcast"] = member.start("broadcast", np, mine, root=2, replicas=3).wait()
        return out

    results, group = _in_threads(3, each)
    total = (parts[0] + parts[1]) + parts[2]
    for r in results:
        assert r["sum"].tobytes() == total.tobytes()
        assert r["mean"].tobytes() == (total * (1.0 / 3)).tobytes()
        np.testing.assert_array_equal(r["max"], np.maximum(np.maximum(parts[0], parts[1]), parts[2]))
        np.testing.assert_array_equal(r["min"], np.minimum(np.minimum(parts[0], parts[1]), parts[2]))
        np.testing.assert_array_equal(r["gather"], np.stack(parts))
        np.testing.assert_array_equal(r["broadcast"], parts[2])
    assert results[0]["sum"] is not results[1]["sum"]  # every replica owns its result
    assert [m.collectives for m in group.members] == [6, 6, 6]


def test_bytes_are_what_the_clusters_direct_algorithms_send():
    n, itemsize = 1000, 4
    # a reduction: reduce-scatter then all-gather, 2 (R - 1) / R of the array per rank
    for size in (2, 4):
        per_rank = [
            collective.bytes_sent("all_reduce", n * itemsize, itemsize, size, r, {"op": "sum"}) for r in range(size)
        ]
        assert per_rank == [2 * (size - 1) * n * itemsize // size] * size
    uneven = [collective.bytes_sent("all_reduce", 10 * 8, 8, 3, r, {"op": "sum"}) for r in range(3)]
    assert uneven == [8 * (10 + 4), 8 * (10 + 3), 8 * (10 + 3)]  # chunks of 4, 3, 3
    assert collective.bytes_sent("all_gather", 80, 8, 3, 1, {}) == 160
    assert [collective.bytes_sent("broadcast", 80, 8, 3, r, {"root": 1}) for r in range(3)] == [0, 160, 0]
    assert collective.bytes_sent("all_reduce", 80, 8, 1, 0, {"op": "sum"}) == 0


def test_a_peer_that_fails_wakes_the_others_with_a_collective_error():
    def each(member):
        if member.rank == 1:
            raise RuntimeError("replica 1 broke")
        return member.start("all_reduce", np, np.ones(3), op="sum", replicas=2).wait()

    with pytest.raises((RuntimeError, wb.ClusterError)):
        _in_threads(2, each)


def test_mismatched_collectives_are_refused():
    def each(member):
        shape = (3,) if member.rank == 0 else (4,)
        return member.start("all_reduce", np, np.ones(shape), op="sum", replicas=2).wait()

    with pytest.raises(wb.ClusterError, match="different collectives"):
        _in_threads(2, each)


def test_the_plan_starts_a_collective_when_its_input_exists_and_waits_at_its_first_consumer(graph):
    x = wb.placeholder("x", shape=(4,))
    g = wb.tanh(x) * 3.0  # the input of the collective: made early
    later = wb.exp(wb.exp(wb.exp(x * 0.1) * 0.1) * 0.1)  # work that does not need the collective
    reduced = wb.all_reduce(g)
    y = reduced + later
    plan = compile_plan(graph, [y.name], ["x"])
    order = [(op.type, op.name) for op in plan.step_ops]
    start = order.index(("all_reduce", reduced.op.name))
    done = len(order) - 1 - order[::-1].index(("all_reduce", reduced.op.name))
    assert order[start - 1][0] == "multiply"  # right after its input
    assert [t for t, _ in order[start + 1 : done] if t == "exp"] == ["exp", "exp", "exp"]  # the rest overlaps it
    assert order[done + 1][0] == "add"  # waited for by its first consumer
    a = np.arange(4.0)
    value = plan.run([a.astype(np.float32)])[0]
    np.testing.assert_allclose(value, np.tanh(a) * 3 + np.exp(np.exp(np.exp(a * 0.1) * 0.1) * 0.1), rtol=1e-6)


def test_a_run_passes_its_communicator_to_the_kernels(graph):
    x = wb.placeholder("x", shape=(2,))
    with collective.replicas(2):
        y = wb.all_gather(wb.all_reduce(x, op="mean"))
    plan = compile_plan(graph, [y.name], ["x"])
    with pytest.raises(wb.ExecutionError, match="built for 2 replicas and runs without a group"):
        plan.run([np.ones(2, np.float32)])
    results, _ = _in_threads(2, lambda m: plan_copy(graph, y).run([np.full(2, m.rank + 1.0, np.float32)], comm=m)[0])
    for r in results:
        assert r.tolist() == [[1.5, 1.5], [1.5, 1.5]]


def plan_copy(graph, y):
    return compile_plan(graph, [y.name], ["x"])


def test_a_rank_that_writes_into_its_result_never_changes_a_peers(rng):
    parts = [rng.normal(size=200_000) for _ in range(4)]  # large: NumPy lets the threads run at once
    expected = collective.pairwise_sum(parts)

    def each(member):
        got = []
        for step in range(1, 6):
            member.begin(step)
            result = member.start("all_reduce", np, parts[member.rank], op="sum", replicas=4).wait()
            got.append(result.copy())
            result *= 0.0  # what a donating kernel of this replica may do next
        return got

    results, _ = _in_threads(4, each)
    for got in results:
        for value in got:
            assert value.tobytes() == expected.tobytes()
