"""The replica context: what r shows, the order of r.apply and r.assign, every-blocks lowered to separate
plans, slots, the registry, strategy_graph and the errors that name the strategy and the line."""

import numpy as np
import pytest

import workbench as wb
from workbench import fit_arguments
from workbench.strategies.program import UPDATE, ReplicaProgram


def linear(dtype="float64", optimizer=None, loss=None):
    g = wb.Graph(name="lin")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2), dtype=dtype)
        w = wb.variable("w", shape=(2,), init=[0.5, -0.5], dtype=dtype)
        wb.variable("c", shape=(), init=1.0, dtype=dtype, trainable=False)
        residual = wb.sum(x * w, axis=1) - 1.0
        value = wb.mean(residual**2) if loss is None else loss(residual, w)
        train = (optimizer or wb.optimizers.SGD(0.1)).minimize(value)
    return g, train


def data():
    return {"x": np.random.default_rng(1).normal(size=(32, 2))}


def run_fit(g, train, strategy, steps=4, replicas=2, **kwargs):
    sess = wb.Session(g, seed=0, cluster=False)
    history = sess.fit(train, data(), batch_size=8, steps=steps, replicas=replicas, strategy=strategy, **kwargs)
    return sess.variables, history


def test_what_a_replica_sees():
    g, train = linear()
    seen = {}

    def look(r):
        seen.update(
            gradients=r.gradients,
            variables=r.variables,
            id=r.replica_id,
            step=r.step,
            weight=r.weight,
            replicas=r.num_replicas,
            x=r.tensor(g.get("x")),
        )
        r.apply(r.gradients)

    wb.strategy_graph(train, look, replicas=3)
    assert [v.name for v in seen["gradients"]] == ["w"] and [v.name for v in seen["variables"]] == ["w"]
    assert isinstance(seen["variables"][0], wb.Variable)
    (grad,) = seen["gradients"].values()
    assert grad.shape == (2,) and grad.dtype == "float64"
    assert seen["gradients"]["w"] is grad and g.get("w") in seen["gradients"]  # by name, or the user's variable
    assert (seen["id"].dtype, seen["id"].shape, seen["step"].dtype) == ("int64", (), "int64")
    assert seen["weight"].dtype == "float64" and seen["replicas"] == 3
    assert seen["x"].name == "x" and seen["x"].graph is seen["id"].graph is not g


def test_replica_id_step_and_weight_hold_their_values():
    g, train = linear()

    @wb.strategy("record_rank")
    def record(r):
        rank = r.slot(r.variables[0], "rank", init=0.0)
        r.apply(r.gradients)
        value = wb.cast(r.replica_id * 100 + r.step, "float64") + r.weight
        r.assign({rank: rank * 0.0 + value})

    sess = wb.Session(g, seed=0, cluster=False)
    request = fit_arguments.request(sess, train, data(), 12, 3, None, None, False)
    from workbench.simulation import SimulatedReplicas

    engine = SimulatedReplicas(request, "record_rank", 3)
    engine.start(sess.variables, 0)
    list(engine.run(1, 3, lambda s: False))
    state = engine.checkpoint_state()
    for rank in range(3):
        np.testing.assert_allclose(state[f"replicas/{rank}/record_rank/w/rank"], [rank * 100 + 3 + 4 / 12] * 2)
    engine.close()


def test_what_comes_after_an_apply_reads_what_it_wrote_and_assign_is_parallel():
    g, train = linear()

    def swap_after_step(r):
        (w,) = r.variables
        c = r.slot(w, "copy")  # w's value at the start of the fit
        r.apply(r.gradients)
        r.assign({c: w, w: c})  # parallel: c gets w after the step, w gets the old copy

    start = wb.Session(g, seed=0, cluster=False).variables["w"]
    after, _ = run_fit(g, train, swap_after_step, steps=1, replicas=1)
    np.testing.assert_array_equal(after["w"], start)
    stepped, _ = run_fit(g, train, lambda r: r.apply(r.gradients), steps=1, replicas=1)
    assert not np.array_equal(stepped["w"], start)


def test_every_blocks_are_separate_plans_not_selects():
    g, train = linear()
    program = ReplicaProgram.build(g, train.name, wb.strategies.local_sgd(every=4), replicas=2)
    assert program.periods == (4,) and program.due(8) == frozenset({4}) and program.due(6) == frozenset()
    quiet = program.variant(frozenset())
    due = program.variant(frozenset({4}))
    assert not [op for op in quiet.operations if op.opdef.collective]
    assert [op.type for op in due.operations if op.opdef.collective] == ["all_reduce"]
    assert not [op for op in due.operations if op.type == "where" and op.name.startswith("local_sgd")]
    assert UPDATE in quiet and UPDATE in due


def test_nested_every_blocks_run_where_every_period_divides_the_step():
    g, train = linear()

    def nested(r):
        r.apply(r.gradients)
        with r.every(2):
            with r.every(3):
                r.assign({v: wb.all_reduce(v, op="mean") for v in r.variables})

    _, history = run_fit(g, train, nested, steps=12)
    assert [s for s, n in zip(history["step"], history["collectives"], strict=True) if n] == [6, 12]


def test_strategy_graph_draws_collectives_and_every_blocks():
    g, train = linear()
    program = wb.strategy_graph(train, wb.strategies.diloco(every=4), replicas=2)
    assert isinstance(program, wb.Graph)
    kinds = {op.name: op.type for op in program.operations}
    assert any(name.startswith("diloco/every_4/") and t == "all_reduce" for name, t in kinds.items())
    assert "diloco/w/anchor" in kinds and UPDATE in kinds
    from workbench.widgets import GraphView
    from workbench.widgets.layout import kind_of

    assert {kind_of(op) for op in program.operations if op.opdef.collective} == {"collective"}
    view = GraphView(program)
    assert any(node.get("kind") == "collective" for node in view.layout["nodes"]) or "diloco" in view.collapsed


def test_the_registry():
    assert {"allreduce", "local_sgd", "diloco", "compressed"} <= set(wb.strategies.names())

    def mine(r):
        r.apply(r.gradients)

    made = wb.strategy("registered_directly", mine)
    assert isinstance(made, wb.strategies.Strategy) and made.name == "registered_directly" and made.fn is mine
    assert "registered_directly" in wb.strategies.names()
    again = wb.strategy("registered_directly", lambda r: r.apply(r.gradients))  # a re-run cell replaces it
    assert wb.strategies.resolve("registered_directly") is again
    with pytest.raises(wb.StrategyError, match="'allreduce' is built in"):
        wb.strategy("allreduce", mine)
    assert repr(wb.strategies.local_sgd(every=8)) == "<Strategy 'local_sgd' (every=8)>"


# -- errors name the strategy and the line ------------------------------------------------------


def test_an_unknown_name_lists_the_registered_ones():
    g, train = linear()
    with pytest.raises(
        wb.StrategyError, match=r"unknown strategy 'nope'; registered strategies are .*allreduce.*diloco"
    ):
        run_fit(g, train, "nope")


def test_a_strategy_that_never_writes_is_refused_at_its_def_line():
    g, train = linear()

    def lazy(r):
        wb.all_reduce(r.gradients[r.variables[0]])

    line = lazy.__code__.co_firstlineno
    with pytest.raises(
        wb.StrategyError, match=rf"strategy 'lazy', line {line}: def lazy\(r\):: it never calls r.apply"
    ):
        wb.strategy_graph(train, lazy)


def test_a_collective_of_a_replica_dependent_shape_names_the_line():
    g, train = linear()

    def per_row(r):
        rows = wb.sum(r.tensor("x") * 0.0, axis=1)
        r.assign({"c": wb.sum(wb.all_reduce(rows))})  # the shard's rows differ between replicas

    with pytest.raises(wb.StrategyError) as caught:
        wb.strategy_graph(train, per_row)
    message = str(caught.value)
    assert "strategy 'per_row', line" in message and "wb.all_reduce(rows)" in message
    assert "depends on the replica" in message


def test_assigning_to_something_that_is_not_a_variable_or_slot():
    g, train = linear()

    def bad(r):
        r.apply(r.gradients)
        r.assign({r.gradients["w"]: wb.constant([0.0, 0.0], dtype="float64")})

    with pytest.raises(wb.StrategyError, match=r"strategy 'bad', line \d+: r.assign\(.*needs a variable or a slot"):
        wb.strategy_graph(train, bad)


def test_apply_needs_every_gradient_of_the_right_shape():
    g, train = linear()
    with pytest.raises(wb.StrategyError, match="r.apply needs a gradient for every variable; missing: w"):
        wb.strategy_graph(train, lambda r: r.apply({}))
    with pytest.raises(wb.StrategyError, match=r"the gradient of 'w' is float32"):
        wb.strategy_graph(train, lambda r: r.apply({v: wb.cast(g_, "float32") for v, g_ in r.gradients.items()}))


def test_a_value_of_an_every_block_used_outside_it():
    g, train = linear()

    def leaky(r):
        with r.every(2):
            mean = {v: wb.all_reduce(v, op="mean") for v in r.variables}
        r.assign(mean)

    with pytest.raises(wb.StrategyError, match=r"computed inside 'with r.every\(2\)', outside that block"):
        wb.strategy_graph(train, leaky)


def test_r_weight_refuses_a_loss_that_cannot_be_split():
    g, train = linear(loss=lambda residual, w: wb.sum(residual**2) + wb.sum(w * w))
    with pytest.raises(
        wb.StrategyError, match=r"strategy 'allreduce', line \d+: .*r.weight: the loss 'add'.*cannot be split"
    ):
        wb.strategy_graph(train, "allreduce")
    g, train = linear(loss=lambda residual, w: wb.max(residual**2))
    with pytest.raises(wb.StrategyError, match="r.weight: the loss 'max'.*cannot be split across replicas exactly"):
        wb.strategy_graph(train, "allreduce")
    # a mean with a regularizer splits exactly; local SGD does not need r.weight at all
    g, train = linear(loss=lambda residual, w: wb.mean(residual**2) + 0.1 * wb.sum(w * w))
    wb.strategy_graph(train, "allreduce")
    g, train = linear(loss=lambda residual, w: wb.max(residual**2))
    wb.strategy_graph(train, wb.strategies.local_sgd(every=2))


def test_r_tensor_refuses_what_the_graph_lacks():
    g, train = linear()
    with pytest.raises(wb.StrategyError, match="the fit's graph has no tensor 'nothing'"):
        wb.strategy_graph(train, lambda r: r.tensor("nothing"))
