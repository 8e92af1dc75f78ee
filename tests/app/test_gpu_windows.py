"""benchmarks/studies/gpu_window.sh, the prepared research windows of a lent GPU, run here on the CPU
with a tiny CapsNet and a tiny data set: each window trains its study to the end inside the call,
says what it ran and how long each run took, and packs the study folder without checkpoints; window
C measures each routing's step time first and sizes the study to its budget."""
import json
import os
import subprocess
import tarfile

import pytest

from cli_helpers import tiny_data_dir
from paths import ROOT

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "benchmarks" / "studies" / "gpu_window.sh"
TINY_MODEL = ("--conv1-channels 4 --primary-types 2 --primary-dim 4 --digit-dim 4 --kernel-size 3 "
              "--decoder-hidden 16,32")


def window(name, out, data, **env):
    environment = dict(os.environ, DEVICE="cpu", DATASET="tiny", EXTRA=f"{TINY_MODEL} --limit-test 12",
                       **{"SEEDS": "2", "EPOCHS": "1", **env})
    return subprocess.run(["bash", str(SCRIPT), name, str(out), str(data)], capture_output=True, text=True,
                          env=environment, timeout=900)


def packed(out, name):
    with tarfile.open(out / f"window-{name}.tar.gz") as tar:
        return tar.getnames()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data_dir(tmp_path_factory.mktemp("windows"), (24, 12))


@pytest.mark.parametrize("name, study, configs", [("A", "gradient-modes", 3), ("B", "paper-accuracy", 1)])
def test_windows_a_and_b_train_their_study_to_the_end_and_pack_it_without_checkpoints(name, study, configs, data,
                                                                                     tmp_path):
    done = window(name, tmp_path, data)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"window {name}: tinygrad-caps study run {study} --out {tmp_path / study} --epochs 1 --seeds 2" in done.stdout
    assert f"window {name}: exit 0 after" in done.stdout
    per_run = [line for line in done.stdout.splitlines() if line.startswith("  ") and "epochs," in line]
    assert len(per_run) == 2 * configs and all("test accuracy" in line for line in per_run)
    names = packed(tmp_path, name)
    assert f"{study}/study.json" in names and f"{study}/summary.json" in names and f"{study}.log" in names
    assert sum(n.endswith("metrics.jsonl") for n in names) == 2 * configs
    assert not any("checkpoints" in n or n.endswith((".npz", ".lock")) for n in names)
    summary = json.loads((tmp_path / study / "summary.json").read_text())
    assert summary["complete"] and summary["study"] == study


def test_window_c_times_each_routing_then_sizes_the_study_to_its_budget(data, tmp_path):
    done = window("C", tmp_path, data, SEEDS="1", MINUTES="0.001", PROBE_IMAGES="16", TRAIN_IMAGES="24",
                  TEST_IMAGES="12")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    times = json.loads((tmp_path / "step_times.json").read_text())
    assert len(times["step_seconds"]) == 11 and all(s > 0 for s in times["step_seconds"].values())
    assert times["epochs"] == 1  # a budget smaller than one epoch still trains one
    lines = done.stdout.splitlines()
    assert sum(" ms a step at B=100 on cpu" in line for line in lines) == 11
    assert any(line.startswith("plan: 1 epoch of 24 images x 1 seeds x 11 configurations") for line in lines)
    assert "step_times.json" in packed(tmp_path, "C")


def test_an_unknown_window_is_one_line_and_status_2(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "D", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == "gpu_window.sh: the window is A, B or C, got D"
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
