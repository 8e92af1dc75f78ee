"""``benchmarks/gpu_check.sh`` without a GPU: it must fail when there is none, and on a GPU machine
it must run every step even after one fails (GPU time is scarce), cut each step to what is left of
its budget, and fail at the end naming each failed step. A stand-in Python plays the GPU steps."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

# Plays the steps that need a GPU; everything else (the script's own small programs) runs on the
# real interpreter. GPU_STEPS names how each GPU step behaves.
STAND_IN = """#!/usr/bin/env bash
real={python}
case "$*" in
    "-m pip "*) echo "pip: installed"; exit 0 ;;
    "- "*versions.json)
        if [ "$GPU_STEPS" = "no-gpu" ]; then exec "$real" "$@"; fi
        echo '{{"gpu": "Stand-in GPU", "gpus": 1}}' > "$2"; echo "gpu: Stand-in GPU"; exit 0 ;;
    "-m tinygrad_caps.kernels.selftest"*) echo "selftest on Stand-in GPU: all kernels agree with NumPy"; exit 0 ;;
    "-m pytest "*)
        xml=${{@: -1}}
        echo '<testsuites><testsuite tests="5" failures="0" errors="0" skipped="1"/></testsuites>' > "$xml"
        echo "4 passed, 1 skipped"; exit 0 ;;
    "routing_speed.py "*) echo "table"; printf '{{\\n  "rows": [1, 2]\\n}}\\n'; exit 0 ;;
    "train_step.py "*) sleep 60; exit 0 ;;
esac
exec "$real" "$@"
"""


def run_check(tmp_path, gpu_steps, budget):
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    sanitizer = tmp_path / "compute-sanitizer"
    sanitizer.write_text("#!/usr/bin/env bash\necho 'ERROR SUMMARY: 0 errors'\n")
    sanitizer.chmod(0o755)
    env = dict(os.environ, PYTHON=str(stand_in), GPU_STEPS=gpu_steps, GPU_CHECK_BUDGET_S=str(budget),
               COMPUTE_SANITIZER=str(sanitizer))
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=120)
    return result, out


def test_without_a_gpu_the_check_fails_at_once(tmp_path):
    result, out = run_check(tmp_path, "no-gpu", 480)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no usable GPU" in (out / "versions.log").read_text()
    assert not (out / "gpu_summary.json").exists()


def test_every_step_runs_and_each_failure_is_named(tmp_path):
    # budget 30 s: 15 s kept for the summary leaves the slow train step about 15 s, then it is cut
    result, out = run_check(tmp_path, "gpu", 30)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = (out / "failed_steps.txt").read_text().splitlines()
    assert failed[0] == "gpu-tests-counted (exit 1)"  # a skipped GPU test fails the check
    assert failed[1].startswith("train-step-cuda (timed out after ")
    # the train step used up the budget: what is left is not run, and says so
    assert failed[2:] == ["sanitizer-memcheck (not run: the budget is spent)",
                          "sanitizer-racecheck (not run: the budget is spent)"]
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["passed"] is False and summary["failed_steps"] == failed
    assert summary["versions"]["gpu"] == "Stand-in GPU"
    assert summary["selftest"].endswith("all kernels agree with NumPy")
    assert summary["routing_speed"] == {"rows": [1, 2]}
    assert "error" in summary["train_step_cuda"]
    assert "gpu_check FAILED" in result.stderr
