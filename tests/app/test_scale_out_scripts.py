"""The prepared GPU scripts of a study's scale-out, checked where they can be without a GPU:
runs_per_device.py measures K runs side by side (here on the CPU, its smoke mode), and
gpu_scale_out.sh is valid bash that runs both steps and continues its study across calls."""
import json
import subprocess
import sys

import pytest

from paths import ROOT

pytestmark = pytest.mark.slow


def test_runs_per_device_measures_every_count_of_runs_side_by_side():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "runs_per_device.py"), "--device", "cpu",
                           "--runs", "1", "2", "--batch", "2", "--seconds", "0.5", "--setup-seconds", "2", "--model", "tiny",
                           "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [row["runs"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert len(row["per_run"]) == row["runs"] and all(v > 0 for v in row["per_run"])
        assert row["total"] == pytest.approx(sum(row["per_run"]), rel=1e-12, abs=1e-9)


def test_the_gpu_scale_out_script_is_valid_bash_and_continues_its_study():
    script = ROOT / "benchmarks" / "studies" / "gpu_scale_out.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "--runs-per-device" in text and '--resume' in text and "--max-minutes" in text
    assert "runs_per_device.py" in text and "--runs 1 2 4" in text
