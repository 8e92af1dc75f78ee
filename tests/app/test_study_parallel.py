"""``study run --jobs N``: several runs at once, each in its own worker process, with real processes
and real signals. The runs' metrics.jsonl (wall-clock fields aside) and summary.json equal those of
the study trained one run at a time in the driver's process; a run process SIGKILLed mid-epoch is
started again and ends as if never killed; a driver SIGKILLed mid-study (its workers die with it) and
resumed, and one stopped with Ctrl-C and resumed, end the same; a failing run leaves the others
finished and is reported with its last error line; a run folder held by another process is never
trained twice; the bad scheduling options are one-line errors with nothing created."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import tinygrad_caps as tc
from cli_helpers import TINY, one_line_error
from helpers import with_default_sigint
from study_helpers import leftovers, study_argv, study_files
from tinygrad_caps.models import cli

pytestmark = pytest.mark.slow


def driver(argv, **options):
    """``tinygrad-caps`` run as a process of its own (the tests that signal or kill the driver), with SIGINT at
    its default disposition however this suite was started (``helpers.with_default_sigint``)."""
    return subprocess.Popen([sys.executable, "-m", "tinygrad_caps.models.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=with_default_sigint, **options)


def wait_for(predicate, seconds=120.0):
    """Poll ``predicate`` until it holds: for what must happen (a held run, a file the driver writes), never
    for a moment to catch; fails after ``seconds``."""
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def held_at(hold, point="optimizer-step@2"):
    """The environment whose runs stop at ``point`` (by default after the 2nd batch of their first epoch)
    until ``hold``/release exists (run_state.py's TINYGRAD_CAPS_TEST_HOLD): no run can finish before the
    test has done what it must do mid-study."""
    hold.mkdir()
    return dict(os.environ, TINYGRAD_CAPS_TEST_HOLD=f"{point}:{hold}")


def held(hold):
    """The PIDs of the run processes held in ``hold``."""
    return [int(p.name.split("-")[1]) for p in hold.glob("held-*")]


def test_two_jobs_give_the_files_of_the_sequential_study_and_each_run_its_train_log(
        tmp_path, data_options, sequential_study, capsys):
    out = tmp_path / "study"
    assert cli.main(study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1")) == 0
    assert study_files(out) == sequential_study
    printed = capsys.readouterr().out
    assert f"[routing3-detach seed 0] started: {out / 'runs/routing3-detach/seed-0'}" in printed
    assert "[routing1 seed 0] finished" in printed and "study: 3 finished, 0 running, 0 left" in printed
    for run_dir in (out / "runs").glob("*/seed-*"):
        log = (run_dir / "train.log").read_text()
        assert f"run folder: {run_dir}" in log and "epoch 2: train loss" in log
    assert leftovers(out) == []


def test_a_run_process_killed_mid_epoch_is_started_again_and_ends_as_if_never_killed(
        tmp_path, data_options, sequential_study, capsys, monkeypatch):
    out, marker = tmp_path / "study", tmp_path / "killed-once"
    monkeypatch.setenv("TINYGRAD_CAPS_TEST_CRASH", "optimizer-step@2:KILL")  # the 2nd batch of epoch 1
    monkeypatch.setenv("TINYGRAD_CAPS_TEST_CRASH_ONCE", str(marker))
    assert cli.main(study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1")) == 0
    assert marker.exists()
    printed = capsys.readouterr().out
    assert "its process was killed by SIGKILL; starting it again from its last checkpoint" in printed
    assert "(retry 1 of 3)" in printed
    assert study_files(out) == sequential_study and leftovers(out) == []


def test_a_run_killed_more_often_than_max_retries_is_reported_and_resume_finishes_it(
        tmp_path, data_options, sequential_study, capsys, monkeypatch):
    out = tmp_path / "study"
    monkeypatch.setenv("TINYGRAD_CAPS_TEST_CRASH", "optimizer-step@2:KILL")  # every process of every run
    assert cli.main(study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1", "--max-retries", "1")) == 1
    printed = capsys.readouterr().out
    assert "failed: routing1 seed 0: its process was killed by SIGKILL" in printed
    assert f"retry the failed with: tinygrad-caps study run gradient-modes --out {out} --resume" in printed
    monkeypatch.delenv("TINYGRAD_CAPS_TEST_CRASH")
    assert cli.main(["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress", "--jobs", "2",
                     "--threads-per-run", "1"]) == 0
    assert study_files(out) == sequential_study


def test_a_failing_run_leaves_the_others_finished_and_is_listed_with_its_error(tmp_path, data_options, capsys):
    out = tmp_path / "study"
    jobs = ["--jobs", "2", "--threads-per-run", "1"]
    assert cli.main(study_argv(out, data_options, *jobs, "--epochs", "1")) == 0
    # damage two runs: a folder where their config.json must be rewritten on resume
    for config_id in ("routing3-full", "routing3-detach"):
        config = out / f"runs/{config_id}/seed-0/config.json"
        config.unlink()
        (config / "in-the-way").mkdir(parents=True)
    capsys.readouterr()
    resume = ["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress", "--epochs", "2", *jobs]
    assert cli.main(resume) == 1
    printed = capsys.readouterr().out
    assert "[routing3-full seed 0] failed: " in printed and "config.json" in printed and "Traceback" not in printed
    assert f"retry the failed with: tinygrad-caps study run gradient-modes --out {out} --resume" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [(f["config_id"], f["seed"]) for f in summary["failed"]] == [("routing3-full", 0), ("routing3-detach", 0)]
    assert summary["runs_finished"] == 1 and [row["n"] for row in summary["rows"]] == [1, 0, 0]
    error = json.loads((out / "runs/routing3-detach/seed-0/failed.json").read_text())["error"]
    assert error == summary["failed"][1]["error"] and "config.json" in error
    assert f"- routing3-detach seed 0: {error}" in (out / "summary.md").read_text()
    assert leftovers(out) == []
    for config_id in ("routing3-full", "routing3-detach"):  # repaired, --resume trains them, and the failure records go
        shutil.rmtree(out / f"runs/{config_id}/seed-0/config.json")
    assert cli.main(resume) == 0
    assert "failed" not in json.loads((out / "summary.json").read_text())
    assert not list((out / "runs").glob("*/seed-*/failed.json"))


def test_a_run_held_by_another_live_process_is_not_trained_twice(tmp_path, data_options, capsys):
    out = tmp_path / "study"
    jobs = ["--jobs", "2", "--threads-per-run", "1"]
    assert cli.main(study_argv(out, data_options, *jobs, "--epochs", "1")) == 0
    run_dir = out / "runs" / "routing1" / "seed-0"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys; from tinygrad_caps.models.app.studies.lock import run_lock\n"
                               # it holds the lock until killed
                               "with run_lock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()",
                               str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (run_dir / "metrics.jsonl").read_bytes()
        capsys.readouterr()
        assert cli.main(["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress",
                         "--epochs", "2", *jobs]) == 1
        printed = capsys.readouterr().out
        held = f"{run_dir} is being trained by another process (pid {holder.pid} on "
        assert f"failed: routing1 seed 0: {held}" in printed
        assert (run_dir / "metrics.jsonl").read_bytes() == before  # never touched
        assert not (run_dir / "failed.json").exists()  # (the run itself has not failed)
        assert json.loads((out / "summary.json").read_text())["runs_finished"] == 2
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_driver_takes_its_runs_with_it_and_resume_ends_as_the_sequential_study(
        tmp_path, data_options, sequential_study):
    out, hold = tmp_path / "study", tmp_path / "hold"
    first = driver(study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1"), env=held_at(hold))
    try:
        wait_for(lambda: len(held(hold)) == 2)  # both runs mid-epoch, neither can finish
        pids = [json.loads(p.read_text())["pid"] for p in (out / "runs").glob("*/seed-*/run.lock")]
        assert sorted(pids) == sorted(held(hold))
    finally:
        first.kill()
        first.communicate()
    wait_for(lambda: not any(_alive(pid) for pid in pids), seconds=30)  # PR_SET_PDEATHSIG: they died with it
    resumed = driver(["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress",
                      "--jobs", "2", "--threads-per-run", "1"])
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert study_files(out) == sequential_study and leftovers(out) == []


def test_a_second_driver_of_a_running_study_is_refused_in_one_line_naming_the_first(tmp_path, data_options,
                                                                                  capsys):
    out, hold = tmp_path / "study", tmp_path / "hold"
    first = driver(study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1"), env=held_at(hold))
    try:
        wait_for(lambda: held(hold))  # the first study is certainly running
        plan, lock = (out / "study.json").read_bytes(), (out / "study.lock").read_bytes()
        line = one_line_error(capsys, cli.main(["study", "run", "gradient-modes", "--out", str(out), "--resume",
                                                "--jobs", "2"]))
        assert f"{out} is being run by another study run (pid {first.pid} on " in line
        assert (out / "study.json").read_bytes() == plan and (out / "study.lock").read_bytes() == lock
    finally:
        (hold / "release").touch()
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr


def test_ctrl_c_saves_every_running_run_and_resume_ends_as_the_sequential_study(
        tmp_path, data_options, sequential_study):
    out, hold = tmp_path / "study", tmp_path / "hold"
    first = driver(study_argv(out, data_options, "--jobs", "2", "--threads-per-run", "1", "--epochs", "2"),
                   env=held_at(hold))
    try:
        wait_for(lambda: len(held(hold)) == 2)  # both runs mid-epoch: the study cannot end before the Ctrl-C
        first.send_signal(signal.SIGINT)
        wait_for(lambda: (out / "study.stop").exists())  # the driver has told the runs to stop
    finally:
        (hold / "release").touch()
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 130, stderr
    assert "(2 running)" in stdout
    saved = [tc.load(path)["progress"] for path in (out / "runs").glob("*/seed-*/checkpoints/last.npz")]
    assert [(p["epoch"], p["step"]) for p in saved] == [(0, 2), (0, 2)]  # both saved where they were stopped
    assert f"continue it with: tinygrad-caps study run gradient-modes --out {out} --resume" in stderr
    assert "stopping: every running run saves at its next batch boundary" in stdout
    assert leftovers(out) == []
    resumed = driver(["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress",
                      "--jobs", "2", "--threads-per-run", "1"])
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert study_files(out) == sequential_study


def test_the_ctrl_c_tests_start_their_driver_with_sigint_at_its_default_even_where_this_suite_ignores_it():
    """The Ctrl-C tests start their driver with ``with_default_sigint``: without it, a suite started as a
    background job of a script (SIGINT ignored, inherited) gave a driver without a KeyboardInterrupt handler,
    and those tests waited out their time limit."""
    show = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        inherited = subprocess.run(show, capture_output=True, text=True, check=True).stdout
        restored = subprocess.run(show, capture_output=True, text=True, check=True,
                                  preexec_fn=with_default_sigint).stdout
    finally:
        signal.signal(signal.SIGINT, previous)
    assert inherited.strip() in ("1", "Handlers.SIG_IGN")  # (its value, or its name on newer Pythons)
    assert "default_int_handler" in restored


def test_max_minutes_is_the_whole_study_s_and_resume_ends_as_the_sequential_study(
        tmp_path, data_options, sequential_study, capsys):
    out = tmp_path / "study"
    jobs = ["--jobs", "2", "--threads-per-run", "1"]
    assert cli.main(study_argv(out, data_options, *jobs, "--max-minutes", "0.0001")) == 75
    printed = capsys.readouterr().out
    assert f"continue with: tinygrad-caps study run gradient-modes --out {out} --resume" in printed
    assert not json.loads((out / "summary.json").read_text())["complete"]
    assert cli.main(["study", "run", "gradient-modes", "--out", str(out), "--resume", "--no-progress",
                     "--jobs", "2", "--threads-per-run", "1"]) == 0
    assert study_files(out) == sequential_study


def test_the_progress_line_counts_the_runs_and_names_the_epoch_of_each_running_one(tmp_path):
    from tinygrad_caps.models.app.studies.study_progress import StudyProgress

    runs = [(f"c seed {s}", tmp_path / f"seed-{s}") for s in range(4)]
    for _, run_dir in runs:
        run_dir.mkdir()
    clock = iter([0.0, 100.0, 100.0])
    progress = StudyProgress(runs, epochs=3, terminal=False, clock=lambda: next(clock))
    (runs[0][1] / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3}\n')
    (runs[1][1] / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (runs[1][1] / "run.lock").write_text("{}")
    progress.finished.add("c seed 0")
    progress.running.update({"c seed 1", "c seed 2"})  # seed 2 waits for its resources: not running yet
    # 4 epochs trained in 100 s; 2 + 3 + 3 left: about 200 s
    assert progress.line() == "study: 1 finished, 1 running (c seed 1 epoch 2/3), 2 left; about 3 min left"
    progress.failed.add("c seed 3")
    assert progress.line().startswith("study: 1 finished, 1 running (c seed 1 epoch 2/3), 1 failed, 1 left")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("extra, message", [
    (["--jobs", "0"], "--jobs must be at least 1, got 0"),
    (["--jobs", "-3"], "--jobs must be at least 1, got -3"),
    (["--threads-per-run", "0"], "--threads-per-run must be at least 1, got 0"),
    (["--executor", "dask"], "argument --executor: invalid choice: 'dask'"),
    (["--runs-per-device", "0"], "--runs-per-device must be at least 1, got 0"),
    (["--executor", "ray", "--gpus-per-run", "-1"], "--gpus-per-run must be 0 or more, got -1"),
    (["--executor", "ray", "--cpus-per-run", "0"], "--cpus-per-run must be positive, got 0"),
    (["--devices", "cuda:7"], "--devices: device 'cuda:7'"),
    (["--device", "cpu", "--devices", "cuda:0"], "--devices places runs on GPUs; this study trains on the CPU"),
    (["--executor", "ray", "--jobs", "2"], "--jobs: the local executor's"),
    (["--ray-address", "127.0.0.1:6379"], "--ray-address: options of --executor ray"),
    (["--max-retries", "-1"], "--max-retries must be at least 0, got -1"),
    (["--jobs", "1000000000000"], "--jobs must be at most 4096, got 1000000000000"),
    (["--runs-per-device", "5000"], "--runs-per-device must be at most 4096, got 5000"),
])
def test_bad_scheduling_options_are_one_line_errors_with_nothing_created(
        tmp_path, data_options, capsys, extra, message):
    out = tmp_path / "study"
    try:
        status = cli.main(study_argv(out, data_options, *extra))
    except SystemExit as exc:  # (the parser's own refusals: an unknown --executor)
        status = exc.code
    line = one_line_error(capsys, status)
    assert message in line
    assert not out.exists()


def test_runs_on_gpus_are_placed_on_every_device_and_equal_the_runs_of_one_gpu_at_a_time(tmp_path):
    # Under the CuPy stand-in with two GPUs (tests/support/cupy_standin): real worker processes, each
    # told its GPU; the stand-in computes in NumPy, so every GPU gives the same numbers.
    from cli_helpers import tiny_data_dir
    from standin import launch_standin

    # 16 training and 8 test images: two batches an epoch on the emulated GPUs
    data = ["--dataset", "tiny", "--data-dir", str(tiny_data_dir(tmp_path / "data", (16, 8), compress=False))]
    cli_command = [sys.executable, "-m", "tinygrad_caps.models.cli"]
    # 3 runs of one epoch: the first three of the four slots below (cuda:0, cuda:0, cuda:1) take them
    shared = study_argv(tmp_path / "x", data, "--device", "cuda", "--cuda-graph", "off", "--seeds", "1",
                        "--epochs", "1")[5:]  # (without --out DIR)
    placed = launch_standin([*cli_command, "study", "run", "gradient-modes", "--out", str(tmp_path / "placed"),
                             *shared, "--runs-per-device", "2", "--threads-per-run", "1"], devices=2)
    assert placed.returncode == 0, placed.stderr[-3000:]
    one = launch_standin([*cli_command, "study", "run", "gradient-modes", "--out", str(tmp_path / "one"), *shared,
                          "--devices", "cuda:1", "--threads-per-run", "1"], devices=2)
    assert one.returncode == 0, one.stderr[-3000:]
    assert study_files(tmp_path / "placed") == study_files(tmp_path / "one")
    def devices(out):
        return {json.loads(p.read_text())["device"] for p in out.glob("runs/*/seed-*/config.json")}

    assert devices(tmp_path / "placed") == {"cuda:0", "cuda:1"} and devices(tmp_path / "one") == {"cuda:1"}

    slots = launch_standin([sys.executable, "-c",
                            "from tinygrad_caps.models.app.studies.placement import study_placement as p\n"
                            "print(p({'runs_per_device': 2}, 'cuda'))\n"
                            "print(p({'devices': 'cuda:1,cuda:0', 'jobs': 3}, 'auto'))"], devices=2)
    first, second = slots.stdout.splitlines()
    assert "jobs=4" in first and "devices=('cuda:0', 'cuda:0', 'cuda:1', 'cuda:1')" in first
    assert "jobs=2" in second and "devices=('cuda:1', 'cuda:0')" in second and "in_process=False" in second
    missing = launch_standin([*cli_command, "study", "run", "gradient-modes", "--out", str(tmp_path / "missing"),
                              *shared, "--devices", "cuda:0,cuda:2"], devices=2)
    assert missing.returncode == 2 and not (tmp_path / "missing").exists()
    assert missing.stderr.strip().splitlines() == [
        "tinygrad-caps study: error: --devices: device 'cuda:2' does not exist: this machine has 2 GPU(s), "
        "cuda:0 to cuda:1"]
