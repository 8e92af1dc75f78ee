"""The prepared GPU scripts of the GPU issue (graph_buffers_check.py, cold_start.py, step_profile.py)
without a GPU: their arithmetic here, their whole run on the CPU stand-in for CuPy with the tiny model
(so that a slip costs no GPU time), and the spin kernel step_profile.py launches compiled by NVRTC."""
import json
import math
import shutil

import pytest

from paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
NEEDS_GXX = pytest.mark.skipif(shutil.which("g++") is None, reason="the stand-in runs the kernels on their emulation")


@pytest.fixture
def step_profile(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_profile

    return step_profile


def test_contractions_count_two_flops_per_multiply_add(step_profile):
    flops = step_profile.contraction_flops
    assert flops("MatMul", [(100, 160), (160, 512), (100, 512)]) == 2 * 100 * 160 * 512
    assert flops("MatMul", [(4, 3, 5), (4, 5, 2), (4, 3, 2)]) == 2 * 4 * 3 * 5 * 2
    assert flops("Conv2d", [(100, 256, 20, 20), (256, 256, 9, 9), (256,), (100, 256, 6, 6)]) == \
        2 * 100 * 6 * 6 * 256 * 256 * 81
    assert flops("CapsulePredict", [(100, 1152, 8), (1152, 10, 16, 8), (100, 1152, 10, 16)]) == 2 * 100 * 1152 * 10 * 16 * 8
    assert flops("RoutingAgreement", [(100, 1152, 10, 16), (100, 10, 16), (100, 1152, 10)]) == 2 * 100 * 1152 * 160
    assert flops("Add", [(3,), (3,), (3,)]) is None


def test_the_spin_kernel_compiles_with_nvrtc(step_profile):
    compile_check = pytest.importorskip("tinygrad_caps.kernels.checking.compile_check")
    try:
        compile_check.nvrtc_bindings().getVersion()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVRTC is not usable here: {exc}")
    for arch in compile_check.ARCHITECTURES:
        assert compile_check.compile_text_with_nvrtc(step_profile.SPIN_SOURCE, "spin.cu", arch)


def run_script(*args, timeout=600):
    from standin import run_standin

    return run_standin(list(args), devices=1, cwd=BENCHMARKS, timeout=timeout)


@NEEDS_GXX
@pytest.mark.slow
def test_graph_buffers_check_runs_on_the_stand_in():
    result = json.loads(run_script("graph_buffers_check.py", "--model", "tiny", "--batch", "4", "--steps", "2", "--json"))
    assert result["ok"] and result["ours"]["ok"] and result["ours"]["standin_freed_graph_buffers"] == []
    assert result["ours"]["max_rel_diff_to_eager"] <= 1e-5 and result["ours"]["labels_unchanged"]


@NEEDS_GXX
@pytest.mark.slow
def test_cold_start_times_every_phase_cold_and_warm_on_the_stand_in():
    result = json.loads(run_script("cold_start.py", "--model", "tiny", "--batch", "4", "--replays", "2", "--json"))
    cold, warm = result["runs"]
    assert (cold["run"], warm["run"]) == ("cold", "warm")
    phases = [phase["phase"] for phase in cold["phases"]]
    assert phases[0] == "import tinygrad_caps" and phases[-1] == "2 replays" and len(phases) == 10
    modules = next(p for p in cold["phases"] if "module_seconds" in p)
    assert set(modules["module_seconds"]) >= {"capsule.cu[f32]", "routing.cu[f32]", "im2col.cu[f32]"}
    assert modules["new_cache_files"]["ours"] == len(modules["module_seconds"])  # compiled cold ...
    assert sum(p["new_cache_files"]["ours"] for p in warm["phases"]) == 0          # ... and found warm
    for run in (cold, warm):
        assert all(p["seconds"] >= 0 and p["start_s"] >= 0 for p in run["phases"]) and run["replay_seconds"] > 0


@NEEDS_GXX
@pytest.mark.slow
def test_step_profile_times_every_op_of_the_step_on_the_stand_in():
    (result,) = json.loads(run_script("step_profile.py", "--model", "tiny", "--batch", "4", "--spin-us", "0",
                                      "--precision", "high", "--json"))["profiles"]
    ops = {(row["op"], row["phase"]) for row in result["ops"]}
    assert {("CapsulePredict", "forward"), ("CapsulePredict", "backward"), ("Conv2d", "forward"),
            ("Adam (every parameter)", "update"), ("(gradient sums)", "backward")} <= ops
    assert math.isclose(sum(row["share"] for row in result["ops"]), 1.0, rel_tol=1e-9)
    assert result["ops"] == sorted(result["ops"], key=lambda row: -row["seconds"])
    predict = next(row for row in result["ops"] if row["op"] == "CapsulePredict" and row["phase"] == "forward")
    assert predict["gflop"] * 1e9 == 2 * 4 * 18 * 3 * 4 * 4  # B=4, I=18 capsules of 4, J=3 of 4
    assert result["captured_step_seconds"] > 0 and result["peak"] is None  # no datasheet for the stand-in
