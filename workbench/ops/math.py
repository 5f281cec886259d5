"""Elementwise arithmetic, comparisons, casts and matmul (reductions: :mod:`workbench.ops.reduce`).

Each op: its public function, then its registry entry (shape rule, kernel,
gradient) on adjacent lines. Broadcasting in gradients is undone centrally by
``gradients()``, so the rules here return gradients of the broadcast shape.
"""

from __future__ import annotations

from workbench.errors import DTypeError, ShapeError
from workbench.ops import rules
from workbench.ops.registry import TensorSpec, apply, as_dtype, defop, is_float


def _binary_spec(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    return TensorSpec(rules.broadcast(a.shape, b.shape), rules.same_dtype(a, b))


def _compare_spec(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    rules.same_dtype(a, b)
    return TensorSpec(rules.broadcast(a.shape, b.shape), "bool")


def _unary_float_spec(x: TensorSpec) -> TensorSpec:
    rules.need_float(x)
    return x


def _same_spec(x: TensorSpec) -> TensorSpec:
    return x


# -- elementwise binary ---------------------------------------------------------


def add(a, b, name=None):
    """``a + b`` with NumPy broadcasting."""
    return apply("add", a, b, name=name)


def subtract(a, b, name=None):
    """``a - b`` with NumPy broadcasting."""
    return apply("subtract", a, b, name=name)


def multiply(a, b, name=None):
    """``a * b`` with NumPy broadcasting."""
    return apply("multiply", a, b, name=name)


def divide(a, b, name=None):
    """``a / b`` (true division) with NumPy broadcasting."""
    return apply("divide", a, b, name=name)


def pow(a, b, name=None):  # noqa: A001 - the op's name
    """``a ** b`` elementwise."""
    return apply("pow", a, b, name=name)


def maximum(a, b, name=None):
    """Elementwise maximum; the gradient goes to ``a`` where ``a >= b``."""
    return apply("maximum", a, b, name=name)


def minimum(a, b, name=None):
    """Elementwise minimum; the gradient goes to ``a`` where ``a <= b``."""
    return apply("minimum", a, b, name=name)


def _pow_grad(op, g):
    a, b = op.inputs
    y = op.outputs[0]
    ga = g * b * pow(a, b - 1)
    gb = g * y * log(where(a > 0, a, 1)) if is_float(b.dtype) else None
    return ga, gb


def _add_into(xp, out, a, b):
    out += b if out is a else a
    return out


def _subtract_into(xp, out, a, b):
    if out is not a:
        return a - b
    out -= b
    return out


def _multiply_into(xp, out, a, b):
    out *= b if out is a else a
    return out


def _select_grad(op, g):
    a, b = op.inputs
    pick_a = (a >= b) if op.type == "maximum" else (a <= b)
    zero = zeros_like(g)
    return where(pick_a, g, zero), where(pick_a, zero, g)


defop(
    "add",
    infer=_binary_spec,
    elementwise=True,
    kernel=lambda xp, a, b: a + b,
    inplace=_add_into,
    grad=lambda op, g: (g, g),
)
defop(
    "subtract",
    infer=_binary_spec,
    elementwise=True,
    kernel=lambda xp, a, b: a - b,
    inplace=_subtract_into,
    grad=lambda op, g: (g, negative(g)),
)
defop(
    "multiply",
    infer=_binary_spec,
    elementwise=True,
    kernel=lambda xp, a, b: a * b,
    inplace=_multiply_into,
    grad=lambda op, g: (g * op.inputs[1], g * op.inputs[0]),
)
defop(
    "divide",
    infer=_binary_spec,
    elementwise=True,
    kernel=lambda xp, a, b: a / b,
    grad=lambda op, g: (g / op.inputs[1], negative(g) * op.outputs[0] / op.inputs[1]),
)
defop("pow", infer=_binary_spec, elementwise=True, kernel=lambda xp, a, b: xp.pow(a, b), grad=_pow_grad)
defop("maximum", infer=_binary_spec, elementwise=True, kernel=lambda xp, a, b: xp.maximum(a, b), grad=_select_grad)
defop("minimum", infer=_binary_spec, elementwise=True, kernel=lambda xp, a, b: xp.minimum(a, b), grad=_select_grad)

# -- comparisons (boolean outputs, no gradient) ---------------------------------


def less(a, b, name=None):
    """``a < b`` elementwise (a bool tensor)."""
    return apply("less", a, b, name=name)


def less_equal(a, b, name=None):
    """``a <= b`` elementwise (a bool tensor)."""
    return apply("less_equal", a, b, name=name)


def greater(a, b, name=None):
    """``a > b`` elementwise (a bool tensor)."""
    return apply("greater", a, b, name=name)


def greater_equal(a, b, name=None):
    """``a >= b`` elementwise (a bool tensor)."""
    return apply("greater_equal", a, b, name=name)


def equal(a, b, name=None):
    """``a == b`` elementwise (a bool tensor). ``==`` on tensors compares identity, as in TensorFlow 1."""
    return apply("equal", a, b, name=name)


def not_equal(a, b, name=None):
    """``a != b`` elementwise (a bool tensor)."""
    return apply("not_equal", a, b, name=name)


_BOOLEAN = "boolean output"
defop("less", infer=_compare_spec, kernel=lambda xp, a, b: a < b, nondiff=_BOOLEAN, elementwise=True)
defop("less_equal", infer=_compare_spec, kernel=lambda xp, a, b: a <= b, nondiff=_BOOLEAN, elementwise=True)
defop("greater", infer=_compare_spec, kernel=lambda xp, a, b: a > b, nondiff=_BOOLEAN, elementwise=True)
defop("greater_equal", infer=_compare_spec, kernel=lambda xp, a, b: a >= b, nondiff=_BOOLEAN, elementwise=True)
defop("equal", infer=_compare_spec, kernel=lambda xp, a, b: a == b, nondiff=_BOOLEAN, elementwise=True)
defop("not_equal", infer=_compare_spec, kernel=lambda xp, a, b: a != b, nondiff=_BOOLEAN, elementwise=True)


def isfinite(x, name=None):
    """Whether each element of ``x`` is neither infinite nor NaN (a bool tensor)."""
    return apply("isfinite", x, name=name)


def _isfinite_spec(x: TensorSpec) -> TensorSpec:
    rules.need_float(x)
    return TensorSpec(x.shape, "bool")


# Not flagged elementwise: its use (loss scaling) feeds a reduction at once, nothing to fuse.
defop("isfinite", infer=_isfinite_spec, kernel=lambda xp, x: xp.isfinite(x), nondiff=_BOOLEAN)

# -- elementwise unary ----------------------------------------------------------


def negative(x, name=None):
    """``-x``."""
    return apply("negative", x, name=name)


def exp(x, name=None):
    """Elementwise ``e ** x``."""
    return apply("exp", x, name=name)


def log(x, name=None):
    """Elementwise natural logarithm."""
    return apply("log", x, name=name)


def sqrt(x, name=None):
    """Elementwise square root."""
    return apply("sqrt", x, name=name)


def tanh(x, name=None):
    """Elementwise hyperbolic tangent."""
    return apply("tanh", x, name=name)


def sigmoid(x, name=None):
    """Elementwise logistic function ``1 / (1 + exp(-x))``, computed without overflow."""
    return apply("sigmoid", x, name=name)


def relu(x, name=None):
    """Elementwise ``max(x, 0)``."""
    return apply("relu", x, name=name)


def abs(x, name=None):  # noqa: A001 - the op's name
    """Elementwise absolute value."""
    return apply("abs", x, name=name)


def sign(x, name=None):
    """Elementwise sign (-1, 0 or 1)."""
    return apply("sign", x, name=name)


def _relu_grad(op, g):
    return (relu_grad(g, op.outputs[0]),)


def relu_grad(g, y, name=None):
    """``g`` where ``y > 0``, else 0: the gradient of :func:`relu` given its output ``y``.

    One op rather than ``where(y > 0, g, 0)``: a multiply by the mask is an order of
    magnitude faster than a select on NumPy, whose branches mispredict on random signs.
    """
    return apply("relu_grad", g, y, name=name)


def _relu_grad_kernel(xp, g, y):
    return g * xp.astype(y > 0, g.dtype)


def _relu_grad_into(xp, out, g, y):
    return xp.multiply(g, y > 0, out=out)  # the mask is made before ``out`` (maybe ``y``) is written


def _zero_grad(op, g):
    # The gradient is zero (or cut on purpose): nothing flows back, and unlike a
    # nondiff op this does not stop second derivatives of rules that use the op.
    return (None,)


defop("negative", infer=_same_spec, elementwise=True, kernel=lambda xp, x: -x, grad=lambda op, g: (negative(g),))
defop(
    "exp",
    infer=_unary_float_spec,
    elementwise=True,
    kernel=lambda xp, x: xp.exp(x),
    grad=lambda op, g: (g * op.outputs[0],),
)
defop(
    "log",
    infer=_unary_float_spec,
    elementwise=True,
    kernel=lambda xp, x: xp.log(x),
    grad=lambda op, g: (g / op.inputs[0],),
)
defop(
    "sqrt",
    infer=_unary_float_spec,
    elementwise=True,
    kernel=lambda xp, x: xp.sqrt(x),
    grad=lambda op, g: (g / (2 * op.outputs[0]),),
)
defop(
    "tanh",
    infer=_unary_float_spec,
    elementwise=True,
    kernel=lambda xp, x: xp.tanh(x),
    grad=lambda op, g: (g * (1 - op.outputs[0] * op.outputs[0]),),
)
defop(
    "sigmoid",
    infer=_unary_float_spec,
    elementwise=True,
    kernel=lambda xp, x: 0.5 * xp.tanh(0.5 * x) + 0.5,  # tanh form: no overflow for large |x|
    grad=lambda op, g: (g * op.outputs[0] * (1 - op.outputs[0]),),
)
defop(
    "relu",
    infer=_unary_float_spec,
    elementwise=True,
    kernel=lambda xp, x: xp.maximum(x, 0),
    inplace=lambda xp, out, x: xp.maximum(x, 0, out=out),
    grad=_relu_grad,
)
defop(
    "relu_grad",
    infer=_binary_spec,
    elementwise=True,
    kernel=_relu_grad_kernel,
    inplace=_relu_grad_into,
    grad=lambda op, gg: (relu_grad(gg, op.inputs[1]), None),
)  # zero with respect to y, where it exists
defop(
    "abs",
    infer=_same_spec,
    elementwise=True,
    kernel=lambda xp, x: xp.abs(x),
    grad=lambda op, g: (g * sign(op.inputs[0]),),
)
defop(
    "sign", infer=_same_spec, elementwise=True, kernel=lambda xp, x: xp.sign(x), grad=_zero_grad
)  # piecewise constant: zero gradient wherever it exists

# -- where, cast, identity ------------------------------------------------------


def where(condition, a, b, name=None):
    """Elementwise ``a if condition else b``, broadcasting all three."""
    return apply("where", condition, a, b, name=name)


def _where_spec(c: TensorSpec, a: TensorSpec, b: TensorSpec) -> TensorSpec:
    if c.dtype != "bool":
        raise DTypeError(f"condition must be a bool tensor, got {c.dtype}")
    return TensorSpec(rules.broadcast(c.shape, a.shape, b.shape), rules.same_dtype(a, b))


def _where_grad(op, g):
    c = op.inputs[0]
    zero = zeros_like(g)
    return None, where(c, g, zero), where(c, zero, g)


def _where_into(xp, out, c, a, b):
    xp.copyto(out, b if out is a else a, where=xp.logical_not(c) if out is a else c)
    return out


defop(
    "where",
    infer=_where_spec,
    elementwise=True,
    kernel=lambda xp, c, a, b: xp.where(c, a, b),
    inplace=_where_into,
    grad=_where_grad,
)


def cast(x, dtype, name=None):
    """``x`` converted to ``dtype``; gradients flow between float dtypes."""
    return apply("cast", x, dtype=as_dtype(dtype), name=name)


def _cast_grad(op, g):
    x = op.inputs[0]
    return (cast(g, x.dtype) if is_float(x.dtype) and is_float(op.attrs["dtype"]) else None,)


defop(
    "cast",
    infer=lambda x, *, dtype: TensorSpec(x.shape, dtype),
    elementwise=True,
    kernel=lambda xp, x, *, dtype: xp.astype(x, getattr(xp, dtype)),
    grad=_cast_grad,
)


def identity(x, name=None):
    """``x`` unchanged (a named point in the graph)."""
    return apply("identity", x, name=name)


def stop_gradient(x, name=None):
    """``x`` in the forward pass; no gradient flows through it."""
    return apply("stop_gradient", x, name=name)


def zeros_like(x, name=None):
    """Zeros of ``x``'s shape and dtype."""
    return apply("zeros_like", x, name=name)


def ones_like(x, name=None):
    """Ones of ``x``'s shape and dtype."""
    return apply("ones_like", x, name=name)


defop("identity", infer=_same_spec, kernel=lambda xp, x: x, grad=lambda op, g: (g,))
defop("stop_gradient", infer=_same_spec, kernel=lambda xp, x: x, grad=_zero_grad)  # stops gradients by definition
defop(
    "zeros_like", infer=_same_spec, kernel=lambda xp, x: xp.zeros_like(x), grad=_zero_grad
)  # its output does not depend on the input's values
defop(
    "ones_like", infer=_same_spec, kernel=lambda xp, x: xp.ones_like(x), grad=_zero_grad
)  # the output does not depend on the input's values

# -- matmul ---------------------------------------------------------------------


def matmul(a, b, transpose_a=False, transpose_b=False, name=None):
    """Matrix product of the last two axes, batched over (broadcast) leading axes.

    ``transpose_a``/``transpose_b`` swap the last two axes of an input first,
    without a copy.
    """
    return apply("matmul", a, b, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b), name=name)


def _matmul_spec(a: TensorSpec, b: TensorSpec, *, transpose_a: bool, transpose_b: bool) -> TensorSpec:
    dtype = rules.same_dtype(a, b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(f"needs inputs of rank 2 or more, got {rules.fmt(a.shape)} and {rules.fmt(b.shape)}")
    m, ka = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if not rules.dims_match(ka, kb):
        raise ShapeError(
            f"inner dimensions differ: {rules.fmt(a.shape)} @ {rules.fmt(b.shape)} "
            f"({ka} != {kb}{', after transposes' if transpose_a or transpose_b else ''})"
        )
    batch = rules.broadcast(a.shape[:-2], b.shape[:-2])
    return TensorSpec(batch + (m, n), dtype)


def _matmul_kernel(xp, a, b, *, transpose_a, transpose_b):
    if transpose_a:
        a = _transposed(xp, a)
    if transpose_b:
        b = _transposed(xp, b)
    return xp.matmul(a, b)


def _transposed(xp, x):
    """``x`` with its last two axes swapped: ``.T`` for a matrix (an attribute, where NumPy's
    ``matrix_transpose`` is a Python function costing a few microseconds a call)."""
    return x.T if x.ndim == 2 else xp.matrix_transpose(x)


def _matmul_grad(op, g):
    a, b = op.inputs
    ta, tb = op.attrs["transpose_a"], op.attrs["transpose_b"]
    ga = matmul(b, g, transpose_a=tb, transpose_b=True) if ta else matmul(g, b, transpose_b=not tb)
    gb = matmul(g, a, transpose_a=True, transpose_b=ta) if tb else matmul(a, g, transpose_a=not ta)
    return ga, gb


defop("matmul", infer=_matmul_spec, kernel=_matmul_kernel, grad=_matmul_grad)
