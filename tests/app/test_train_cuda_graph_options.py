"""``train --cuda-graph`` and ``--matmul-precision`` on a machine without a GPU: "on" is refused in
one line before anything is created, "auto" trains as before, the precision is recorded and, as it
changes what the run computes, cannot change on resume (the graph mode can: a captured step
computes what the eager one does). The captured run itself is checked on the stand-in GPU."""
import json

import pytest

from tinygrad_caps.models import cli

import cli_helpers
from cli_helpers import TINY_DIM3_CPU, tiny_data_dir
from paths import SUPPORT
from standin import run_standin

ONE_SHORT_EPOCH = ["--epochs", "1", *TINY_DIM3_CPU, "--limit-train", "16", "--limit-test", "8"]


@pytest.fixture
def data_dir(tmp_path):
    """16 training, 8 test images: two batches an epoch."""
    return tiny_data_dir(tmp_path / "data", (16, 8))


def train(data_dir, out, *extra):
    return cli_helpers.train(data_dir, out, *extra, options=ONE_SHORT_EPOCH)


def test_cuda_graph_on_without_a_gpu_is_one_line_and_creates_nothing(data_dir, tmp_path, capsys):
    assert train(data_dir, tmp_path / "run", "--cuda-graph", "on") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--cuda-graph on" in lines[0] and "GPU" in lines[0]
    assert not (tmp_path / "run").exists()


def test_auto_trains_on_the_cpu_and_the_options_are_recorded(data_dir, tmp_path, capsys):
    assert train(data_dir, tmp_path / "run", "--matmul-precision", "high") == 0
    assert "CUDA graph" not in capsys.readouterr().out  # nothing to say on the CPU
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["cuda_graph"] == "auto" and config["matmul_precision"] == "high"


def test_on_resume_the_graph_mode_may_change_but_not_the_precision(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data_dir, out) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(out), "--matmul-precision", "high"]) == 2
    assert "--matmul-precision high differs from the run's highest" in capsys.readouterr().err
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--cuda-graph", "off",
                     "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["cuda_graph"] == "off"


def test_a_captured_training_run_equals_the_eager_one_and_resumes_on_the_stand_in(tmp_path):
    output = run_standin([str(SUPPORT / "standin_scenarios.py"), "training_captured_equals_eager", str(tmp_path)],
                         devices=1)
    assert output.split()[-1] == "ok"


def test_a_capture_that_fails_falls_back_under_auto_and_is_refused_under_on(tmp_path):
    output = run_standin([str(SUPPORT / "standin_scenarios.py"), "training_goes_on_eagerly_when_the_capture_fails",
                          str(tmp_path)], devices=1)
    assert output.split()[-1] == "ok"


def test_the_trainer_takes_the_mode_as_a_keyword(data_dir, tmp_path):
    from tinygrad_caps.models.errors import UsageError
    from tinygrad_caps.models.app.training.trainer import Trainer

    config = dict(dataset="tiny", data_dir=str(data_dir), batch_size=8, epochs=1, lr=1e-3, lr_decay=0.9, seed=0,
                  augment=None, device="cpu", conv1_channels=3, primary_types=2, primary_dim=3, digit_dim=3,
                  kernel_size=3)
    with pytest.raises(UsageError, match="--cuda-graph on"):
        Trainer(config, tmp_path / "run", cuda_graph="on", show_progress=False, log=lambda *a: None)
    assert Trainer(config, tmp_path / "run", cuda_graph="off", show_progress=False,
                   log=lambda *a: None).graph_reason == "--cuda-graph off"
    with pytest.raises(UsageError, match="--cuda-graph must be one of"):
        Trainer(config, tmp_path / "run", cuda_graph="sometimes", show_progress=False, log=lambda *a: None)
