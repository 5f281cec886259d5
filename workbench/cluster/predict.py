"""A scaling model: a step's time at ``R`` workers from a profile measured at a few.

Plain arithmetic (an alpha-beta model), tested without a cluster. A :class:`Profile`
holds what was measured (compute per step and per sample, the optimizer's update,
the all-reduce's latency per message and bandwidth, the scheduler's cost per step and
per dependent hop); :class:`Assumptions` say what the prediction assumes about the
larger cluster (its links, how the batch grows). :func:`predict` gives rows of
throughput, speedup and efficiency per worker count and strategy.

The step time of each strategy at ``R`` workers, with ``b`` rows per replica
(``B / R`` with the global batch ``B`` fixed, ``B`` with the per-replica batch fixed)
and ``M`` bytes of gradients (as many as variables):

``"allreduce"``
    ``overhead + compute(b) + exposed + update``, or the scheduler's ``R x task_seconds``
    if that is longer (it runs ``R`` tasks a step, off the critical path). The gradients are all-reduced in
    buckets of ``bucket_bytes``, each started as soon as the backward pass (the last
    ``backward_fraction`` of ``compute``) has made it; one bucket costs
    ``2 (R - 1) latency + 2 (R - 1) / R x bytes / bandwidth`` (reduce-scatter then
    all-gather: ring or direct, the same count of messages per rank), buckets share the
    link one after the other, and ``exposed`` is what is left after the backward pass ends.
``"parameter_server"``
    ``overhead + hops x hop + compute(b) + L x (latency + M / bandwidth + M / sum_rate)
    + update + (R - 1) x (latency + M / bandwidth)``: ``L = ceil(log2 R)`` levels of the
    pairwise reduction tree, each moving one gradient to the worker that sums it, then
    the update worker sends the new variables to the ``R - 1`` other replicas, and
    ``hops = 2 + L`` dependent scheduler round trips (replica, reductions, update, next
    replicas); its ``2 (R - 1)`` more tasks than at one worker add ``task_seconds`` each.

Workers that share ``cores`` cores (``Assumptions(cores=...)``) slow compute, transfers and
the update by ``R / cores`` beyond that many.

>>> p = Profile(model_bytes=96e6, batch_size=32, compute_per_sample=1 / 32, latency=50e-6, bandwidth=1.25e9)
>>> rows = predict(p, [1, 100], assumptions=Assumptions(batch="per_replica"))
>>> [(r["strategy"], r["workers"], round(r["efficiency"], 2)) for r in rows]
[('allreduce', 1, 1.0), ('allreduce', 100, 0.98), ('parameter_server', 1, 1.0), ('parameter_server', 100, 0.11)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.errors import ClusterError

STRATEGIES = ("allreduce", "parameter_server")


@dataclass(frozen=True)
class Link:
    """A class of interconnect: what one worker can send (and receive at once) per second, and
    the fixed cost of one message (the transport's software included)."""

    name: str
    bandwidth: float  # bytes per second, each way
    latency: float  # seconds per message


#: Links to assume instead of the measured one (``Assumptions(link=...)``).
LINKS = {
    "10gbe": Link("10 GbE, NCCL-class transport", 1.25e9, 50e-6),
    "25gbe": Link("25 GbE, NCCL-class transport", 3.125e9, 30e-6),
    "infiniband": Link("InfiniBand EDR, NCCL over RDMA", 12.5e9, 5e-6),
    "nvlink": Link("NVLink within a node, NCCL", 100e9, 5e-6),
}


@dataclass(frozen=True)
class Profile:
    """What a step costs on the measured cluster.

    Attributes
    ----------
    model_bytes : float
        Bytes of gradients per step (the trained variables' bytes).
    batch_size : int
        The global batch of the study (with ``batch="per_replica"``: each replica's batch).
    compute_per_sample, compute_fixed : float
        A replica's forward and backward pass on ``b`` rows takes ``compute_fixed + b x compute_per_sample`` s.
    update_seconds : float
        The optimizer's update of every variable, per step.
    latency, bandwidth : float
        The all-reduce's cost per message (s) and bytes per second per worker, as measured.
    overhead : float
        The driver's and scheduler's time per step with no dependent hop on the critical path.
    hop : float
        One dependent scheduler round trip (a task's end to the start of one that needs it).
    task_seconds : float
        The scheduler's time per task when many run at once (its throughput).
    sum_rate : float
        Bytes of gradients a worker adds per second.
    backward_fraction : float
        The share of ``compute`` that is the backward pass (when gradients appear).
    bucket_bytes : int
        The all-reduce's bucket size.
    source : str
        Where the numbers come from, in words.
    """

    model_bytes: float
    batch_size: int
    compute_per_sample: float
    compute_fixed: float = 0.0
    update_seconds: float = 0.0
    latency: float = 0.0
    bandwidth: float = math.inf
    overhead: float = 0.0
    hop: float = 0.0
    task_seconds: float = 0.0
    sum_rate: float = math.inf
    backward_fraction: float = 2 / 3
    bucket_bytes: int = 4 << 20
    source: str = ""

    def compute(self, rows: float) -> float:
        """Seconds of one replica's forward and backward pass on ``rows`` rows."""
        return self.compute_fixed + rows * self.compute_per_sample


@dataclass(frozen=True)
class Assumptions:
    """What a prediction assumes about the larger cluster.

    Attributes
    ----------
    link : str
        ``"measured"`` (the profile's latency and bandwidth) or a name in :data:`LINKS`
        (``"10gbe"``, ``"25gbe"``, ``"infiniband"``, ``"nvlink"``: NCCL-class transports).
    bandwidth, latency : float or None
        Override the link's bytes per second and seconds per message.
    batch : {"global", "per_replica"}
        ``"global"``: the global batch stays fixed and is split over the workers (strong
        scaling, as :func:`workbench.scaling_study` measures); ``"per_replica"``: each
        worker keeps its batch, the global batch grows with the workers (weak scaling, as
        the published 100-GPU results).
    overlap : bool
        All-reduce buckets start during the backward pass (else after it).
    cores : float or None
        The workers share this many cores (one machine running them all, as a local cluster
        does): beyond that many workers, compute and transfers slow down in proportion.
        None: every worker has cores of its own.
    """

    link: str = "measured"
    bandwidth: float | None = None
    latency: float | None = None
    batch: str = "global"
    overlap: bool = True
    cores: float | None = None

    def __post_init__(self):
        if self.link != "measured" and self.link not in LINKS:
            raise ClusterError(f"unknown link {self.link!r}; use 'measured' or one of {', '.join(LINKS)}")
        if self.batch not in ("global", "per_replica"):
            raise ClusterError(f"batch must be 'global' or 'per_replica', got {self.batch!r}")

    def link_of(self, profile: Profile) -> Link:
        """The link the prediction uses: the measured or named one, with any override."""
        base = Link("measured", profile.bandwidth, profile.latency) if self.link == "measured" else LINKS[self.link]
        return Link(
            base.name if self.bandwidth is None and self.latency is None else f"{base.name}, overridden",
            base.bandwidth if self.bandwidth is None else float(self.bandwidth),
            base.latency if self.latency is None else float(self.latency),
        )

    def describe(self, profile: Profile) -> list[str]:
        """The assumptions in words, as the views state them."""
        link = self.link_of(profile)
        name = "the measured link" if link.name == "measured" else link.name
        batch = (
            f"global batch {profile.batch_size} fixed, split over the workers"
            if self.batch == "global"
            else f"{profile.batch_size} rows per worker, the global batch grows with the workers"
        )
        return [
            f"link: {name}: {_rate(link.bandwidth)} per worker, {link.latency * 1e6:,.0f} µs a message",
            f"batch: {batch}; per-worker compute as measured (one worker's speed)",
            f"all-reduce: buckets of {profile.bucket_bytes / 2**20:g} MiB, "
            + ("started during the backward pass" if self.overlap else "after the backward pass"),
            "parameter server: one unsharded update worker; 2 + log2(R) dependent scheduler hops and 2R + 1 tasks a step",
            "workers: " + ("each with cores of its own" if self.cores is None else f"sharing {self.cores:g} cores"),
            f"profile: {profile.source}" if profile.source else "profile: as given",
        ]


def _rate(bandwidth: float) -> str:
    return "unlimited" if math.isinf(bandwidth) else f"{bandwidth / 1e9:.3g} GB/s"


def allreduce_seconds(nbytes: float, ranks: int, link: Link) -> float:
    """One all-reduce of ``nbytes`` over ``ranks`` ranks (reduce-scatter + all-gather)."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * link.latency + 2 * (ranks - 1) / ranks * nbytes / link.bandwidth


def bucket_sizes(model_bytes: float, bucket_bytes: float) -> list[float]:
    """The buckets' bytes: full ones, then what is left."""
    full, rest = divmod(float(model_bytes), float(bucket_bytes))
    return [float(bucket_bytes)] * int(full) + ([rest] if rest > 0 else [])


def exposed_allreduce(
    profile: Profile, compute: float, ranks: int, link: Link, overlap: bool = True, share: float = 1.0
) -> float:
    """Seconds of all-reduce left after the backward pass ends.

    Bucket ``i`` of ``n`` is ready when the backward pass has made its share of the
    gradients; buckets use the link one after the other, each ``share`` times slower.
    """
    sizes = bucket_sizes(profile.model_bytes, profile.bucket_bytes)
    if ranks <= 1 or not sizes:
        return 0.0
    backward = profile.backward_fraction * compute if overlap else 0.0
    start, done, made = compute - backward, 0.0, 0.0
    for size in sizes:
        made += size
        ready = start + backward * made / profile.model_bytes
        done = max(done, ready) + allreduce_seconds(size, ranks, link) * share
    return max(0.0, done - compute)


def hops(strategy: str, workers: int) -> int:
    """Dependent scheduler round trips on a step's critical path."""
    if strategy == "parameter_server":
        return 2 + math.ceil(math.log2(workers)) if workers > 1 else 2
    return 0


def step_time(profile: Profile, strategy: str, workers: int, assumptions: Assumptions = Assumptions()) -> dict:
    """One step at ``workers`` workers, and where its time goes (seconds)."""
    if strategy not in STRATEGIES:
        raise ClusterError(f"no scaling model for strategy {strategy!r}; models are {', '.join(STRATEGIES)}")
    if workers < 1:
        raise ClusterError(f"workers must be positive, got {workers}")
    link = assumptions.link_of(profile)
    rows = math.ceil(profile.batch_size / workers) if assumptions.batch == "global" else profile.batch_size
    share = max(1.0, workers / assumptions.cores) if assumptions.cores else 1.0
    compute, update = profile.compute(rows) * share, profile.update_seconds * share
    overhead = profile.overhead + hops(strategy, workers) * profile.hop
    if strategy == "allreduce":
        communication = exposed_allreduce(profile, compute, workers, link, assumptions.overlap, share)
    else:
        overhead += 2 * (workers - 1) * profile.task_seconds
        levels = math.ceil(math.log2(workers)) if workers > 1 else 0
        gradient = link.latency + profile.model_bytes / link.bandwidth
        communication = (
            levels * (gradient + profile.model_bytes / profile.sum_rate) + (workers - 1) * gradient
        ) * share
    seconds = overhead + compute + communication + update
    if strategy == "allreduce":
        seconds = max(seconds, workers * profile.task_seconds)
    return {
        "step_seconds": seconds,
        "compute_seconds": compute,
        "communication_seconds": communication,
        "overhead_seconds": overhead,
        "update_seconds": update,
    }


def predict(
    profile: Profile,
    workers,
    strategies=STRATEGIES,
    assumptions: Assumptions = Assumptions(),
    base: tuple[int, float] | None = None,
) -> list[dict]:
    """Predicted rows, by strategy then worker count.

    Each row: ``workers``, ``strategy``, ``samples_per_s``, ``speedup``, ``efficiency``,
    ``step_seconds`` and the parts of the step (``compute_seconds``, ``communication_seconds``,
    ``overhead_seconds``, ``update_seconds``). Speedup is against ``base`` (a measured
    ``(workers, samples_per_s)``, scaled to its count) or else the same strategy's
    prediction at one worker; efficiency is speedup over the count.
    """
    counts = sorted({int(k) for k in workers})
    rows = []
    for strategy in strategies:
        ref = base
        if ref is None:
            ref = (1, _rate_of(profile, step_time(profile, strategy, 1, assumptions), 1, assumptions))
        for k in counts:
            part = step_time(profile, strategy, k, assumptions)
            rate = _rate_of(profile, part, k, assumptions)
            speedup = rate / ref[1] * ref[0]
            rows.append(
                {
                    "workers": k,
                    "strategy": strategy,
                    "samples_per_s": rate,
                    "speedup": speedup,
                    "efficiency": speedup / k,
                    **part,
                }
            )
    return rows


def _rate_of(profile: Profile, part: dict, workers: int, assumptions: Assumptions) -> float:
    samples = profile.batch_size * (workers if assumptions.batch == "per_replica" else 1)
    return samples / part["step_seconds"]


def seed_case(step_seconds: float = 1.0, model_bytes: float = 96e6, batch_size: int = 32) -> Profile:
    """An Inception-v3-sized model on GPUs: ``model_bytes`` of gradients, ``step_seconds`` of
    compute per step on ``batch_size`` rows, GPU-speed sums, no other costs."""
    return Profile(
        model_bytes=model_bytes,
        batch_size=batch_size,
        compute_per_sample=step_seconds / batch_size,
        sum_rate=500e9,
        source=f"{model_bytes / 1e6:.0f} MB of gradients, {step_seconds:g} s of compute a step",
    )
