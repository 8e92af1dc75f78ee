"""The GPU code path without a GPU: the GPU tests and a training run under the CPU stand-in for
CuPy (``tests/cupy_standin``: NumPy arrays that refuse what CuPy refuses, our kernels on the CPU
emulation, two stand-in GPUs). Each run is a process of its own, with the stand-in first on the
path. It catches what only a GPU run would show otherwise: an implicit copy to NumPy, an array
made on the current GPU instead of its tensor's, a kernel argument of the wrong width."""
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import run_with_group_timeout

TESTS = Path(__file__).resolve().parent
STANDIN = TESTS / "cupy_standin"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernels' CPU emulation needs g++")


def run_standin(args, cwd=TESTS.parent, timeout=300):
    env = dict(os.environ, CUPY_STANDIN_DEVICES="2", TINYGRAD_CAPS_REQUIRE_GPU="1",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    env.pop("TINYGRAD_CAPS_DEVICE", None)
    result = run_with_group_timeout([sys.executable, *args], timeout, cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return result.stdout


def summary(output: str) -> dict:
    """pytest's closing counts ("31 passed, 4 skipped") as {"passed": 31, "skipped": 4}."""
    last = output.strip().splitlines()[-1]
    return {word: int(count) for count, word in re.findall(r"(\d+) (\w+)", last)}


def test_the_stand_in_refuses_what_cupy_refuses_and_tensors_stay_on_their_gpu():
    output = run_standin([str(TESTS / "standin_scenarios.py"),
                          "standin_refuses_what_cupy_refuses,tensor_api_on_the_second_gpu"])
    assert output.split() == ["ok", "ok"]


def test_gpu_op_and_device_tests_pass_on_two_stand_in_gpus():
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/test_gpu_ops.py",
                          "tests/test_devices.py", "-k", "not nccl"])
    # every GPU and two-GPU test ran; the 4 skips are the no-GPU message checks
    assert summary(output) == {"passed": 31, "skipped": 4}, output[-3000:]
    assert output.count("checks the message on a machine without a GPU") == 1, output[-3000:]


def test_gpu_kernel_tests_pass_on_the_stand_in_at_small_shapes():
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu_kernels.py",
                          "-k", "shape0 or shape3 or case0 or switch"])
    assert summary(output) == {"passed": 9, "deselected": 11}, output[-3000:]


def test_training_on_the_second_gpu_equals_the_cpu(tmp_path):
    assert run_standin([str(TESTS / "standin_scenarios.py"), "train_on_the_second_gpu", str(tmp_path)]).strip() == "ok"


def test_nccl_collectives_and_ddp_on_one_stand_in_rank():
    assert run_standin([str(TESTS / "standin_scenarios.py"), "nccl_one_rank"]).strip() == "ok"
