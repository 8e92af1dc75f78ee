"""``study run`` with its runs one at a time in its own process (``--jobs 1``, the default) goes
through the one scheduling loop, ``driver.drive_runs``, with an ``InProcessExecutor``: its lines are
those a study has always printed (recorded below), a failed run leaves the others going, the time
limit stops the study between runs, and Ctrl-C, in a run or between two, stops it with the command
that continues it."""
import os
import re
import signal

import pytest

import tinygrad_caps as tc
from cli_helpers import TINY, tiny_data_dir
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.studies import driver, in_process_executor, runner
from tinygrad_caps.models.app.studies.driver import StudyResult, drive_runs
from tinygrad_caps.models.app.studies.folder import StudyFolder
from tinygrad_caps.models.app.studies.in_process_executor import InProcessExecutor
from tinygrad_caps.models.app.studies.outcome import Outcome, RunResult
from tinygrad_caps.models.app.studies.plan import StudyPlan
from tinygrad_caps.models.app.training.run_state import Interrupted

STUDY = ["--seed-list", "0", "--epochs", "1", "--log-gradflow", "1", "--device", "cpu"]
# The lines of `study run gradient-modes ... --out study` (the study's and its runs', before the summary), as
# the sequential loop printed them before the runs went through drive_runs; losses, accuracies and
# times masked (#).
TRANSCRIPT = """\
[routing1 seed 0] training study/runs/routing1/seed-0
[routing1 seed 0] data: tiny from data/tiny, 24 training and 12 test images, 3 classes
[routing1 seed 0] run folder: study/runs/routing1/seed-0
[routing1 seed 0] epoch 1: train loss # acc # | test loss # acc # | #s
[routing3-full seed 0] training study/runs/routing3-full/seed-0
[routing3-full seed 0] data: tiny from data/tiny, 24 training and 12 test images, 3 classes
[routing3-full seed 0] run folder: study/runs/routing3-full/seed-0
[routing3-full seed 0] epoch 1: train loss # acc # | test loss # acc # | #s
[routing3-detach seed 0] training study/runs/routing3-detach/seed-0
[routing3-detach seed 0] data: tiny from data/tiny, 24 training and 12 test images, 3 classes
[routing3-detach seed 0] run folder: study/runs/routing3-detach/seed-0
[routing3-detach seed 0] epoch 1: train loss # acc # | test loss # acc # | #s
"""


def masked(text):
    """``text``'s lines before the summary, each number with a fraction (losses, accuracies, times) as #."""
    lines = text.split("# Study ")[0]
    return re.sub(r"\| \d+s$", "| #s", re.sub(r"\d+\.\d+(e-?\d+)?", "#", lines), flags=re.MULTILINE)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """``tmp_path`` as the working folder, with the tiny dataset in data/."""
    tiny_data_dir(tmp_path / "data", (24, 12), compress=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "1")
    return tmp_path


def study(*extra, out="study"):
    return cli.main(["study", "run", "gradient-modes", "--out", out, "--dataset", "tiny", "--data-dir", "data",
                     *TINY, *STUDY, *extra])


def test_the_sequential_loop_is_gone():
    assert not hasattr(runner, "train_runs") and not hasattr(runner, "check_plan_runs")


def test_jobs_1_prints_the_lines_a_study_has_always_printed(here, capsys):
    assert study() == 0
    printed = capsys.readouterr()
    assert masked(printed.out) == TRANSCRIPT
    assert "stopping" not in printed.out + printed.err and "study:" not in printed.out  # (no progress line)
    assert (here / "study" / "runs" / "routing1" / "seed-0" / "train.log").read_text().splitlines() == [
        line.split("] ", 1)[1] for line in printed.out.splitlines()[1:4]]
    capsys.readouterr()
    assert study("--resume") == 0  # finished runs: no run line at all
    assert "[routing" not in capsys.readouterr().out


def interrupt_at_step(monkeypatch, n):
    """SIGINT to this process in the ``n``-th optimizer step."""
    calls, step = {"n": 0}, tc.optim.Adam.step

    def interrupting(self):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    monkeypatch.setattr(tc.optim.Adam, "step", interrupting)


def test_ctrl_c_in_a_run_saves_it_and_stops_the_study_with_the_command_that_continues(here, capsys, monkeypatch):
    interrupt_at_step(monkeypatch, 5)  # the second run's second batch (3 batches a run)
    assert study() == 130
    printed = capsys.readouterr()
    assert printed.err.strip().splitlines()[-1] == ("study stopped; continue it with: tinygrad-caps study run "
                                                    "gradient-modes --out study --resume")
    assert "[routing3-full seed 0] training" in printed.out and "routing3-detach" not in printed.out
    assert "stopping" not in printed.out
    folder = StudyFolder(here / "study")
    assert folder.run("routing3-full", 0).last.exists() and not folder.stop.exists() and not folder.lock.exists()
    monkeypatch.undo()
    monkeypatch.chdir(here)
    assert study("--resume") == 0
    out = capsys.readouterr().out
    assert "[routing3-full seed 0] continuing study/runs/routing3-full/seed-0" in out
    assert "[routing3-detach seed 0] training" in out and "[routing1 seed 0]" not in out


# --- the loop with a stand-in for the runs' training (no data, no Trainer) ---

def stand_in_plan(tmp_path):
    record = {"study": "s", "epochs": 1, "seeds": [0, 1], "options": {},
              "configs": [{"config_id": c, "options": {}, "runs": [{"seed": s, "path": f"runs/{c}/seed-{s}"}
                                                                    for s in (0, 1)]} for c in ("a", "b")]}
    return StudyPlan.from_json(record), StudyFolder(tmp_path / "s")


def trained_as(monkeypatch, outcomes):
    """``train_study_run`` stood in for: each run ends as ``outcomes`` says (by label; default FINISHED),
    and, as the real one does first, as INTERRUPTED (untrained) where DIR/study.stop exists."""
    trained = []

    def train(folder, config_id, seed, **options):
        if StudyFolder.of(folder).stop.exists():
            return RunResult(None, Outcome.INTERRUPTED)
        label = f"{config_id} seed {seed}"
        trained.append(label)
        outcome, data = outcomes.get(label, (Outcome.FINISHED, {}))
        if callable(outcome):
            outcome = outcome()
        return RunResult(None, outcome, **data)

    monkeypatch.setattr(in_process_executor, "train_study_run", train)
    return trained


def test_a_failed_run_leaves_the_others_going(tmp_path, monkeypatch, capsys):
    plan, folder = stand_in_plan(tmp_path)
    trained = trained_as(monkeypatch, {"a seed 1": (Outcome.FAILED, {"reason": "bad data"})})
    result = drive_runs(plan, folder, InProcessExecutor(folder))
    assert trained == ["a seed 0", "a seed 1", "b seed 0", "b seed 1"]
    assert isinstance(result, StudyResult) and (result.finished, result.total, result.stopped) == (3, 4, False)
    assert [(r.run.label, r.reason) for r in result.failed] == [("a seed 1", "bad data")]
    assert "[a seed 1] failed: bad data" in capsys.readouterr().out.splitlines()
    driver.print_failures(result)
    assert capsys.readouterr().out == "failed: a seed 1: bad data\n"


def test_the_time_limit_stops_the_study_between_runs_after_the_first(tmp_path, monkeypatch, capsys):
    plan, folder = stand_in_plan(tmp_path)
    trained = trained_as(monkeypatch, {})
    readings = iter([5.0, 20.0])  # the limit is 10: the second run starts, the third does not
    result = drive_runs(plan, folder, InProcessExecutor(folder), deadline=10.0, clock=lambda: next(readings))
    assert trained == ["a seed 0", "a seed 1"] and (result.finished, result.stopped) == (2, True)
    trained.clear()
    result = drive_runs(plan, folder, InProcessExecutor(folder), deadline=10.0, clock=lambda: 99.0)
    assert trained == ["a seed 0"] and result.stopped  # every call trains its first run


def test_a_run_stopped_by_the_time_limit_stops_the_study(tmp_path, monkeypatch):
    plan, folder = stand_in_plan(tmp_path)
    trained = trained_as(monkeypatch, {"a seed 0": (Outcome.STOPPED, {})})
    result = drive_runs(plan, folder, InProcessExecutor(folder), deadline=10.0, clock=lambda: 0.0)
    assert trained == ["a seed 0"] and result == StudyResult(0, 4, True, ())


def test_an_interrupted_run_stops_the_study_and_a_stale_stop_file_goes_first(tmp_path, monkeypatch, capsys):
    plan, folder = stand_in_plan(tmp_path)
    folder.path.mkdir(parents=True)
    folder.stop.write_text("stop\n")  # left by a driver killed while stopping

    def interrupted():
        assert not folder.stop.exists()
        return Outcome.INTERRUPTED

    trained = trained_as(monkeypatch, {"a seed 1": (interrupted, {"signum": int(signal.SIGTERM)})})
    with pytest.raises(Interrupted) as stopped:
        drive_runs(plan, folder, InProcessExecutor(folder), resume_command="continue here")
    assert stopped.value.signum == signal.SIGTERM and trained == ["a seed 0", "a seed 1"]
    printed = capsys.readouterr()
    assert printed.err == "study stopped; continue it with: continue here\n"
    assert "stopping" not in printed.out and not folder.stop.exists()


def test_ctrl_c_between_two_runs_stops_the_study_before_the_next(tmp_path, monkeypatch, capsys):
    plan, folder = stand_in_plan(tmp_path)
    trained = trained_as(monkeypatch, {})
    handed, hand_over = [], in_process_executor.SequentialLines.run_handed_over

    def ctrl_c_at_the_second(self, run, run_dir, retry=""):
        handed.append(run.label)
        if len(handed) == 2:
            raise KeyboardInterrupt
        return hand_over(self, run, run_dir, retry)

    monkeypatch.setattr(in_process_executor.SequentialLines, "run_handed_over", ctrl_c_at_the_second)
    with pytest.raises(Interrupted) as stopped:
        drive_runs(plan, folder, InProcessExecutor(folder))
    assert stopped.value.signum == signal.SIGINT and trained == ["a seed 0"]
    assert capsys.readouterr().err.startswith("study stopped; continue it with: tinygrad-caps study run s --out ")
    assert not folder.stop.exists()
