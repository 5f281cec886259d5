"""Elementwise special functions: rsqrt, square, erf, gelu, clip.

Each op: its public function, then its registry entry (shape rule, kernel,
gradient) on adjacent lines. Kernels write into one fresh result array where the
namespace allows (NumPy and CuPy ufuncs take ``out=``), so GELU is one pass over
one temporary rather than a chain of them; on a GPU the fusion pass turns these
ops into generated CUDA (see ``workbench.gpu.codegen``).
"""

from __future__ import annotations

import math

import numpy as np

from workbench.errors import ShapeError
from workbench.ops import rules
from workbench.ops.math import exp, maximum, where, zeros_like
from workbench.ops.registry import TensorSpec, apply, defop

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_C = math.sqrt(2.0 / math.pi)
_TANH_A = 0.044715
APPROXIMATIONS = ("none", "tanh")


def _float_spec(x: TensorSpec) -> TensorSpec:
    rules.need_float(x)
    return x


def _ufunc(xp, name: str, x):
    """``xp.<name>(x)``, written into ``x`` when the namespace's function is a ufunc (NumPy, CuPy):
    the caller passes a temporary it owns."""
    fn = getattr(xp, name)
    return fn(x, out=x) if _writable(fn, x) else fn(x)


def _writable(fn, x) -> bool:
    """``fn`` is a ufunc and ``x`` an array it can write into (not a NumPy scalar)."""
    return hasattr(fn, "nin") and getattr(x, "ndim", 0) > 0


# -- erf ---------------------------------------------------------------------------------


def _special_erf(xp):
    """The namespace's own erf (SciPy's for NumPy, ``cupyx.scipy.special`` for CuPy), or None."""
    name = getattr(xp, "__name__", "").removeprefix("array_api_compat.")  # the GPU device's CuPy is wrapped
    try:
        if name == "numpy":
            from scipy.special import erf
        elif name == "cupy":
            from cupyx.scipy.special import erf
        else:
            return None
    except ImportError:  # pragma: no cover - scipy comes with scikit-learn
        return None
    return erf


# erf in float32 as Eigen (and so TensorFlow's CPU kernels) computes it: x P(x^2) / Q(x^2) on x
# clamped to [-4, 4] (beyond, erf is +-1 in float32), P of degree 6 and Q of degree 4; the rational
# function is within 6.5e-8 of erf, and the float32 evaluation within 4.3e-7 (a few ulp) of it.
_ERF32_P = tuple(np.float32(c) for c in (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02,
))  # fmt: skip
_ERF32_Q = tuple(np.float32(c) for c in (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02,
))  # fmt: skip


def _erf_float32(x, out_ok: bool):
    """erf of a float32 NumPy array in about 26 in-place passes over two temporaries (SciPy's
    erf evaluates each float32 element in double precision, four times slower)."""
    t = np.clip(x, -4.0, 4.0, out=x if out_ok else None)
    x2 = t * t
    p = x2 * _ERF32_P[0]
    for c in _ERF32_P[1:]:
        p += c
        p *= x2 if c is not _ERF32_P[-1] else t
    q = x2 * _ERF32_Q[0]
    for c in _ERF32_Q[1:]:
        q += c
        if c is not _ERF32_Q[-1]:
            q *= x2
    p /= q
    return np.clip(p, -1.0, 1.0, out=p)  # the rounding takes it 2e-7 past 1 near the clamp


def erf_values(xp, x, out_ok: bool = False):
    """erf of the array ``x`` with namespace ``xp``; ``out_ok``: ``x`` is a temporary that may be
    overwritten. float32 NumPy arrays get :func:`_erf_float32`; other NumPy and CuPy arrays SciPy's
    erf. Namespaces without an erf of their own (the array API has none) get the series
    ``erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (2n+1)!!``, whose terms are all positive
    (no cancellation), summed to double precision for ``|x| < 6`` (beyond, erf is +-1 in float64)."""
    if xp is np and isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim > 0:
        return _erf_float32(x, out_ok and x.flags.writeable)
    special = _special_erf(xp)
    if special is not None:
        return special(x, out=x) if out_ok and _writable(special, x) else special(x)
    dtype = x.dtype
    x = xp.astype(x, xp.float64)  # summed in float64, rounded once to the input's dtype
    a = xp.minimum(xp.abs(x), 6.0)
    a2 = a * a
    term = xp.asarray(a, copy=True)
    total = xp.asarray(a, copy=True)
    n = 0
    while bool(xp.any(term > 1e-17 * total)):
        term = term * (2.0 * a2 / (2 * n + 3))
        total = total + term
        n += 1
    result = xp.minimum(_TWO_OVER_SQRT_PI * xp.exp(-a2) * total, 1.0)
    return xp.astype(xp.where(x < 0, -result, result), dtype)


def erf(x, name=None):
    """Elementwise error function ``2/sqrt(pi) * integral_0^x exp(-t^2) dt``."""
    return apply("erf", x, name=name)


defop(
    "erf",
    infer=_float_spec,
    elementwise=True,
    kernel=lambda xp, x: erf_values(xp, x),
    grad=lambda op, g: (g * (_TWO_OVER_SQRT_PI * exp(-op.inputs[0] * op.inputs[0])),),
)

# -- rsqrt, square -------------------------------------------------------------------------


def rsqrt(x, name=None):
    """Elementwise ``1 / sqrt(x)``."""
    return apply("rsqrt", x, name=name)


def square(x, name=None):
    """Elementwise ``x * x``."""
    return apply("square", x, name=name)


def _rsqrt_kernel(xp, x):
    y = xp.sqrt(x)
    return _reciprocal(xp, y)


def _reciprocal(xp, y):
    fn = getattr(xp, "reciprocal", None)
    if fn is not None and _writable(fn, y):
        return fn(y, out=y)
    return 1.0 / y


def _square_spec(x: TensorSpec) -> TensorSpec:
    if x.dtype == "bool":
        raise ShapeError("cannot square a bool tensor; cast it to a number first")
    return x


defop(
    "rsqrt",
    infer=_float_spec,
    elementwise=True,
    kernel=_rsqrt_kernel,
    grad=lambda op, g: (g * (-0.5 * op.outputs[0] / op.inputs[0]),),  # d x^-1/2 = -1/2 x^-3/2
)
defop(
    "square",
    infer=_square_spec,
    elementwise=True,
    kernel=lambda xp, x: x * x,
    grad=lambda op, g: (g * (2 * op.inputs[0]),),
)

# -- gelu ----------------------------------------------------------------------------------


def gelu(x, approximate="none", name=None):
    """Gaussian error linear unit ``x * Phi(x)``, ``Phi`` the standard normal CDF.

    ``approximate="tanh"`` uses ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, as
    ``torch.nn.functional.gelu(approximate="tanh")`` and ``tf.nn.gelu(approximate=True)``.
    """
    return apply("gelu", x, approximate=_approximation(approximate), name=name)


def gelu_grad(g, x, y, approximate="none", name=None):
    """``g * gelu'(x)``, given ``y = gelu(x)``: the gradient of :func:`gelu`, one pass."""
    return apply("gelu_grad", g, x, y, approximate=_approximation(approximate), name=name)


def _approximation(approximate) -> str:
    if approximate is True:
        return "tanh"
    if approximate is False or approximate is None:
        return "none"
    return approximate if isinstance(approximate, str) else repr(approximate)  # the rule checks it


def _gelu_spec(x: TensorSpec, *, approximate) -> TensorSpec:
    if approximate not in APPROXIMATIONS:
        raise ShapeError(f'approximate must be "none" or "tanh", got {approximate!r}')
    rules.need_float(x)
    return x


def _gelu_kernel(xp, x, *, approximate):
    if approximate == "tanh":
        t = x * x  # the one temporary: c (x + a x^3) = x (c + c a x^2), then tanh, then the product
        t *= _TANH_C * _TANH_A
        t += _TANH_C
        t *= x
        t = _ufunc(xp, "tanh", t)
    else:
        t = erf_values(xp, x * _SQRT1_2, out_ok=True)
    t += 1.0
    t *= x
    t *= 0.5
    return t


def _gelu_grad_kernel(xp, g, x, y, *, approximate):
    # y = x * r with r = Phi(x) (or 0.5 (1 + tanh u)): r comes back from the forward's output, so the
    # backward pass computes no erf (or tanh) again; at x = 0, r = 1/2
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 where x = 0, replaced just below
        r = y / x
    r = xp.where(x == 0, 0.5, r)
    x2 = x * x
    if approximate == "tanh":
        t = 2.0 * r  # tanh(u), then d/dx 0.5 x (1 + t) = r + 0.5 x (1 - t^2) c (1 + 3 a x^2)
        t -= 1.0
        t *= t
        t -= 1.0
        x2 *= -0.5 * 3 * _TANH_A * _TANH_C
        x2 -= 0.5 * _TANH_C
        x2 *= x
        x2 *= t  # -(1 - t^2) twice negated
    else:
        x2 *= -0.5
        x2 = _ufunc(xp, "exp", x2)
        x2 *= _INV_SQRT_2PI
        x2 *= x  # x phi(x)
    r += x2
    r *= g
    return r


defop(
    "gelu",
    infer=_gelu_spec,
    elementwise=True,
    kernel=_gelu_kernel,
    grad=lambda op, g: (gelu_grad(g, op.inputs[0], op.outputs[0], **op.attrs),),
)
defop(
    "gelu_grad",
    infer=lambda g, x, y, *, approximate: _gelu_spec(
        TensorSpec(rules.broadcast(g.shape, x.shape, y.shape), rules.same_dtype(g, x, y)), approximate=approximate
    ),
    elementwise=True,
    kernel=_gelu_grad_kernel,
    nondiff="gradient of gelu; second derivatives are not supported",
)

# -- clip --------------------------------------------------------------------------------------


def clip(x, lo, hi, name=None):
    """``x`` limited to ``[lo, hi]`` elementwise (``lo`` and ``hi`` broadcast); as ``tf.clip_by_value``.

    The gradient goes to ``x`` where ``lo <= x <= hi``, to ``lo`` where ``x < lo`` and to
    ``hi`` where ``x > hi``.
    """
    return apply("clip", x, lo, hi, name=name)


def _clip_spec(x: TensorSpec, lo: TensorSpec, hi: TensorSpec) -> TensorSpec:
    if x.dtype == "bool":
        raise ShapeError("cannot clip a bool tensor")
    return TensorSpec(rules.broadcast(x.shape, lo.shape, hi.shape), rules.same_dtype(x, lo, hi))


def _clip_grad(op, g):
    x, lo, hi = op.inputs
    zero = zeros_like(g)
    above, below = maximum(x, lo) > hi, x < lo  # the result is hi, else lo, else x
    return where(above, zero, where(below, zero, g)), where(above, zero, where(below, g, zero)), where(above, g, zero)


defop(
    "clip",
    infer=_clip_spec,
    elementwise=True,
    kernel=lambda xp, x, lo, hi: xp.minimum(xp.maximum(x, lo), hi),
    grad=_clip_grad,
)
