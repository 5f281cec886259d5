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
