"""The scheduler makes a few task groups per fit (one per phase), not one per task: the groups a long
computation keeps (the scheduler's ``computations`` hold every group they saw) stay bounded however
many steps run, and the dashboard's prefixes stay the phases'."""

import pytest

import workbench as wb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def seen(client, name: str) -> tuple[int, set]:
    """How many task groups of ``name`` the scheduler's computations hold, and the prefixes of ``name``."""

    def count(dask_scheduler, name):
        groups = {id(g) for c in dask_scheduler.computations for g in c.groups if str(g.name).startswith(name)}
        return len(groups), sorted(p for p in dask_scheduler.task_prefixes if str(p).startswith(name))

    found, prefixes = client.run_on_scheduler(count, name=name)
    return found, set(prefixes)


@pytest.mark.parametrize(
    "strategy, phases",
    [
        ("allreduce", {"allreduce", "allreduce-start"}),
        ("parameter_server", {"grad", "reduce", "update", "metrics"}),
    ],
)
def test_a_fit_makes_a_few_task_groups_not_one_per_task(client, kit, strategy, phases):
    name = f"groups_{strategy}"
    m = kit.mlp(name=name)
    data = kit.blobs(n=96)
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    sess.fit(m["train"], data, batch_size=24, steps=60, strategy=strategy, sync_every=20)
    groups, prefixes = seen(client, name)
    assert prefixes == {f"{name}-{phase}" for phase in phases}
    assert 0 < groups <= 4 * len(phases)  # one per task would be 60 steps x 2 replicas and more
