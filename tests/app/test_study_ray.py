"""``study run --executor ray`` on a real Ray (no mock): a local Ray started for the study, and a
two-node local cluster from ``ray start --head`` and ``ray start --address``. The runs' files equal the
sequential study's; a Ray worker SIGKILLed mid-epoch is retried by Ray and its run ends as if never
killed; an address where no Ray answers, and a node that cannot see the study folder, are one-line
errors with nothing created; without Ray installed, the error says how to install it. Each Ray
started costs seconds: the killed worker is one of the local Ray's study, and the two-node cluster
serves both tests that need one."""
import json
import shutil
import socket
import subprocess
import sys
import time

import pytest

from cli_helpers import one_line_error
from study_helpers import leftovers, study_argv, study_files
from tinygrad_caps.models import cli

# One xdist worker runs them all, one at a time (the README's `--dist loadfile` keeps a file's tests
# together): two_node_cluster's `ray stop --force` ends every Ray of this machine, another's included.
pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
# Ray's own default ports (dashboard, client server, dashboard agent) and its workers' range: `ray start`
# refuses a --port among them ("used by other components").
RAY_PORTS = {8265, 10001, 52365, *range(10002, 20000)}


@pytest.fixture
def no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def free_port():
    """A port that nothing listens on and that no part of Ray takes by default."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_PORTS:
            return port


def ray_command(*args, check=True):
    """``ray ARGS`` run by this Python, so that a cluster it starts runs its tasks with this Python (and
    this tree's code), not with the interpreter of whichever ``ray`` comes first on PATH."""
    return subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *args], capture_output=True, text=True,
                          timeout=180, check=check)


def test_a_local_ray_retries_a_worker_killed_mid_epoch_and_gives_the_files_of_the_sequential_study(
        tmp_path, data_options, sequential_study, capsys, monkeypatch, no_ray_address):
    """A local Ray started for the study, one of whose workers is SIGKILLed mid-epoch (once): Ray
    retries the task, its run continues from its checkpoint, and every file equals the sequential
    study's (one study for both checks: each local Ray costs its start)."""
    out, marker = tmp_path / "study", tmp_path / "killed-once"
    monkeypatch.setenv("TINYGRAD_CAPS_TEST_CRASH", "optimizer-step@2:KILL")  # reaches the tasks' workers
    monkeypatch.setenv("TINYGRAD_CAPS_TEST_CRASH_ONCE", str(marker))
    assert cli.main(study_argv(out, data_options, "--executor", "ray", "--threads-per-run", "1")) == 0
    assert marker.exists()
    killed = [log for log in (out / "runs").glob("*/seed-*/train.log") if log.read_text().count("run folder:") > 1
              or "resuming" in log.read_text()]
    assert len(killed) == 1  # the one run whose worker died was continued from its checkpoint
    assert study_files(out) == sequential_study and leftovers(out) == []
    printed = capsys.readouterr().out
    assert "[routing1 seed 0] submitted to Ray" in printed and "study: 3 finished, 0 running, 0 left" in printed
    for run_dir in (out / "runs").glob("*/seed-*"):
        assert "epoch 2: train loss" in (run_dir / "train.log").read_text()
    assert not ray.is_initialized()  # the local Ray started for the study is stopped after it


def test_an_address_where_no_ray_answers_is_a_one_line_error_within_a_minute(tmp_path, data_options, capsys):
    out = tmp_path / "study"
    started = time.monotonic()
    line = one_line_error(capsys, cli.main(study_argv(out, data_options, "--executor", "ray", "--ray-address",
                                                      f"127.0.0.1:{free_port()}")))
    assert time.monotonic() - started < 60
    assert "no Ray cluster answers there" in line and not out.exists()


def test_without_ray_the_error_says_how_to_install_it(tmp_path, data_options):
    out = tmp_path / "study"
    code = ("import sys; sys.modules['ray'] = None\n"  # an import of ray fails as it does where it is missing
            "from tinygrad_caps.models import cli\n"
            f"sys.exit(cli.main({study_argv(out, data_options, '--executor', 'ray')!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "tinygrad-caps study: error: --executor ray needs Ray, which is not installed: "
        "pip install -e \".[cluster]\" (or pip install \"ray[default]\")"]
    assert not out.exists()


@pytest.fixture(scope="module")
def two_node_cluster():
    """A Ray cluster of two nodes on this machine (a head and a worker, one CPU each); its address.
    Started once for the tests of this file that use it (they leave nothing running on it)."""
    port = free_port()
    ray_command("stop", "--force", check=False)
    ray_command("start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false",
                "--disable-usage-stats")
    try:
        ray_command("start", f"--address=127.0.0.1:{port}", "--num-cpus=1", "--num-gpus=0", "--disable-usage-stats")
        yield f"127.0.0.1:{port}"
    finally:
        ray_command("stop", "--force", check=False)


def test_a_two_node_cluster_gives_the_files_of_the_sequential_study(
        tmp_path, data_options, sequential_study, two_node_cluster, capsys):
    out = tmp_path / "study"
    assert cli.main(study_argv(out, data_options, "--executor", "ray", "--ray-address", two_node_cluster,
                               "--threads-per-run", "1")) == 0
    assert study_files(out) == sequential_study and leftovers(out) == []
    assert (out / "study.token").exists()


def _can_unshare():
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -m (root) to give the driver a folder no node sees")
def test_a_study_folder_the_nodes_cannot_see_is_a_one_line_error_with_nothing_created(tmp_path, data_options,
                                                                                    two_node_cluster):
    # The driver runs in a mount namespace of its own, with a tmpfs over `private`: the Ray nodes, started
    # outside it, see an empty folder there, as a node without the shared volume would.
    private = tmp_path / "private"
    private.mkdir()
    argv = study_argv(private / "study", data_options, "--executor", "ray", "--ray-address", two_node_cluster)
    script = (f"mount -t tmpfs none {private} && {sys.executable} -m tinygrad_caps.models.cli "
              + " ".join(json.dumps(a) for a in argv) + f"; status=$?; ls -A {private}; exit $status")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tinygrad-caps study: error: node ")
    assert f"cannot see the study folder {private / 'study'}" in line
    assert "must be on storage every node sees" in line
    assert done.stdout.strip() == ""  # nothing created in the driver's folder either
    assert list(private.iterdir()) == []
