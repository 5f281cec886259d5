"""A checkpoint that cannot be written ends a cluster fit, but the steps it trained are kept: the
session holds the host copy it had in hand, as local training keeps its variables."""

import numpy as np
import pytest

import workbench as wb
from workbench import checkpoint
from workbench.errors import FileError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def failing_at(step, monkeypatch):
    real = checkpoint.save_step

    def save_step(directory, variables, at, keep=2):
        if at == step:
            raise FileError(28, f"cannot write checkpoint step {at}: No space left on device", directory)
        return real(directory, variables, at, keep)

    monkeypatch.setattr(checkpoint, "save_step", save_step)


@pytest.mark.parametrize("strategy", ["local", "allreduce", "parameter_server"])
def test_a_failed_checkpoint_keeps_the_trained_steps(client, kit, strategy, tmp_path, monkeypatch):
    m = kit.mlp(name=f"kept_{strategy}")
    data = kit.blobs(n=96)
    ten = wb.Session(m["graph"], seed=0)
    ten.fit(m["train"], data, batch_size=24, steps=10)
    failing_at(10, monkeypatch)
    cluster = None if strategy == "local" else client
    options = {} if strategy == "local" else {"strategy": strategy}
    sess = wb.Session(m["graph"], seed=0, cluster=cluster)
    with pytest.raises(FileError, match="No space left on device"):
        sess.fit(m["train"], data, batch_size=24, steps=20, checkpoint_dir=tmp_path, checkpoint_every=5, **options)
    kit.assert_same_variables(ten.variables, sess.variables, rtol=1e-9)  # step 10's, not the initial ones
    assert [r["step"] for r in sess.last_history.records] == list(range(1, 11))
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000005.npz"]
    assert not np.array_equal(sess.variables["w0"], wb.Session(m["graph"], seed=0).variables["w0"])
