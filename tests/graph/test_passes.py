"""Graph passes: each keeps results identical and leaves a graph that validates."""

import numpy as np
import pytest

import workbench as wb
from workbench.graph import passes
from workbench.graph.core import Operation


def random_graph(seed):
    """A graph of random elementwise, matmul and reduction ops over two inputs and constants,
    with repeated subexpressions and constant-only branches."""
    rng = np.random.default_rng(seed)
    g = wb.Graph(name=f"random{seed}")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4), dtype="float64")
        w = wb.variable("w", init=rng.normal(size=(4, 4)), dtype="float64")
        pool = [x, x @ w, wb.constant(rng.normal(size=(4,)))]
        unary = [wb.tanh, wb.sigmoid, wb.relu, lambda t: t * 2.0, lambda t: -t, wb.abs]
        binary = [wb.add, wb.subtract, wb.multiply, wb.maximum, wb.minimum]
        for _ in range(25):
            if rng.random() < 0.4:
                f = unary[rng.integers(len(unary))]
                pool.append(f(pool[rng.integers(len(pool))]))
            else:
                f = binary[rng.integers(len(binary))]
                a, b = (pool[i] for i in rng.integers(len(pool), size=2))
                pool.append(f(a, b))
            if rng.random() < 0.3:  # the same expression again
                pool.append(wb.tanh(pool[-1]))
                pool.append(wb.tanh(pool[-2]))
        const = wb.constant(rng.normal(size=(4,)))
        pool.append(wb.exp(const * 0.5) + const)
        outs = [wb.sum(t * 1.0) for t in pool[-6:]] + [wb.mean(pool[-1], axis=0)]
    return g, x, outs


PASSES = {
    "prune": lambda g, names: passes.prune(g, names),
    "fold_constants": lambda g, names: passes.fold_constants(g),
    "cse": lambda g, names: passes.eliminate_common_subexpressions(g),
    "optimize": lambda g, names: passes.optimize(g, names),
    "all": lambda g, names: passes.eliminate_common_subexpressions(passes.fold_constants(passes.prune(g, names))),
}


def evaluate(graph, names, x_value):
    """Run the named fetches without the session's own passes: compile the graph as it is."""
    from workbench.graph.plan import Plan

    state = {}
    from workbench.ops.state import initial_value

    for v in graph.variables:
        state[v.name] = initial_value(v.name, v.op.attrs, 0)
    plan = Plan(graph, names, ["x"], np, state)
    return plan.run([x_value])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(PASSES))
def test_passes_keep_results_and_validate(seed, name):
    g, x, outs = random_graph(seed)
    names = [t.name for t in outs]
    passes.validate(g)
    new = PASSES[name](g, names)
    passes.validate(new)
    assert new is not g
    x_value = np.random.default_rng(seed).normal(size=(5, 4))
    before = evaluate(g, names, x_value)
    after = evaluate(new, names, x_value)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert len(g.operations) >= len(new.operations)


def test_passes_do_not_change_their_input():
    g, x, outs = random_graph(3)
    snapshot = g.to_json()
    passes.optimize(g, [t.name for t in outs])
    assert g.to_json() == snapshot


def test_prune_keeps_only_what_the_fetches_need(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    unused = wb.placeholder("u", shape=(3,), dtype="float64")
    y = wb.exp(x)
    wb.log(unused) + y
    z = x * 2.0
    pruned = passes.prune(graph, [y.name])
    passes.validate(pruned)
    assert [op.name for op in pruned.operations] == ["x", "exp"]
    # stopping at fed placeholders: nothing upstream of a fed name is kept
    kept = passes.prune(graph, [z.name], fed=["x"])
    assert "u" not in kept and "exp" not in kept


def test_prune_keeps_control_inputs(graph):
    v = wb.variable("v", shape=(), init=0.0, dtype="float64")
    inc = wb.assign_add(v, 1.0)
    with graph.control_dependencies([inc]):
        y = wb.identity(v)
    pruned = passes.prune(graph, [y.name])
    passes.validate(pruned)
    assert inc.op.name in pruned
    assert pruned.get(y.name).op.control_inputs[0].name == inc.op.name


def test_fold_constants_really_folds(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    c = wb.exp(wb.constant(np.array([0.0, 1.0, 2.0])) * 2.0) + 1.0
    y = x * c
    folded = passes.fold_constants(passes.prune(graph, [y.name]))
    passes.validate(folded)
    # every op computed from constants alone became a constant, the chain included
    assert [op.type for op in folded.operations if op.type != "constant"] == ["placeholder", "multiply"]
    assert [op.type for op in passes.prune(folded, [y.name]).operations] == ["placeholder", "constant", "multiply"]
    value = folded.get(c.name).op.attrs["value"]
    np.testing.assert_allclose(value, np.exp(np.array([0.0, 1.0, 2.0]) * 2.0) + 1.0)
    # the folded constant keeps the name of the op it replaced, so fetches still work
    assert folded.get(c.name).op.type == "constant"


def test_fold_constants_folds_shape_only_ops(graph):
    x = wb.placeholder("x", shape=(2, 3), dtype="float64")
    z = wb.zeros_like(x) + wb.ones_like(x)
    folded = passes.fold_constants(passes.prune(graph, [z.name]))
    passes.validate(folded)
    assert folded.get(z.name).op.type == "constant"
    np.testing.assert_array_equal(folded.get(z.name).op.attrs["value"], np.ones((2, 3)))


def test_fold_constants_leaves_state_and_randomness_alone(graph):
    v = wb.variable("v", shape=(3,), init=1.0)
    d = wb.dropout(wb.constant(np.ones(3, np.float32)), 0.5)
    u = wb.assign_add(v, wb.constant(np.ones(3, np.float32)))
    folded = passes.fold_constants(graph)
    passes.validate(folded)
    assert folded.get(d.name).op.type == "dropout"
    assert folded.get(u.name).op.type == "assign_add"


def test_cse_merges_and_aliases_resolve(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    a = x * 2.0
    b = x * 2.0
    c = wb.tanh(a) + wb.tanh(b)
    merged = passes.eliminate_common_subexpressions(graph)
    passes.validate(merged)
    assert [op.type for op in merged.operations].count("multiply") == 1
    assert [op.type for op in merged.operations].count("tanh") == 1
    assert [op.type for op in merged.operations].count("constant") == 1
    assert merged.get(b.name) is merged.get(a.name)
    assert merged.operation(b.name) is merged.operation(a.name)
    assert b.name in merged
    add = merged.get(c.name).op
    assert add.inputs[0] is add.inputs[1]
    # the session fetches removed names through their aliases
    sess = wb.Session(graph)
    va, vb = sess.run([a, b], {x: [1.0, 2.0, 3.0]})
    np.testing.assert_array_equal(va, vb)


def test_cse_does_not_merge_state_randomness_or_different_attrs(graph):
    x = wb.placeholder("x", shape=(2, 3), dtype="float64")
    v = wb.variable("v", shape=(), init=0.0, dtype="float64")
    s0, s1 = wb.sum(x, axis=0), wb.sum(x, axis=1)
    d0, d1 = wb.dropout(x, 0.5), wb.dropout(x, 0.5)
    u0, u1 = wb.assign_add(v, 1.0), wb.assign_add(v, 1.0)
    merged = passes.eliminate_common_subexpressions(graph)
    passes.validate(merged)
    for t, u in [(s0, s1), (d0, d1), (u0, u1)]:
        assert merged.get(t.name) is not merged.get(u.name)


def test_validate_catches_corrupted_graphs(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    y = wb.exp(x)
    z = y + 1.0
    passes.validate(graph)

    # an op used before it is defined
    graph.operations[1], graph.operations[3] = graph.operations[3], graph.operations[1]
    with pytest.raises(wb.GraphError, match="uses 'exp', which is not defined before it"):
        passes.validate(graph)
    graph.operations[1], graph.operations[3] = graph.operations[3], graph.operations[1]

    # an output spec its rule disagrees with
    z.shape = (4,)
    with pytest.raises(wb.GraphError, match="its rule says"):
        passes.validate(graph)
    z.shape = (3,)

    # a name used twice
    y.op.name = "x"
    with pytest.raises(wb.GraphError, match="used twice"):
        passes.validate(graph)
    y.op.name = "exp"

    # an unknown op type
    y.op.type = "no_such_op"
    with pytest.raises(wb.GraphError, match="unknown type 'no_such_op'"):
        passes.validate(graph)
    y.op.type = "exp"

    # a dangling alias cannot be made: set_aliases keeps only those that end at an op
    graph.set_aliases({"gone": "missing", "twice": "gone"})
    assert dict(graph.aliases) == {}
    passes.validate(graph)

    # an input from an op outside the graph
    other = wb.Graph()
    with other.as_default():
        stray = wb.placeholder("x", shape=(3,), dtype="float64")
    z.op.inputs = (stray, z.op.inputs[1])
    with pytest.raises(wb.GraphError, match="not defined before it"):
        passes.validate(graph)


def test_optimize_on_a_training_graph_keeps_updates(graph):
    x = wb.placeholder("x", shape=(None, 3), dtype="float64")
    w = wb.variable("w", shape=(3, 1), init=0.5, dtype="float64")
    loss = wb.mean((x @ w) ** 2)
    train = wb.optimizers.SGD(0.1).minimize(loss)
    opt = passes.optimize(graph, [train.name, loss.name], fed=["x"])
    passes.validate(opt)
    assert sum(op.type == "assign_sub" for op in opt.operations) == 1
    assert isinstance(opt.get(train.name), Operation)
