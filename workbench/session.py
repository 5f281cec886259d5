"""Sessions: run a graph's fetches with feeds, keep variables, train with ``fit``."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from workbench import checkpoint
from workbench.errors import FeedError, GraphError, WorkbenchError
from workbench.events import ROOT, EventStream, PlanCompiled, RunFailed, RunFinished, RunStarted, new_token
from workbench.fitloop import FitLoop, request_stop
from workbench.devices import open_device
from workbench.graph.compile import PlanCache, PlanKey, compile_plan
from workbench.graph import default_session
from workbench.graph.core import Graph, Operation, Tensor, get_default_graph
from workbench.graph.passes import optimize
from workbench.graph.plan import Plan
from workbench.ops import rules
from workbench.ops.registry import cast_exactly
from workbench.ops.state import initial_value
from workbench.training import History, check_fit_arguments, is_dask_array
from workbench import fit_arguments
from workbench.graph import profile as profiling
from workbench.clock import check as check_clock
from workbench.validation import make_validation


class Session:
    """Runs a graph and keeps the values of its variables.

    Parameters
    ----------
    graph : Graph, optional
        The graph to run (the default graph when left out).
    seed : int
        Seeds variable initializers, dropout and the batch order of :meth:`fit`.
    cluster : Client, address, "local", None or False
        Where :meth:`fit` trains data-parallel: a ``distributed.Client``, a scheduler
        address (``"tcp://..."``, ``"tls://..."``), ``"local"`` for an embedded
        cluster (closed with the session), None for the default set by
        ``%flow_cluster`` or :func:`workbench.cluster.set_default` (local execution
        when none is set), or False for local execution. See :func:`workbench.cluster.connect`.
    security : distributed.Security, optional
        Certificates for a ``tls://`` address (default: Dask's ``distributed.comm.tls.*`` configuration).
    device : {"cpu", "gpu", "gpu:<index>"} or a Device
        Where kernels run (see :mod:`workbench.graph.device`); :attr:`device` is the opened device. On a GPU (CuPy) variables stay on the device, feeds
        go up once per run and results come back as NumPy. With a cluster,
        ``fit`` runs each worker's plans on its GPU (see :mod:`workbench.cluster.program`).
    **device_options
        For ``device="gpu"``: ``memory_pool``, ``memory_limit``, ``results``
        (``"numpy"`` or ``"device"``), ``fuse``, ``cuda_graphs`` (replay
        repeated runs as CUDA graphs, default False) and ``emulate``; see
        :class:`workbench.gpu.GPU`.

    Examples
    --------
    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(None, 2))
    ...     w = wb.variable("w", init=[[1.0], [2.0]])
    ...     y = wb.matmul(x, w)
    >>> wb.Session(g).run(y, feed_dict={"x": [[3.0, 4.0]]}).tolist()
    [[11.0]]
    """

    def __init__(
        self,
        graph: Graph | None = None,
        seed: int = 0,
        cluster=None,
        device: str = "cpu",
        security=None,
        **device_options,
    ):
        self.graph = graph if graph is not None else get_default_graph()
        if not isinstance(self.graph, Graph):
            raise GraphError(f"Session needs a workbench Graph, got {type(self.graph).__name__}")
        self.seed = int(seed)
        self.device = open_device(device, **device_options)
        self.client, self._owns_client = _client_for(cluster, security)
        self.token = new_token("session")  # identity in events (never reused, unlike id())
        self.events = EventStream(parent=ROOT, session=self.token, graph=self.graph.token)
        self._state: dict[str, Any] = {}
        self._plans = PlanCache()
        self._fits = 0
        # checkpoint directory -> the batch seed of this session's fit that wrote it: a fit that resumes
        # there draws the batches the fit it continues would have drawn
        self._batch_seeds: dict[str, tuple] = {}
        self._said_local = False  # whether run() said that a training step runs here, not on the cluster
        self._resident = None  # the NumPy data of its cluster fits, kept on the workers until close()
        #: The history of the latest ``fit``, also when it was interrupted or failed (the steps done).
        self.last_history: History | None = None
        self.last_profile: dict[str, float] = {}  # run(..., profile=True): seconds per op of that run

    @property
    def xp(self):
        """The array namespace of the session's device."""
        return self.device.xp

    @property
    def device_options(self) -> dict:
        """The options the device was opened with (those that differ from its defaults)."""
        return dict(self.device.options)

    @property
    def plans(self) -> PlanCache:
        """The session's compiled plans (keyed by :class:`~workbench.graph.compile.PlanKey`)."""
        return self._plans

    # -- variables ---------------------------------------------------------------------
    def initialize(self, names=None) -> None:
        """(Re)set variables (all when ``names`` is None) to their initial values."""
        for name in self._variable_names(names):
            op = self.graph.operation(name)
            self._state[name] = self.xp.asarray(initial_value(name, op.attrs, self.seed))

    def _ensure_initialized(self, names) -> None:
        missing = [n for n in names if n not in self._state]
        if missing:
            self.initialize(missing)

    def _variable_names(self, names) -> list[str]:
        if names is None:
            return [v.name for v in self.graph.variables]
        out = []
        for n in names:
            n = n.name if isinstance(n, Tensor) else n
            if n not in self.graph or self.graph.operation(n).type != "variable":
                raise GraphError(f"graph {self.graph.name!r} has no variable named {n!r}")
            out.append(n)
        return out

    @property
    def variables(self) -> dict[str, np.ndarray]:
        """Variable name to a NumPy copy of its current value."""
        self._ensure_initialized([v.name for v in self.graph.variables])
        return {name: np.array(self.device.to_host(value)) for name, value in self._state.items() if name in self.graph}

    # -- running -----------------------------------------------------------------------
    def run(
        self, fetches, feed_dict=None, check_numerics: bool = False, step: int | None = None, profile: bool = False
    ):
        """Compute ``fetches`` (a tensor, an operation, a name, or a list, tuple or dict of them).

        ``feed_dict`` maps placeholders (tensors or names) to values. Tensors come
        back as NumPy arrays, operations as ``None``, in the structure of ``fetches``.
        With ``check_numerics=True`` the run stops at the first op that makes a
        NaN or Inf, and the error names it.

        Feeding dask arrays (split along the first axis) maps the run over their
        chunks and returns dask arrays: sharded inference, lazily, on whatever
        scheduler computes them (``sess.client.compute(...)`` on the session's cluster).

        With ``step`` (0-based), random ops (dropout) draw what training step
        ``step + 1`` draws, locally or on a cluster; by default they draw anew each run.

        With ``profile=True`` every kernel call is timed (CUDA events on a GPU) and
        :attr:`last_profile` holds ``{op name: seconds}`` of this run (see
        :mod:`workbench.graph.profile`; a profiled run is not replayed as a CUDA graph).
        """
        flat, unflatten = _flatten(fetches)
        if any(_is_initializer(f) for f in flat):
            return unflatten(self._run_initializers(flat, feed_dict, check_numerics, step))
        names = [self._fetch_name(f) for f in flat]
        if feed_dict and any(is_dask_array(v) for v in feed_dict.values()):
            return unflatten(self._run_sharded(names, feed_dict))
        if self.client is not None and not self._said_local and any(n in self.graph.training for n in names):
            self._said_local = True
            warnings.warn(LocalRunWarning(_RUNS_HERE), stacklevel=2)
        feeds = self._check_feeds(feed_dict or {})
        plan = self._plan(names, feeds)
        timed = {} if profile else None
        values = self._execute(plan, [feeds[n] for n in plan.feed_names], check_numerics, step, profile=timed)
        if timed is not None:
            self.last_profile = timed
        values = [None if isinstance(f, Operation) else v for f, v in zip(flat, values)]  # run for effect
        result = self.device.result
        return unflatten([None if v is None else result(v) for v in values])

    def _run_initializers(self, flat: list, feed_dict, check_numerics, step) -> list:
        """Fetched initializer ops (``variables_initializer``) (re)set their variables first; the
        other fetches then run as usual. An initializer fetches as None."""
        for fetch in flat:
            if _is_initializer(fetch):
                self._fetch_name(fetch)  # this session's graph
                self.initialize(list(fetch.attrs["variables"]))
        rest = [f for f in flat if not _is_initializer(f)]
        values = iter(self.run(rest, feed_dict=feed_dict, check_numerics=check_numerics, step=step) if rest else [])
        return [None if _is_initializer(f) else next(values) for f in flat]

    def _execute(self, plan: Plan, feed_values: list, check_numerics: bool, step: int | None, profile=None) -> list:
        """One run of ``plan`` on the device, with run events for whoever watches (``profile``: a dict
        that gets each op's seconds; the plan then runs call by call, never as a captured graph)."""
        watched = self.events.wanted  # live views: which ops run, which one failed
        if watched:
            self.events.emit(RunStarted, ops=tuple(op.name for op in plan.step_ops))
        try:
            if profile is not None:
                values = plan.run(feed_values, check_numerics, step=step, profile=profile)
            else:
                values = self.device.run(
                    plan, feed_values, check_numerics=check_numerics, step=step, emit=self.events.emit
                )
        except WorkbenchError as e:
            if watched:
                self.events.emit(RunFailed, op=getattr(e, "op", None), error=str(e))
            raise
        if watched:
            self.events.emit(RunFinished)
        return values

    def plan_for(self, fetches, feed_dict=None) -> Plan:
        """The plan that ``run(fetches, feed_dict)`` runs (compiled now if it is not yet)."""
        names = [self._fetch_name(f) for f in _flatten(fetches)[0]]
        return self._plan(names, self._check_feeds(feed_dict or {}))

    def _run_sharded(self, names: list[str], feed_dict: dict) -> list:
        from workbench.cluster.infer import run_sharded

        feeds = {}
        for key, value in feed_dict.items():
            ph = self._placeholder(key)
            if is_dask_array(value):
                self._feed_value(ph, np.empty((0, *value.shape[1:]), dtype=value.dtype), any_length=True)
                feeds[ph.name] = value.astype(ph.dtype)
            else:
                feeds[ph.name] = self._feed_value(ph, value)
        fetched = [self.graph.get(n) for n in names]
        if any(isinstance(t, Operation) for t in fetched):
            raise GraphError("operations cannot be run chunk by chunk; fetch tensors")
        graph = optimize(self.graph, names, fed=list(feeds))
        variables = [op.name for op in graph.operations if op.type == "variable"]
        if _updated_variables(graph):
            raise GraphError("a run with dask-array feeds cannot update variables; fetch tensors only")
        self._ensure_initialized(variables)
        values = {n: np.asarray(self.device.to_host(self._state[n])) for n in variables}
        return run_sharded(
            graph, fetched, feeds, values, seed=self.seed, device=(self.device.kind, self.device.options)
        )

    def _plan(self, names: list[str], feeds: dict) -> Plan:
        key = PlanKey.of(self.graph, names, feeds, self.device)
        return self._plans.get(key, lambda: self._compile(names, feeds))

    def _compile(self, names: list[str], feeds: dict) -> Plan:
        started = time.perf_counter()
        plan = compile_plan(self.graph, names, feeds, self.device, state=self._state, seed=self.seed, own_state=True)
        self._ensure_initialized(plan.variable_names + _updated_variables(plan.graph))
        seconds = time.perf_counter() - started
        ops = len(self.graph.operations)
        self.events.emit(
            PlanCompiled, fetches=tuple(names), ops=ops, steps=len(plan), seconds=seconds, device=self.device.name
        )
        return plan

    def _fetch_name(self, fetch) -> str:
        if isinstance(fetch, (Tensor, Operation)):
            if fetch.graph is not self.graph:
                raise GraphError(self.graph.foreign(repr(fetch.name), fetch.graph))
            return fetch.name
        if isinstance(fetch, str):
            found = self.graph.get(fetch)
            return found.name
        raise GraphError(f"cannot fetch {fetch!r}: fetch tensors, operations or their names")

    def _placeholder(self, key) -> Tensor:
        if isinstance(key, Tensor):
            if key.graph is not self.graph:
                raise FeedError(self.graph.foreign(f"feed key {key.name!r}", key.graph))
            tensor = key
        elif isinstance(key, str):
            try:
                tensor = self.graph.get(key)
            except GraphError:
                raise FeedError(f"graph {self.graph.name!r} has no placeholder named {key!r}") from None
        else:
            raise FeedError(f"feed keys are placeholders or their names, got {key!r}")
        if not isinstance(tensor, Tensor) or tensor.op.type != "placeholder":
            label = getattr(tensor, "name", key)
            raise FeedError(f"only placeholders can be fed; {label!r} is a {getattr(tensor, 'op', tensor).type} op")
        return tensor

    def _check_feeds(self, feed_dict: dict) -> dict:
        feeds = {}
        for key, value in feed_dict.items():
            ph = self._placeholder(key)
            feeds[ph.name] = self.device.put(self._feed_value(ph, value))
        return feeds

    def _feed_value(self, ph: Tensor, value, any_length: bool = False):
        """``value`` as an array of the placeholder's dtype, or FeedError; ``any_length``
        accepts any size along the first axis (a whole data set). A device array is checked
        on a zero-stride host stand-in and cast on the device."""
        if value.__class__ is not np.ndarray and self.device.holds(value):
            stand_in = np.lib.stride_tricks.as_strided(np.zeros((), value.dtype), value.shape, (0,) * value.ndim)
            checked = self._feed_value(ph, stand_in, any_length)
            return (
                value
                if checked.dtype == value.dtype
                else cast_exactly(value, checked.dtype.name, f"placeholder {ph.name!r}")
            )
        array = np.asarray(value)
        if array.dtype != ph.dtype:  # not dtype.name: that is a Python property costing ~1.5 us a feed
            if array.dtype == object or not np.can_cast(array.dtype, ph.dtype, "same_kind"):
                raise FeedError(f"placeholder {ph.name!r} expects {ph.dtype} values, got {array.dtype}")
            array = cast_exactly(array, ph.dtype, f"placeholder {ph.name!r}")
        if ph.shape is not None:
            expected = ph.shape[:1] if not any_length else (None,) if ph.shape else ()
            expected += ph.shape[1:]
            if array.ndim != len(expected) or not all(d is None or d == s for d, s in zip(expected, array.shape)):
                what = "data of shape" if any_length else "shape"
                raise FeedError(
                    f"placeholder {ph.name!r} expects shape {_fmt(ph.shape)}, got {what} {_fmt(array.shape)}"
                )
        return array

    # -- training ----------------------------------------------------------------------
    def fit(
        self,
        train,
        data: dict,
        batch_size: int,
        steps: int | None = None,
        epochs: int | None = None,
        fetches=None,
        check_numerics: bool = False,
        callback: Callable[[dict], Any] | None = None,
        replicas: int | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        window: int = 4,
        sync_every: int = 20,
        workers=None,
        backup_replicas: int = 0,
        strategy: str | None = None,
        validation=None,
        stats: int | None = None,
        step_timeout: float | None = None,
        feed_dict: dict | None = None,
        profile: int | None = None,
        stragglers=None,
        clock: str = "wall",
        compute_seconds: float | None = None,
        segment_steps: int = 16,
    ) -> History:
        """Run ``train`` on batches of ``data`` and record each step.

        Parameters
        ----------
        train : Operation or Tensor
            What one step runs, usually ``optimizer.minimize(loss)``.
        data : dict
            Placeholder (name or tensor) to an array of examples; all of one length.
            On a cluster, values may also be dask arrays (their chunks stay where they are).
        batch_size : int
            Examples per step (the global batch, split across replicas). Batches are
            drawn in a deterministic order from the session's seed (shuffled epochs;
            the last partial batch is dropped).
        steps, epochs : int
            How long to train (``epochs`` counts full passes; default one epoch).
        fetches : list or dict, optional
            Tensors recorded at every step, by name (or by the dict's keys).
        replicas : int, optional
            On a cluster session: data-parallel replicas (default: one per worker).
            Results match local training with the same global batch and seed.
        checkpoint_dir, checkpoint_every : optional
            Write the variables every ``checkpoint_every`` steps (atomically) and
            resume from the newest checkpoint there when fit starts again. Without
            ``checkpoint_every``: at the last step, and on a cluster at every sync.
        window, sync_every, workers, backup_replicas, strategy, step_timeout :
            Cluster options (see :class:`workbench.cluster.ClusterOptions`): steps in
            flight, steps between host copies of the variables, the workers to use,
            extra shards per step whose slowest are dropped (Chen et al. 2016), the
            step engine: ``"allreduce"`` (the default: gradients all-reduced worker to
            worker, each worker running a segment of steps in one task; with ``backup_replicas`` the first ``replicas``
            gradients to arrive are applied) or ``"parameter_server"`` (a task graph per
            step; what GPU sessions use, chosen by itself for them when
            no strategy is named), ``"async"`` (asynchronous SGD: each replica's gradient
            applied as it arrives, one record per applied gradient), or a strategy function: a name
            of ``wb.strategies.names()``, a :class:`~workbench.strategies.Strategy`
            (``wb.strategies.local_sgd(every=8)``) or a function of ``r``; without a cluster,
            ``replicas`` or a strategy trains R replicas in this process (the simulation,
            :mod:`workbench.simulation`: the reference for the cluster), and
            seconds without progress before the fit restarts from its last sync without
            the workers that stopped answering (default: from the measured step time,
            at most a minute for fast steps; the first step gets longer to compile).
        segment_steps : int
            The all-reduce engines (their backups and strategy functions included): steps each worker
            runs in one task, each step's results streamed back as it ends (a segment ends at a sync);
            1: one task per worker and step. Results do not depend on it.
        validation : tuple (data, every_k_steps), optional
            Held-out data (as ``data``) on which the fetches are evaluated every k steps,
            recorded as ``val_<label>`` (see :mod:`workbench.validation`).
        stats : int, optional
            Every ``stats`` steps, also fetch the statistic ops :func:`workbench.watch` adds
            (gradient norms, activation mean/std) into ``History.stats``. On a cluster they are the global
            batch's: with the all-reduce strategy (its backups and strategy functions included) every replica
            computes them on its shard and they are joined by share, gradient norms of the all-reduced
            gradient; other strategies refuse.
        feed_dict : dict, optional
            Placeholders (names or tensors) fed the same value at every training step,
            locally and on a cluster, e.g. ``{"training": True}`` for a placeholder
            ``training`` with ``default=False``; validation runs without them (so with
            the placeholders' defaults: the graph's inference settings).
        profile : int, optional
            Every ``profile`` steps of a local fit, time each op's kernels (CUDA events on a GPU):
            :meth:`History.profile` gives ``{op name: seconds per step}``, and a GraphView of the
            graph can colour its nodes by ``stat="time"``. On a cluster, :meth:`History.timeline`
            tells where each worker's time went.
        stragglers : wb.stragglers.Bernoulli, LogNormal or Fixed, optional
            Delays injected into a fit with replicas: a late replica waits after computing and
            before handing its gradient in; records then hold ``"delays"`` and ``"arrivals"``
            per replica (and ``"dropped"`` with ``backup_replicas``). See :mod:`workbench.stragglers`.
            ``strategy="async"`` trains asynchronous SGD (each replica's gradient applied as it arrives).
        clock : {"wall", "virtual"}
            The simulation's clock (:mod:`workbench.clock`): with ``"virtual"`` nothing sleeps, each
            replica's step takes ``compute_seconds`` (or its measured compute time when None) plus
            its injected delay, and the History's times are virtual; bit-identical on a rerun.
        compute_seconds : float, optional
            Virtual seconds of one replica's compute (``clock="virtual"`` only).

        Returns
        -------
        History
            ``records``: one dict per step with ``"step"``, ``"time"``,
            ``"samples_per_s"`` and each fetch (on a cluster also per-replica
            compute, reduce and update seconds, busy seconds per worker and bytes moved).
            :attr:`last_history` holds it too, also when the fit raised.

        Notes
        -----
        Ending early: :meth:`request_stop` (or the training view's Stop button) ends
        the fit after the current step; ``fit`` returns the steps done and the session
        keeps that step's variables. A ``KeyboardInterrupt`` (the notebook's interrupt)
        does the same and is raised again, the steps done in its ``history`` attribute
        and in :attr:`last_history`. Either way a ``FitInterrupted`` event names the step.
        On a cluster every failure is a ``ClusterError`` whose cause is chained.
        """
        check_fit_arguments(batch_size, steps, epochs, checkpoint_every, replicas, stats)
        timing = check_clock(clock, compute_seconds)
        request = fit_arguments.request(
            self,
            train,
            data,
            batch_size,
            steps,
            epochs,
            fetches,
            check_numerics,
            stats,
            feed_dict,
            checkpoint_dir,
            stragglers=fit_arguments.stragglers_for(stragglers, replicas, backup_replicas),
        )
        request = profiling.with_profile(request, profile)
        checked = None if validation is None else make_validation(self, validation, request.fetches, self._fit_data)
        cluster = {
            "window": window,
            "sync_every": sync_every,
            "workers": workers,
            "backup_replicas": backup_replicas,
            "segment_steps": segment_steps,
        }
        engine, every = fit_arguments.engine(
            self, request, replicas, strategy, checkpoint_every, timing, step_timeout=step_timeout, **cluster
        )
        profiling.check_engine(engine, request)
        loop = FitLoop(request, self.events, callback, checkpoint_dir, every, validation=checked)
        self.last_history = loop.history
        try:
            history, final = loop.run(engine, self.variables)
        except (KeyboardInterrupt, Exception):
            if loop.final is not None:  # the last completed step's variables (after a failure: the last in hand)
                self.set_variables(loop.final)
            raise
        self.set_variables(final)
        return history

    def request_stop(self) -> bool:
        """End the running ``fit`` of this session after its current step (from any thread:
        a callback, a timer, the training view's Stop button). Returns whether a fit was running."""
        return request_stop(self.token)

    def _fit_data(self, data: dict) -> dict:
        """Placeholder name to checked examples (dask arrays cast lazily): ``fit``'s data, and validation's."""
        return fit_arguments.examples(self, data)

    def close(self) -> None:
        """Release the data its fits keep on the cluster's workers, and close the cluster client (and
        local cluster) this session started, if any."""
        if self._resident is not None:
            self._resident.release()
            self._resident = None
        if self.client is not None and self._owns_client:
            from workbench.cluster.connect import close

            close(self.client)
        self.client = None

    def as_default(self):
        """``with sess.as_default():`` makes this the session ``Tensor.eval()`` and ``Operation.run()`` use."""
        return default_session.as_default(self)

    def __enter__(self) -> Session:
        default_session.push(self)  # as in TensorFlow 1.x, ``with Session() as sess:`` is also the default
        return self

    def __exit__(self, *exc) -> None:
        default_session.remove(self)
        self.close()

    # -- checkpoints -------------------------------------------------------------------
    def save(self, path: str | os.PathLike, private: bool = False) -> str:
        """Write every variable's value to ``path`` (.npz), atomically: a crash leaves the old file.

        The file's permissions follow the umask, or are owner-only with ``private=True``.
        """
        return checkpoint.write(path, self.variables, private=private)

    def restore(self, path: str | os.PathLike, strict: bool = True) -> None:
        """Load variable values written by :meth:`save` or by a fit's checkpoints; checks everything
        before changing anything.

        ``path`` is a file or a ``fit(checkpoint_dir=...)`` directory (its newest checkpoint; a
        replicated fit's per-replica state in it is left out). With ``strict=True`` every variable of
        the graph must be in the file.
        """
        loaded = checkpoint.restore(path, self.graph.variables, strict)  # checked against the graph before reading
        self._put(loaded)

    def export(
        self, path: str | os.PathLike, inputs: dict, outputs: dict, feed_dict=None, private: bool = False
    ) -> str:
        """Write the inference graph of ``outputs`` with the trained values to ``path``, atomically.

        ``inputs`` and ``outputs`` map signature names to tensors (or their names): the file
        keeps only what the outputs need from the inputs, in inference mode (dropout is the
        identity, training switches are off; see :mod:`workbench.graph.export`), the
        variables' current values, the signature (batch axis of any size) and the
        workbench version. ``feed_dict`` freezes other placeholders to values.
        :func:`workbench.load_model` reads it back; :func:`workbench.export_onnx` writes ONNX.
        """
        from workbench import modelfile
        from workbench.graph.export import inference_graph

        graph, signature = inference_graph(self.graph, inputs, outputs, self.variables, feed_dict)
        return modelfile.write(path, graph, signature, private=private)

    def set_variables(self, values: dict, strict: bool = False) -> None:
        """Set variables from ``values`` (name to array), after checking every name, shape and dtype.

        With ``strict=True`` every variable of the graph must be given. Nothing
        changes when a check fails (FormatError).
        """
        arrays = {name: np.asarray(value) for name, value in values.items()}
        found = {name: (value.shape, value.dtype.name) for name, value in arrays.items()}
        checkpoint.check_members("values", found, checkpoint.specs(self.graph.variables), strict, "the")
        self._put(arrays)

    def _put(self, arrays: dict) -> None:
        """Checked values onto the device, as the variables' new arrays (copies: the caller keeps its own)."""
        for name, value in arrays.items():
            self._state[name] = self.device.put(np.array(value))


class LocalRunWarning(UserWarning):
    """A cluster session's ``run`` of a training step: it runs in this process, not on the cluster."""


_RUNS_HERE = (
    "sess.run(train) runs the training step in this (the notebook's) process, not on the session's cluster; "
    "to train data-parallel on the cluster call sess.fit(train, data={...}, batch_size=..., replicas=N) "
    "(this is said once per session)"
)


def _client_for(cluster, security=None):
    """(client, whether the session owns it) for the ``cluster`` argument of Session.

    None: the default cluster set by ``%flow_cluster`` or ``workbench.cluster.set_default``,
    else local execution; False: local execution; anything else: see
    :func:`workbench.cluster.connect`.
    """
    if cluster is False:
        return None, False
    from workbench.cluster.connect import connect, default_client

    if cluster is None:
        return default_client(), False
    client = connect(cluster, security=security)
    return client, client is not cluster


def _is_initializer(fetch) -> bool:
    return isinstance(fetch, Operation) and fetch.type == "initialize_variables"


def _updated_variables(graph: Graph) -> list[str]:
    return [op.inputs[0].op.name for op in graph.operations if op.opdef.stateful and op.inputs]


def _fmt(shape) -> str:
    return "any" if shape is None else rules.fmt(shape)


def _flatten(fetches) -> tuple[list, Callable[[list], Any]]:
    """Flat fetches and a function that puts results back into the caller's structure."""
    if isinstance(fetches, dict):
        keys = list(fetches)
        parts = [_flatten(fetches[k]) for k in keys]
        return _join(parts, lambda vals: dict(zip(keys, vals)))
    if isinstance(fetches, (list, tuple)):
        parts = [_flatten(f) for f in fetches]
        kind = type(fetches) if type(fetches) in (list, tuple) else list
        return _join(parts, kind)
    return [fetches], lambda vals: vals[0]


def _join(parts, build):
    flat, sizes = [], []
    for items, _ in parts:
        flat.extend(items)
        sizes.append(len(items))

    def unflatten(values):
        out, i = [], 0
        for (_, inner), size in zip(parts, sizes):
            out.append(inner(values[i : i + size]))
            i += size
        return build(out)

    return flat, unflatten
