"""Comparing results that went through floating-point arithmetic, the way the tests do.

Two runs of the same model agree to a tolerance *relative to the size of the values compared*, never to
a fixed absolute one: an element near zero is the sum of terms as large as the others, and a BLAS kernel
that orders or fuses them differently moves it by as much as it moves the largest element.

>>> import numpy as np
>>> assert_close(np.float32([1.0, 1e-8]), np.float32([1.0, 2e-8]), rtol=1e-6)
"""

from __future__ import annotations

import numpy as np


def tolerance(desired, rtol: float) -> float:
    """The absolute tolerance that goes with ``rtol`` for values like ``desired``: ``rtol * max|desired|``."""
    values = np.abs(np.asarray(desired, dtype="float64"))
    finite = values[np.isfinite(values)]
    return rtol * float(finite.max(initial=0.0))


def assert_close(actual, desired, rtol: float, err_msg: str = "") -> None:
    """``actual`` equals ``desired`` to ``rtol``, each element to ``rtol`` of the largest value, in float64.

    Parameters
    ----------
    actual, desired : array_like
    rtol : float
        For float32 results, 1e-5 or more; for float64, 1e-9 or more.
    err_msg : str
        Printed on failure (the variable's name, say).
    """
    desired64 = np.asarray(desired, dtype="float64")
    np.testing.assert_allclose(
        np.asarray(actual, dtype="float64"), desired64, rtol=rtol, atol=tolerance(desired64, rtol), err_msg=err_msg
    )
