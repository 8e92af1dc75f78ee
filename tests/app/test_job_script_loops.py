"""One command that starts or continues, for job scripts: ``study run ... --resume-or-start`` and
``train ... --resume-or-start``. docs/studies.md's job-script loop, run as written from an empty
folder, ends with the study finished and equal to one never stopped; a train job killed and run
again with the same command ends as a run never stopped. ``--resume`` keeps refusing a folder
without a study or run (a typo), and ``--resume-or-start`` keeps refusing what ``--resume`` and a
start refuse."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import cli

from cli_helpers import TINY, one_line_error, tiny_data_dir, train
from helpers import metrics_without_times as metrics
from study_helpers import study_files

ROOT = Path(__file__).resolve().parents[2]
# the loop of docs/studies.md: until COMMAND; [ $? -ne 75 ]; do :; done
LOOP = re.compile(r"^until (?P<command>tinygrad-caps study run (?P<name>\S+) --out (?P<out>\S+) (?P<options>.*)); "
                  r"\[ \$\? -ne 75 \]; do :; done$", re.MULTILINE)


def documented_loop():
    """The job-script loop of docs/studies.md and its options (``--resume-or-start --max-minutes 55``)."""
    found = LOOP.search((ROOT / "docs" / "studies.md").read_text())
    assert found, "docs/studies.md has no job-script loop `until tinygrad-caps study run ...; [ $? -ne 75 ]; ...`"
    return found


def tiny_study(root):
    """gradient-modes with one seed, one epoch and one batch per epoch: 3 runs."""
    data = tiny_data_dir(root, (8, 4), compress=False)
    return ["--dataset", "tiny", "--data-dir", str(data), *TINY, "--seeds", "1", "--epochs", "1"]


def command_path_env(**extra):
    """The environment of a child process that finds this Python's ``tinygrad-caps`` first."""
    env = dict(os.environ, **extra)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@pytest.mark.slow
def test_the_documented_study_loop_goes_from_an_empty_folder_to_the_finished_study(tmp_path, monkeypatch):
    loop = documented_loop()
    assert loop["options"].split() == ["--resume-or-start", "--max-minutes", "55"]
    options = tiny_study(tmp_path / "data")
    out = tmp_path / "jobs" / "study"  # (its parent does not exist either)
    # the documented loop, word for word, with this study's options and a limit every call reaches
    command = " ".join(["tinygrad-caps", "study", "run", "gradient-modes", "--out", str(out), *options,
                        "--resume-or-start", "--max-minutes", "0.0001"])
    script = loop[0].replace(loop["command"], command)
    done = subprocess.run(["bash", "-c", script], env=command_path_env(TINYGRAD_CAPS_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = done.stdout.count("; continue with: ")
    assert calls >= 2, done.stdout  # stopped by the limit at least twice, then finished
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["runs_finished"] == summary["runs_planned"] == 3
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "1")
    whole = tmp_path / "whole"
    assert cli.main(["study", "run", "gradient-modes", "--out", str(whole), *options]) == 0
    assert study_files(out) == study_files(whole)


def test_resume_or_start_of_a_folder_with_another_study_plan_is_refused_as_resume_refuses_it(tmp_path, capsys):
    options = tiny_study(tmp_path / "data")
    out = tmp_path / "study"
    assert cli.main(["study", "run", "gradient-modes", "--out", str(out), *options, "--max-minutes", "0.0001"]) == 75
    plan = (out / "study.json").read_bytes()
    capsys.readouterr()
    line = one_line_error(capsys, cli.main(["study", "run", "gradient-modes", "--out", str(out), *options,
                                            "--lr", "0.01", "--resume-or-start"]))
    assert "--resume: --lr 0.01 differs from the study's 0.001" in line
    line = one_line_error(capsys, cli.main(["study", "run", "conventions", "--out", str(out), *options,
                                            "--resume-or-start"]))
    assert f"{out} holds the study gradient-modes, not conventions" in line
    assert (out / "study.json").read_bytes() == plan


def test_resume_or_start_never_adopts_run_folders_without_a_study(tmp_path, capsys):
    out = tmp_path / "study"
    (out / "runs").mkdir(parents=True)
    line = one_line_error(capsys, cli.main(["study", "run", "gradient-modes", "--out", str(out),
                                            *tiny_study(tmp_path / "data"), "--resume-or-start"]))
    assert "holds run folders but no study.json" in line


@pytest.mark.parametrize("command", [["train"], ["study", "run", "gradient-modes"]])
def test_resume_and_resume_or_start_together_are_one_line_error(tmp_path, capsys, command):
    with pytest.raises(SystemExit) as stopped:
        cli.main([*command, "--out", str(tmp_path / "x"), "--resume", "--resume-or-start"])
    line = one_line_error(capsys, stopped.value.code)
    assert "--resume-or-start: not allowed with argument --resume" in line
    assert not (tmp_path / "x").exists()


def test_resume_of_an_empty_folder_is_refused_and_names_resume_or_start(data_dir, tmp_path, capsys):
    out = tmp_path / "fresh"
    out.mkdir()
    line = one_line_error(capsys, train(data_dir, out, "--resume", "--epochs", "1"))
    assert f"{out} holds no run" in line and "--resume-or-start" in line
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_a_train_job_run_again_with_the_same_command_ends_as_a_run_never_stopped(data_dir, tmp_path, monkeypatch,
                                                                                capsys):
    assert train(data_dir, tmp_path / "whole", "--epochs", "2") == 0
    out = tmp_path / "jobs" / "run"  # nothing there yet: the first job starts the run
    job = ["--epochs", "2", "--resume-or-start"]
    step, calls = tc.optim.Adam.step, {"n": 0}

    def stopped_by_the_scheduler(self):  # SIGTERM, as a batch system sends at a job's end, in batch 7
        calls["n"] += 1
        if calls["n"] == 7:
            os.kill(os.getpid(), 15)
        return step(self)

    monkeypatch.setattr(tc.optim.Adam, "step", stopped_by_the_scheduler)
    assert train(data_dir, out, *job) == 143
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    capsys.readouterr()
    assert train(data_dir, out, *job) == 0  # the next job: the same command continues it
    printed = capsys.readouterr().out
    assert f"resuming {out} at epoch 2, batch 2" in printed
    assert metrics(out) == metrics(tmp_path / "whole")
    assert train(data_dir, out, *job) == 0  # and a job after the end trains nothing
    assert f"{out} has trained its 2 epochs: nothing to train" in capsys.readouterr().out
