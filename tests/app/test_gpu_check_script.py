"""``benchmarks/gpu_check.sh`` without a GPU: it must fail when there is none, and on a GPU machine
it must run every step even after one fails (GPU time is scarce), cut each step to what is left of
its budget, and fail at the end naming each failed step. A stand-in Python plays the GPU steps."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from paths import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")

# Plays the steps that need a GPU; everything else (the script's own small programs) runs on the
# real interpreter. GPU_STEPS says how the GPU steps go: "no-gpu", "failing" (a skipped GPU test,
# a train step that never ends) or "passing".
STAND_IN = """#!/usr/bin/env bash
real={python}
case "$*" in
    "-m pip "*) echo "pip: installed"; exit 0 ;;
    "- "*versions.json)
        if [ "$GPU_STEPS" = "no-gpu" ]; then exec "$real" "$@"; fi
        echo '{{"gpu": "Stand-in GPU", "gpus": 1}}' > "$2"; echo "gpu: Stand-in GPU"; exit 0 ;;
    "-m tinygrad_caps.kernels.checking.selftest"*) echo "selftest on Stand-in GPU: all kernels agree with NumPy"; exit 0 ;;
    "-m pytest "*)
        skipped=$([ "$GPU_STEPS" = "failing" ] && echo 1 || echo 0)
        echo "<testsuites><testsuite tests=\\"5\\" failures=\\"0\\" errors=\\"0\\" skipped=\\"$skipped\\"/></testsuites>" > "${{@: -1}}"
        echo "5 tests, $skipped skipped"; exit 0 ;;
    "routing_speed.py "*) echo "table"; printf '{{\\n  "rows": [1, 2]\\n}}\\n'; exit 0 ;;
    "benchmarks/first_epoch.py "*)
        printf '{{"rows": [{{"run": "cold", "epoch_seconds": 4.5, "process_seconds": 9.0, "new_cache_files": 8}}]}}\\n'
        exit 0 ;;
    "train_step.py "*)
        echo "$*" >> "${{CALLS:-/dev/null}}"
        if [ "$GPU_STEPS" = "failing" ]; then sleep 60; fi
        if [ -n "${{TRAIN_STEP_JSON:-}}" ]; then echo "table"; cat "$TRAIN_STEP_JSON"; exit 0; fi
        printf '{{\\n  "rows": [{{"batch": 32, "precision": "highest", "ours_s": 0.01, "graph_max_rel_diff": %s}}]\\n}}\\n' "${{GRAPH_DIFF:-0.0}}"
        exit 0 ;;
    "-m tinygrad_caps.models.cli train "*)
        out=${{@: -1}}; mkdir -p "$out"
        if [ "${{EPOCH:-}}" = "cut" ]; then  # stopped by a signal before its epoch ended
            : > "$out/metrics.jsonl"; exit 143
        fi
        echo '{{"epoch": 1, "seconds": 12.0, "train_accuracy": 0.8, "test_accuracy": 0.85}}' > "$out/metrics.jsonl"
        exit 0 ;;
esac
exec "$real" "$@"
"""


def run_check(tmp_path, gpu_steps, budget, with_data=False, **env):
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    sanitizer = tmp_path / "compute-sanitizer"
    sanitizer.write_text("#!/usr/bin/env bash\necho 'ERROR SUMMARY: 0 errors'\n")
    sanitizer.chmod(0o755)
    data = tmp_path / "data"
    if with_data:
        (data / "fashion-mnist").mkdir(parents=True)
        (data / "fashion-mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"")
    env = dict(os.environ, PYTHON=str(stand_in), GPU_STEPS=gpu_steps, GPU_CHECK_BUDGET_S=str(budget),
               COMPUTE_SANITIZER=str(sanitizer), GPU_CHECK_DATA_DIR=str(data),
               GPU_CHECK_HISTORY_DIR=str(tmp_path / "history"), **env)
    out = tmp_path / "out"
    result = subprocess.run(["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=120)
    return result, out


def test_without_a_gpu_the_check_fails_at_once(tmp_path):
    result, out = run_check(tmp_path, "no-gpu", 480)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no usable GPU" in (out / "versions.log").read_text()
    assert not (out / "gpu_summary.json").exists()


@pytest.mark.slow
def test_every_step_runs_and_each_failure_is_named(tmp_path):
    # budget 36 s: 15 s kept for the summary and 10 s for timeout's grace leave the steps 11 s,
    # which the never-ending train step uses up; then it is cut
    result, out = run_check(tmp_path, "failing", 36, with_data=True)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = (out / "failed_steps.txt").read_text().splitlines()
    # a skipped GPU test fails the check, in either part of the GPU tests
    assert failed[:2] == ["gpu-tests-counted (exit 1)", "gpu-tests-nccl-counted (exit 1)"]
    assert failed[2].startswith("train-step-cuda (timed out after ")
    # the train step used up the budget: what is left is not run, and says so
    assert failed[3:] == ["cuda-graph-equals-eager (not run: the budget is spent)",
                          "first-epoch (not run: the budget is spent)",
                          "sanitizer-memcheck (not run: the budget is spent)",
                          "sanitizer-racecheck (not run: the budget is spent)",
                          "epoch-fashion-mnist (not run: the budget is spent)"]
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["passed"] is False and summary["failed_steps"] == failed
    assert summary["versions"]["gpu"] == "Stand-in GPU"
    assert summary["selftest"].endswith("all kernels agree with NumPy")
    assert summary["routing_speed"] == {"rows": [1, 2]}
    assert "error" in summary["train_step_cuda"]
    assert "budget is spent" in summary["fashion_mnist_epoch"]["not_timed"]
    assert "gpu_check FAILED" in result.stderr


def test_a_passing_check_gathers_every_figure(tmp_path):
    result, out = run_check(tmp_path, "passing", 480, with_data=True)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["passed"] is True and summary["failed_steps"] == []
    assert summary["gpu_tests"] == summary["gpu_tests_nccl"] == "5 tests, 0 skipped"
    assert summary["sanitizers"] == {"memcheck": "ERROR SUMMARY: 0 errors", "racecheck": "ERROR SUMMARY: 0 errors"}
    assert summary["train_step_cuda"]["rows"][0]["graph_max_rel_diff"] == 0.0
    assert summary["cuda_graph_equals_eager"].startswith("captured vs eager weights")
    assert summary["figures"]["train_step_ms"][0]["ours_eager"] == 10.0
    assert summary["figures"]["epoch_seconds"] == 12.0
    assert summary["figures"]["first_epoch_seconds"] == {"cold": {"epoch": 4.5, "process": 9.0, "new_cache_files": 8}}
    assert summary["fashion_mnist_epoch"] == {"train_seconds": 12.0, "images_per_second": 5000.0,
                                              "train_accuracy": 0.8, "test_accuracy_first_1000": 0.85}
    assert "gpu_check passed" in result.stdout


def test_without_the_data_the_epoch_is_not_timed_and_the_check_still_passes(tmp_path):
    result, out = run_check(tmp_path, "passing", 480)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["fashion_mnist_epoch"]["not_timed"].startswith("no Fashion-MNIST files in ")


def test_an_epoch_cut_short_is_a_failed_step_without_figures(tmp_path):
    result, out = run_check(tmp_path, "passing", 480, with_data=True, EPOCH="cut")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["failed_steps"] == ["epoch-fashion-mnist (exit 143)"]
    assert "not_timed" in summary["fashion_mnist_epoch"]
    assert not list(out.glob("**/*.npz")) and (out / "epoch-metrics.jsonl").read_text() == ""


def test_a_captured_step_that_differs_from_the_eager_one_fails_the_check(tmp_path):
    result, out = run_check(tmp_path, "passing", 480, GRAPH_DIFF="0.4")
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["failed_steps"] == ["cuda-graph-equals-eager (exit 1)"]


def test_the_training_step_is_measured_against_pytorchs_best_within_a_compile_budget(tmp_path):
    """train_step.py runs with torch.compile's budget (GPU_CHECK_TORCH_COMPILE_S), and the summary
    carries its figures against PyTorch's fastest variant, the hardware and the memory goal."""
    row = {"batch": 32, "precision": "high", "ours_s": 0.01, "ours_graph_s": 0.002, "torch_s": 0.008,
           "graph_max_rel_diff": 0.0, "ratio": 0.25,
           "variants": {"ours-eager": {"s": 0.01, "host_s": 0.009, "gpu_s": 0.0095, "peak_bytes": 100 * 2 ** 20},
                        "ours-captured": {"s": 0.002, "host_s": 0.0001, "gpu_s": 0.0019, "graph_bytes": 105 * 2 ** 20,
                                          "fraction_of_peak": 0.05, "fraction_of_copy_bandwidth": 0.1},
                        "torch-graph": {"s": 0.0025, "host_s": 0.0001, "gpu_s": 0.0024},
                        "torch-compile-reduce-overhead": {"s": 0.003, "compile_s": 41.0},
                        "torch-compile-max-autotune": {"skipped": "the 60 s compile budget was spent before it"}},
           "goal": {"ours": "ours-captured", "fastest_torch": "torch-graph", "ratio": 0.8, "met": True,
                    "moonshot_met": True},
           "memory": {"ours_eager_peak_bytes": 100 * 2 ** 20, "ours_captured_bytes": 105 * 2 ** 20,
                      "torch_eager_peak_bytes": None, "torch_graph_bytes": None, "captured_to_eager": 1.05, "met": True},
           "cost": {"gflop": 38.4, "mb": 260.0}}
    step_json = tmp_path / "step.json"
    step_json.write_text(json.dumps({"info": {}, "rows": [row]}, indent=2) + "\n")
    calls = tmp_path / "calls.txt"
    result, out = run_check(tmp_path, "passing", 480, TRAIN_STEP_JSON=str(step_json), CALLS=str(calls),
                            GPU_CHECK_TORCH_COMPILE_S="60")
    assert result.returncode == 0, result.stdout + result.stderr
    call = calls.read_text()
    assert "--torch-variants eager graph compile-reduce-overhead --torch-compile-budget 60 --partial-json" in call
    assert "train-step-cuda (at most 210s)" in result.stdout  # the compile budget and 150 s for the rest
    (figures,) = json.loads((out / "gpu_summary.json").read_text())["figures"]["train_step_ms"]
    assert figures["ours_captured"] == 2.0 and figures["ratio_to_pytorch"] == 0.25
    assert figures["fastest_pytorch"] == "torch-graph" and figures["ratio_to_fastest_pytorch"] == 0.8
    assert figures["goal_1x_met"] is True and figures["memory_goal_1_1x_met"] is True
    assert figures["host_gpu_ms"]["ours-captured"] == [0.1, 1.9]
    assert figures["compile_s"] == {"torch-compile-reduce-overhead": 41.0}
    assert figures["skipped"]["torch-compile-max-autotune"].startswith("the 60 s compile budget")
    assert figures["memory_mib"]["ours_captured"] == 105.0 and figures["memory_captured_to_eager"] == 1.05
    assert figures["gflop_per_step"] == 38.4 and figures["ours_fraction_of_peak"] == 0.05


def passing_step_json(tmp_path, ours_captured_s=0.002):
    """A train_step.py JSON of one row (B=32, high) with every figure gpu_check gathers."""
    row = {"batch": 32, "precision": "high", "ours_s": 0.01, "ours_graph_s": ours_captured_s, "torch_s": 0.008,
           "graph_max_rel_diff": 0.0, "ratio": 0.25,
           "variants": {"ours-eager": {"s": 0.01}, "ours-captured": {"s": ours_captured_s, "fraction_of_peak": 0.05},
                        "torch-eager": {"s": 0.008}, "torch-graph": {"skipped": "its first steps crashed (SIGABRT)"}},
           "goal": {"ours": "ours-captured", "fastest_torch": "torch-eager", "ratio": ours_captured_s / 0.008},
           "memory": {}, "cost": {}}
    path = tmp_path / "step.json"
    path.write_text(json.dumps({"info": {}, "rows": [row]}, indent=2) + "\n")
    return path


def test_an_unknown_profile_is_refused_before_any_work(tmp_path):
    result, out = run_check(tmp_path, "passing", 480, GPU_CHECK_PROFILE="thorough")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["gpu_check.sh: GPU_CHECK_PROFILE must be quick or full, got 'thorough'"]
    assert not out.exists()


def test_the_quick_profile_runs_its_steps_within_three_minutes(tmp_path):
    calls = tmp_path / "calls.txt"
    result, out = run_check(tmp_path, "passing", "", GPU_CHECK_PROFILE="quick", CALLS=str(calls))  # its own budget
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "gpu_summary.json").read_text())
    assert summary["profile"] == "quick" and summary["budget_s"] == 180 and summary["passed"] is True
    # our step against PyTorch eager and its CUDA graph at B=100, both precisions (train_step.py's default)
    call = calls.read_text()
    assert "--batch 100 --repeat 3 --torch-variants eager graph --partial-json" in call and "compile" not in call
    assert summary["gpu_tests"] == "5 tests, 0 skipped" and summary["gpu_tests_nccl"] is None
    assert summary["sanitizers"] == {"memcheck": None, "racecheck": None}
    assert "first-epoch" not in result.stdout and "epoch-fashion-mnist" not in result.stdout
    assert "routing-speed (at most 45s)" in result.stdout
    assert "history" in summary  # compared with the history, as the full check is


def test_every_run_is_kept_in_the_history_and_compared_with_the_last_of_its_gpu_model(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    earlier = {"format": 1, "date": "2026-11-28", "gpu": "Stand-in GPU", "gpu_model": "stand-in-gpu",
               "transcribed": None, "versions": {}, "figures": {
                   "step B=32 high: ours captured (ms)": {"value": 1.5, "unit": "ms", "better": "lower"},
                   "step B=32 high: ours eager (ms)": {"value": 10.5, "unit": "ms", "better": "lower"}}}
    (history / "2026-11-28-stand-in-gpu.json").write_text(json.dumps(earlier))
    other = dict(earlier, gpu="Other GPU", gpu_model="other-gpu", date="2026-11-29")
    (history / "2026-11-29-other-gpu.json").write_text(json.dumps(other))
    result, out = run_check(tmp_path, "passing", 480, TRAIN_STEP_JSON=str(passing_step_json(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr  # a regression is flagged, not failed
    summary = json.loads((out / "gpu_summary.json").read_text())
    section = summary["history"]
    assert section["against"].endswith("2026-11-28-stand-in-gpu.json")  # the same model, not the newer other
    assert section["regressions"] == ["step B=32 high: ours captured (ms)"]  # 2.0 ms against 1.5 ms: +33%
    assert any("REGRESSION" in line for line in section["lines"]) and "1 regression beyond 10%" in result.stdout
    (written,) = [p for p in history.glob("*stand-in-gpu*.json") if p.name != "2026-11-28-stand-in-gpu.json"]
    record = json.loads(written.read_text())
    assert record["gpu"] == "Stand-in GPU" and record["transcribed"] is None
    assert record["figures"]["step B=32 high: ours captured (ms)"]["value"] == 2.0
    assert record["figures"]["step B=32 high: PyTorch CUDA graph (ms)"] == {
        "value": None, "unit": "ms", "better": None, "note": "its first steps crashed (SIGABRT)"}
    assert (out / f"history-{written.name}").read_text() == written.read_text()  # comes back with the summary
