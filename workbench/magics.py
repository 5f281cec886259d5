"""IPython magics: ``%%flow NAME`` builds a graph from a cell, ``%flow_cluster`` picks the cluster.

Loaded with ``%load_ext workbench``::

    %%flow mlp
    x = placeholder("x", shape=(None, 64))
    y = placeholder("y", shape=(None,), dtype="int64")
    w = variable("w", shape=(64, 10), init="glorot_uniform")
    b = variable("b", shape=(10,), init="zeros")
    loss = mean(softmax_cross_entropy(matmul(x, w) + b, y))
    train = optimizers.SGD(0.1).minimize(loss)

after which ``mlp`` is a :class:`workbench.Graph` and ``mlp.loss`` its loss tensor.
"""

from __future__ import annotations

import traceback
from typing import Any

import dask.config
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

import workbench
from workbench import cluster as wb_cluster
from workbench.errors import WorkbenchError
from workbench.graph.core import Graph, Operation, Tensor
from workbench.ops import PUBLIC
from workbench.ops.state import INITIALIZERS


def flow_namespace() -> dict[str, Any]:
    """What a ``%%flow`` cell sees besides the user's names: ops, optimizers, initializers, errors."""
    names = {name: getattr(workbench, name) for name in PUBLIC}
    names.update(
        wb=workbench,
        optimizers=workbench.optimizers,
        metrics=workbench.metrics,
        accuracy=workbench.accuracy,
        name_scope=workbench.name_scope,
        group=workbench.group,
        gradients=workbench.gradients,
        cond=workbench.cond,
        scan=workbench.scan,
        initializers=INITIALIZERS,
        SGD=workbench.optimizers.SGD,
        Momentum=workbench.optimizers.Momentum,
        Adam=workbench.optimizers.Adam,
    )
    return names


def _valid_name(name: str) -> str:
    if not name.isidentifier():
        raise UsageError(f"%%flow needs a Python name for the graph, got {name!r}")
    return name


@magics_class
class FlowMagics(Magics):
    """``%%flow`` and ``%flow_cluster``."""

    def __init__(self, shell) -> None:
        super().__init__(shell)
        self.views: dict[str, Any] = {}  # graph name -> its GraphView, stopped when the cell runs again

    @magic_arguments()
    @argument("name", type=_valid_name, help="the user-namespace name the Graph is bound to")
    @argument("-q", "--quiet", action="store_true", help="do not display the graph view")
    @argument("--expand", action="store_true", help="start with every name scope open (gradients included)")
    @cell_magic
    def flow(self, line: str, cell: str):
        """Build a workbench Graph from the cell and bind it to NAME.

        Every public op (placeholder, variable, matmul, mean, ...), ``optimizers``
        and ``name_scope`` are in scope without imports, as are the user's names.
        Each tensor or operation the cell assigns becomes an attribute of the
        graph (``NAME.loss``). Running the cell again replaces the graph.
        """
        args = parse_argstring(self.flow, line)
        graph = Graph(name=args.name)
        namespace = {**self.shell.user_ns, **flow_namespace()}
        before = dict(namespace)
        filename, code = self._compile(line, cell)
        with graph.as_default():
            try:
                exec(code, namespace)  # the user's own cell, as IPython runs any cell
            except Exception as e:  # noqa: BLE001 - re-raised with a short report
                raise _cell_error(e, args.name, filename) from None
        skipped = _bind(graph, namespace, before)
        if skipped:
            print(f"%%flow {args.name}: not set as graph attributes (names the Graph uses): {', '.join(skipped)}")
        previous = self.shell.user_ns.get(args.name)
        if isinstance(previous, Graph) and previous is not graph:
            previous.replaced(f"re-running %%flow {args.name}")
        old = self.views.pop(args.name, None)
        if old is not None:
            old.stop()
        self.shell.user_ns[args.name] = graph
        if not args.quiet:
            from workbench.widgets import GraphView

            view = GraphView(graph, collapsed=[] if args.expand else None).follow()
            self.views[args.name] = view
            from IPython.display import display

            display(view)

    def _security(self, name: str | None):
        """The ``distributed.Security`` the notebook holds under ``name`` (None without a name)."""
        if name is None:
            return None
        from distributed import Security

        value = self.shell.user_ns.get(name)
        if not isinstance(value, Security):
            found = "nothing" if value is None else f"a {type(value).__name__}"
            raise UsageError(f"%flow_cluster --security {name}: expected a distributed.Security, {name!r} is {found}")
        return value

    def _compile(self, line: str, cell: str):
        """Compile the cell under a file name IPython keeps in ``linecache`` (for op sources and
        errors); line numbers count the ``%%flow`` line, as the notebook shows the cell."""
        text = f"%%flow {line}\n{cell}"
        filename = self.shell.compile.cache(text, self.shell.execution_count, raw_code=f"# workbench %%flow\n{text}")
        try:
            return filename, compile("\n" + cell, filename, "exec", dont_inherit=True)
        except SyntaxError as e:
            e.filename = filename
            raise

    @magic_arguments()
    @argument(
        "target",
        nargs="?",
        default=None,
        help="'local' for a cluster on this machine, a scheduler address (tcp://host:8786), 'gateway', "
        "'close' to let the default go, or nothing for the configured default "
        "(workbench.cluster.address; the current default when one is set)",
    )
    @argument("-n", "--workers", type=int, default=None, help="workers of a local cluster")
    @argument(
        "-s",
        "--security",
        default=None,
        help="the name of a distributed.Security in the notebook (certificates for tls:// addresses; "
        "default: Dask's distributed.comm.tls.* configuration)",
    )
    @line_magic
    def flow_cluster(self, line: str):
        """Set (or show, or close) the Dask cluster that new sessions use by default.

        With no argument: the default cluster if one is set, else the configured one
        (Dask's ``workbench.cluster.address``, e.g. ``DASK_WORKBENCH__CLUSTER__ADDRESS``:
        ``"local"`` or a scheduler address), so a shared notebook runs on whatever
        cluster its reader configured. ``close`` closes a local cluster this notebook
        started; a cluster reached by address is only disconnected and keeps running.
        """
        args = parse_argstring(self.flow_cluster, line)
        security = self._security(args.security)
        if args.workers is not None and args.workers < 1:
            raise UsageError(f"-n needs a positive number of workers, got {args.workers}")
        if args.workers is not None and args.target not in (None, "local"):
            raise UsageError("-n applies to a local cluster only: %flow_cluster local -n N")
        from workbench.widgets import ClusterView

        if args.target == "close":
            return ClusterView(None, message=wb_cluster.close_default() or "no default cluster to close")
        if args.target is None and args.workers is None:
            client = wb_cluster.default_client()
            if client is not None:
                return _cluster_view(client)
        target = args.target or (
            "local" if args.workers is not None else dask.config.get("workbench.cluster.address", "local")
        )
        if target not in ("local", "gateway") and "://" not in target:
            origin = "" if args.target else " (from workbench.cluster.address)"
            raise UsageError(
                f"%flow_cluster: {target!r}{origin} is not 'local', 'close' or a scheduler address like tcp://host:8786"
            )
        try:
            options = {} if security is None else {"security": security}
            client = wb_cluster.set_default(target, n_workers=args.workers, **options)
        except WorkbenchError as e:
            raise _short(e, [f"{type(e).__name__}: {e}"]) from None
        return _cluster_view(client, message=f"new sessions run on {target}")


def _cluster_view(client, message: str = ""):
    """The ClusterView of ``client``'s cluster, saying whether its dashboard has the Workbench page
    (and why not); fits on it send their progress there from now on."""
    from workbench.dashboard import forward
    from workbench.dashboard.status import dashboard_info
    from workbench.widgets import ClusterView

    info = wb_cluster.info(client)
    info.update(dashboard_info(client, info.get("dashboard") or ""))
    forward()
    return ClusterView(info, message=message)


def _bind(graph: Graph, namespace: dict, before: dict) -> list[str]:
    """Set every tensor or operation the cell assigned as an attribute of ``graph``."""
    skipped = []
    for name, value in namespace.items():
        if name.startswith("_") or before.get(name, _MISSING) is value:
            continue
        if isinstance(value, (Tensor, Operation)) and value.graph is graph:
            if hasattr(Graph, name) or name in vars(graph):
                skipped.append(name)
            else:
                setattr(graph, name, value)
    return skipped


_MISSING = object()


def _cell_error(error: Exception, name: str, filename: str) -> Exception:
    """``error`` with a traceback that starts at the cell: for workbench errors only the
    cell's line and code, for other errors the frames from the cell down."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    if tb is None:
        return error
    if not isinstance(error, WorkbenchError):
        return _short(error, [part.rstrip("\n") for part in traceback.format_exception(type(error), error, tb)])
    line = tb
    while line.tb_next is not None and line.tb_next.tb_frame.f_code.co_filename == filename:
        line = line.tb_next
    import linecache

    lineno = line.tb_lineno
    code = linecache.getline(filename, lineno).strip()
    message = "\n".join(part for part in str(error).split("\n") if filename not in part)
    lines = [f"%%flow {name}, line {lineno}:", f"    {code}", f"{type(error).__name__}: {message}"]
    return _short(error, lines)


def _short(error: Exception, lines: list[str]) -> Exception:
    """The same exception, shown by IPython as ``lines`` instead of a traceback through workbench."""
    error._render_traceback_ = lambda: list(lines)
    error.flow_report = "\n".join(lines)
    return error.with_traceback(None)


def load_ipython_extension(ip) -> None:
    """``%load_ext workbench``: register the magics and show a TrainingView when ``fit`` runs."""
    ip.register_magics(FlowMagics)
    from workbench import notebook

    if notebook.in_kernel() and not notebook.installed():
        notebook.install()
