"""A replica's compiled plans stay warm on its worker between fits of the same program: the next replica
copies its starting variables into them instead of parsing and compiling again, and trains to the same bits."""

import numpy as np
import pytest

import workbench as wb
from workbench.cluster import worker_plans
from workbench.cluster.collective import replica as replica_module
from workbench.cluster.collective.group import CollectiveGroup
from workbench.cluster.collective.replica import Replica
from workbench.cluster.worker_plans import WarmPlans
from workbench.cluster.program import TrainingProgram
from workbench.errors import CollectiveError

OWN_CLUSTER = True  # its tests count what the workers compiled


def program_of(kit, **mlp_args):
    m = kit.mlp(**mlp_args)
    program = TrainingProgram.from_graph(m["graph"], m["train"], [m["loss"].name], seed=0)
    return program, wb.Session(m["graph"], seed=0).variables


def test_plans_are_reused_for_the_same_program_and_loaded_with_the_new_start(kit):
    warm = WarmPlans(maxsize=2)
    program, variables = program_of(kit)
    first = warm.replica(program, variables, 1 << 20)
    assert (warm.compiled, warm.reused) == (1, 0)
    first.variables["w0"][...] = 7.0  # what a run left in them
    warm.give_back(first)
    start = {name: value + 1.0 for name, value in variables.items()}
    again = warm.replica(program, start, 1 << 20)
    assert again is first and (warm.compiled, warm.reused) == (1, 1)
    for name, value in start.items():
        np.testing.assert_array_equal(again.variables[name], value)
        assert again.variables[name] is first.variables[name]  # the arrays the update plan writes into
    # taken: a second replica of the program on this worker gets plans of its own
    assert warm.replica(program, start, 1 << 20) is not first and warm.compiled == 2
    # another bucket size, other shapes or another program: compiled afresh
    warm.give_back(again)
    assert warm.replica(program, start, 4 << 20) is not again
    warm.give_back(again)
    wider = {**start, "w0": np.zeros((6, 9))}
    assert warm.replica(program, wider, 1 << 20) is not again
    other, other_variables = program_of(kit, hidden=5)
    assert other.digest != program.digest
    assert warm.replica(other, other_variables, 1 << 20) is not again


def test_only_the_latest_sets_are_kept(kit):
    warm = WarmPlans(maxsize=2)
    programs = [program_of(kit, hidden=h) for h in (3, 4, 5)]
    sets = [warm.replica(p, v, 1 << 20) for p, v in programs]
    for plans in sets:
        warm.give_back(plans)
    assert warm.replica(*programs[0], 1 << 20) is not sets[0]  # the oldest was let go
    assert warm.replica(*programs[2], 1 << 20) is sets[2]


class _Comm:
    rank, size, bytes_sent, bytes_received = 0, 1, 0, 0

    def close(self):
        pass


def test_a_replica_gives_its_plans_back_only_when_no_step_runs_or_failed(kit, monkeypatch):
    warm = WarmPlans(maxsize=4)
    monkeypatch.setattr(replica_module, "WARM", warm)
    monkeypatch.setattr(replica_module, "communicator", lambda group: _Comm())
    program, variables = program_of(kit)
    group = CollectiveGroup("run-1.0", ("tcp://127.0.0.1:1",))

    clean = Replica(program, variables, 0, group)
    clean.close()
    clean.close()  # twice: once given back
    assert warm._free == [clean.plans]
    with pytest.raises(CollectiveError, match="is broken: its run ended"):
        clean.run(1, np.arange(4), 0, 1.0, None, 1.0, False)  # a step that comes after the close

    busy = Replica(program, variables, 0, group)
    assert busy.plans is clean.plans and warm._free == []
    busy._running = True  # a step still running (a hung peer): its arrays stay its own
    busy.close()
    assert warm._free == []

    broken = Replica(program, variables, 0, group)
    broken.failed = "step 3 failed here: ValueError: x"
    broken.close()
    assert warm._free == []


def worker_counts(client) -> dict:
    return client.run(lambda: (worker_plans.WARM.compiled, worker_plans.WARM.reused))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "strategy", [None, wb.strategies.local_sgd(every=2)], ids=["allreduce_engine", "strategy_function"]
)
def test_a_later_fit_reuses_the_workers_plans_and_trains_to_the_bits_of_a_cold_start(client, kit, strategy):
    data = kit.blobs(n=256)
    m = kit.mlp(name="warm", dropout=0.25)

    def fit():
        sess = wb.Session(m["graph"], seed=0, cluster=client)
        history = sess.fit(
            m["train"], data, batch_size=32, steps=5, fetches={"loss": m["loss"]}, replicas=2, strategy=strategy
        )
        variables = sess.variables
        sess.close()
        return variables, history["loss"]

    client.run(lambda: worker_plans.WARM.clear())
    before = worker_counts(client)
    cold, cold_loss = fit()
    after_cold = worker_counts(client)
    warm, warm_loss = fit()
    after_warm = worker_counts(client)
    for worker in before:
        assert after_cold[worker][0] == before[worker][0] + 1, (before, after_cold)
        assert after_warm[worker] == (after_cold[worker][0], after_cold[worker][1] + 1), (after_cold, after_warm)
    assert sorted(cold) == sorted(warm)
    for name in cold:
        assert cold[name].tobytes() == warm[name].tobytes(), name
    assert cold_loss.tobytes() == warm_loss.tobytes()
