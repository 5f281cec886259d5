"""Errors workbench raises show the user's frames and the message in IPython, not workbench's internals."""

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import workbench as wb

SETUP = """
import workbench as wb
g = wb.Graph()
with g.as_default():
    x = wb.placeholder("x", shape=(None, 2))
    y = wb.sum(x)
sess = wb.Session(g)
"""


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    shell.user_ns["np"] = np
    assert shell.run_cell(SETUP).success
    return shell


def shown(ip, capsys, cell) -> list[str]:
    capsys.readouterr()
    result = ip.run_cell(cell)
    assert result.error_in_exec is not None
    return [line for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_a_feed_error_in_a_plain_cell_shows_the_cell_line_and_the_message(ip, capsys):
    lines = shown(ip, capsys, "sess.run(y, feed_dict={x: [[1.0, 2.0, 3.0]]})")
    assert lines[0].startswith("Traceback (most recent call last, workbench's own frames left out)")
    assert lines[1].endswith("line 1, in <module>") and lines[2] == "    sess.run(y, feed_dict={x: [[1.0, 2.0, 3.0]]})"
    assert lines[3] == "FeedError: placeholder 'x' expects shape (None, 2), got shape (1, 3)"
    assert len(lines) == 4
    assert not any("workbench/" in line for line in lines)


def test_a_user_function_between_keeps_its_frame(ip, capsys):
    cell = "def evaluate(v):\n    return sess.run(y, feed_dict={x: v})\n\nevaluate(np.ones((2, 5)))"
    lines = shown(ip, capsys, cell)
    assert [line.strip() for line in lines[2::2][:2]] == [
        "evaluate(np.ones((2, 5)))",
        "return sess.run(y, feed_dict={x: v})",
    ]
    assert lines[-1] == "FeedError: placeholder 'x' expects shape (None, 2), got shape (2, 5)"
    assert len(lines) == 6


def test_a_shape_error_at_build_time_is_short_too(ip, capsys):
    lines = shown(ip, capsys, "with g.as_default():\n    z = wb.matmul(x, wb.constant(np.ones((3, 4), 'float32')))")
    assert lines[-2].startswith("ShapeError: matmul 'matmul': inner dimensions differ: (None, 2) @ (3, 4)")
    assert lines[-1].strip().startswith('File "')  # the op's own line, as the message gives it
    assert len(lines) == 5


def test_errors_that_are_not_workbench_s_keep_the_full_traceback(ip, capsys):
    lines = shown(ip, capsys, "1 / 0")
    assert any("ZeroDivisionError" in line for line in lines)
    assert not any("workbench's own frames" in line for line in lines)


def test_the_short_form_is_the_error_s_own():
    try:
        wb.Session(wb.Graph()).run("nothing")
    except wb.GraphError as e:
        lines = e._render_traceback_()
    assert lines[-1] == "GraphError: graph 'graph' has no tensor or operation named 'nothing'"
    assert all("workbench" + "/" not in line for line in lines[:-1])
