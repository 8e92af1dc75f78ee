"""Crash consistency of `tinygrad-caps train`: a run killed or signalled at exact places (through the
TINYGRAD_CAPS_TEST_CRASH hook of models/app/run_state.py) and then resumed writes the same metrics.jsonl
as a run that was never interrupted, and leaves no half-written checkpoint behind."""
import json
import os
import subprocess
import sys

import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import cli

from cli_helpers import TINY_CPU, tiny_data_dir
from helpers import metrics_without_times as metrics

THREE_EPOCHS = ["--dataset", "tiny", *TINY_CPU, "--epochs", "3"]  # "3" last: [*THREE_EPOCHS[:-1], "1"] is one epoch
BATCHES_PER_EPOCH = 5


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Module-wide (the uninterrupted run is trained once), labels 0, 1, 2, 0, ..."""
    return tiny_data_dir(tmp_path_factory.mktemp("data"), (40, 16), cycle_labels=True)


def args(data_dir, out, *extra):
    return ["train", *THREE_EPOCHS, "--data-dir", str(data_dir), "--out", str(out), *extra]


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    assert cli.main(args(data_dir, out)) == 0
    return metrics(out)


def run_with_crash(data_dir, out, spec):
    env = dict(os.environ, TINYGRAD_CAPS_TEST_CRASH=spec, TINYGRAD_CAPS_DEVICE="cpu")
    return subprocess.run([sys.executable, "-m", "tinygrad_caps.models.cli", *args(data_dir, out)], env=env,
                          capture_output=True, text=True, timeout=300)


# (hook spec, expected exit status): KILL at each commit point, and signals that the run must defer
CASES = [
    ("metrics-line@2", -9),              # epoch 2's line written, its checkpoint not yet
    ("checkpoint@1", -9),                # epoch 1 committed, nothing printed yet
    ("optimizer-step@7", -9),            # mid-batch: the step applied, not counted
    ("optimizer-step@7:INT,INT", 130),   # two Ctrl-C between the step and its counter
    ("optimizer-step@4:TERM", 143),      # SIGTERM: stop at the batch boundary and save
    ("metrics-line@1:TERM,TERM", 143),   # two SIGTERMs during an epoch's commit
]


@pytest.mark.parametrize("spec, status", CASES, ids=[spec for spec, _ in CASES])
def test_a_run_stopped_anywhere_resumes_to_the_uninterrupted_metrics(data_dir, tmp_path, uninterrupted, spec, status):
    out = tmp_path / "run"
    result = run_with_crash(data_dir, out, spec)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    checkpoints = out / "checkpoints"
    if (checkpoints / "last.npz").exists():
        saved = tc.load(checkpoints / "last.npz")  # never half-written
        assert len(metrics(out)) >= saved["progress"]["epoch"]
    if status != -9:  # a signalled run saved where it stopped
        saved = tc.load(checkpoints / "last.npz")
        assert saved["progress"]["epoch"] * BATCHES_PER_EPOCH + saved["progress"]["step"] >= 1
    (checkpoints / ".tmp-left-by-a-kill.npz").parent.mkdir(parents=True, exist_ok=True)
    (checkpoints / ".tmp-left-by-a-kill.npz").write_bytes(b"partial")
    assert cli.main(args(data_dir, out, "--resume")) == 0
    assert metrics(out) == uninterrupted  # exactly: no epoch twice, none lost, the same numbers
    assert not list(checkpoints.glob(".tmp-*"))


def test_a_broken_stdout_pipe_stops_the_run_cleanly_and_resume_completes_it(data_dir, tmp_path, uninterrupted):
    out = tmp_path / "run"
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu")
    command = [sys.executable, "-m", "tinygrad_caps.models.cli", *args(data_dir, out)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as process:
        process.stdout.readline()  # read one line, then go away like `| head -1`
        process.stdout.close()
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=300) == 141
    assert "Traceback" not in stderr and "interrupted: saved" in stderr
    assert cli.main(args(data_dir, out, "--resume")) == 0
    assert metrics(out) == uninterrupted


def test_checkpoints_follow_the_umask(data_dir, tmp_path):
    previous = os.umask(0o027)
    try:
        assert cli.main(["train", *THREE_EPOCHS[:-1], "1", "--data-dir", str(data_dir), "--out", str(tmp_path / "run")]) == 0
    finally:
        os.umask(previous)
    mode = (tmp_path / "run" / "checkpoints" / "last.npz").stat().st_mode & 0o777
    assert mode == 0o640
    assert (tmp_path / "run" / "metrics.jsonl").stat().st_mode & 0o777 == 0o640


def test_resume_drops_metrics_lines_beyond_the_checkpoint(data_dir, tmp_path, uninterrupted):
    out = tmp_path / "run"
    assert cli.main(["train", *THREE_EPOCHS[:-1], "1", "--data-dir", str(data_dir), "--out", str(out)]) == 0
    with open(out / "metrics.jsonl", "a") as f:  # as if a process died after writing epoch 2's line
        f.write(json.dumps(dict(uninterrupted[1], seconds=0.0)) + "\n" + '{"epoch": 3, "trunc')
    assert cli.main(args(data_dir, out, "--resume")) == 0
    assert metrics(out) == uninterrupted


def wait_for_numpy(pid, timeout=60.0):
    """Return once process ``pid`` has loaded NumPy, which the launcher imports after installing its
    SIGINT handler (before that, Python's own start-up answers a Ctrl-C). Returns at once where
    /proc cannot tell."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text():
                return
        except OSError:
            return
        time.sleep(0.002)


@pytest.mark.parametrize("delay", [0.0, 0.25, 0.6, 1.5])  # from the first import of ours on
def test_a_ctrl_c_at_any_moment_of_start_up_exits_130_without_a_traceback(data_dir, tmp_path, delay):
    import time
    from pathlib import Path

    script = Path(sys.executable).parent / "tinygrad-caps"
    launcher = [sys.executable, str(script)] if script.exists() else [sys.executable, "-m", "tinygrad_caps_cli"]
    # the run waits after its first batch until the Ctrl-C has been sent: it can never end before it
    hold = tmp_path / "hold"
    hold.mkdir()
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu", TINYGRAD_CAPS_TEST_HOLD=f"optimizer-step@1:{hold}")
    with subprocess.Popen(launcher + args(data_dir, tmp_path / "run"), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=env) as process:
        wait_for_numpy(process.pid)
        time.sleep(delay)  # imports, data loading, or the first batch, depending on the machine's speed
        process.send_signal(2)
        (hold / "release").touch()
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=120) == 130, stderr
    assert "Traceback" not in stderr


# A Ctrl-C whose KeyboardInterrupt library code swallows (an extension module's initialisation that
# clears any error, as seen under load during NumPy's import) must still stop the run, both during
# the imports and just before the training loop's own handlers take over.
SWALLOWED_CTRL_C = r'''
import os, signal, sys, time
import tinygrad_caps_cli

def swallowed_ctrl_c():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler runs here
    except KeyboardInterrupt:
        pass  # what the library code does

if sys.argv[1] == "imports":
    install = signal.signal
    def install_then_swallow(signum, handler):
        previous = install(signum, handler)
        if isinstance(handler, tinygrad_caps_cli.StartUpInterrupt):
            swallowed_ctrl_c()
        return previous
    signal.signal = install_then_swallow
else:
    from tinygrad_caps.models.app.training.run_state import StopSignals
    enter = StopSignals.__enter__
    def swallow_then_enter(self):
        swallowed_ctrl_c()
        return enter(self)
    StopSignals.__enter__ = swallow_then_enter
sys.exit(tinygrad_caps_cli.main(sys.argv[2:]))
'''


@pytest.mark.parametrize("moment", ["imports", "training loop"])
def test_a_swallowed_ctrl_c_during_start_up_still_stops_the_run(data_dir, tmp_path, moment):
    out = tmp_path / "run"
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu")
    done = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C, moment, *args(data_dir, out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()


def test_a_remembered_start_up_ctrl_c_stops_one_run_only():
    import signal

    import tinygrad_caps_cli
    from tinygrad_caps.models.app.training.run_state import Interrupted, StopSignals

    start_up = tinygrad_caps_cli.StartUpInterrupt()
    start_up.received = signal.SIGINT
    previous = signal.signal(signal.SIGINT, start_up)
    try:
        with StopSignals() as first:
            with pytest.raises(Interrupted):
                first.check()  # the first batch boundary
        assert signal.getsignal(signal.SIGINT) is start_up and start_up.received is None
        with StopSignals() as second:
            second.check()  # a later run in the same process is not stopped by it
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_launcher_puts_back_the_sigint_handler_it_found(tmp_path):
    import signal

    import tinygrad_caps_cli

    before = signal.getsignal(signal.SIGINT)
    assert tinygrad_caps_cli.main(["plot", str(tmp_path / "no-run-here")]) == 2
    assert signal.getsignal(signal.SIGINT) is before
