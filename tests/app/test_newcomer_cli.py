"""What a newcomer meets first: ``--resume`` of a folder that holds no run, Ctrl-C during a test pass,
progress bars only on a terminal, run folders where a checkpoint is asked for, and refusals that
say what to type instead (the nearest dataset or option, the option that conflicts with a checkpoint)."""
import os
import signal

import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.training import evaluation, progress

from cli_helpers import TINY, one_line_error, train
from helpers import metrics_without_times as metrics


@pytest.mark.parametrize("made", [False, True])
def test_resume_of_a_folder_without_a_run_is_refused_and_creates_nothing(data_dir, tmp_path, capsys, made):
    out = tmp_path / "runs" / "quik"
    if made:
        out.mkdir(parents=True)
    line = one_line_error(capsys, train(data_dir, out, "--resume", "--epochs", "1"))
    assert str(out) in line and ("does not exist" if not made else "holds no run") in line
    assert "without --resume" in line
    assert not out.exists() if not made else list(out.iterdir()) == []


def interrupt_in_test_pass(monkeypatch, n):
    """SIGINT to this process at the ``n``-th test batch (evaluation batches run with train=False)."""
    calls = {"n": 0}
    losses = evaluation.batch_losses

    def interrupting(model, x, y, weight, train, traces=None):
        if not train:
            calls["n"] += 1
            if calls["n"] == n:
                os.kill(os.getpid(), signal.SIGINT)
        return losses(model, x, y, weight, train, traces)

    monkeypatch.setattr(evaluation, "batch_losses", interrupting)
    return calls


@pytest.mark.parametrize("epoch", [1, 2])  # in the middle of a run, and in its last test pass
def test_ctrl_c_in_the_test_pass_stops_at_the_next_batch_and_resume_matches(data_dir, tmp_path, capsys, monkeypatch,
                                                                           epoch):
    assert train(data_dir, tmp_path / "whole", "--epochs", "2") == 0
    first_test_batch = 2 * (epoch - 1) + 1  # 16 test images: 2 batches per pass
    calls = interrupt_in_test_pass(monkeypatch, first_test_batch)
    assert train(data_dir, tmp_path / "cut", "--epochs", "2") == 130
    assert calls["n"] == first_test_batch  # the pass stopped before its next batch, not at its end
    err = capsys.readouterr().err
    assert f"continue with: tinygrad-caps train --resume --out {tmp_path / 'cut'}" in err
    saved = tc.load(tmp_path / "cut" / "checkpoints" / "last.npz")
    assert saved["progress"]["epoch"] == epoch - 1 and saved["progress"]["step"] == 5  # the epoch trained, uncommitted
    monkeypatch.undo()
    assert train(data_dir, tmp_path / "cut", "--epochs", "2", "--resume") == 0
    whole, cut = metrics(tmp_path / "whole"), metrics(tmp_path / "cut")
    assert len(cut) == 2
    for a, b in zip(whole, cut):
        assert a == pytest.approx(b, rel=1e-9)


def test_train_draws_no_bar_into_a_pipe_and_writes_its_lines_above_a_terminal_bar(data_dir, tmp_path, capsys,
                                                                                monkeypatch):
    args = ["train", "--dataset", "tiny", "--data-dir", str(data_dir), *[a for a in TINY if a != "--no-progress"],
            "--epochs", "1"]
    assert cli.main([*args, "--out", str(tmp_path / "piped")]) == 0
    captured = capsys.readouterr()
    assert "img/s" not in captured.err and "epoch 1/1" not in captured.err  # no bar: stderr is not a terminal
    written = []
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "write", classmethod(lambda cls, text, *a, **k: written.append(text)))
    assert cli.main([*args, "--out", str(tmp_path / "terminal")]) == 0
    assert f"run folder: {tmp_path / 'terminal'}" in written, (  # through the bar, which clears its line first
        written, progress.bars_wanted(False), capsys.readouterr())


def test_evaluate_takes_a_run_folder_and_says_which_checkpoint(data_dir, tmp_path, capsys):
    assert train(data_dir, tmp_path / "run", "--epochs", "1") == 0
    capsys.readouterr()
    assert cli.main(["evaluate", "--checkpoint", str(tmp_path / "run"), "--data-dir", str(data_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"using {tmp_path / 'run' / 'checkpoints' / 'best.npz'}" in out and "accuracy" in out
    (tmp_path / "empty").mkdir()
    line = one_line_error(capsys, cli.main(["evaluate", "--checkpoint", str(tmp_path / "empty")]))
    assert "checkpoints/best.npz" in line and str(tmp_path / "empty") in line


def test_an_unknown_dataset_lists_the_known_ones_and_the_nearest(tmp_path, capsys):
    line = one_line_error(capsys, cli.main(["train", "--dataset", "fashion_mnist", "--data-dir", str(tmp_path), *TINY]))
    assert "did you mean 'fashion-mnist'?" in line and "mnist, fashion-mnist, smallnorb, cifar10, imagefolder" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, nearest, command", [
    (["train", "--epcohs", "3"], "--epochs", "tinygrad-caps train"),
    (["study", "run", "gradient-modes", "--out", "x", "--seedz", "2"], "--seeds", "tinygrad-caps study run"),
    (["evaluate", "--checkpoint", "x", "--limit-tset", "5"], "--limit-test", "tinygrad-caps evaluate")])
def test_an_unknown_option_names_the_nearest_and_the_command_help(capsys, argv, nearest, command):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    line = one_line_error(capsys, info.value.code)
    assert f"did you mean {nearest}?" in line and f"(see {command} --help)" in line


def test_a_model_option_that_conflicts_with_the_checkpoint_is_named(data_dir, tmp_path, capsys):
    assert train(data_dir, tmp_path / "run", "--epochs", "1") == 0
    capsys.readouterr()
    checkpoint = str(tmp_path / "run" / "checkpoints" / "last.npz")
    for command in (["gradflow", "--out", str(tmp_path / "gf")], ["evaluate"]):
        line = one_line_error(capsys, cli.main([*command, "--checkpoint", checkpoint, "--data-dir", str(data_dir),
                                                "--conv1-channels", "6", "--no-progress"]))
        assert "--conv1-channels 6 (the checkpoint's is 4)" in line and "drop the option" in line
