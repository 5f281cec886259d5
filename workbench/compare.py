"""``wb.compare_strategies``: the comparison of "Revisiting Distributed Synchronous SGD" (Chen et al., 2016).

Synchronous SGD waits for its slowest replica; with b backup replicas it uses the first R gradients
to arrive and drops the rest; asynchronous SGD never waits but applies stale gradients. The
comparison trains one graph under each configuration from the same initial variables and batches,
under the same injected stragglers, and compares them by what a researcher cares about: validation
accuracy against time, and the time to reach a target. On the virtual clock (the default without a
cluster, :mod:`workbench.clock`) a rerun gives the same histories bit for bit.

>>> result = wb.compare_strategies(g, train, data, batch_size=256, steps=100,
...                                validation=(val_data, 10), compute_seconds=0.01,
...                                stragglers=wb.stragglers.Bernoulli(p=0.1, delay=0.05))  # doctest: +SKIP
>>> result.table()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from workbench.errors import ArgumentError
from workbench.events import current_study, new_token
from workbench.graph.core import Graph
from workbench.training import History

#: The paper's three configurations: what ``compare_strategies`` runs by default.
DEFAULT_RUNS = {"sync": {}, "sync + 2 backups": {"backup_replicas": 2}, "async": {"strategy": "async"}}

#: Keywords a run's dict may set for that run only (others come from ``**fit_keywords`` for every run).
_PER_RUN = {"replicas", "backup_replicas", "strategy", "stragglers", "batch_size", "steps", "compute_seconds"}


@dataclass
class Comparison:
    """What :func:`compare_strategies` returns.

    Attributes
    ----------
    histories : dict
        Run label to its :class:`~workbench.History` (in the order the runs were given).
    configurations : dict
        Run label to the fit keywords it ran with.
    clock : str
        ``"virtual"`` or ``"wall"``: what the histories' seconds are.
    view : ComparisonView or None
        The view of the runs (validation metric against time, arrival distribution).
    """

    histories: dict[str, History] = field(default_factory=dict)
    configurations: dict[str, dict] = field(default_factory=dict)
    clock: str = "virtual"
    view: object = None

    def metric(self) -> tuple[str, bool]:
        """The series the comparison ranks by, and whether lower is better: ``val_accuracy`` when
        recorded, else the first ``val_*`` series, else the training ``loss``."""
        fields = [f for h in self.histories.values() for f in h.fields]
        for name in ("val_accuracy", *[f for f in fields if f.startswith("val_")], "accuracy", "loss"):
            if name in fields:
                return name, "loss" in name
        raise KeyError("the runs recorded no validation metric or loss: pass validation=(data, k) and fetches")

    def default_target(self, key: str, below: bool) -> float | None:
        """The best value every run reached: the highest accuracy all of them got to (the lowest loss),
        so each has a time to it."""
        bests = []
        for history in self.histories.values():
            if key not in history.fields:
                return None
            values = np.asarray(history[key], dtype=np.float64)
            bests.append(values.min() if below else values.max())
        return float(max(bests) if below else min(bests)) if bests else None

    def time_to(self, target: float | None = None, key: str | None = None, below: bool | None = None) -> dict:
        """Run label to :meth:`History.time_to` of ``key`` reaching ``target`` (defaults: :meth:`metric`
        and :meth:`default_target`); None for a run that never reached it."""
        key, below = self._key(key, below)
        target = self.default_target(key, below) if target is None else float(target)
        return {label: h.time_to(key, target, below=below) for label, h in self.histories.items()}

    def _key(self, key, below):
        if key is None:
            key, lower = self.metric()
        else:
            lower = "loss" in key
        return key, lower if below is None else bool(below)

    def table(self, target: float | None = None, key: str | None = None, below: bool | None = None) -> Table:
        """One row per run: steps, steps/s, the final value of every validation metric, and the seconds to
        ``target`` of ``key``.

        Parameters
        ----------
        target : float, optional
            The value of ``key`` to reach; by default the best value every run reached
            (:meth:`default_target`), so every run has a time. The column's name says which it is.
        key : str, optional
            The series (default :meth:`metric`: ``val_accuracy`` when recorded).
        below : bool, optional
            Whether ``key`` must fall to the target (default: for names with "loss").
        """
        key, below = self._key(key, below)
        target = self.default_target(key, below) if target is None else float(target)
        times = self.time_to(target, key, below)
        column = (
            f"seconds to {key} {'<=' if below else '>='} {target:.4g}" if target is not None else "seconds to target"
        )
        rows = []
        for label, history in self.histories.items():
            elapsed = float(history.records[-1]["elapsed"]) if history.records else 0.0
            row = {"run": label, "steps": len(history), "steps/s": len(history) / elapsed if elapsed > 0 else None}
            for name in history.fields:
                if name.startswith("val_"):
                    row[f"final {name}"] = float(np.asarray(history[name])[-1])
            row["seconds"] = elapsed
            row[column] = times.get(label)
            rows.append(row)
        return Table(
            rows,
            caption=f"{self.clock} clock; target: {key} {'<=' if below else '>='} {target:.4g}"
            if target is not None
            else f"{self.clock} clock",
        )

    def _repr_mimebundle_(self, **kwargs):
        return self.table()._repr_mimebundle_(**kwargs)


class Table:
    """Rows of a comparison (a list of dicts), shown as an HTML table; :meth:`to_pandas` for a DataFrame."""

    def __init__(self, rows: list[dict], caption: str = ""):
        self.rows, self.caption = rows, caption
        self.columns = list(dict.fromkeys(k for r in rows for k in r))

    def __getitem__(self, run: str) -> dict:
        for row in self.rows:
            if row["run"] == run:
                return row
        raise KeyError(f"no run {run!r}; runs are {[r['run'] for r in self.rows]}")

    def __len__(self) -> int:
        return len(self.rows)

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=self.columns).set_index("run")

    def _cells(self, row) -> list[str]:
        return [_shown(row.get(c)) for c in self.columns]

    def __repr__(self) -> str:
        cells = [self.columns, *[self._cells(r) for r in self.rows]]
        widths = [max(len(str(line[i])) for line in cells) for i in range(len(self.columns))]
        lines = ["  ".join(str(v).ljust(w) for v, w in zip(line, widths)) for line in cells]
        return "\n".join([*lines, self.caption] if self.caption else lines)

    def _repr_mimebundle_(self, **kwargs):
        import html

        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in self._cells(r)) + "</tr>" for r in self.rows
        )
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        table = f'<table class="wb-comparison">{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        return {"text/html": table, "text/plain": repr(self)}


def _shown(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def compare_strategies(
    graph: Graph,
    train,
    data: dict,
    batch_size: int,
    steps: int,
    runs: Mapping[str, Mapping] | None = None,
    replicas: int = 8,
    validation=None,
    stragglers=None,
    clock: str | None = None,
    cluster=None,
    seed: int = 0,
    show: bool | None = None,
    **fit_keywords,
) -> Comparison:
    """Train ``graph`` under each configuration of ``runs`` from the same initial variables; compare them.

    Parameters
    ----------
    graph : Graph
    train : Operation
        The update (``optimizer.minimize(loss)``).
    data : dict
        Training examples, as for :meth:`Session.fit`.
    batch_size, steps : int
        The global batch and the steps of every run (a run's dict may set its own). For
        ``strategy="async"`` a step is one applied gradient of ``batch_size // replicas`` rows: an
        asynchronous run gets ``steps * replicas`` of them (the examples the synchronous runs see) and
        validates every ``k * replicas``, unless its dict sets ``steps``.
    runs : dict, optional
        Label to the fit keywords of that run (``backup_replicas``, ``strategy``, ``replicas``,
        ``stragglers`` ...); default :data:`DEFAULT_RUNS`: ``"sync"``, ``"sync + 2 backups"``, ``"async"``.
    replicas : int
        R, for every run that does not set its own (with backups R + b replicas run).
    validation : tuple (data, k), optional
        Evaluated every k steps (as in :meth:`Session.fit`): the curves of the view and the table.
    stragglers : wb.stragglers distribution, optional
        The same injected delays in every run.
    clock : {"virtual", "wall"}, optional
        The simulation's clock; default ``"virtual"`` without a cluster, ``"wall"`` with one.
    cluster : distributed.Client or address, optional
        Run every configuration on this cluster (through ``Session(..., cluster=cluster)``); None:
        the one-process simulation.
    seed : int
        The sessions' seed: initial variables, batch order.
    show : bool, optional
        Display the live :class:`~workbench.widgets.ComparisonView` (default: in a notebook).
    **fit_keywords
        Any other :meth:`Session.fit` keyword (``fetches``, ``compute_seconds`` ...), for every run.

    Returns
    -------
    Comparison
        ``.histories`` (label -> History), ``.table()``, ``.time_to()`` and ``.view``.
    """
    from workbench.kernel import in_kernel
    from workbench.session import Session

    runs = dict(DEFAULT_RUNS if runs is None else runs)
    _check_runs(runs, fit_keywords)
    clock = clock or ("wall" if cluster is not None else "virtual")
    fit_keywords = _with_fetches(graph, train, fit_keywords)
    if clock == "virtual" and cluster is None:
        fit_keywords["clock"] = "virtual"
    elif clock != "wall":
        fit_keywords["clock"] = clock  # fit names what is wrong with it
    client, owned = _client(cluster)
    initial = Session(graph, seed=seed, cluster=False).variables
    result = Comparison(clock=clock)
    view = None
    if show if show is not None else in_kernel():
        from IPython.display import display

        from workbench.widgets.comparison_view import ComparisonView

        view = ComparisonView(list(runs), clock=clock)
        display(view)
    marked = current_study.set(new_token("comparison"))  # a notebook shows the comparison's view, not one per fit
    try:
        for label, options in runs.items():
            keywords = {"replicas": replicas, "stragglers": stragglers, **fit_keywords, **options}
            sess = Session(graph, seed=seed, cluster=client if client is not None else False)
            sess.set_variables(initial)
            callback = _recorder(view, label, keywords.pop("callback", None))
            run_steps, checked = _async_scaled(keywords, options, steps, validation)
            history = sess.fit(train, data, batch_size=keywords.pop("batch_size", batch_size),
                               steps=run_steps, validation=checked, callback=callback, **keywords)  # fmt: skip
            result.histories[label] = history
            result.configurations[label] = {k: v for k, v in keywords.items() if k != "fetches"}
            if view is not None:
                view.finish_run(label)
            sess.close()  # (a cluster's client is the comparison's, not the session's)
    finally:
        current_study.reset(marked)
        if owned:
            from workbench.cluster.connect import close

            close(client)
    if view is None:
        from workbench.widgets.comparison_view import ComparisonView

        view = ComparisonView.of(result)
    else:
        view.done()
    result.view = view
    return result


def _client(cluster):
    """(client, whether the comparison started it): None without a cluster; an address or "local" connects once."""
    if cluster is None or cluster is False:
        return None, False
    from workbench.cluster.connect import connect

    client = connect(cluster)
    return client, client is not cluster


def _async_scaled(keywords: dict, options: Mapping, steps: int, validation):
    """An asynchronous run's steps and validation: R applied gradients of ``batch_size // R`` rows stand for
    one synchronous step, so it gets ``steps * R`` of them (the same examples; unless its dict sets
    ``steps``) and validates every ``k * R``."""
    run_steps = keywords.pop("steps", steps)
    if keywords.get("strategy") != "async":
        return run_steps, validation
    replicas = int(keywords.get("replicas") or 1)
    if "steps" not in options:
        run_steps = steps * replicas
    if isinstance(validation, tuple) and len(validation) == 2 and isinstance(validation[1], int):
        validation = (validation[0], validation[1] * replicas)
    return run_steps, validation


def _recorder(view, label: str, callback):
    def record(step: dict) -> None:
        if view is not None:
            view.add(label, step)
        if callback is not None:
            callback(step)

    return record if view is not None or callback is not None else None


def _check_runs(runs: dict, fit_keywords: dict) -> None:
    if not runs:
        raise ArgumentError("compare_strategies(runs=...) needs at least one run: {label: {fit keywords}}")
    for label, options in runs.items():
        if not isinstance(label, str) or not isinstance(options, Mapping):
            raise ArgumentError(
                f"compare_strategies(runs=...) maps a label to a dict of fit keywords, got {label!r}: {options!r}"
            )
    for name in ("validation", "cluster", "data", "train"):
        if name in fit_keywords:
            raise ArgumentError(f"compare_strategies: {name}= is an argument of its own, not a fit keyword of a run")


def _with_fetches(graph: Graph, train, fit_keywords: dict) -> dict:
    """The fit keywords, with ``fetches`` defaulting to the fit's loss (validation needs something to evaluate)."""
    keywords = dict(fit_keywords)
    if keywords.get("fetches") is None:
        name = getattr(train, "name", train)
        record = graph.training.get(name)
        if record is not None and record.loss:
            keywords["fetches"] = {"loss": record.loss}
    return keywords
