"""Scaling studies: the same training at several worker counts, for the user's own model.

This is the figure distributed TensorFlow was announced with (throughput,
speedup and efficiency against the number of workers), measured on the user's
cluster with the user's graph. A study is a client of sessions: it sits above
:mod:`workbench.session`, and its events carry the study's own token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.errors import ClusterError
from workbench.events import ROOT, ScalingFinished, ScalingPoint, ScalingStarted, new_token
from workbench.session import Session


@dataclass
class ScalingStudy:
    """Rows of ``{"workers", "samples_per_s", "speedup", "efficiency", "step_seconds"}``, one per count."""

    rows: list[dict] = field(default_factory=list)
    batch_size: int = 0
    steps: int = 0

    def table(self) -> str:
        """The rows as a Markdown table."""
        lines = [
            "| workers | samples/s | speedup | efficiency | s/step |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r['workers']} | {r['samples_per_s']:,.0f} | {r['speedup']:.2f}x | "
                f"{r['efficiency']:.0%} | {r['step_seconds']:.4f} |"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ScalingStudy(batch_size={self.batch_size}, steps={self.steps})\n{self.table()}"

    def _repr_markdown_(self) -> str:
        return self.table()


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
    """
    from workbench.cluster.connect import close, connect, default_client

    counts = sorted({int(k) for k in workers})
    if not counts or counts[0] < 1:
        raise ClusterError(f"workers must be positive counts, got {workers!r}")
    owned = cluster is None and default_client() is None
    client = connect(cluster, n_workers=max(counts)) if owned else connect(cluster if cluster is not None else default_client())
    try:
        available = sorted(client.scheduler_info().get("workers", {}))
        if max(counts) > len(available):
            raise ClusterError(f"the cluster has {len(available)} workers; the study asks for {max(counts)}")
        study = ScalingStudy(batch_size=batch_size, steps=steps)
        ids = {"session": new_token("study"), "graph": graph.token}
        ROOT.emit(ScalingStarted(**ids, workers=tuple(counts), batch_size=batch_size, steps=steps))
        for k in counts:
            sess = Session(graph, seed=seed, cluster=client)
            total = warmup + steps
            history = sess.fit(
                train,
                data,
                batch_size=batch_size,
                steps=total,
                replicas=k,
                workers=available[:k],
                fetches=fetches,
                sync_every=max(total, 1),
            )
            row = _row(k, history.records[warmup:] or history.records, batch_size, study.rows)
            study.rows.append(row)
            ROOT.emit(ScalingPoint(**ids, **row))
        ROOT.emit(ScalingFinished(**ids, rows=tuple(study.rows)))
        return study
    finally:
        if owned:
            close(client)


def _row(workers: int, measured: list[dict], batch_size: int, rows: list[dict]) -> dict:
    """One worker count's row; speedup against the first row (scaled to its count)."""
    seconds = sum(r["time"] for r in measured)
    row = {
        "workers": workers,
        "samples_per_s": len(measured) * batch_size / seconds,
        "step_seconds": seconds / len(measured),
    }
    base = rows[0] if rows else row
    row["speedup"] = row["samples_per_s"] / base["samples_per_s"] * base["workers"]
    row["efficiency"] = row["speedup"] / workers
    return row
