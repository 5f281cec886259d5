"""The main job (``python -m workbench.demo``) trains both models to the accuracy it promises."""

import pytest

from workbench import demo

pytestmark = pytest.mark.slow  # trains both models of the main job


@pytest.fixture(scope="module")
def results():
    return {r["section"]: r for r in demo.main(["--seed", "0", "--sections", "mlp,cnn"])}


def test_mlp_reaches_95_percent_on_held_out_digits(results):
    mlp = results["mlp"]
    assert mlp["steps"] == 600
    assert mlp["test_accuracy"] >= 0.95, mlp


def test_cnn_trains_to_90_percent(results):
    cnn = results["cnn"]
    assert cnn["steps"] == 600
    assert cnn["test_accuracy"] >= 0.90, cnn
    assert cnn["final_loss"] < 0.5, cnn


def test_prints_what_it_did(capsys):
    demo.main(["--sections", "mlp", "--steps", "20"])
    out = capsys.readouterr().out
    assert "1347 training and 450 test images" in out
    assert "mlp: 20 steps of 64" in out
    for field in ("final loss", "test accuracy", "samples/s", "done in"):
        assert field in out


def test_unknown_section_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        demo.main(["--sections", "mlp,gpu"])
    assert exc.value.code == 2
    assert "unknown section(s) gpu" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_distributed_sections_train_on_a_local_cluster_and_print_the_scaling_table(capsys):
    results = {
        r["section"]: r
        for r in demo.main(
            ["--sections", "distributed,scaling", "--steps", "100", "--scaling-steps", "3", "--scaling-batch", "4096"]
        )
    }
    distributed = results["distributed"]
    assert distributed["replicas"] == 2 and distributed["steps"] == 100
    assert distributed["max_difference"] < 1e-4  # float32: the same training as in one process
    assert distributed["test_accuracy"] >= 0.9
    assert [row["workers"] for row in results["scaling"]["rows"]] == [1, 2]
    out = capsys.readouterr().out
    assert "local Dask cluster: 2 worker processes" in out
    assert "largest difference from local training" in out
    assert "| workers | strategy | samples/s | speedup | efficiency | s/step |" in out
