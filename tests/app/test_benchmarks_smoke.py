"""The two benchmarks that benchmarks/gpu_check.sh runs on a GPU, at tiny sizes on the CPU: their
options parse, they compare against PyTorch from the same initial weights, and their JSON is the
last thing they print (gpu_check.sh reads it from there). Also the kernel self-test's answer
without a GPU. Figures are not checked here: performance lives in benchmarks/RESULTS.md."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import tinygrad_caps as tc
from paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def last_json(stdout: str) -> dict:
    """The JSON object a benchmark prints last, found as gpu_check.sh finds it."""
    return json.loads(stdout[stdout.rfind("\n{") + 1:])


def run_benchmark(*args):
    done = subprocess.run([sys.executable, *args], cwd=BENCHMARKS, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return last_json(done.stdout)


@pytest.mark.parametrize("option, value", [("--primary-channels", "0"), ("--batch", "-1"), ("--in-caps", "x")])
def test_routing_speed_refuses_a_size_below_1_naming_the_option(option, value):
    done = subprocess.run([sys.executable, "routing_speed.py", option, value], cwd=BENCHMARKS, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1].startswith(f"routing_speed.py: error: argument {option}: ")


def test_routing_speed_reports_every_implementation_and_pass():
    impls = ["numpy"] + (["torch"] if HAS_TORCH else [])
    result = run_benchmark("routing_speed.py", "--impl", *impls, "--batch", "2", "--in-caps", "16", "--repeat", "2",
                           "--warmup", "1", "--json")
    rows = [row for row in result["rows"] if "impl" in row]
    assert {row["impl"] for row in rows} == {"numpy"} | ({"torch-cpu"} if HAS_TORCH else set())
    assert {row["pass"] for row in rows} == {"forward", "forward+backward"}
    for row in rows:
        assert row["median_s"] > 0 and row["max_rel_error"] < 1e-5


@pytest.mark.slow
def test_train_step_starts_both_libraries_from_the_same_weights():
    result = run_benchmark("train_step.py", "--batch", "2", "--repeat", "1", "--json")
    (row,) = result["rows"]
    assert row["batch"] == 2 and row["ours_s"] > 0 and result["info"]["device"] == "cpu"
    if HAS_TORCH:
        assert row["torch_s"] > 0 and row["ratio"] == pytest.approx(row["ours_s"] / row["torch_s"])
        assert row["first_loss_ours"] == pytest.approx(row["first_loss_torch"], rel=1e-5)
    # PyTorch's GPU variants and our capture say why they are not run on the CPU; the cost is counted
    variants = row["variants"]
    assert "CUDA graphs need a GPU" in variants["ours-captured"]["skipped"]
    assert variants["ours-eager"]["s"] == row["ours_s"] and variants["ours-eager"]["tflops"] > 0
    assert row["cost"]["gflop"] > 0 and row["cost"]["mb"] > 0 and row["cost"]["peak"] is None
    if HAS_TORCH:
        assert variants["torch-eager"]["first_loss"] == row["first_loss_torch"]
        assert "CUDA graphs need a GPU" in variants["torch-graph"]["skipped"]
        assert "torch.compile is not tried on the CPU" in variants["torch-compile-max-autotune"]["skipped"]
        assert row["goal"]["fastest_torch"] == "torch-eager"
        assert row["goal"]["ratio"] == pytest.approx(row["ours_s"] / row["torch_s"], abs=1e-12)
    assert row["memory"]["met"] is None and "measured on a GPU only" in result["info"]["not_measured_here"]


@pytest.mark.slow
def test_train_step_prints_its_table_with_the_goals_on_the_cpu():
    done = subprocess.run([sys.executable, "train_step.py", "--device", "cpu", "--batch", "2", "--repeat", "1",
                           "--torch-variants", "eager", "graph", "--no-torch-compile"],
                          cwd=BENCHMARKS, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ours-captured" in done.stdout and "skipped: CUDA graphs need a GPU" in done.stdout
    assert "GFLOP/step" in done.stdout and "memory goal (captured <= 1.1x eager peak): not measured" in done.stdout
    if HAS_TORCH:
        assert "time: ours-eager / torch-eager (PyTorch's fastest)" in done.stdout
        assert "torch-compile" not in done.stdout  # not asked for
    assert "nan" not in done.stdout


def test_train_step_isolated_a_crashing_variant_costs_its_own_cell(tmp_path):
    """--isolate: each variant's first steps in a process of its own; one that crashes (here ours
    eager at B=2, made to abort as a device-side assert would) costs that cell, with the reason; the
    other batch is timed; what was gathered is written after each stage (--partial-json)."""
    partial = tmp_path / "partial.json"
    done = subprocess.run([sys.executable, "train_step.py", "--batch", "2", "3", "--repeat", "1", "--isolate",
                           "--torch-variants", "eager", "--partial-json", str(partial), "--json"],
                          cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TRAIN_STEP_FAIL="ours-eager@2"))
    assert done.returncode == 0, done.stdout + done.stderr
    result = last_json(done.stdout)
    assert result["info"]["isolated"] is True
    first, second = result["rows"]
    assert "ours_s" not in first
    assert first["variants"]["ours-eager"]["skipped"].startswith("its first steps crashed (SIGABRT) in a process of "
                                                                 "its own: ") and "index out of bounds" in \
        first["variants"]["ours-eager"]["skipped"]
    assert second["ours_s"] > 0 and second["variants"]["ours-eager"]["s"] == second["ours_s"]
    if HAS_TORCH:  # PyTorch eager survived at both batches
        assert first["variants"]["torch-eager"]["s"] > 0 and second["variants"]["torch-eager"]["s"] > 0
    assert json.loads(partial.read_text())["rows"] == result["rows"]


@pytest.mark.skipif(tc.gpu_available(), reason="checks the answer on a machine without a GPU")
def test_the_kernel_self_test_says_when_there_is_no_gpu():
    done = subprocess.run([sys.executable, "-m", "tinygrad_caps.kernels.checking.selftest", "--small"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "no usable GPU" in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the CPU emulation needs g++")
def test_emulation_speed_times_fibers_and_os_threads_on_the_same_launches():
    result = run_benchmark("emulation_speed.py", "--batch", "1", "--repeat", "1", "--json")
    assert len(result["rows"]) == 5
    for row in result["rows"]:
        assert row["cuda_threads"] > 0 and row["fibers_seconds"] > 0 and row["os_threads_seconds"] > 0
        assert row["speedup"] == row["os_threads_seconds"] / row["fibers_seconds"]


def test_benchmarks_without_pytorch_say_so_and_leave_its_columns_out(tmp_path):
    """With PyTorch hidden (an import that fails, as where it is not installed): one line saying so,
    no PyTorch column and no "nan" in the table."""
    hidden = tmp_path / "torch"
    hidden.mkdir()
    (hidden / "__init__.py").write_text('raise ImportError("No module named torch")\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, "engine_overhead.py", "--batch", "1", "--repeat", "1", "--chain", "50"],
                          cwd=BENCHMARKS, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "PyTorch not installed" in done.stdout
    assert "nan" not in done.stdout and "torch fwd" not in done.stdout
