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
- plans with random ops (host RNG) never capture, nor do runs with
  ``check_numerics`` (it reads values on the host);
- what the captured run allocates comes from a private memory pool that lives
  as long as the graph, so no other array is ever given that memory;
- before each replay the variables are checked to be the captured arrays
  (``Session.initialize`` or ``restore`` put new ones): if not, the graph is
  dropped and the plan warms up again;
- if capture raises for any reason, the session's state is put back, the run
  is done plainly, and that plan is never captured again.

The CUDA specifics sit in :class:`CudaCapture`; the bookkeeping here takes any
object with the same five methods, so it is tested on NumPy with a stand-in.
"""

from __future__ import annotations

from dataclasses import dataclass


def capture_obstacle(plan) -> str | None:
    """Why ``plan`` can never be captured, or None."""
    if not plan.own_state:
        return "the plan does not own its variables' arrays (own_state=False)"
    for op in plan.step_ops:
        if op.opdef.random:
            return f"{op.type} {op.name!r} draws random numbers on the host"
        if op.opdef.stateful and op.opdef.inplace is None:
            return f"{op.type} {op.name!r} has no in-place kernel to update its variable"
    return None


def signature(feeds) -> tuple:
    """The cache key of a run: each feed's shape and dtype."""
    return tuple((tuple(f.shape), str(f.dtype)) for f in feeds)


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

    def __init__(self, plan, capture):
        self.plan, self.capture = plan, capture
        self.obstacle = capture_obstacle(plan)  # set too when a capture fails: never retried
        updated = [op.inputs[0].op.name for op in plan.step_ops if op.opdef.stateful and op.inputs]
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
        elif key in self.ready:
            return self._capture(key, feeds)
        before = self._variables()
        values = self.plan.run(feeds, step=step, row_offset=row_offset)
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
            return plan.run(feeds)
        self.captures += 1
        self.graphs[key] = captured = Captured(graph, inputs, outputs, before, pool)
        return [None if v is None else cap.copy(v) for v in captured.outputs]


class CudaCapture:
    """CUDA stream capture with CuPy: capture on a side stream, launch on the current one."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)  # capture cannot use the legacy default stream

    def capture(self, fn):
        """``(graph, fn(), pool)``: ``fn`` recorded, not run; its allocations come from ``pool``."""
        cp = self.cupy
        pool = cp.cuda.MemoryPool()
        with cp.cuda.using_allocator(pool.malloc), self.stream:
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
        self.cupy.copyto(dst, src)

    def copy(self, array):
        return array.copy()
