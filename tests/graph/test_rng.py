"""Random draws keyed by global row: a shard of a batch draws what the whole batch draws for its rows."""

import numpy as np
import pytest

import workbench as wb
from workbench.graph.passes import optimize
from workbench.graph.plan import Plan
from workbench.graph.rng import RowGenerator, generator

KEY = [7, 11, 0]


@pytest.mark.parametrize("row", [(), (1,), (3,), (4,), (5,), (2, 3), (7, 2)])
@pytest.mark.parametrize("total", [1, 7, 12, 13])
def test_any_split_of_the_rows_draws_the_whole_batch(row, total):
    whole = RowGenerator(KEY, 0).random((total, *row))
    assert whole.shape == (total, *row)
    for parts in (1, 2, 3, 5):
        if parts > total:
            continue
        shards = np.array_split(np.arange(total), parts)
        drawn = [RowGenerator(KEY, int(s[0])).random((len(s), *row)) for s in shards]
        np.testing.assert_array_equal(np.concatenate(drawn), whole)


def test_draws_change_with_the_key_and_are_uniform():
    a = RowGenerator(KEY, 0).random((200, 50))
    assert not np.array_equal(a, RowGenerator([7, 11, 1], 0).random((200, 50)))
    assert 0.0 <= a.min() and a.max() < 1.0 and abs(a.mean() - 0.5) < 0.01


def test_inputs_without_a_batch_axis_keep_a_plain_generator():
    assert isinstance(generator(KEY, batched=False, row_offset=3), np.random.Generator)
    assert isinstance(generator(KEY, batched=True, row_offset=3), RowGenerator)


def dropout_plan(shape, seed=4):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=shape, dtype="float64")
        d = wb.dropout(x, 0.5, seed=seed)
    return Plan(optimize(g, [d.name], fed=["x"]), [d.name], ["x"], np, {}, seed=1)


def test_a_plan_running_a_slice_of_the_batch_draws_that_slice_of_the_mask():
    ones = np.ones((10, 6))
    whole = dropout_plan((None, 6)).run([ones])[0]
    part = dropout_plan((None, 6))
    np.testing.assert_array_equal(part.run([ones[4:7]], step=0, row_offset=4)[0], whole[4:7])
    # the next step draws a new mask
    assert not np.array_equal(part.run([ones[4:7]], step=1, row_offset=4)[0], whole[4:7])


def test_a_fixed_first_axis_is_not_a_batch_axis():
    plan = dropout_plan((10, 6))
    mask = np.random.default_rng([1, 4, 0]).random((10, 6)) < 0.5
    # row_offset is ignored: the whole tensor is drawn from the run's generator
    np.testing.assert_array_equal(plan.run([np.ones((10, 6))], row_offset=4)[0], mask * 2.0)
