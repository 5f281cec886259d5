"""Scaling studies: the same training at several worker counts, for the user's own model.

This is the figure distributed TensorFlow was announced with (throughput,
speedup and efficiency against the number of workers), measured on the user's
cluster with the user's graph. A study is a client of sessions: it sits above
:mod:`workbench.session`, and its events carry the study's own token.

With ``predict=[8, 32, 100]`` a study also measures a profile of the cluster (compute
per step and per sample, the all-reduce's latency and bandwidth, the scheduler's cost
per step and per hop) and predicts throughput and efficiency at those counts for each
strategy (:mod:`workbench.cluster.predict`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from workbench.cluster import predict as model
from workbench.cluster import probe
from workbench.errors import ClusterError
from workbench.events import ROOT, ScalingFinished, ScalingPoint, ScalingStarted, current_study, new_token
from workbench.session import Session


@dataclass
class ScalingStudy:
    """Rows of ``{"workers", "samples_per_s", "speedup", "efficiency", "step_seconds"}``, one per count."""

    rows: list[dict] = field(default_factory=list)
    batch_size: int = 0
    steps: int = 0
    strategy: str = ""
    #: predicted rows (see :func:`workbench.cluster.predict.predict`), when the study predicted
    predictions: list[dict] = field(default_factory=list)
    #: the measured :class:`~workbench.cluster.predict.Profile` the predictions start from
    profile: model.Profile | None = None
    #: the assumptions of the predictions, in words
    assumptions: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The rows as a Markdown table (predicted rows after the measured ones, marked)."""
        lines = [
            "| workers | strategy | samples/s | speedup | efficiency | s/step |",
            "|---:|:---|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            lines.append(_line(r, self.strategy or "measured", ""))
        for r in self.predictions:
            lines.append(_line(r, r["strategy"], " (predicted)"))
        notes = [f"- {a}" for a in self.assumptions]
        return "\n".join(lines + ([""] + ["Predictions assume:"] + notes if notes else []))

    def predicted(self, strategy: str, workers: int) -> dict:
        """The predicted row of ``strategy`` at ``workers``."""
        for r in self.predictions:
            if r["strategy"] == strategy and r["workers"] == workers:
                return r
        raise KeyError(f"no prediction for {strategy!r} at {workers} workers")

    def __repr__(self) -> str:
        return f"ScalingStudy(batch_size={self.batch_size}, steps={self.steps})\n{self.table()}"

    def _repr_markdown_(self) -> str:
        return self.table()


def _line(r: dict, strategy: str, mark: str) -> str:
    return (
        f"| {r['workers']}{mark} | {strategy} | {r['samples_per_s']:,.0f} | {r['speedup']:.2f}x | "
        f"{r['efficiency']:.0%} | {r['step_seconds']:.4f} |"
    )


def scaling_study(
    graph,
    train,
    data: dict,
    batch_size: int,
    steps: int = 20,
    workers=(1, 2),
    fetches=None,
    cluster=None,
    seed: int = 0,
    warmup: int = 3,
    strategy: str | None = None,
    predict=None,
    assumptions=None,
    stragglers=None,
    backup_replicas: int = 0,
) -> ScalingStudy:
    """Train ``steps`` steps (after ``warmup`` more) with 1, 2, ... workers and compare throughput.

    Each count ``k`` trains with ``k`` replicas on the first ``k`` workers of the
    cluster, with the same global batch, so the numbers answer "how much faster
    does my model train with more workers". Speedup is against the smallest
    count (scaled to it), efficiency is speedup over the count.

    Parameters
    ----------
    cluster : Client, address, "local" or None
        Where to run; None uses the default cluster, or starts a local one with
        ``max(workers)`` workers.
    strategy : str or None
        The distributed strategy ``fit`` trains with (None: its default).
    predict : sequence of int or None
        Worker counts to predict throughput and efficiency at, for each strategy, from a
        profile measured here (see :mod:`workbench.cluster.predict`): the study's
        compute, update and step times (and its compute on the shard of the largest
        count, timed with a few more steps), the all-reduce between two of the cluster's
        workers, the scheduler's costs. The measured counts are predicted too, to
        compare. Results in ``study.predictions``, ``study.profile``, ``study.assumptions``.
    assumptions : Assumptions, str, dict or None
        What the predictions assume: a :class:`~workbench.cluster.predict.Assumptions`,
        a link's name (``"10gbe"``, ``"infiniband"``, ``"nvlink"``...) or its keywords.
        Default: the measured link, the global batch fixed.
    stragglers : wb.stragglers distribution, optional
        Delays injected into every measured fit (``fit(stragglers=...)``); the predictions then model
        a synchronous step as the ``R``-th order statistic of ``R + b`` draws of compute plus delay
        (:mod:`workbench.cluster.straggler_model`, a fixed Monte Carlo sample), and rows gain
        ``median_step_seconds`` (``step_seconds`` is the mean).
    backup_replicas : int
        ``b``: each count of workers ``k`` trains ``R = k - b`` replicas' gradients a step plus ``b``
        backups (``fit(backup_replicas=b)``), predicted alike.
    """
    from workbench.cluster.straggler_model import straggled, unstraggled
    from workbench.cluster.connect import close, connect, default_client
    from workbench.cluster.engines import DEFAULT_STRATEGY

    counts = sorted({int(k) for k in workers})
    if not counts or counts[0] < 1:
        raise ClusterError(f"workers must be positive counts, got {workers!r}")
    targets = _targets(predict)
    assumed = _assumptions(assumptions)
    backups = int(backup_replicas)
    if backups < 0 or counts[0] <= backups or (targets and targets[0] <= backups):
        raise ClusterError(f"backup_replicas={backup_replicas!r} must leave at least one replica at every worker count")
    owned = cluster is None and default_client() is None
    client = (
        connect(cluster, n_workers=max(counts))
        if owned
        else connect(cluster if cluster is not None else default_client())
    )
    marked = None
    try:
        available = sorted(client.scheduler_info().get("workers", {}))
        if max(counts) > len(available):
            raise ClusterError(f"the cluster has {len(available)} workers; the study asks for {max(counts)}")
        name = strategy or DEFAULT_STRATEGY
        study = ScalingStudy(batch_size=batch_size, steps=steps, strategy=name)
        ids = {"session": new_token("study"), "graph": graph.token}
        ROOT.emit(ScalingStarted(**ids, workers=tuple(counts), batch_size=batch_size, steps=steps))
        measured, model_bytes = {}, 0
        marked = current_study.set(
            ids["session"]
        )  # its fits say whose they are: a notebook shows the study's view only
        for k in counts:
            sess = Session(graph, seed=seed, cluster=client)
            total = warmup + steps
            history = sess.fit(
                train,
                data,
                batch_size=batch_size,
                steps=total,
                replicas=k - backups,
                workers=available[:k],
                fetches=fetches,
                sync_every=max(total, 1),
                strategy=strategy,
                stragglers=stragglers,
                backup_replicas=backups,
            )
            measured[k] = history.records[warmup:] or history.records
            model_bytes = model_bytes or _gradient_bytes(graph, train, sess.variables)
            row = _row(k, measured[k], batch_size, study.rows)
            study.rows.append(row)
            ROOT.emit(ScalingPoint(**ids, **{k: v for k, v in row.items() if k != "median_step_seconds"}))
        if targets:
            compute = _small_shard(sess, train, data, batch_size, counts[0], max(targets), available, strategy)
            clean = measured if stragglers is None else {k: unstraggled(rs, k - backups) for k, rs in measured.items()}
            study.profile = measure_profile(
                client, available, clean, batch_size, name, model_bytes, assumed, compute=compute
            )
            predicted = sorted({*counts, *targets} | ({1} if backups == 0 else set()))
            study.predictions = model.predict(study.profile, predicted, assumptions=assumed)
            if stragglers is not None:
                for row in study.predictions:
                    row.update(straggled(row["step_seconds"], stragglers, row["workers"] - backups, backups))
                    row["samples_per_s"] = batch_size / row["step_seconds"]
            study.assumptions = assumed.describe(study.profile)
        ROOT.emit(
            ScalingFinished(
                **ids,
                rows=tuple(study.rows),
                predictions=tuple(study.predictions),
                assumptions=tuple(study.assumptions),
            )
        )
        return study
    finally:
        if marked is not None:
            current_study.reset(marked)
        if owned:
            close(client)


def _small_shard(sess, train, data, batch_size: int, workers: int, target: int, available, strategy) -> list:
    """A dedicated timing: compute on the shard of the largest predicted count, with the smallest
    measured count's workers (as busy as in its run): ``[(rows, seconds)]``, or nothing if no smaller."""
    rows = math.ceil(batch_size / target)
    if rows >= math.ceil(batch_size / workers):
        return []
    history = sess.fit(
        train,
        data,
        batch_size=rows * workers,
        steps=8,
        replicas=workers,
        workers=available[:workers],
        sync_every=8,
        strategy=strategy,
    )
    seconds = _median(history.records[3:], "compute_seconds")
    return [] if seconds is None else [(rows, seconds)]


def _targets(predict) -> list[int]:
    if predict is None:
        return []
    try:
        targets = sorted({int(k) for k in ([predict] if isinstance(predict, int) else predict)})
    except (TypeError, ValueError):
        raise ClusterError(f"predict must be worker counts such as [8, 32, 100], got {predict!r}") from None
    if targets and targets[0] < 1:
        raise ClusterError(f"predict must be positive worker counts, got {predict!r}")
    return targets


def _assumptions(assumptions) -> model.Assumptions:
    if assumptions is None:
        return model.Assumptions()
    if isinstance(assumptions, model.Assumptions):
        return assumptions
    if isinstance(assumptions, str):
        return model.Assumptions(link=assumptions)
    if isinstance(assumptions, dict):
        return model.Assumptions(**assumptions)
    raise ClusterError(f"assumptions must be an Assumptions, a link's name or a dict, got {type(assumptions).__name__}")


def _gradient_bytes(graph, train, variables: dict) -> int:
    """Bytes of the variables ``train`` updates (every variable when the graph does not say)."""
    name = getattr(train, "name", str(train))
    record = graph.training.get(name) or graph.training.get(name.split(":")[0])
    names = [v for _, v in record.gradients] if record is not None else list(variables)
    return int(sum(variables[n].nbytes for n in names if n in variables))


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def measure_profile(
    client,
    workers,
    measured: dict,
    batch_size: int,
    strategy: str,
    model_bytes: int,
    assumptions: model.Assumptions | None = None,
    compute=(),
) -> model.Profile:
    """The profile of a study: compute and update from its step records (``measured``: worker
    count to records), the link, a scheduler hop and the sum rate timed on ``workers``.

    Compute is fitted as ``fixed + rows x per_sample`` to the smallest count's shard and any
    more ``compute`` points ``(rows, seconds)`` timed with as many workers (per sample only,
    from one point): larger counts may share cores and are left out. The per-step overhead is
    what the smallest count's mean step time leaves after the modelled parts.
    """
    assumptions = model.Assumptions() if assumptions is None else assumptions
    workers = list(workers)
    first = min(measured)
    points = [
        (rows, c)
        for rows, c in [(math.ceil(batch_size / first), _median(measured[first], "compute_seconds")), *compute]
        if c is not None
    ]
    fixed, per_sample = probe.fit_line(*zip(*points)) if points else (0.0, 0.0)
    step = statistics.fmean(r["time"] for r in measured[first])
    update = _median(measured[first], "update_seconds") or 0.0
    if not points:  # an engine that does not time its compute: all of a step is compute
        per_sample = max(step - update, 0.0) / math.ceil(batch_size / first)
    link = {"latency": 0.0, "bandwidth": math.inf, "samples": []}
    if len(workers) >= 2:
        link = probe.measure_link(client, workers[:2])
    elif assumptions.link == "measured" and assumptions.bandwidth is None:
        raise ClusterError(
            "predicting with the measured link needs a cluster of two workers or more; this one has "
            "one: name a link, e.g. assumptions='10gbe'"
        )
    profile = model.Profile(
        model_bytes=model_bytes,
        batch_size=batch_size,
        compute_per_sample=per_sample,
        compute_fixed=fixed,
        update_seconds=update,
        latency=link["latency"],
        bandwidth=link["bandwidth"],
        hop=probe.measure_hop(client, workers[0]),
        task_seconds=probe.measure_task_seconds(client, workers[0]),
        sum_rate=probe.measure_sum_rate(client, workers[0]),
        source=f"measured with {strategy!r} at {', '.join(map(str, sorted(measured)))} workers",
    )
    return _calibrated(profile, strategy if strategy in model.STRATEGIES else "allreduce", first, step)


def _calibrated(profile: model.Profile, strategy: str, workers: int, step: float) -> model.Profile:
    """The profile whose prediction at ``workers`` is the measured ``step``: what the modelled parts
    leave is the per-step overhead, or, when even the measured hops do not fit in it, smaller hops."""
    hops = model.hops(strategy, workers)
    unhopped = replace(profile, hop=0.0, overhead=0.0)
    left = max(step - model.step_time(unhopped, strategy, workers)["step_seconds"], 0.0)
    if left >= hops * profile.hop:
        return replace(profile, overhead=left - hops * profile.hop)
    return replace(profile, overhead=0.0, hop=left / hops)


def _row(workers: int, measured: list[dict], batch_size: int, rows: list[dict]) -> dict:
    """One worker count's row; speedup against the first row (scaled to its count)."""
    seconds = sum(r["time"] for r in measured)
    row = {
        "workers": workers,
        "samples_per_s": len(measured) * batch_size / seconds,
        "step_seconds": seconds / len(measured),
        "median_step_seconds": statistics.median(r["time"] for r in measured),
    }
    base = rows[0] if rows else row
    row["speedup"] = row["samples_per_s"] / base["samples_per_s"] * base["workers"]
    row["efficiency"] = row["speedup"] / workers
    return row
