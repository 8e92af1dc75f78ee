"""Messages that do not mislead: the study's progress line counts a run as running from its
"started" line; "1 epoch", not "1 epochs"; every command takes the options the others share
(``--no-progress``, ``--debug``); a study without matplotlib says in one line which picture it did
not draw and how to get it."""
import sys

import pytest

from tinygrad_caps.models import cli
from tinygrad_caps.models.app.cli.parser import command_parsers, make_parser
from tinygrad_caps.models.app.studies.study_progress import StudyProgress

from cli_helpers import TINY, tiny_data_dir, train

SHARED_OPTIONS = ("--no-progress", "--debug")


def test_a_run_counts_as_running_from_its_started_line(tmp_path, capsys):
    runs = [(f"c seed {s}", tmp_path / f"seed-{s}") for s in range(3)]
    for _, run_dir in runs:
        run_dir.mkdir()
    progress = StudyProgress(runs, epochs=2, terminal=False, clock=lambda: 0.0)
    progress.run_started("c seed 0", "[c seed 0] started: there")  # its process has not taken its lock yet
    progress.run_started("c seed 1", "[c seed 1] started: there")
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["[c seed 0] started: there", "study: 0 finished, 1 running (c seed 0 epoch 1/2), 2 left",
                       "[c seed 1] started: there",
                       "study: 0 finished, 2 running (c seed 0 epoch 1/2, c seed 1 epoch 1/2), 1 left"]


def test_a_ray_task_counts_as_running_once_it_holds_its_run_lock_and_says_so(tmp_path, capsys):
    runs = [(f"c seed {s}", tmp_path / f"seed-{s}") for s in range(2)]
    for _, run_dir in runs:
        run_dir.mkdir()
    progress = StudyProgress(runs, epochs=2, terminal=False, clock=lambda: 0.0)
    progress.running.update({"c seed 0", "c seed 1"})  # submitted, waiting for resources
    progress.note_started()
    assert capsys.readouterr().out == "" and progress.line() == "study: 0 finished, 0 running, 2 left"
    (runs[1][1] / "run.lock").write_text("{}")
    progress.note_started()
    assert capsys.readouterr().out.splitlines() == ["[c seed 1] started",
                                                    "study: 0 finished, 1 running (c seed 1 epoch 1/2), 1 left"]
    progress.note_started()  # said once
    assert capsys.readouterr().out == ""


def test_a_finished_run_of_one_epoch_says_epoch(data_dir, tmp_path, capsys):
    assert train(data_dir, tmp_path / "run", "--epochs", "1", "--limit-train", "8", "--limit-test", "8") == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert f"{tmp_path / 'run'} has trained its 1 epoch: nothing to train (--epochs N with N > 1 extends it)" \
        in capsys.readouterr().out


def test_every_command_takes_the_options_the_commands_share():
    leaves = [p for p in command_parsers(make_parser()) if not p._subparsers]
    assert {p.prog for p in leaves} >= {f"tinygrad-caps {name}" for name in ("train", "evaluate", "visualize",
                                                                           "gradflow", "graph", "plot")}
    assert {"tinygrad-caps study run", "tinygrad-caps study summary", "tinygrad-caps study list"} <= \
        {p.prog for p in leaves}
    for parser in leaves:
        flags = {flag for action in parser._actions for flag in action.option_strings}
        for option in SHARED_OPTIONS:
            assert option in flags, f"{parser.prog} lacks {option}"


@pytest.mark.slow
def test_plot_and_study_list_take_no_progress(data_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert train(data_dir, tmp_path / "run", "--epochs", "1", "--limit-train", "8", "--limit-test", "8") == 0
    assert cli.main(["plot", str(tmp_path / "run"), "--no-progress", "--debug"]) == 0
    assert cli.main(["study", "list", "--no-progress"]) == 0
    assert (tmp_path / "run" / "plot.png").is_file()


@pytest.mark.slow
def test_a_study_without_matplotlib_says_which_picture_it_did_not_draw_and_how_to_get_it(tmp_path, capsys,
                                                                                       monkeypatch):
    data = tiny_data_dir(tmp_path / "data", (8, 4), compress=False)
    for name in [name for name in sys.modules if name == "matplotlib" or name.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    out = tmp_path / "study"
    assert cli.main(["study", "run", "gradient-modes", "--out", str(out), "--dataset", "tiny", "--data-dir",
                     str(data), *TINY, "--seeds", "1", "--epochs", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if "summary.png" in line] == [
        f"not drawn: {out / 'summary.png'} (it needs matplotlib: pip install matplotlib, or pip install -e '.[viz]')"]
    assert (out / "summary.json").is_file() and not (out / "summary.png").exists()
    assert cli.main(["study", "summary", str(out)]) == 0
    assert f"not drawn: {out / 'summary.png'}" in capsys.readouterr().out
