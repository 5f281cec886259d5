"""A graph file's bad values are quoted briefly in the FormatError: a 50 MB value does not come back whole."""

import json

import pytest

import workbench as wb
from workbench.errors import FormatError


@pytest.mark.slow
def test_a_format_error_quotes_a_huge_value_briefly():
    g = wb.Graph(name="g")
    with g.as_default():
        wb.placeholder("x", shape=(None, 2))
    doc = json.loads(g.to_json())
    doc["operations"][0]["type"] = "t" * 50_000_000  # 50 MB
    with pytest.raises(FormatError, match=r"unknown op type 'tttt.* \(50000002 characters\) \.\.\. t+'") as raised:
        wb.Graph.from_json(json.dumps(doc))
    assert len(str(raised.value)) < 1000
