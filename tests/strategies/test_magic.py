"""%%flow_strategy in a real IPython shell."""

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import workbench as wb

GRAPH = """%%flow lin
x = placeholder("x", shape=(None, 4), dtype="float64")
w = variable("w", shape=(4, 2), dtype="float64")
loss = mean(reduce_sum(matmul(x, w) ** 2, axis=1))
train = optimizers.SGD(0.1).minimize(loss)
"""

STRATEGY = """%%flow_strategy cell_local_sgd
r.apply(r.gradients)
with r.every(2):
    r.assign({v: all_reduce(v, op="mean") for v in r.variables})
"""


@pytest.fixture
def ip(monkeypatch):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "workbench")
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: None)
    yield shell
    for name in ("lin", "cell_local_sgd", "cell_bad", "h"):
        shell.user_ns.pop(name, None)


def run(ip, cell):
    result = ip.run_cell(cell)
    return result.error_in_exec or result.error_before_exec


def test_a_cell_is_a_strategy_with_r_and_the_ops_in_scope(ip):
    assert run(ip, GRAPH) is None
    assert run(ip, STRATEGY) is None
    made = ip.user_ns["cell_local_sgd"]
    assert isinstance(made, wb.strategies.Strategy) and "cell_local_sgd" in wb.strategies.names()
    lin = ip.user_ns["lin"]
    data = {"x": np.random.default_rng(0).normal(size=(64, 4))}
    history = wb.Session(lin, cluster=False).fit(lin.train, data, batch_size=16, steps=4, replicas=2,
                                                 strategy="cell_local_sgd")  # fmt: skip
    assert history["collectives"].tolist() == [0, 1, 0, 1]
    builtin = wb.Session(lin, cluster=False)
    builtin.fit(lin.train, data, batch_size=16, steps=4, replicas=2, strategy=wb.strategies.local_sgd(every=2))
    mine = wb.Session(lin, cluster=False)
    mine.fit(lin.train, data, batch_size=16, steps=4, replicas=2, strategy=made)
    np.testing.assert_array_equal(mine.variables["w"], builtin.variables["w"])
    program = wb.strategy_graph(lin.train, "cell_local_sgd")
    (reduce,) = [op for op in program.operations if op.type == "all_reduce"]
    assert reduce.source.lineno == 4 and "all_reduce(v" in reduce.source.code  # the line in the cell


def test_errors_name_the_cells_line(ip):
    run(ip, GRAPH)
    assert run(ip, "%%flow_strategy cell_bad\nr.apply(r.gradients)\nr.assign({r.gradients[lin.w]: 1.0})\n") is None
    with pytest.raises(wb.StrategyError, match=r"strategy 'cell_bad', line 3: r.assign\(.*needs a variable or a slot"):
        wb.strategy_graph(ip.user_ns["lin"].train, "cell_bad")
    assert run(ip, "%%flow_strategy cell_bad\nx = 1\n") is None
    with pytest.raises(wb.StrategyError, match=r"strategy 'cell_bad', line 1: %%flow_strategy cell_bad: it never"):
        wb.strategy_graph(ip.user_ns["lin"].train, "cell_bad")


def test_bad_names_are_usage_errors(ip):
    assert isinstance(run(ip, "%%flow_strategy 3x\nr.apply(r.gradients)\n"), UsageError)
    assert isinstance(run(ip, "%%flow_strategy allreduce\nr.apply(r.gradients)\n"), UsageError)
