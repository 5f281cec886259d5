"""TensorFlow 1.x's names, mapped onto workbench: ``import workbench.tf1 as tf``.

Tutorial and research code of the TensorFlow 1.x era runs as written: placeholders,
``tf.Variable``, ``tf.nn`` (NHWC convolutions with ``[height, width, in, out]``
filters), ``tf.train`` optimizers, ``tf.Session`` / ``tf.InteractiveSession``,
``Tensor.eval`` and ``Operation.run``. Every name builds ordinary workbench ops in
the default graph, so ``wb.Session``, ``fit``, the views and the cluster work on the
result. Names that have no equivalent (``tf.device``, queues, ``tf.train.ClusterSpec``)
raise :class:`UnsupportedError` saying what to use instead.

>>> import workbench.tf1 as tf
>>> g = tf.Graph()
>>> with g.as_default():
...     x = tf.placeholder(tf.float32, [None, 2])
...     w = tf.Variable(tf.ones([2, 1]))
...     y = tf.reduce_sum(tf.matmul(x, w), reduction_indices=[1])
...     with tf.Session() as sess:
...         sess.run(tf.global_variables_initializer())
...         print(y.eval(feed_dict={x: [[1.0, 2.0]]}))
[3.]
"""

from __future__ import annotations

import builtins

import numpy as np

import workbench as wb
from workbench.graph import default_session as _default_session
from workbench.graph.core import Graph, Operation, Tensor, Variable, get_default_graph, reset_default_graph
from workbench.ops.registry import DTYPES as _DTYPES
from workbench.tf1 import layers, losses, nn, train  # noqa: F401 - tf.layers, tf.losses, tf.nn, tf.train
from workbench.tf1._common import UnsupportedError, axis_arg, generator, one_of, set_random_seed, shape_arg
from workbench.tf1._common import unsupported as _unsupported
from workbench.tf1.session import InteractiveSession, Session  # noqa: F401 - tf.Session ...

# -- dtypes: their names, which is what a tensor's ``dtype`` is -------------------------
float16, float32, float64 = "float16", "float32", "float64"
int8, int16, int32, int64, uint8, bool = "int8", "int16", "int32", "int64", "uint8", "bool"  # noqa: A001
half, double = float16, float64


#: TensorFlow's own spellings of dtypes ("float" is float32 there, not NumPy's float64).
_TF_NAMES = {"float": "float32", "double": "float64", "half": "float16", "int": "int32", "long": "int64"}


def as_dtype(dtype) -> str:
    """A dtype's name (``tf.as_dtype(np.float32) == tf.float32``; ``"float"`` is float32, as in TensorFlow)."""
    if isinstance(dtype, str) and dtype in _TF_NAMES:
        return _TF_NAMES[dtype]
    return wb.ops.registry.as_dtype(dtype)


# -- graph inputs and state ---------------------------------------------------------------


def placeholder(dtype, shape=None, name=None):
    """``tf.placeholder(dtype, shape=None, name=None)``: TensorFlow's argument order (``wb.placeholder``
    takes the name first). The name defaults to ``"Placeholder"`` (``"Placeholder_1"`` ... when taken)."""
    if isinstance(dtype, str) and dtype not in _DTYPES and dtype not in _TF_NAMES:
        raise wb.ArgumentError(
            f"tf.placeholder({dtype!r}, ...): the first argument is the dtype (tf.float32 ...), as in TensorFlow; "
            "wb.placeholder takes the name first"
        )
    base = name if name is not None else _free_name("Placeholder")
    return wb.placeholder(base, shape=None if shape is None else [None if d is None else int(d) for d in shape],
                          dtype=as_dtype(dtype))  # fmt: skip


def placeholder_with_default(input, shape, name=None):  # noqa: A002 - TensorFlow's name
    """A placeholder that need not be fed: ``input`` when it is not."""
    value = np.asarray(input)
    base = name if name is not None else _free_name("PlaceholderWithDefault")
    return wb.placeholder(base, shape=shape, dtype=value.dtype.name if value.dtype != np.float64 else "float32",
                          default=input)  # fmt: skip


def _free_name(base: str) -> str:
    return get_default_graph().unique_name(base).rsplit("/", 1)[-1]


def constant(value, dtype=None, shape=None, name="Const", verify_shape=False):
    """``tf.constant(value, dtype=None, shape=None)``: with ``shape``, a scalar (or one-element)
    ``value`` fills it, and a value with as many elements is reshaped to it."""
    array = wb.ops.state.constant_array(value, None if dtype is None else as_dtype(dtype))
    if shape is not None:
        shape = shape_arg(shape)
        if array.size == 1:
            array = np.full(shape, array.reshape(()), dtype=array.dtype)
        elif array.size == int(np.prod(shape)) and not verify_shape:
            array = array.reshape(shape)
        else:
            raise wb.ShapeError(f"tf.constant: a value of shape {array.shape} cannot fill shape {shape}")
    return wb.constant(array, name=name)


def zeros(shape, dtype=float32, name=None):
    """A constant of zeros."""
    return wb.constant(np.zeros(shape_arg(shape), dtype=as_dtype(dtype)), name=name or "zeros")


def ones(shape, dtype=float32, name=None):
    """A constant of ones."""
    return wb.constant(np.ones(shape_arg(shape), dtype=as_dtype(dtype)), name=name or "ones")


def fill(dims, value, name=None):
    """A constant of ``value`` everywhere."""
    return constant(value, shape=dims, name=name or "Fill")


def truncated_normal(shape, mean=0.0, stddev=1.0, dtype=float32, seed=None, name=None):
    """A constant drawn from a normal distribution, values beyond two standard deviations redrawn
    (TensorFlow's truncation). Drawn once, when the graph is built, from ``tf.set_random_seed``'s seed
    and ``seed``, so the same program draws the same values; ``tf.Variable(tf.truncated_normal(...))``
    keeps only the variable."""
    shape, rng = shape_arg(shape), generator(seed)
    values = rng.standard_normal(shape)
    outside = np.abs(values) > 2.0
    while outside.any():
        values[outside] = rng.standard_normal(int(outside.sum()))
        outside = np.abs(values) > 2.0
    return wb.constant((mean + stddev * values).astype(as_dtype(dtype)), name=name or "truncated_normal")


def random_normal(shape, mean=0.0, stddev=1.0, dtype=float32, seed=None, name=None):
    """A constant drawn from a normal distribution (see :func:`truncated_normal` for the seeds)."""
    values = generator(seed).normal(mean, stddev, shape_arg(shape))
    return wb.constant(values.astype(as_dtype(dtype)), name=name or "random_normal")


def random_uniform(shape, minval=0, maxval=None, dtype=float32, seed=None, name=None):
    """A constant drawn uniformly from ``[minval, maxval)`` (``maxval`` 1 for floats)."""
    dtype, rng = as_dtype(dtype), generator(seed)
    if dtype.startswith(("int", "uint")):
        if maxval is None:
            raise wb.ArgumentError("tf.random_uniform with an integer dtype needs maxval")
        values = rng.integers(minval, maxval, shape_arg(shape))
    else:
        values = rng.uniform(minval, 1.0 if maxval is None else maxval, shape_arg(shape))
    return wb.constant(values.astype(dtype), name=name or "random_uniform")


def get_variable(name, shape=None, dtype=float32, initializer=None, trainable=True, **kwargs):
    """``tf.get_variable(name, shape, initializer=...)``: a new variable (``reuse`` is not supported:
    a name is used once); ``initializer`` a value, a constant tensor, or None (Glorot uniform, as in TensorFlow)."""
    if kwargs.get("reuse"):
        raise UnsupportedError("tf.get_variable(reuse=True): variables are not shared by name; keep the Variable")
    if initializer is None:
        return wb.variable(
            name, shape=shape_arg(shape), init="glorot_uniform", dtype=as_dtype(dtype), trainable=trainable
        )
    return Variable(initializer, name=name, trainable=trainable, dtype=as_dtype(dtype))


def global_variables_initializer():
    """An operation that sets every variable made so far to its initial value when a session runs it
    (sessions also initialize variables by themselves on first use)."""
    return wb.variables_initializer(get_default_graph().variables)


initialize_all_variables = global_variables_initializer


def variables_initializer(var_list, name="init"):
    """An operation that (re)initializes ``var_list`` when run."""
    return wb.variables_initializer(var_list, name=name)


def global_variables():
    return get_default_graph().variables


def trainable_variables():
    return get_default_graph().trainable_variables


def get_default_session():
    """The session ``Tensor.eval()`` uses now, or None."""
    return _default_session.get_default_session()


# -- reductions and math -------------------------------------------------------------------


def _reduction(op):
    def reduce(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None, keep_dims=None):
        axis = one_of(axis, reduction_indices, "axis", "reduction_indices")
        keepdims = one_of(keepdims, keep_dims, "keepdims", "keep_dims")
        return op(input_tensor, axis=axis_arg(axis), keepdims=builtins.bool(keepdims), name=name)

    reduce.__name__ = f"reduce_{op.__name__}"
    reduce.__doc__ = (
        f"``tf.reduce_{op.__name__}(input_tensor, axis=None, keepdims=False)`` (also ``reduction_indices``, "
        f"``keep_dims``): :func:`workbench.{op.__name__}`."
    )
    return reduce


reduce_sum, reduce_mean, reduce_max = _reduction(wb.sum), _reduction(wb.mean), _reduction(wb.max)
reduce_min, reduce_prod, reduce_all = _reduction(wb.min), _reduction(wb.prod), _reduction(wb.all)


def reduce_any(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None, keep_dims=None):
    """Whether any element is true: ``not all(not x)``."""
    inverted = wb.logical_not(input_tensor) if hasattr(wb, "logical_not") else wb.equal(input_tensor, False)
    found = reduce_all(inverted, axis, keepdims, None, reduction_indices, keep_dims)
    return wb.equal(found, False, name=name)


def argmax(input, axis=None, name=None, dimension=None, output_type=int64):  # noqa: A002 - TensorFlow's name
    """``tf.argmax(input, axis)`` (``dimension`` is the old spelling; axis 0 when neither is given)."""
    axis = one_of(axis, dimension, "axis", "dimension")
    found = wb.argmax(input, axis=0 if axis is None else int(axis), name=name)
    return found if as_dtype(output_type) == int64 else wb.cast(found, output_type)


def argmin(input, axis=None, name=None, dimension=None, output_type=int64):  # noqa: A002
    """``tf.argmin``: the argmax of ``-input``."""
    return argmax(wb.negative(input), axis, name, dimension, output_type)


def cast(x, dtype, name=None):
    return wb.cast(x, as_dtype(dtype), name=name)


def matmul(a, b, transpose_a=False, transpose_b=False, adjoint_a=False, adjoint_b=False, name=None, **kwargs):
    """``tf.matmul`` (``adjoint_*`` is ``transpose_*`` for real numbers)."""
    return wb.matmul(a, b, transpose_a=transpose_a or adjoint_a, transpose_b=transpose_b or adjoint_b, name=name)


def reshape(tensor, shape, name=None):
    return wb.reshape(tensor, shape_arg(shape), name=name)


def transpose(a, perm=None, name="transpose", conjugate=False):
    return wb.transpose(a, perm, name=name)


def concat(values, axis, name="concat"):
    """``tf.concat(values, axis)`` (TensorFlow 1.0's order)."""
    return wb.concat(list(values), axis=int(axis), name=name)


def stack(values, axis=0, name="stack"):
    return wb.stack(list(values), axis=int(axis), name=name)


def expand_dims(input, axis=None, name=None, dim=None):  # noqa: A002
    return wb.expand_dims(input, one_of(axis, dim, "axis", "dim"), name=name)


def one_hot(indices, depth, on_value=None, off_value=None, axis=None, dtype=float32, name=None):
    if on_value is not None or off_value is not None or axis not in (None, -1):
        raise wb.ArgumentError(
            "tf.one_hot: on_value, off_value and axis are not supported (1 and 0 on a new last axis)"
        )
    return wb.one_hot(indices, depth, dtype=as_dtype(dtype), name=name)


def gather(params, indices, axis=0, name=None):
    return wb.gather(params, indices, axis=axis, name=name)


def where(condition, x=None, y=None, name=None):
    if x is None or y is None:
        raise wb.ArgumentError("tf.where(condition) without x and y (the indices of true elements) is not supported")
    return wb.where(condition, x, y, name=name)


def name_scope(name, default_name=None, values=None):
    """``with tf.name_scope("layer1"):`` prefixes op names (as ``wb.name_scope``)."""
    return wb.name_scope(name or default_name)


def variable_scope(name_or_scope, default_name=None, values=None, reuse=None, **kwargs):
    """A name scope (variables are not shared by name: ``reuse`` is not supported)."""
    if reuse:
        raise UnsupportedError("tf.variable_scope(reuse=True): variables are not shared by name; keep the Variables")
    return wb.name_scope(name_or_scope or default_name)


def control_dependencies(control_inputs):
    return get_default_graph().control_dependencies(control_inputs)


def gradients(ys, xs, grad_ys=None, name="gradients", **kwargs):
    if grad_ys is not None:
        raise wb.ArgumentError("tf.gradients: grad_ys is not supported; differentiate reduce_sum(ys * grad_ys)")
    if isinstance(ys, (list, tuple)):
        ys = ys[0] if len(ys) == 1 else wb.add_n(ys) if hasattr(wb, "add_n") else _sum_all(ys)
    return wb.gradients(ys, list(xs) if isinstance(xs, (list, tuple)) else [xs])


def _sum_all(tensors):
    total = wb.sum(tensors[0])
    for t in tensors[1:]:
        total = total + wb.sum(t)
    return total


def shape(input, name=None, out_type=None):  # noqa: A002 - TensorFlow's name
    """Shapes are static in workbench: ``tf.shape`` has no tensor form. The message says what to use."""
    raise UnsupportedError(
        f"tf.shape: shapes are static in workbench; use x.shape (here {getattr(input, 'shape', None)}, None for "
        "an axis the batch decides) in Python, and -1 in tf.reshape for the batch axis"
    )


def add_n(inputs, name=None):
    """The elementwise sum of a list of tensors of one shape."""
    inputs = list(inputs)
    if not inputs:
        raise wb.ArgumentError("tf.add_n needs at least one tensor")
    total = inputs[0]
    for t in inputs[1:]:
        total = wb.add(total, t)
    return total if name is None else wb.identity(total, name=name)


def _static_shape(x, what: str) -> tuple:
    if not isinstance(x, Tensor) or x.shape is None:
        raise wb.ShapeError(f"tf.{what} needs a tensor of known rank, got {x!r}")
    return tuple(x.shape)


def _axis(axis: int, rank: int, what: str) -> int:
    axis = int(axis)
    if not -rank <= axis < rank:
        raise wb.ShapeError(f"tf.{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def _new_shape(dims) -> tuple:
    """A reshape target: the one unknown (batch) axis as -1."""
    return tuple(-1 if d is None else int(d) for d in dims)


def squeeze(input, axis=None, name=None, squeeze_dims=None):  # noqa: A002
    """Removes axes of size 1 (all of them, or those ``axis`` names)."""
    dims = _static_shape(input, "squeeze")
    axis = one_of(axis, squeeze_dims, "axis", "squeeze_dims")
    if axis is None:
        drop = {i for i, d in enumerate(dims) if d == 1}
    else:
        drop = {_axis(a, len(dims), "squeeze") for a in ([axis] if isinstance(axis, (int, np.integer)) else axis)}
        wrong = sorted(i for i in drop if dims[i] != 1)
        if wrong:
            raise wb.ShapeError(f"tf.squeeze: axes {wrong} of shape {dims} are not of size 1")
    return wb.reshape(input, _new_shape(d for i, d in enumerate(dims) if i not in drop), name=name)


def _slice_along(x, axis: int, start: int, stop: int):
    index = (builtins.slice(None),) * axis + (builtins.slice(start, stop),)
    return x[index]


def split(value, num_or_size_splits, axis=0, num=None, name="split"):
    """``tf.split(value, 3, axis)`` (equal parts) or ``tf.split(value, [2, 5, -1], axis)`` (these sizes)."""
    dims = _static_shape(value, "split")
    axis = _axis(axis, len(dims), "split")
    length = dims[axis]
    if length is None:
        raise wb.ShapeError(f"tf.split: axis {axis} of shape {dims} has no static size")
    if isinstance(num_or_size_splits, (int, np.integer)):
        parts = int(num_or_size_splits)
        if parts < 1 or length % parts:
            raise wb.ShapeError(f"tf.split: axis {axis} of size {length} does not split into {parts} equal parts")
        sizes = [length // parts] * parts
    else:
        sizes = [int(s) for s in num_or_size_splits]
        if sizes.count(-1) > 1:
            raise wb.ArgumentError("tf.split: at most one size may be -1")
        if -1 in sizes:
            sizes[sizes.index(-1)] = length - (builtins.sum(sizes) + 1)
        if builtins.sum(sizes) != length or builtins.min(sizes) < 0:
            raise wb.ShapeError(f"tf.split: sizes {list(num_or_size_splits)} do not add up to axis {axis}'s {length}")
    with wb.name_scope(name):
        starts = np.cumsum([0] + sizes)
        return [_slice_along(value, axis, int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def unstack(value, num=None, axis=0, name="unstack"):
    """The slices of ``value`` along ``axis``, that axis removed."""
    dims = _static_shape(value, "unstack")
    axis = _axis(axis, len(dims), "unstack")
    if dims[axis] is None:
        raise wb.ShapeError(f"tf.unstack: axis {axis} of shape {dims} has no static size")
    with wb.name_scope(name):
        return [value[(builtins.slice(None),) * axis + (i,)] for i in builtins.range(dims[axis])]


def slice(input_, begin, size, name=None):  # noqa: A001 - TensorFlow's name
    """``tf.slice(x, begin, size)``: ``size`` -1 takes the rest of an axis."""
    dims = _static_shape(input_, "slice")
    if len(begin) != len(dims) or len(size) != len(dims):
        raise wb.ShapeError(
            f"tf.slice: begin {list(begin)} and size {list(size)} must have one entry per axis of {dims}"
        )
    index = tuple(builtins.slice(int(b), None if int(n) == -1 else int(b) + int(n)) for b, n in zip(begin, size))
    return input_[index] if name is None else wb.identity(input_[index], name=name)


def tile(input, multiples, name=None):  # noqa: A002
    """``input`` repeated ``multiples[i]`` times along each axis ``i`` (as concatenations)."""
    dims = _static_shape(input, "tile")
    multiples = [int(m) for m in multiples]
    if len(multiples) != len(dims) or builtins.min(multiples, default=1) < 1:
        raise wb.ShapeError(f"tf.tile: multiples {multiples} must be one positive count per axis of {dims}")
    out = input
    for axis, times in enumerate(multiples):
        if times > 1:
            out = wb.concat([out] * times, axis=axis)
    return out if name is None else wb.identity(out, name=name)


def pad(tensor, paddings, mode="CONSTANT", name=None, constant_values=0):
    """``tf.pad(tensor, paddings, mode="CONSTANT" | "REFLECT", constant_values=0)``."""
    kind = str(mode).lower()
    if kind not in ("constant", "reflect"):
        raise UnsupportedError(f"tf.pad: mode {mode!r} is not supported; use 'CONSTANT' or 'REFLECT'")
    pairs = [(int(a), int(b)) for a, b in np.asarray(paddings).reshape(-1, 2)]
    return wb.pad(tensor, pairs, mode=kind, value=constant_values, name=name)


def range(start, limit=None, delta=1, dtype=None, name="range"):  # noqa: A001 - TensorFlow's name
    """A constant ``[start, start + delta, ...)`` below ``limit`` (``tf.range(n)`` counts from 0)."""
    start, limit = (0, start) if limit is None else (start, limit)
    values = np.arange(start, limit, delta)
    if dtype is not None:
        values = values.astype(as_dtype(dtype))
    elif values.dtype == np.float64:
        values = values.astype("float32")
    return wb.constant(values, name=name)


def reduce_logsumexp(input_tensor, axis=None, keepdims=None, name=None, reduction_indices=None, keep_dims=None):
    """``log(sum(exp(x)))`` over ``axis``, computed from the maximum so that it does not overflow."""
    axis = axis_arg(one_of(axis, reduction_indices, "axis", "reduction_indices"))
    keepdims = builtins.bool(one_of(keepdims, keep_dims, "keepdims", "keep_dims"))
    top = wb.stop_gradient(wb.max(input_tensor, axis=axis, keepdims=True))
    total = wb.log(wb.sum(wb.exp(input_tensor - top), axis=axis, keepdims=True)) + top
    if not keepdims:
        total = wb.sum(total, axis=axis)  # drops the kept axes (each of size 1)
    return total if name is None else wb.identity(total, name=name)


def clip_by_norm(t, clip_norm, axes=None, name=None):
    """``t`` scaled down so that its L2 norm (over ``axes``, default all) is at most ``clip_norm``."""
    norm = wb.sqrt(wb.sum(wb.square(t), axis=axis_arg(axes), keepdims=True))
    clipped = t * clip_norm / wb.maximum(norm, clip_norm)
    return clipped if name is None else wb.identity(clipped, name=name)


def logical_not(x, name=None):
    return wb.equal(x, False, name=name)


def logical_and(x, y, name=None):
    """``x and y`` elementwise (bool tensors)."""
    return wb.where(x, y, False, name=name)


def logical_or(x, y, name=None):
    """``x or y`` elementwise (bool tensors)."""
    return wb.where(x, True, y, name=name)


def no_op(name=None):
    """An operation that does nothing (for ``tf.control_dependencies`` and ``sess.run``)."""
    return wb.group(name=name or "NoOp")


add, subtract, multiply, divide = wb.add, wb.subtract, wb.multiply, wb.divide
div, truediv = wb.divide, wb.divide
negative, maximum, minimum, pow, abs = wb.negative, wb.maximum, wb.minimum, wb.pow, wb.abs  # noqa: A001
exp, log, sqrt, sign, tanh, sigmoid = wb.exp, wb.log, wb.sqrt, wb.sign, wb.tanh, wb.sigmoid
equal, not_equal, less, less_equal, greater, greater_equal = (
    wb.equal, wb.not_equal, wb.less, wb.less_equal, wb.greater, wb.greater_equal,
)  # fmt: skip
identity, stop_gradient, zeros_like, ones_like = wb.identity, wb.stop_gradient, wb.zeros_like, wb.ones_like
square, rsqrt, erf, clip_by_value = wb.square, wb.rsqrt, wb.erf, wb.clip
assign, assign_add, assign_sub, group = wb.assign, wb.assign_add, wb.assign_sub, wb.group
is_finite = wb.isfinite

# -- what has no equivalent -------------------------------------------------------------------

_PLACEMENT = (
    "placement is the session's: wb.Session(graph, device='gpu') runs every op on the GPU, and "
    "tf.Session(cluster='local' or 'tcp://scheduler:8786').fit(..., replicas=N) spreads training over a Dask cluster"
)
device = _unsupported("device", _PLACEMENT)
container = _unsupported("container", _PLACEMENT)
FIFOQueue = _unsupported("FIFOQueue", train._NO_QUEUES)
RandomShuffleQueue = _unsupported("RandomShuffleQueue", train._NO_QUEUES)
PaddingFIFOQueue = _unsupported("PaddingFIFOQueue", train._NO_QUEUES)
ConfigProto = _unsupported("ConfigProto", "sessions take no config; wb.Session(device=..., seed=...) has the options")
Print = _unsupported("Print", "fetch the tensor (sess.run) or record it with fit(fetches={...})")
py_func = _unsupported("py_func", "graphs hold only workbench ops; compute in Python between runs")
while_loop = _unsupported("while_loop", "use wb.scan for loops over a sequence")


def cond(pred, true_fn=None, false_fn=None, strict=False, name=None, fn1=None, fn2=None):
    """``tf.cond(pred, true_fn, false_fn)``: :func:`wb.cond` (only the branch taken runs)."""
    return wb.cond(pred, true_fn if fn1 is None else fn1, false_fn if fn2 is None else fn2, name=name)


summary = None  # replaced below by a module whose every function raises


class _Summary:
    """``tf.summary``: every function raises, pointing at fit's History and the views."""

    def __getattr__(self, name):
        return _unsupported(f"summary.{name}", "fit() records every fetch in its History; the TrainingView plots it")


summary = _Summary()

string = _unsupported("string", "graphs hold numbers only; keep strings in Python")


class _Metrics:
    """``tf.metrics``: every function raises, pointing at the graph's own metrics and fit's History."""

    def __getattr__(self, name):
        return _unsupported(
            f"metrics.{name}",
            "streaming metrics are not graph state here: compute the batch's value (wb.accuracy, tf.reduce_mean of "
            "tf.equal ...) and fit(validation=(data, k)) averages it over the held-out set",
        )


metrics = _Metrics()

__all__ = [name for name in dir() if not name.startswith("_") and name not in ("annotations", "builtins", "np", "wb")]
__all__ += ["Graph", "Operation", "Tensor", "Variable", "get_default_graph", "reset_default_graph", "set_random_seed"]


def __getattr__(name):
    raise AttributeError(
        f"module 'workbench.tf1' has no attribute {name!r}: it maps the TensorFlow 1.x names tutorials use "
        "(README, 'Coming from TensorFlow 1.x'); the rest of workbench is `import workbench as wb`"
    )
