"""A resumed run or study computes what it would have computed never stopped: a run records the
thread count it trains with (config.json's ``threads``) and ``--resume`` restores it (another
``--threads`` is taken with a warning that the last bits will differ); the command a stopped study
prints repeats every scheduling option it was started with, so that the printed command alone
continues it bit for bit; and each command's ``--resume`` refusal lists that command's own
options that may change."""
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import cli
from tinygrad_caps.models.app.cli import study as study_command, train as train_command
from tinygrad_caps.models.app.cli.training_options import may_change_on_resume
from tinygrad_caps.models.app.training import threads, trainer as training
from tinygrad_caps.models.app.training.run_options import train_may_change_on_resume

from cli_helpers import one_line_error, train
from helpers import with_default_sigint
from study_helpers import leftovers, study_argv, study_files


def spy_on_threads(monkeypatch):
    """The thread counts the Trainer's runs compute with, in order."""
    counts, run_threads = [], training.run_threads

    def recorded(count):
        counts.append(count)
        return run_threads(count)

    monkeypatch.setattr(training, "run_threads", recorded)
    return counts


def interrupt_at_step(monkeypatch, n):
    """SIGINT to this process in the ``n``-th optimizer step; returns the step to put back."""
    calls, step = {"n": 0}, tc.optim.Adam.step

    def interrupting(self):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self)

    monkeypatch.setattr(tc.optim.Adam, "step", interrupting)
    return step


def run_threads_recorded(out):
    return json.loads((out / "config.json").read_text())["threads"]


def test_run_threads_sets_the_engine_and_blas_threads_and_puts_them_back(monkeypatch):
    monkeypatch.setenv(threads.ENGINE_VARIABLE, "3")
    before = threads.blas_threads()
    with threads.run_threads(1):
        assert os.environ[threads.ENGINE_VARIABLE] == "1" and threads.default_threads() == 1
        if threads.blas_settable():
            assert threads.blas_threads() == 1
    assert os.environ[threads.ENGINE_VARIABLE] == "3" and threads.blas_threads() == before
    monkeypatch.delenv(threads.ENGINE_VARIABLE)  # then BLAS's own count (its variables', else the CPUs)
    assert threads.default_threads() == (threads.blas_threads() or threads.usable_cpus())


def test_numpy_s_blas_threads_can_be_set_here():
    # NumPy's wheels bring OpenBLAS: a run that could not set its threads would not be reproducible
    assert threads.blas_settable()


@pytest.mark.slow
def test_a_run_records_its_thread_count_and_resume_restores_it(data_dir, tmp_path, monkeypatch, capsys):
    counts = spy_on_threads(monkeypatch)
    assert train(data_dir, tmp_path / "whole", "--epochs", "2", "--threads", "1") == 0
    assert run_threads_recorded(tmp_path / "whole") == 1
    out = tmp_path / "cut"
    step = interrupt_at_step(monkeypatch, 7)
    assert train(data_dir, out, "--epochs", "2", "--threads", "1") == 130
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    monkeypatch.setenv(threads.ENGINE_VARIABLE, "2")  # the environment says otherwise: the run's own count wins
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert counts == [1, 1, 1] and run_threads_recorded(out) == 1
    assert "warning" not in capsys.readouterr().out
    whole, cut = (tmp_path / name / "metrics.jsonl" for name in ("whole", "cut"))
    assert [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in cut.read_text().splitlines()] \
        == [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in whole.read_text().splitlines()]


@pytest.mark.slow
def test_resume_with_another_thread_count_takes_it_and_warns_of_the_last_bits(data_dir, tmp_path, monkeypatch,
                                                                            capsys):
    out = tmp_path / "run"
    step = interrupt_at_step(monkeypatch, 3)
    assert train(data_dir, out, "--epochs", "1", "--threads", "1") == 130
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    counts = spy_on_threads(monkeypatch)
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(out), "--threads", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert (f"warning: {out} trained with 1 thread and continues with 2: BLAS then sums in another order, so its "
            "results will differ in their last bits from a run never stopped (--threads 1 keeps them identical)"
            ) in printed
    assert printed.count("warning") == 1 and counts == [2] and run_threads_recorded(out) == 2


def test_a_run_without_threads_records_the_count_of_its_process(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(threads.ENGINE_VARIABLE, "3")
    assert train(data_dir, tmp_path / "run", "--epochs", "1", "--limit-train", "8", "--limit-test", "8") == 0
    assert run_threads_recorded(tmp_path / "run") == 3


def test_the_ctrl_c_hint_of_train_is_the_whole_command_and_it_continues_the_run(data_dir, tmp_path, monkeypatch,
                                                                                capsys):
    assert train(data_dir, tmp_path / "whole", "--epochs", "1") == 0
    step = interrupt_at_step(monkeypatch, 2)
    assert train(data_dir, tmp_path / "cut", "--epochs", "1") == 130
    monkeypatch.setattr(tc.optim.Adam, "step", step)
    hint = capsys.readouterr().err.strip().splitlines()[-1]
    command = hint.split("; continue with: ", 1)[1]
    assert command == f"tinygrad-caps train --resume --out {shlex.quote(str(tmp_path / 'cut'))}"
    words = shlex.split(command)
    assert cli.main([*words[1:], "--no-progress"]) == 0
    whole, cut = ((tmp_path / name / "metrics.jsonl").read_text().splitlines() for name in ("whole", "cut"))
    assert [json.loads(a) | {"seconds": 0} for a in cut] == [json.loads(a) | {"seconds": 0} for a in whole]


def test_each_command_lists_its_own_options_that_may_change_on_resume():
    train_list = may_change_on_resume(train_command.own_parser())
    assert train_list == train_may_change_on_resume()
    assert "--tensorboard" in train_list and "--threads" in train_list and "--seeds" not in train_list
    study_list = may_change_on_resume(study_command.run_parser())
    for flag in ("--seeds", "--seed-list", "--max-depth", "--epochs", "--tensorboard-out", "--data-dir", "--device",
                 "--jobs", "--threads-per-run", "--executor", "--devices", "--runs-per-device"):
        assert flag in study_list, flag
    assert "--tensorboard" not in study_list and "--threads" not in study_list and "--lr" not in study_list
    run_flags = {flag for action in study_command.run_parser()._actions for flag in action.option_strings}
    assert set(study_list) <= run_flags


@pytest.mark.slow
def test_study_resume_refuses_another_lr_with_the_study_s_own_list(tmp_path, data_options, capsys):
    out = tmp_path / "study"
    assert cli.main(study_argv(out, data_options, "--max-minutes", "0.0001")) == 75
    capsys.readouterr()
    line = one_line_error(capsys, cli.main(["study", "run", "gradient-modes", "--out", str(out), "--resume",
                                            "--lr", "0.01"]))
    listed = line.split("(only ", 1)[1].split(" may change)", 1)[0].split(", ")
    assert listed == may_change_on_resume(study_command.run_parser())
    assert "--lr 0.01 differs from the study's 0.001; a study continues as it was configured" in line
    assert "start a new study with another --out" in line


def test_the_continue_command_repeats_the_scheduling_options_given():
    from tinygrad_caps.models.app.studies.plan import PlannedConfig, PlannedRun, StudyPlan

    plan = StudyPlan(study="depth", epochs=1, seeds=[0], options={}, tensorboard_out="tb dir",
                     configs=[PlannedConfig("a", {}, [PlannedRun("a", 0, "runs/a/seed-0")])])
    args = type("Args", (), dict(jobs=2, threads_per_run=1, executor="local", devices=None, runs_per_device=None,
                                 ray_address=None, cpus_per_run=None, gpus_per_run=None, max_retries=5))()
    words = study_command.scheduling_words(args, {"jobs", "threads_per_run", "max_retries"})
    assert words == ["--jobs", "2", "--threads-per-run", "1", "--max-retries", "5"]
    assert plan.continue_command("runs/d e", words) == ("tinygrad-caps study run depth --out 'runs/d e' --resume "
                                                         "--tensorboard-out 'tb dir' --jobs 2 --threads-per-run 1 "
                                                         "--max-retries 5")


def _pid(lock):
    """The pid a run lock names (None while its holder is still writing it)."""
    try:
        return json.loads(lock.read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _stopped(pid) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): its state in /proc is T."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _wait_for(predicate, seconds=180.0):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_a_study_stopped_with_ctrl_c_and_continued_by_the_printed_command_alone_is_bit_identical(
        tmp_path, data_options, sequential_study):
    out = tmp_path / "study"
    # every run process stops itself (SIGSTOP) in its second batch: the Ctrl-C cannot come after the study
    # has finished, whatever the machine's speed
    env = dict(os.environ, TINYGRAD_CAPS_TEST_CRASH="optimizer-step@2:STOP")
    driver = subprocess.Popen([sys.executable, "-m", "tinygrad_caps.models.cli",
                               *study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              preexec_fn=with_default_sigint)
    try:
        locks = lambda: list((out / "runs").glob("*/seed-*/run.lock"))  # noqa: E731
        _wait_for(lambda: driver.poll() is not None or (len(locks()) == 2 and all(map(_stopped, map(_pid, locks())))))
        assert driver.poll() is None, driver.communicate()
        pids = [_pid(p) for p in locks()]
        driver.send_signal(signal.SIGINT)
        _wait_for(lambda: (out / "study.stop").exists() or driver.poll() is not None)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        stdout, stderr = driver.communicate(timeout=300)
    finally:
        driver.kill()
    assert driver.returncode == 130, stderr
    assert "study: 0 finished, 2 running (" in stdout  # running from their "started" lines
    hint = [line for line in stderr.splitlines() if "continue it with: " in line][-1]
    command = shlex.split(hint.split("continue it with: ", 1)[1])
    assert command[:7] == ["tinygrad-caps", "study", "run", "gradient-modes", "--out", str(out), "--resume"]
    assert command[7:] == ["--jobs", "2", "--threads-per-run", "1"]
    assert leftovers(out) == []
    resumed = subprocess.run([sys.executable, "-m", "tinygrad_caps.models.cli", *command[1:]],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert study_files(out) == sequential_study
    assert {json.loads(p.read_text())["threads"] for p in out.glob("runs/*/seed-*/config.json")} == {1}
