"""The op functions and their registry (shape rule, kernel and gradient of every op)."""

from workbench.ops.array import (
    concat,
    concat_part,
    expand_dims,
    gather,
    gather_grad,
    getitem,
    getitem_grad,
    one_hot,
    reshape,
    reshape_like,
    stack,
    transpose,
)
from workbench.ops.math import (
    abs,
    add,
    all,
    argmax,
    broadcast_like,
    cast,
    divide,
    equal,
    exp,
    greater,
    greater_equal,
    identity,
    isfinite,
    less,
    less_equal,
    log,
    matmul,
    max,
    maximum,
    mean,
    minimum,
    multiply,
    negative,
    not_equal,
    ones_like,
    pow,
    reduce_to_like,
    relu,
    sigmoid,
    sign,
    sqrt,
    stop_gradient,
    subtract,
    sum,
    tanh,
    unreduce,
    where,
    zeros_like,
)
from workbench.ops.nn import (
    conv2d,
    conv2d_filter_grad,
    conv2d_input_grad,
    dropout,
    log_softmax,
    max_pool2d,
    softmax,
    softmax_cross_entropy,
)
from workbench.ops.registry import REGISTRY, OpDef, TensorSpec, apply, get_op
from workbench.ops import fused as _fused  # noqa: E402, F401 - registers fused_elementwise
from workbench.ops import fused_train as _fused_train  # noqa: E402, F401 - registers fused_update, softmax_cross_entropy_with_grad
from workbench.ops.state import assign, assign_add, assign_sub, constant, placeholder, variable

#: The op functions users call (``wb.matmul`` ...), by name.
PUBLIC = (
    "abs", "add", "all", "argmax", "assign", "assign_add", "assign_sub", "cast", "concat", "constant", "conv2d",
    "divide", "dropout", "equal", "exp", "expand_dims", "gather", "greater", "greater_equal",
    "identity", "isfinite", "less", "less_equal", "log", "log_softmax", "matmul", "max", "max_pool2d",
    "maximum", "mean", "minimum", "multiply", "negative", "not_equal", "one_hot", "ones_like",
    "placeholder", "pow", "relu", "reshape", "sigmoid", "sign", "softmax",
    "softmax_cross_entropy", "sqrt", "stack", "stop_gradient", "subtract", "sum", "tanh",
    "transpose", "variable", "where", "zeros_like",
)  # fmt: skip
