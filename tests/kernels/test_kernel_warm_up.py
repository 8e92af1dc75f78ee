"""Compiling every kernel module at a GPU's first launch, in parallel, once per machine
(``tinygrad_caps.kernels.warmup``): on the CPU stand-in (its RawModule compiles through a model of
CuPy's kernel cache), against the installed CuPy's own cache with NVRTC (no GPU), a CPU-only run
that touches none of it, and on a real GPU."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from paths import ROOT, SUPPORT
from standin import launch_standin, run_standin
from tinygrad_caps.kernels import modules
from tinygrad_caps.kernels.launch import cuda_sources

NEEDS_GXX = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="the stand-in runs the kernels on their g++ emulation")


def scenario(name, **kwargs):
    """The JSON line a warm_up_scenarios.py scenario printed (under the stand-in)."""
    return json.loads(run_standin([str(SUPPORT / "warm_up_scenarios.py"), name], **kwargs).strip().splitlines()[-1])


@NEEDS_GXX
@pytest.mark.slow
def test_the_warm_up_compiles_every_module_once_in_parallel_and_a_second_process_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUPY_STANDIN_COMPILE_SECONDS", "0.3")  # NVRTC's time, the GIL released
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    first = scenario("warm_up_twice")
    assert sorted(first["first"]) == sorted(first["modules"])  # each .cu per dtype (and optim.cu's of none)
    assert {m.split("[")[0] for m in first["modules"]} == set(cuda_sources()) and len(first["modules"]) > 2 * 4
    assert first["compiled"] == first["distinct"] == len(first["modules"])
    assert first["second"] == []  # a second call in the process: nothing
    assert first["files"] == sorted(os.listdir(tmp_path / "cache")) and len(first["files"]) == len(first["modules"])
    if first["workers"] >= 2:
        assert first["most_at_once"] >= 2
        assert sum(first["module_seconds"].values()) > 1.5 * first["seconds"]  # they overlapped
    again = scenario("warm_up_twice")  # a new process, the same cache
    assert sorted(again["first"]) == sorted(first["modules"]) and again["compiled"] == 0
    assert again["files"] == first["files"]
    assert not (tmp_path / "home").exists()  # the cache folder named is the one used


@NEEDS_GXX
@pytest.mark.slow
def test_the_first_launch_warms_up_every_module_of_its_dtype_unless_turned_off(monkeypatch):
    monkeypatch.delenv("CUPY_CACHE_DIR", raising=False)  # the stand-in's cache then lives in the process
    warmed = scenario("first_launch")
    float32 = [m for m in warmed["modules"] if not m.endswith("[f64]")]  # and optim.cu's kernels of no dtype
    assert warmed["loaded"] == float32 and warmed["compiled"] == len(float32)
    monkeypatch.setenv("TINYGRAD_CAPS_KERNEL_WARM_UP", "0")
    lazy = scenario("first_launch")  # each module at the first launch of one of its kernels
    assert set(lazy["loaded"]) < set(float32) and lazy["compiled"] == len(lazy["loaded"])
    assert not any(m.startswith("optim.cu") for m in lazy["loaded"])


@pytest.mark.slow
def test_the_warm_up_says_that_it_needs_a_gpu():
    result = launch_standin([sys.executable, str(SUPPORT / "warm_up_scenarios.py"), "no_gpu"], devices=0)
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said["error"] == "DeviceError" and "GPU" in said["message"]
    command = launch_standin([sys.executable, "-m", "tinygrad_caps.kernels.warmup"], devices=0)
    assert command.returncode == 2 and "needs a GPU" in command.stderr


@pytest.mark.slow
def test_a_cpu_run_neither_imports_cupy_nor_compiles():
    program = """
import sys
import numpy as np
import tinygrad_caps as tc
from tinygrad_caps.kernels import modules, warmup
from tinygrad_caps.models import CapsNet
from tinygrad_caps.models.app.training.step import capsnet_training_step
model = CapsNet(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3, in_channels=1,
                image_size=10, num_classes=3, decoder_hidden=(16, 32))
x = tc.tensor(np.random.default_rng(0).random((2, 1, 10, 10), dtype=np.float32))
_, step = capsnet_training_step(model, x, np.array([0, 2]))
step()
print("cupy" in sys.modules, len(modules._modules), len(warmup._warm))
"""
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "0", "0"]


@pytest.mark.slow
def test_the_first_epoch_benchmark_says_that_it_needs_a_gpu():
    env = dict(os.environ, TINYGRAD_CAPS_DEVICE="cpu", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "benchmarks/first_epoch.py", "--runs", "cold"], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 2 and "needs a GPU" in result.stderr, result.stderr[-3000:]


def nvrtc_available() -> bool:
    try:
        from tinygrad_caps.kernels.checking.compile_check import nvrtc_bindings

        nvrtc_bindings().getVersion()
        return True
    except Exception:  # noqa: BLE001  (no CuPy, or no NVRTC library)
        return False


@pytest.mark.slow
@pytest.mark.skipif(not nvrtc_available(), reason="needs CuPy and NVRTC (nvidia-cuda-nvrtc)")
def test_cupys_kernel_cache_keeps_our_modules_across_processes(tmp_path):
    """The installed CuPy's RawModule path, NVRTC included: a process compiles each module (each
    .cu per dtype) once into CUPY_CACHE_DIR, the next one compiles none, and a changed source
    compiles again (its modules alone). On the two smallest sources' modules: the cache treats every
    module alike, and test_kernels_compile.py compiles every source."""
    sources = ["activation.cu", "optim.cu"]
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path / "home"),
               CUPY_CACHE_PROBE_SOURCES=",".join(sources))

    def probe(*args):
        result = subprocess.run([sys.executable, str(SUPPORT / "cupy_cache_probe.py"), *args], capture_output=True,
                                text=True, cwd=ROOT, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    every = sorted(modules.module_label(s, v) for s in sources for v in modules.module_variants(s))
    assert probe()["compiled"] == every
    cubins = sorted(f for f in os.listdir(tmp_path / "cache") if f.endswith(".cubin"))
    assert len(cubins) == len(every)
    assert probe()["compiled"] == []
    assert probe("// a changed activation.cu")["compiled"] == ["activation.cu[f32]", "activation.cu[f64]"]
    assert not (tmp_path / "home").exists()


@pytest.mark.gpu
def test_the_warm_up_on_the_gpu_fills_the_cache_once(tmp_path):
    """On a GPU, in fresh processes with an empty CUPY_CACHE_DIR: the first warms every module up
    (new cubins in the folder), the second loads them all and writes nothing."""
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cache"))
    every = sum(len(modules.module_variants(s)) for s in cuda_sources())
    runs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-m", "tinygrad_caps.kernels.warmup"], capture_output=True, text=True,
                                cwd=ROOT, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(result.stdout)
    assert f"{every} kernel modules ready" in runs[0] and f"{every} new files" in runs[0], runs[0]
    assert "0 new files" in runs[1], runs[1]
