"""The GPU history (benchmarks/gpu_history.py, compare_gpu_runs.py): a run's figures under stable
names, a regression flagged where a figure that improves downwards grew, or one that improves upwards
fell, by more than 10%; someone else's figures only reported; the first file transcribed from the GPU
issue's table, its names those that gpu_check writes."""
import json
import subprocess
import sys

import pytest

from paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
TRANSCRIBED = BENCHMARKS / "history" / "gpu" / "2026-11-28-nvidia-h200.json"


@pytest.fixture
def history(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_history

    return gpu_history


def record(figures, date="2026-12-01", gpu="NVIDIA H200"):
    return {"format": 1, "date": date, "gpu": gpu, "gpu_model": gpu.lower().replace(" ", "-"), "transcribed": None,
            "versions": {}, "figures": {name: dict(zip(("value", "unit", "better"), f)) for name, f in figures.items()}}


OLD = record({"step (ms)": (5.0, "ms", "lower"), "kernel: fraction": (0.5, "fraction", "higher"),
              "PyTorch (ms)": (9.0, "ms", None), "epoch (s)": (4.0, "s", "lower"), "failed tests": (0, "tests", "lower"),
              "speed-up": (2.0, "x", "higher")}, date="2026-11-30")


@pytest.mark.parametrize("name, value, regression", [
    ("step (ms)", 5.5, False), ("step (ms)", 5.51, True), ("step (ms)", 3.0, False),   # +10% is within
    ("kernel: fraction", 0.45, False), ("kernel: fraction", 0.449, True), ("kernel: fraction", 0.9, False),
    ("PyTorch (ms)", 90.0, False),                                                      # someone else's
    ("epoch (s)", None, True),                                                          # measured before, not now
    ("failed tests", 1, True), ("speed-up", 1.7, True),
])
def test_a_regression_is_a_change_beyond_ten_percent_the_wrong_way(history, name, value, regression):
    new = json.loads(json.dumps(OLD))
    new["figures"][name]["value"] = value
    result = history.compare(OLD, new)
    assert result["regressions"] == ([name] if regression else [])
    row = next(r for r in result["rows"] if r["name"] == name)
    assert row["ratio"] == (None if value is None or OLD["figures"][name]["value"] == 0
                            else pytest.approx(value / OLD["figures"][name]["value"]))


def test_figures_only_in_one_run_are_listed_never_flagged(history):
    new = record({"step (ms)": (5.0, "ms", "lower"), "new kernel: fraction": (0.3, "fraction", "higher")})
    result = history.compare(OLD, new)
    assert result["regressions"] == [] and {r["name"] for r in result["rows"]} == set(OLD["figures"]) | {
        "new kernel: fraction"}


def test_the_command_prints_each_ratio_and_exits_1_on_a_regression(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(OLD))
    worse = json.loads(json.dumps(OLD))
    worse["figures"]["step (ms)"]["value"] = 6.0
    new.write_text(json.dumps(worse))
    run = lambda *files: subprocess.run([sys.executable, "compare_gpu_runs.py", *map(str, files)], cwd=BENCHMARKS,  # noqa: E731
                                        capture_output=True, text=True, timeout=60)
    done = run(old, new)
    assert done.returncode == 1, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("step (ms)"))
    assert line.split()[2:6] == ["5", "6", "1.200", "REGRESSION"]
    assert "1 regression beyond 10%: step (ms)" in done.stdout
    assert run(old, old).returncode == 0
    (tmp_path / "bad.json").write_text("{")
    done = run(old, tmp_path / "bad.json")
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1


def test_the_newest_file_of_the_same_gpu_model_is_the_one_compared_with(history, tmp_path):
    for date, gpu in (("2026-11-28", "NVIDIA H200"), ("2026-12-02", "NVIDIA H200"), ("2026-12-05", "NVIDIA H100")):
        r = record({}, date=date, gpu=gpu)
        history.free_name(tmp_path, date, r["gpu_model"]).write_text(json.dumps(r))
    second = history.free_name(tmp_path, "2026-12-02", "nvidia-h200")
    assert second.name == "2026-12-02-nvidia-h200-2.json"
    second.write_text(json.dumps(record({}, date="2026-12-02")))
    (tmp_path / "notes.json").write_text("[]")  # not a history file: passed over
    assert history.newest_of_model("nvidia-h200", tmp_path) == second
    assert history.newest_of_model("nvidia-a100", tmp_path) is None


def full_summary():
    """A gpu_check summary with every figure gpu_check gathers (the names routing_speed.py and
    first_epoch.py give their rows)."""
    rows = [{"batch": b, "precision": p, "ms": {"ours-captured": 5.0, "ours-eager": 9.0, "torch-eager": 8.0,
                                                "torch-compile-reduce-overhead": 9.0},
             "skipped": {"torch-graph": "crashed", "torch-compile-max-autotune": "did not compile within 360 s"},
             "ratio_to_fastest_pytorch": 0.6, "fastest_pytorch": "torch-eager", "ours_fraction_of_peak": 0.3,
             "memory_captured_to_eager": 1.05} for b in (32, 100) for p in ("highest", "high")]
    kernels = ["capsule_predict", "capsule_predict (W[i] in shared memory, forced)", "capsule_grad (u and W)",
               "capsule_grad_u", "capsule_grad_w", "routing_agreement", "im2col (PrimaryCaps)"]
    return {"versions": {"gpu": "NVIDIA H200"}, "gpu_tests": "1 failed, 147 passed in 90.1s",
            "sanitizers": {"memcheck": "========= ERROR SUMMARY: 0 errors",
                           "racecheck": "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"},
            "figures": {"train_step_ms": rows, "kernel_fraction_of_copy_bandwidth": {k: 0.5 for k in kernels},
                        "kernel_variants": {"capsule_predict": "shared (tuned)"},
                        "fused_forward_speedup": {"speedup": 3.0, "goal": 5.0, "met": False},
                        "first_epoch_seconds": {run: {"epoch": 5.0, "process": 9.0, "new_cache_files": 60}
                                                for run in ("cold-lazy", "cold", "warm")}}}


def test_the_transcribed_run_is_marked_and_its_names_are_those_gpu_check_writes(history):
    transcribed = history.read(TRANSCRIBED)
    assert transcribed["transcribed"] and transcribed["gpu_model"] == "nvidia-h200" and transcribed["date"] == "2026-11-28"
    figures = transcribed["figures"]
    assert figures["step B=100 highest: ours / torch.compile reduce-overhead"]["value"] == 0.565
    assert figures["kernel capsule_predict: fraction of copy bandwidth"]["value"] == 0.119
    assert figures["step B=32 highest: PyTorch CUDA graph (ms)"]["value"] is None  # crashed: said in its note
    written = history.figures_from_summary(full_summary())
    not_from_gpu_check = {name for name in figures if name.startswith(("runs per device", "NCCL"))}
    assert set(figures) - not_from_gpu_check <= set(written), set(figures) - not_from_gpu_check - set(written)
    assert written["GPU tests failed"]["value"] == 1 and written["compute-sanitizer racecheck: hazards"]["value"] == 0
    assert written["kernel capsule_predict: fraction of copy bandwidth"]["note"] == "variant shared (tuned)"
    # the next run side by side with the transcribed one, goals beside them: RESULTS.md's table
    table = history.markdown_table([transcribed, history.history_record(full_summary(), "2026-12-01")])
    assert table[0] == "| figure | goal | NVIDIA H200, 2026-11-28 (transcribed) | NVIDIA H200, 2026-12-01 |"
    assert "| kernel capsule_predict: fraction of copy bandwidth | >= 0.8 | 0.119 (variant registers, the fixed " \
           "default then) | 0.500 (variant shared (tuned)) |" in table
