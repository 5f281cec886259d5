"""CUDA graph replay of whole plan runs: one launch in place of dozens of kernel calls.

A training step of a small model is many short kernels, and on a GPU the time
goes to Python and launch overhead per call. :class:`PlanGraphs` captures one
run of a plan with CUDA stream capture and from then on replays it: the feeds
are copied into the captured input buffers, the graph is launched, and the
fetched values are copied out of the captured output buffers (the next replay
overwrites them).

A captured run is only correct while every address it baked in stays valid, so:

- a plan is captured only after a plain run with the same feed signature
  (shapes and dtypes) left every variable's array in place (the plan's
  ``own_state`` updates write into the variables' own arrays), and only if the
  capture itself replaced none;
- plans with random ops (host RNG) or index checks (gather, one_hot,
  softmax_cross_entropy read their indices on the host) never capture, nor do
  runs with ``check_numerics`` (it reads values on the host);
- what the captured run allocates comes from a private memory pool that lives
  as long as the graph, so no other array is ever given that memory;
- before each replay the variables are checked to be the captured arrays
  (``Session.initialize`` or ``restore`` put new ones): if not, the graph is
  dropped and the plan warms up again;
- if capture raises for any reason, the session's state is put back, the run
  is done plainly, and that plan is never captured again.

Each decision is reported through ``emit`` (a session's ``events.emit``) as a
``graph_capture`` event: ``status`` ``"captured"`` (with the feed signature),
``"skipped"`` (with the ``reason``: the obstacle, or why the capture failed) or
``"dropped"`` (the variables were given new arrays).

The CUDA specifics sit in :class:`CudaCapture`; the bookkeeping here takes any
object with the same five methods (and, optionally, ``warm(fn)``: run ``fn``
plainly as it will be captured), so it is tested on NumPy with a stand-in.
Matrix products are captured through :class:`workbench.gpu.blas.CapturableMatmul`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from workbench.graph.plan import written_variables


def capture_obstacle(plan) -> str | None:
    """Why ``plan`` can never be captured, or None."""
    if not plan.own_state:
        return "the plan does not own its variables' arrays (own_state=False)"
    for op in plan.step_ops:
        if op.opdef.random:
            return f"{op.type} {op.name!r} draws random numbers on the host"
        if op.opdef.collective:
            return f"{op.type} {op.name!r} waits for its peers at every run"
        if op.opdef.checks_values:
            return f"{op.type} {op.name!r} checks its indices on the host at every run"
        if op.opdef.stateful and op.opdef.inplace is None:
            return f"{op.type} {op.name!r} has no in-place kernel to update its variable"
    return None


def signature(feeds) -> tuple:
    """The cache key of a run: each feed's shape and dtype (a dtype object: equal to its name)."""
    return tuple([(f.shape, f.dtype) for f in feeds])


@dataclass
class Captured:
    """One captured run: the graph and every buffer whose address it holds."""

    graph: object
    inputs: list  # feeds are copied in here before each launch
    outputs: list  # fetched values land here (None for operations)
    variables: list  # the variables' arrays at capture, in PlanGraphs.names order
    pool: object  # private memory pool of what the captured run allocated


class PlanGraphs:
    """Captured runs of one plan, one per feed signature.

    Parameters
    ----------
    plan : Plan
    capture : CudaCapture or a stand-in with ``capture``, ``launch``, ``empty_like``,
        ``copy_into`` and ``copy``.
    """

    def __init__(self, plan, capture, emit=None):
        self.plan, self.capture = plan, capture
        self.emit = emit or _ignore
        self.obstacle = capture_obstacle(plan)  # set too when a capture fails: never retried
        if self.obstacle is not None:
            self.emit("graph_capture", status="skipped", reason=self.obstacle, steps=len(plan))
        self.warm = getattr(capture, "warm", None) or _run
        updated = [name for op in plan.step_ops for name in written_variables(op)]
        self.names = list(dict.fromkeys(plan.variable_names + updated))
        self.graphs: dict[tuple, Captured] = {}
        self.ready: set[tuple] = set()  # signatures whose last plain run kept every variable's array
        self.replays = 0
        self.captures = 0

    def run(self, feeds: list, check_numerics: bool = False, step=None, row_offset: int = 0) -> list:
        """What ``plan.run(feeds, ...)`` returns: by replay when possible.

        ``step`` and ``row_offset`` only key random draws, and plans with random
        ops never capture: they reach the plain runs only.
        """
        if self.obstacle is not None or check_numerics:
            return self.plan.run(feeds, check_numerics=check_numerics, step=step, row_offset=row_offset)
        key = signature(feeds)
        captured = self.graphs.get(key)
        if captured is not None:
            if self._current(captured.variables):
                return self._replay(captured, feeds)
            del self.graphs[key]  # a variable was given a new array: warm up again
            self.ready.discard(key)
            self.emit("graph_capture", status="dropped", reason="a variable was given a new array", signature=key)
        elif key in self.ready:
            return self._capture(key, feeds)
        before = self._variables()
        values = self.warm(lambda: self.plan.run(feeds, step=step, row_offset=row_offset))
        if self._current(before):
            self.ready.add(key)
        else:
            self.ready.discard(key)
        return values

    def _variables(self) -> list:
        state = self.plan.state
        return [state.get(n) for n in self.names]

    def _current(self, arrays: list) -> bool:
        state = self.plan.state
        return all(state.get(n) is a for n, a in zip(self.names, arrays))

    def _replay(self, captured: Captured, feeds: list) -> list:
        cap = self.capture
        for buffer, value in zip(captured.inputs, feeds):
            cap.copy_into(buffer, value)
        cap.launch(captured.graph)
        self.plan.count_run()
        self.replays += 1
        return [None if v is None else cap.copy(v) for v in captured.outputs]

    def _capture(self, key: tuple, feeds: list) -> list:
        plan, cap = self.plan, self.capture
        saved = plan.snapshot()
        before = self._variables()
        inputs = [cap.empty_like(f) for f in feeds]
        for buffer, value in zip(inputs, feeds):
            cap.copy_into(buffer, value)
        try:
            graph, outputs, pool = cap.capture(lambda: plan.run(inputs))
            if not self._current(before):
                raise RuntimeError("a variable update did not write into the variable's array")
            cap.launch(graph)  # the capture ran nothing: this launch is this run
        except Exception as e:  # noqa: BLE001 - any failure: put the state back and run plainly
            plan.restore(saved)
            self.obstacle = f"capture failed: {type(e).__name__}: {e}"
            self.emit("graph_capture", status="skipped", reason=self.obstacle, steps=len(plan))
            return plan.run(feeds)
        self.captures += 1
        self.emit("graph_capture", status="captured", signature=key, steps=len(plan))
        self.graphs[key] = captured = Captured(graph, inputs, outputs, before, pool)
        return [None if v is None else cap.copy(v) for v in captured.outputs]


def _ignore(kind, **fields) -> None:
    pass


def _run(fn):
    return fn()


class CudaCapture:
    """CUDA stream capture with CuPy: capture on a side stream, launch on the current one.

    With ``xp`` (the namespace plans run with), its ``matmul`` is replaced during
    warm-up runs and captures by a :class:`~workbench.gpu.blas.CapturableMatmul`
    (cuBLAS on a handle with its own workspace); ``blas_error`` says why not when
    cuBLAS cannot be loaded, and matmuls then refuse the capture as before.
    """

    def __init__(self, cupy, xp=None, matmul=None):
        self.cupy, self.xp = cupy, xp
        self.stream = cupy.cuda.Stream(non_blocking=True)  # capture cannot use the legacy default stream
        self.matmul, self.blas_error = matmul, None
        if xp is not None and matmul is None:
            from workbench.gpu.blas import CapturableMatmul

            try:
                self.matmul = CapturableMatmul(cupy, xp.matmul)
            except (OSError, AttributeError, RuntimeError) as e:  # no cuBLAS symbols, or a failed call
                self.blas_error = f"{type(e).__name__}: {e}"

    def warm(self, fn):
        """``fn()`` run plainly, with the products it will have when captured (their first calls
        load cuBLAS kernels and pick algorithms, which a capture must not do)."""
        if self.matmul is None:
            return fn()
        self.matmul.bind(self.cupy.cuda.get_current_stream().ptr)
        with _replaced(self.xp, "matmul", self.matmul):
            return fn()

    def capture(self, fn):
        """``(graph, fn(), pool)``: ``fn`` recorded, not run; its allocations come from ``pool``."""
        cp = self.cupy
        pool = cp.cuda.MemoryPool()
        if self.matmul is not None:
            self.matmul.bind(self.stream.ptr)  # before the capture: setting a stream is not captured
        with cp.cuda.using_allocator(pool.malloc), self.stream, _replaced(self.xp, "matmul", self.matmul):
            self.stream.begin_capture()
            try:
                result = fn()
            except BaseException:
                try:
                    self.stream.end_capture()  # leave the stream out of capture mode
                except Exception:  # noqa: BLE001 - the capture is invalid already; report fn's error
                    pass
                raise
            graph = self.stream.end_capture()
        return graph, result, pool

    def launch(self, graph) -> None:
        graph.launch()  # on the current stream, ordered after the feed copies and before the reads

    def empty_like(self, array):
        return self.cupy.empty(array.shape, array.dtype)

    def copy_into(self, dst, src) -> None:
        # the namespace's copyto is one memcpy for arrays of one shape and dtype (see gpu/device.py)
        (self.cupy if self.xp is None else self.xp).copyto(dst, src)

    def copy(self, array):
        return array.copy()


@contextlib.contextmanager
def _replaced(namespace, name: str, value):
    """``namespace.name`` is ``value`` inside (nothing changes when either is None)."""
    if namespace is None or value is None:
        yield
        return
    saved = getattr(namespace, name)
    setattr(namespace, name, value)
    try:
        yield
    finally:
        setattr(namespace, name, saved)
