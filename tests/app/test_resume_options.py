"""``train --resume --out DIR`` continues the run as it was configured: options not given again are
the run's own, an option given with another value is a one-line error (except those that may change
on resume, such as ``--epochs``), and ``gradflow.jsonl`` is repaired like ``metrics.jsonl``. Options
that only a CapsNet has are refused with ``--model cnn``."""
import json
import os
import signal

import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import cli
from tinygrad_caps.models.errors import UsageError
from tinygrad_caps.models.app.training.trainer import Trainer, train as train_run

from cli_helpers import one_line_error, train
from helpers import metrics_without_times as metrics

# Options that differ from every default, so that a resume that forgot any of them would show.
RUN = ["--conv1-channels", "3", "--primary-types", "2", "--primary-dim", "3", "--digit-dim", "3", "--kernel-size",
       "3", "--batch-size", "6", "--epochs", "2", "--limit-train", "30", "--limit-test", "12", "--lr", "0.002",
       "--lr-decay", "0.5", "--seed", "5", "--routing-iterations", "2", "--reconstruction-weight", "0.01",
       "--augment", "none", "--no-progress", "--device", "cpu"]


def start(data_dir, out, *extra):
    return train(data_dir, out, *extra, options=RUN)


def interrupt_at_step(monkeypatch, n):
    """Send SIGINT to this process during the ``n``-th optimizer step (the run stops after that batch)."""
    calls = {"n": 0}
    step = tc.optim.Adam.step

    def interrupting_step(self):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    monkeypatch.setattr(tc.optim.Adam, "step", interrupting_step)
    return step


def test_resume_with_out_alone_continues_the_run_as_configured(data_dir, tmp_path, monkeypatch):
    assert start(data_dir, tmp_path / "whole") == 0
    step = interrupt_at_step(monkeypatch, 7)  # in epoch 2 (5 batches of 6 per epoch)
    assert start(data_dir, tmp_path / "cut") == 130
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    assert cli.main(["train", "--resume", "--out", str(tmp_path / "cut"), "--no-progress"]) == 0
    whole, cut = metrics(tmp_path / "whole"), metrics(tmp_path / "cut")
    assert len(cut) == 2
    for a, b in zip(whole, cut):
        assert a == pytest.approx(b, rel=1e-9)
    configs = [json.loads((tmp_path / name / "config.json").read_text()) for name in ("whole", "cut")]
    assert configs[0] == configs[1] and configs[1]["batch_size"] == 6 and configs[1]["limit_train"] == 30


@pytest.mark.parametrize("option, value, run_value", [("--conv1-channels", "16", "3"), ("--batch-size", "5", "6"),
                                                      ("--limit-train", "24", "30"), ("--seed", "0", "5"),
                                                      ("--hidden-capsules", "2x2", "(none)")])
def test_resume_refuses_an_option_given_with_another_value(data_dir, tmp_path, capsys, option, value, run_value):
    out = tmp_path / "run"
    assert start(data_dir, out, "--epochs", "1") == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    line = one_line_error(capsys, cli.main(["train", "--resume", "--out", str(out), option, value]))
    assert f"{option} {value} differs from the run's {run_value}" in line
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resume_may_extend_the_epochs_and_records_them(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert start(data_dir, out, "--epochs", "1") == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--conv1-channels", "3",
                     "--no-progress"]) == 0
    assert "--epochs changes from 1 to 2" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["epochs"] == 2
    assert [m["epoch"] for m in metrics(out)] == [1, 2]
    assert cli.main(["train", "--resume", "--out", str(out), "--no-progress"]) == 0  # finished: says so
    assert "has trained its 2 epochs: nothing to train" in capsys.readouterr().out
    assert [m["epoch"] for m in metrics(out)] == [1, 2]


def test_the_library_trainer_refuses_another_model_on_resume(data_dir, tmp_path):
    config = dict(dataset="tiny", data_dir=str(data_dir), batch_size=8, epochs=1, lr=1e-3, lr_decay=0.9, seed=0,
                  augment=None, device="cpu", conv1_channels=3, primary_types=2, primary_dim=3, digit_dim=3,
                  kernel_size=3, limit_train=16, limit_test=8)
    train_run(config, tmp_path / "run", show_progress=False, log=lambda *_: None)
    with pytest.raises(UsageError, match="conv1_channels is 3, not 4"):
        Trainer(dict(config, conv1_channels=4, epochs=2), tmp_path / "run", resume=True, show_progress=False)


def test_resume_repairs_gradflow_log_like_metrics(data_dir, tmp_path, monkeypatch):
    assert start(data_dir, tmp_path / "whole", "--log-gradflow", "2") == 0
    step = interrupt_at_step(monkeypatch, 7)
    assert start(data_dir, tmp_path / "cut", "--log-gradflow", "2") == 130
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    log = tmp_path / "cut" / "gradflow.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 6]
    # what a kill after the checkpoint leaves: a line of a step beyond it, then a line cut short
    log.write_text("".join(lines) + lines[-1].replace('"step": 6', '"step": 8') + lines[-1][:40])
    assert cli.main(["train", "--resume", "--out", str(tmp_path / "cut"), "--no-progress"]) == 0
    whole = [json.loads(line) for line in (tmp_path / "whole" / "gradflow.jsonl").read_text().splitlines()]
    cut = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in cut] == [r["step"] for r in whole] == [2, 4, 6, 8, 10]
    assert cut == whole  # the resumed steps compute exactly what the uninterrupted run did


@pytest.mark.parametrize("option", [["--log-gradflow", "1"], ["--hidden-capsules", "4x4"], ["--routing-iterations", "1"],
                                    ["--reconstruction-weight", "0.1"], ["--capsule-bias"]])
def test_capsule_options_are_refused_for_the_cnn(data_dir, tmp_path, capsys, option):
    out = tmp_path / "cnn"
    line = one_line_error(capsys, cli.main(["train", "--model", "cnn", "--dataset", "tiny", "--data-dir",
                                            str(data_dir), "--out", str(out), "--epochs", "1", *option]))
    assert option[0] in line and "CapsNet only" in line
    assert not out.exists()


def test_a_cnn_run_records_no_capsule_options(data_dir, tmp_path):
    from tinygrad_caps.models.capsnet.config import MODEL_OPTIONS

    out = tmp_path / "cnn"
    assert cli.main(["train", "--model", "cnn", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out),
                     "--epochs", "1", "--batch-size", "8", "--limit-train", "16", "--limit-test", "8",
                     "--no-progress", "--device", "cpu"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "cnn" and not set(MODEL_OPTIONS) & set(config)
    assert "log_gradflow" not in config and "reconstruction_weight" not in config


def _without_decoder_hidden(run):
    """``run``'s config.json and checkpoints as a run made before --decoder-hidden existed wrote them."""
    config = json.loads((run / "config.json").read_text())
    del config["decoder_hidden"]
    (run / "config.json").write_text(json.dumps(config))
    for path in (run / "checkpoints").glob("*.npz"):
        checkpoint = tc.load(path)
        del checkpoint["config"]["decoder_hidden"]
        tc.save(checkpoint, path)


def test_a_run_older_than_a_model_option_resumes_with_that_options_default(data_dir, tmp_path, capsys):
    """A run whose config predates --decoder-hidden was built with the paper's 512,1024: --resume continues
    it as such, and another value is the one-line refusal of any changed model option, before any data is
    read (not a shape error from its weights after)."""
    out = tmp_path / "old"
    assert train(data_dir, out, "--epochs", "1", options=[*RUN[:10], "--no-progress"]) == 0
    _without_decoder_hidden(out)
    capsys.readouterr()
    status = cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--decoder-hidden", "16,32",
                       "--no-progress"])
    printed = capsys.readouterr()
    assert status == 2 and len(printed.err.strip().splitlines()) == 1 and "data:" not in printed.out
    assert "--decoder-hidden [16, 32] differs from the run's [512, 1024]" in printed.err
    assert cli.main(["train", "--resume", "--out", str(out), "--epochs", "2", "--no-progress"]) == 0
    assert len(metrics(out)) == 2
    assert json.loads((out / "config.json").read_text())["decoder_hidden"] == [512, 1024]
