"""The index and lossless-cast checks: one reduction on the common path, exact on the rest."""

import numpy as np
import pytest

from workbench.errors import FeedError
from workbench.ops.array import check_indices
from workbench.ops.registry import cast_exactly


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_a_negative_index_of_any_width_is_caught(dtype):
    with pytest.raises(IndexError, match=r"label -1 at position 2 is out of range \[0, 10\)"):
        check_indices(np, np.array([0, 9, -1], dtype), 10, "label")


@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64"])
def test_the_size_itself_is_out_of_range_and_size_minus_one_is_not(dtype):
    check_indices(np, np.array([9, 0], dtype), 10)
    with pytest.raises(IndexError, match=r"index 10 at position 1 is out of range \[0, 10\) \(and 1 more\)"):
        check_indices(np, np.array([[0, 10], [11, 3]], dtype), 10)


def test_no_indices_pass():
    check_indices(np, np.zeros((0, 3), "int64"), 1)


def test_a_cast_whose_sum_overflows_keeps_finite_values():
    big = np.array([3e38, 3e38])  # each fits float32; their float32 sum is inf
    assert np.array_equal(cast_exactly(big, "float32", "x"), big.astype("float32"))


def test_infs_and_nans_fed_as_such_pass_and_overflows_do_not():
    fed = np.array([np.inf, -np.inf, np.nan, 1.0])
    assert np.array_equal(cast_exactly(fed, "float32", "x"), fed.astype("float32"), equal_nan=True)
    with pytest.raises(FeedError, match="x expects float32 values, got float64 value -1e\\+300 that overflows"):
        cast_exactly(np.array([1.0, -1e300, np.inf]), "float32", "x")


_INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("target", _INTS)
@pytest.mark.parametrize("source", _INTS)
def test_an_integer_cast_passes_exactly_when_every_value_fits(source, target):
    # each end of both ranges, and one past it: the one-maximum checks must agree with the ranges
    src, dst = np.iinfo(source), np.iinfo(target)
    candidates = {0, 1, -1, src.min, src.max, dst.min, dst.max, dst.min - 1, dst.max + 1}
    for value in sorted(v for v in candidates if src.min <= v <= src.max):
        fed = np.array([0, value, 0], source)
        if dst.min <= value <= dst.max:
            assert cast_exactly(fed, target, "x").tolist() == [0, value, 0]
        else:
            with pytest.raises(FeedError, match=f"x expects {target} values, got {source} value {value} that"):
                cast_exactly(fed, target, "x")


def test_a_widening_cast_keeps_every_value():
    fed = np.array([np.inf, np.nan, -3.0], np.float32)
    assert np.array_equal(cast_exactly(fed, "float64", "x"), fed.astype(np.float64), equal_nan=True)
    assert cast_exactly(np.array([-(2**31), 2**31 - 1], np.int32), "int64", "x").dtype == np.int64
