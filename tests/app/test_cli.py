"""The tinygrad-caps command on a tiny IDX dataset written here: training output, exact resume
(after a finished epoch and after Ctrl-C mid-epoch), evaluation, and clear errors."""
import json
import os
import signal
import subprocess
import sys

import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import cli

from cli_helpers import TINY, train
from helpers import metrics_without_times as metrics


def test_train_writes_metrics_checkpoints_and_config(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train(data_dir, out, "--epochs", "2") == 0
    lines = metrics(out)
    assert [m["epoch"] for m in lines] == [1, 2]
    assert set(lines[0]) >= {"train_loss", "train_accuracy", "test_accuracy", "test_loss", "lr"}
    assert lines[1]["lr"] == pytest.approx(0.9e-3)
    assert (out / "checkpoints" / "last.npz").exists() and (out / "checkpoints" / "best.npz").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["version"] == tc.__version__ and config["batch_size"] == 8 and config["augment"] == "shift"
    assert config["routing_gradient"] == "full" and config["conv1_channels"] == 4


def test_resume_after_a_finished_epoch_matches_an_uninterrupted_run(data_dir, tmp_path):
    train(data_dir, tmp_path / "whole", "--epochs", "3")
    train(data_dir, tmp_path / "split", "--epochs", "1")
    assert train(data_dir, tmp_path / "split", "--epochs", "3", "--resume") == 0
    whole, split = metrics(tmp_path / "whole"), metrics(tmp_path / "split")
    assert len(split) == 3
    for a, b in zip(whole, split):
        assert a == pytest.approx(b, rel=1e-9)


def test_ctrl_c_saves_a_checkpoint_and_resume_matches(data_dir, tmp_path, monkeypatch):
    train(data_dir, tmp_path / "whole", "--epochs", "2")
    calls = {"n": 0}
    step = tc.optim.Adam.step

    def interrupting_step(self):
        calls["n"] += 1
        if calls["n"] == 7:  # in the middle of epoch 2 (5 batches per epoch)
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    monkeypatch.setattr(tc.optim.Adam, "step", interrupting_step)
    assert train(data_dir, tmp_path / "cut", "--epochs", "2") == 130
    saved = tc.load(tmp_path / "cut" / "checkpoints" / "last.npz")
    assert saved["progress"]["epoch"] == 1 and saved["progress"]["step"] == 2
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    assert train(data_dir, tmp_path / "cut", "--epochs", "2", "--resume") == 0
    for a, b in zip(metrics(tmp_path / "whole"), metrics(tmp_path / "cut")):
        assert a == pytest.approx(b, rel=1e-9)


def test_evaluate_prints_accuracy_per_class_and_confusion(data_dir, tmp_path, capsys):
    train(data_dir, tmp_path / "run", "--epochs", "1")
    capsys.readouterr()
    png = tmp_path / "recon.png"
    args = ["evaluate", "--checkpoint", str(tmp_path / "run" / "checkpoints" / "best.npz"), "--data-dir", str(data_dir)]
    try:
        import matplotlib  # noqa: F401
        args += ["--reconstructions", str(png)]
    except ImportError:
        png = None
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "accuracy" in text and "per-class accuracy" in text and "confusion matrix" in text
    assert text.count("images)") == 3
    if png is not None:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_bad_input_gives_a_message_and_a_nonzero_exit(data_dir, tmp_path, capsys):
    assert cli.main(["train", "--dataset", "nowhere", "--data-dir", str(tmp_path / "none"), *TINY]) == 2
    assert "not found" in capsys.readouterr().err
    corrupt = tmp_path / "bad" / "tiny"
    corrupt.mkdir(parents=True)
    for name in os.listdir(data_dir / "tiny"):
        (corrupt / name).write_bytes((data_dir / "tiny" / name).read_bytes()[:30])
    assert train(tmp_path / "bad", tmp_path / "out1", "--epochs", "1") == 2
    assert "corrupt" in capsys.readouterr().err
    if not tc.gpu_available():
        assert train(data_dir, tmp_path / "out2", "--device", "cuda") == 2
        assert "no usable GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--batch-size", "0"])
    assert info.value.code == 2 and "positive" in capsys.readouterr().err


def test_a_checkpoint_for_another_architecture_names_the_parameters(data_dir, tmp_path, capsys):
    train(data_dir, tmp_path / "run", "--epochs", "1")
    checkpoint = str(tmp_path / "run" / "checkpoints" / "last.npz")
    args = ["evaluate", "--checkpoint", checkpoint, "--data-dir", str(data_dir), "--conv1-channels", "6"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "--conv1-channels 6 (the checkpoint's is 4)" in err and "Traceback" not in err
    (tmp_path / "junk.npz").write_bytes(b"junk")
    assert cli.main(["evaluate", "--checkpoint", str(tmp_path / "junk.npz")]) == 2


def test_console_script_reports_errors_without_a_traceback(tmp_path):
    env = dict(os.environ, TINYGRAD_CAPS_DATA=str(tmp_path), TINYGRAD_CAPS_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "tinygrad_caps.models.cli", "train", "--dataset", "mnist",
                             "--data-dir", str(tmp_path), "--no-progress"],
                            capture_output=True, text=True, env=env, timeout=120,
                            input="")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "train-images-idx3-ubyte" in result.stderr


def test_training_augments_training_batches_only(data_dir, tmp_path, monkeypatch):
    from tinygrad_caps.models.app.training import evaluation, run_data

    made = []

    class Recording(run_data.BatchIterator):
        def __init__(self, images, labels, batch_size, **kwargs):
            made.append((len(images), kwargs.get("augment")))
            super().__init__(images, labels, batch_size, **kwargs)

    monkeypatch.setattr(run_data, "BatchIterator", Recording)  # the training batches
    monkeypatch.setattr(evaluation, "BatchIterator", Recording)  # the test pass's
    assert train(data_dir, tmp_path / "run", "--epochs", "1", "--augment", "shift+flip") == 0
    assert (40, "shift+flip") in made and (16, None) in made
    assert all(augment is None for n, augment in made if n == 16)
