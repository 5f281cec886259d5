"""``fit(check_numerics=True)`` on a cluster: the workers check every op, and the fit ends with the
NumericsError naming the op, as it does locally (both strategies, real worker processes)."""

import numpy as np
import pytest

import workbench as wb
from workbench.errors import NumericsError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_nan_data_ends_the_fit_naming_the_op(client, kit, strategy):
    m = kit.mlp(name=f"nan_{strategy}")
    data = kit.blobs(n=64)
    data["x"][5, 2] = np.nan
    local = wb.Session(m["graph"], seed=0)
    with pytest.raises(NumericsError) as expected:
        local.fit(m["train"], data, batch_size=64, steps=3, check_numerics=True)
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    start = dict(sess.variables)
    with pytest.raises(NumericsError, match="NaN") as raised:
        sess.fit(m["train"], data, batch_size=64, steps=3, check_numerics=True, strategy=strategy)
    assert str(raised.value).split(":")[0] == str(expected.value).split(":")[0]  # the same op
    for name, value in start.items():  # nothing trained on the NaN
        assert np.array_equal(sess.variables[name], value), name


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server"])
def test_an_infinite_learning_rate_ends_the_fit_instead_of_training_to_nan(client, kit, strategy):
    m = kit.mlp(optimizer=wb.optimizers.SGD(float("inf")), name=f"inf_{strategy}")
    data = kit.blobs(n=64)
    sess = wb.Session(m["graph"], seed=0, cluster=client)
    with pytest.raises(NumericsError, match="Inf|NaN"):
        sess.fit(m["train"], data, batch_size=32, steps=4, check_numerics=True, strategy=strategy)
    assert all(np.isfinite(v).all() for v in sess.variables.values())
    unchecked = wb.Session(m["graph"], seed=0, cluster=client)  # without the check it does train to NaN
    unchecked.fit(m["train"], data, batch_size=32, steps=4, strategy=strategy)
    assert not all(np.isfinite(v).all() for v in unchecked.variables.values())
