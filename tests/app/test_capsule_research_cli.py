"""The research options end to end on a tiny IDX dataset: hidden capsules, capsule bias, uniform
routing, the baseline CNN, the official conventions, leaky routing and the sabour-official preset
through `train`, `evaluate` and `--resume`; and the study scripts on a tiny budget."""
import json
import subprocess
import sys

import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.data import DatasetError, load_dataset
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.training.presets import SABOUR_OFFICIAL

import cli_helpers
from cli_helpers import TINY, tiny_data_dir
from paths import ROOT

BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def data_dir(tmp_path):
    """32 training images, uncompressed (not the shared 40, gzipped)."""
    return tiny_data_dir(tmp_path / "data", (32, 16), compress=False)


def train(data_dir, out, *extra):
    return cli_helpers.train(data_dir, out, *extra, options=["--epochs", "1", *TINY])


def evaluate(data_dir, out, *extra):
    return cli.main(["evaluate", "--checkpoint", str(out / "checkpoints" / "last.npz"), "--data-dir", str(data_dir),
                     *extra])


def test_hidden_capsules_bias_and_uniform_routing_train_evaluate_and_resume(data_dir, tmp_path, capsys):
    out = tmp_path / "deep"
    assert train(data_dir, out, "--hidden-capsules", "3x4,2x5", "--capsule-bias", "--routing", "uniform") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_capsules"] == [[3, 4], [2, 5]] and config["capsule_bias"] is True
    assert config["routing"] == "uniform" and config["model"] == "capsnet"
    state = tc.load(out / "checkpoints" / "last.npz")
    assert state["model"]["hidden.1.weight"].shape == (3, 2, 5, 4) and state["model"]["hidden.1.bias"].shape == (2, 5)
    assert state["config"]["hidden_capsules"] == [[3, 4], [2, 5]]
    capsys.readouterr()
    assert evaluate(data_dir, out) == 0
    assert "accuracy" in capsys.readouterr().out
    # resuming without the options keeps the run's model
    assert cli.main(["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--epochs", "2",
                     *TINY, "--resume"]) == 0
    assert json.loads((out / "config.json").read_text())["hidden_capsules"] == [[3, 4], [2, 5]]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    # an explicit different architecture is a clear error naming the keys
    assert evaluate(data_dir, out, "--hidden-capsules", "3x4") == 2
    assert "hidden.1.weight" in capsys.readouterr().err


def test_bad_research_options_are_usage_errors(data_dir, tmp_path, capsys):
    for bad in (["--hidden-capsules", "3by4"], ["--routing", "capsule-em"], ["--conventions", "tf"], ["--model", "mlp"],
                ["--preset", "hinton"]):
        with pytest.raises(SystemExit) as info:
            train(data_dir, tmp_path / "x", *bad)
        assert info.value.code == 2


def cnn_train(data_dir, out, *extra):
    return cli.main(["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--epochs", "1",
                     "--batch-size", "8", "--no-progress", *extra])


def test_baseline_cnn_trains_and_evaluates(data_dir, tmp_path, capsys):
    out = tmp_path / "cnn"
    assert cnn_train(data_dir, out, "--model", "cnn") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "cnn"
    assert "fc1.weight" in tc.load(out / "checkpoints" / "last.npz")["model"]
    capsys.readouterr()
    assert evaluate(data_dir, out) == 0
    assert "confusion matrix" in capsys.readouterr().out
    assert evaluate(data_dir, out, "--reconstructions", str(tmp_path / "r.png")) == 2
    assert "no decoder" in capsys.readouterr().err


def test_cnn_options_apply_to_the_cnn_only(data_dir, tmp_path, capsys):
    out = tmp_path / "cnn"
    assert cnn_train(data_dir, out, "--model", "cnn", "--cnn-channels", "2,3,2", "--cnn-hidden", "5,4",
                     "--dropout", "0.1") == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["cnn_channels"], config["cnn_hidden"], config["dropout"]) == ([2, 3, 2], [5, 4], 0.1)
    assert tc.load(out / "checkpoints" / "last.npz")["model"]["conv2.weight"].shape == (3, 2, 5, 5)
    capsys.readouterr()
    assert cnn_train(data_dir, tmp_path / "caps", "--cnn-hidden", "5,4", "--dropout", "0.1") == 2
    assert "--cnn-hidden, --dropout apply to --model cnn only" in capsys.readouterr().err
    for bad in (["--cnn-channels", "2,3"], ["--dropout", "1"], ["--cnn-hidden", "0,4"]):
        with pytest.raises(SystemExit) as info:
            cnn_train(data_dir, tmp_path / "x", "--model", "cnn", *bad)
        assert info.value.code == 2


def test_official_conventions_leaky_routing_and_resume(data_dir, tmp_path, capsys):
    out = tmp_path / "official"
    assert train(data_dir, out, "--conventions", "official", "--leaky-routing") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["conventions"] == "official" and config["leaky_routing"] is True
    state = tc.load(out / "checkpoints" / "last.npz")
    assert state["config"]["conventions"] == "official" and "digit.bias" in state["model"]
    # the recorded margin loss follows the official scaling: 1/(2K) of the paper's per-example sum
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert line["train_margin_loss"] < 0.5 / 3 + 1e-9
    capsys.readouterr()
    assert evaluate(data_dir, out) == 0
    assert cli.main(["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--epochs", "2",
                     *TINY, "--resume"]) == 0
    assert json.loads((out / "config.json").read_text())["conventions"] == "official"


def test_sabour_official_preset_sets_the_official_options_and_explicit_ones_win(data_dir, tmp_path):
    out = tmp_path / "preset"
    assert train(data_dir, out, "--preset", "sabour-official", "--batch-size", "8") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["preset"] == "sabour-official" and config["conventions"] == "official"
    assert config["lr"] == SABOUR_OFFICIAL["lr"] and config["lr_decay"] == pytest.approx(0.96 ** (60000 / 128 / 2000))
    assert config["batch_size"] == 8 and config["epochs"] == 1  # given on the command line
    args = cli.make_parser()
    parsed = cli.parse_with_preset(args, ["train", "--preset", "sabour-official", "--dataset", "cifar10"])
    assert parsed.leaky_routing is True and parsed.primary_types == 64 and parsed.batch_size == 128
    assert parsed.epochs == 640


def fashion_mnist_or_skip():
    try:
        load_dataset("fashion-mnist", "test", download_missing=False)
    except DatasetError:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")


def run_study_script(script, *args):
    return subprocess.run([sys.executable, str(BENCHMARKS / "studies" / script), "--limit-test", "20", "--batch-size",
                           "6", "--conv1-channels", "8", "--primary-types", "4", "--no-progress", *args],
                          capture_output=True, text=True, timeout=600)


def test_the_study_scripts_are_study_run_with_the_reduced_model_and_their_budget(tmp_path):
    fashion_mnist_or_skip()
    out = tmp_path / "depth"
    result = run_study_script("depth_study.py", "--max-depth", "1", "--seeds", "1", "--limit-train", "12", "--log-gradflow", "1",
                              "--out", str(out))
    assert result.returncode == 0, result.stderr
    plan = json.loads((out / "study.json").read_text())
    assert plan["study"] == "depth" and plan["epochs"] == 1 and plan["options"]["conv1_channels"] == 8
    assert plan["options"]["limit_train"] == 12 and plan["options"]["limit_test"] == 20
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert [row["config_id"] for row in rows] == [f"{variant}-depth{depth}-{bias}" for variant in ("ours", "peer")
                                                  for depth in (0, 1) for bias in ("nobias", "bias")]
    deep = next(row for row in rows if row["config_id"] == "peer-depth1-bias")
    assert deep["config"]["squash"] == "peer" and deep["metrics"]["d_score"]["mean"] > 0
    assert next(row for row in rows if row["config_id"] == "ours-depth0-bias")["metrics"]["d_score"]["mean"] is None
    out = tmp_path / "conventions"
    result = run_study_script("conventions_study.py", "--seeds", "1", "--limit-train", "12", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert [row["config_id"] for row in json.loads((out / "summary.json").read_text())["rows"]] == [
        "paper-full", "paper-detach", "official-full", "official-detach"]
    summary = subprocess.run([sys.executable, str(BENCHMARKS / "studies" / "conventions_study.py"), "--out", str(out),
                              "--summary-only"], capture_output=True, text=True, timeout=600)
    assert summary.returncode == 0 and "| official-detach |" in summary.stdout
