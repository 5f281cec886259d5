"""The cluster options of ``fit``: each bad value is a ClusterError naming it, never a bare TypeError."""

import pytest

from workbench.cluster.options import ClusterOptions
from workbench.errors import ClusterError


@pytest.mark.parametrize(
    "options, match",
    [
        ({"sync_every": 0}, r"sync_every must be at least 1 \(a whole number\), got 0"),
        ({"sync_every": -5}, r"sync_every must be .* got -5"),
        ({"window": None}, r"window must be at least 1 \(a whole number\), got None"),
        ({"window": 0}, r"window must be .* got 0"),
        ({"step_timeout": "10"}, r"step_timeout must be a positive number of seconds, got '10'"),
        ({"step_timeout": 0}, r"step_timeout must be a positive number of seconds, got 0"),
        ({"backup_replicas": -1}, r"backup_replicas must be 0 or more \(a whole number\), got -1"),
        ({"replicas": 0}, r"replicas must be at least 1 \(a whole number\), got 0"),
        ({"workers": [1, 2]}, r"workers must be worker addresses \(strings\), got \[1, 2\]"),
        ({"workers": []}, r"workers must be worker addresses"),
    ],
)
def test_bad_options_are_cluster_errors_naming_them(options, match):
    with pytest.raises(ClusterError, match=match):
        ClusterOptions(**options)


def test_one_worker_address_is_one_worker_not_its_characters():
    assert ClusterOptions(workers="tcp://127.0.0.1:8786").workers == ("tcp://127.0.0.1:8786",)
    assert ClusterOptions(workers=["tcp://a:1", "tcp://b:2"]).workers == ("tcp://a:1", "tcp://b:2")
