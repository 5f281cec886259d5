"""workbench: dataflow graphs for research notebooks, run on NumPy, CuPy or a Dask cluster.

>>> import workbench as wb
>>> g = wb.Graph(name="tiny")
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 2))
...     y = wb.sum(wb.relu(x), axis=1)
>>> wb.Session(g).run(y, feed_dict={x: [[1.0, -2.0]]}).tolist()
[1.0]
"""

from workbench import cluster, metrics, optimizers, strategies
from workbench import layers, models, stragglers
from workbench.errors import (
    ArgumentError,
    ClusterError,
    DeviceError,
    DTypeError,
    ExecutionError,
    FeedError,
    FileError,
    FormatError,
    GradientError,
    GraphError,
    NumericsError,
    PathError,
    ShapeError,
    StrategyError,
    WorkbenchError,
)
from workbench.events import EventStream
from workbench.graph import (
    Graph,
    Operation,
    Tensor,
    Variable,
    get_default_graph,
    gradients,
    group,
    name_scope,
    reset_default_graph,
)
from workbench.graph import cond, scan
from workbench.graph.precision import mixed_precision
from workbench.graph.probes import watch
from workbench.metrics import accuracy
from workbench.ops import PUBLIC as _PUBLIC_OPS
from workbench.session import Session
from workbench.model import Model, export_onnx, load_model
from workbench.strategies import strategy, strategy_graph
from workbench.scaling import ScalingStudy, scaling_study
from workbench.compare import Comparison, compare_strategies
from workbench.training import History
from workbench.timeline import Timeline

from workbench.ops import (  # noqa: E402, F401 - the public op functions
    abs,
    add,
    all,
    all_gather,
    all_reduce,
    cross_replica_sum,
    argmax,
    assign,
    assign_add,
    assign_sub,
    broadcast,
    cast,
    concat,
    constant,
    conv2d,
    divide,
    dropout,
    equal,
    exp,
    expand_dims,
    gather,
    greater,
    greater_equal,
    identity,
    isfinite,
    less,
    less_equal,
    log,
    log_softmax,
    matmul,
    max,
    max_pool2d,
    maximum,
    mean,
    min,
    minimum,
    multiply,
    negative,
    not_equal,
    one_hot,
    ones_like,
    placeholder,
    pow,
    prod,
    relu,
    reshape,
    sigmoid,
    sign,
    softmax,
    softmax_cross_entropy,
    sqrt,
    stack,
    stop_gradient,
    subtract,
    sum,
    tanh,
    transpose,
    variable,
    variables_initializer,
    where,
    zeros_like,
)

from workbench.ops import (  # noqa: E402, F401 - normalization, attention, pooling, padding, special, indexing
    avg_pool2d,
    clip,
    cumsum,
    erf,
    gelu,
    layer_norm,
    moments,
    pad,
    rsqrt,
    scaled_dot_product_attention,
    scatter_add,
    square,
    top_k,
)

from workbench.version import __version__  # noqa: E402

__all__ = [
    "ArgumentError",
    "ClusterError",
    "DTypeError",
    "DeviceError",
    "ExecutionError",
    "EventStream",
    "FeedError",
    "FileError",
    "FormatError",
    "GradientError",
    "Graph",
    "GraphError",
    "History",
    "Timeline",
    "NumericsError",
    "Operation",
    "PathError",
    "Session",
    "Model",
    "export_onnx",
    "load_model",
    "accuracy",
    "metrics",
    "layers",
    "models",
    "ShapeError",
    "Tensor",
    "Variable",
    "WorkbenchError",
    "get_default_graph",
    "gradients",
    "group",
    "mixed_precision",
    "name_scope",
    "optimizers",
    "watch",
    "reset_default_graph",
    "ScalingStudy",
    "scaling_study",
    "Comparison",
    "compare_strategies",
    "cluster",
    "cond",
    "scan",
    "strategies",
    "strategy",
    "stragglers",
    "strategy_graph",
    "StrategyError",
    *_PUBLIC_OPS,
]


def load_ipython_extension(ip) -> None:
    """``%load_ext workbench``: the ``%%flow`` and ``%flow_cluster`` magics and live training views."""
    from workbench.magics import load_ipython_extension as load

    load(ip)


from workbench import notebook as _notebook  # noqa: E402

_notebook.install_if_kernel()  # in a notebook, fit() shows a TrainingView
