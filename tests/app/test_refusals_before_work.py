"""Refusals before any work, with nothing left behind: ``train --tensorboard F`` where F cannot be a
folder is refused before the run folder is created; options that do not go together (a routing
without a capsule bias or without a detach mode) are refused before the dataset is loaded."""
import os

import pytest

from tinygrad_caps.models import cli

from cli_helpers import TINY, one_line_error


def train_line(capsys, data_dir, out, *extra):
    """The one-line refusal of ``train`` with the tiny options and ``extra``; nothing may be printed
    on stdout (no ``data:`` line: the dataset was not loaded)."""
    status = cli.main(["train", "--dataset", "tiny", "--data-dir", str(data_dir), "--out", str(out), *TINY,
                       "--epochs", "1", *extra])
    captured = capsys.readouterr()
    assert captured.out == "", captured.out
    err = captured.err
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def tensorboard_places(tmp_path):
    """(--tensorboard value, what the refusal says) for folders that cannot be made."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    places = [(a_file, f"--tensorboard {a_file} is an existing file, not a folder"),
              (a_file / "tb", f"--tensorboard {a_file / 'tb'}: {a_file} is a file, so no folder can be made under it"),
              ("/proc/tinygrad-caps-tb", "--tensorboard /proc/tinygrad-caps-tb: the folder /proc is not writable")]
    if os.geteuid() != 0:  # (root writes into a folder without write permission)
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        places.append((locked / "tb", f"the folder {locked} is not writable"))
    return places


def test_train_refuses_a_tensorboard_folder_it_cannot_make_before_creating_anything(data_dir, tmp_path, capsys):
    for place, message in tensorboard_places(tmp_path):
        out = tmp_path / "runs" / "quick"
        line = train_line(capsys, data_dir, out, "--tensorboard", str(place))
        assert message in line
        assert not (tmp_path / "runs").exists(), place  # no config.json, metrics.jsonl or checkpoints/


@pytest.mark.parametrize("options, message", [
    (["--routing", "em", "--recipe", "authors", "--capsule-bias"], "routing 'em' takes no capsule bias"),
    (["--routing", "self-attention", "--routing-gradient", "detach"],
     "routing 'self-attention' is not iterative: it has no 'detach' gradient mode"),
    (["--routing", "em", "--conventions", "official"], "routing 'em' takes no capsule bias"),
    # TINY's --decoder-hidden 16,32 sizes the FC decoder, which --decoder deconv replaces
    (["--decoder", "deconv"],
     "--decoder-hidden sizes the fully connected decoder (--decoder fc), not the 'deconv' one"),
])
def test_options_that_do_not_go_together_are_refused_before_the_data_is_loaded(tmp_path, capsys, options, message):
    # the data folder holds no dataset: a refusal after loading would name the missing data instead
    empty = tmp_path / "no-data"
    empty.mkdir()
    out = tmp_path / "run"
    line = train_line(capsys, empty, out, *options)
    assert message in line
    assert not out.exists()
