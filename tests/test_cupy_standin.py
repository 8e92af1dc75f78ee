"""The GPU code path without a GPU: the GPU tests and a training run under the CPU stand-in for
CuPy (``tests/cupy_standin``: NumPy arrays that refuse what CuPy refuses, our kernels on the CPU
emulation, two stand-in GPUs). Each run is a process of its own, with the stand-in first on the
path. It catches what only a GPU run would show otherwise: an implicit copy to NumPy, an array
made on the current GPU instead of its tensor's, a kernel argument of the wrong width."""
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import (assert_metrics_close, metrics_without_times, needs_mpi, run_with_group_timeout, single_thread_env,
                     train_command, write_striped_dataset, write_tiny_data)
from tinygrad_caps.distributed.launch import mpirun_command

TESTS = Path(__file__).resolve().parent
STANDIN = TESTS / "cupy_standin"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernels' CPU emulation needs g++")


def launch_standin(command, devices=2, processes=1, cwd=TESTS.parent, timeout=300):
    """Run ``command`` (its Python programs see the stand-in as ``cupy``, with ``devices`` GPUs), under
    ``mpirun -n processes`` when processes > 1 (one BLAS thread per rank); returns the completed process."""
    env = single_thread_env() if processes > 1 else dict(os.environ)
    env.pop("TINYGRAD_CAPS_DEVICE", None)
    env.update(CUPY_STANDIN_DEVICES=str(devices), TINYGRAD_CAPS_REQUIRE_GPU="1",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    launcher = mpirun_command(processes) if processes > 1 else []
    return run_with_group_timeout(launcher + command, timeout, cwd=cwd, env=env)


def run_standin(args, **kwargs):
    """``python *args`` under the stand-in (see launch_standin); it must succeed; returns its stdout."""
    result = launch_standin([sys.executable, *args], **kwargs)
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
    assert summary(output) == {"passed": 32, "skipped": 4}, output[-3000:]
    assert output.count("checks the message on a machine without a GPU") == 1, output[-3000:]


@pytest.mark.slow
def test_gpu_kernel_tests_pass_on_the_stand_in_below_capsnet_sizes():
    # shape2 and case1 are CapsNet's own sizes: about 4 minutes here, so they are left to the GPU run
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu_kernels.py",
                          "-k", "not shape2 and not case1"])
    assert summary(output) == {"passed": 24, "deselected": 8}, output[-3000:]


@pytest.mark.slow
def test_routing_speed_gpu_branches_run_on_the_stand_in():
    """Everything routing_speed.py does only on a GPU (CUDA events, the pool's peak, every kernel
    replayed alone), at small sizes: a slip there would otherwise cost the first GPU run."""
    output = run_standin(["routing_speed.py", "--impl", "cupy", "raw", "fused", "--batch", "2", "--in-caps", "16",
                          "--repeat", "1", "--warmup", "0", "--json"], cwd=TESTS.parent / "benchmarks")
    result = json.loads(output)
    assert result["info"]["gpu"] == "CPU stand-in for CuPy"
    rows = {(row["impl"], row["pass"]): row for row in result["rows"]}
    assert set(rows) == {("cupy", "forward"), ("cupy", "forward+backward"), ("raw", "forward"),
                         ("raw", "forward+backward"), ("fused", "forward")}
    for row in rows.values():
        assert row["median_s"] > 0 and row["max_rel_error"] < 1e-5 and row["peak_bytes"] > 0, row
        assert 0 < row["fraction_of_copy_bandwidth"] < 10, row
    kernels = result["raw_kernels"]
    assert {name.split(" (")[0] for name in kernels} == {
        "capsule_predict", "capsule_grad", "capsule_grad_u", "capsule_grad_w", "routing_weighted_sum",
        "routing_agreement", "routing_forward", "routing_outer_products", "squash_rows", "squash_rows_grad",
        "softmax_rows", "softmax_rows_grad", "adam_step", "im2col", "col2im"}
    for name, kernel in kernels.items():
        assert kernel["kernel_seconds"] > 0 and kernel["op_seconds"] > 0 and kernel["launches"] >= 1, (name, kernel)
        assert kernel["bytes"] > 0 and kernel["fraction_of_copy_bandwidth"] > 0, (name, kernel)


def test_training_on_the_second_gpu_equals_the_cpu(tmp_path):
    assert run_standin([str(TESTS / "standin_scenarios.py"), "train_on_the_second_gpu", str(tmp_path)]).strip() == "ok"


@pytest.mark.slow
@needs_mpi
def test_nccl_tests_pass_on_one_and_two_stand_in_gpus():
    """The GPU tests of test_distributed.py: NCCL collectives and DDP under mpirun, one stand-in GPU
    per rank, the stand-in's NCCL reducing through MPI. No GPU machine lent to this project has two
    GPUs, so this is where the two-rank path runs."""
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs", "tests/test_distributed.py"])
    assert summary(output) == {"passed": 3, "deselected": 31}, output[-3000:]


@pytest.mark.slow
@needs_mpi
def test_distributed_training_on_two_stand_in_gpus_equals_one_gpu(tmp_path):
    """`train --distributed --device cuda` under mpirun -n 2 (NCCL, one stand-in GPU per rank), then
    --resume from its checkpoint for a second epoch, against one process on one GPU for two epochs."""
    data = write_tiny_data(tmp_path / "data")

    def train(out, epochs, *extra, processes=1):
        command = train_command(data, tmp_path / out, "--epochs", str(epochs), "--device", "cuda", *extra)
        done = launch_standin(command, processes=processes, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    train("one", 2)
    train("two", 1, "--distributed", processes=2)
    train("two", 2, "--distributed", "--resume", processes=2)
    two = metrics_without_times(tmp_path / "two")
    assert len(two) == 2
    assert_metrics_close(two, metrics_without_times(tmp_path / "one"))


@needs_mpi
def test_a_collective_on_a_side_stream_runs_only_when_waited_for():
    output = run_standin([str(TESTS / "standin_scenarios.py"), "nccl_runs_when_waited_for"], processes=2, timeout=120)
    assert output.split() == ["ok", "ok"], output[-3000:]


@needs_mpi
def test_more_ranks_than_gpus_is_one_clear_error_on_every_rank(tmp_path):
    """With one stand-in GPU, mpirun -n 2 would put both ranks on GPU 0, which NCCL refuses: every
    rank stops at init with the reason (one line from the CLI, exit 2), and none waits for the other."""
    reason = "needs one GPU per rank (NCCL refuses two ranks on one GPU): "
    done = launch_standin([sys.executable, str(TESTS / "distributed_worker.py"), "nccl"], devices=1, processes=2,
                          timeout=120)
    assert done.returncode != 0
    assert done.stderr.count("DistributedSetupError: init(backend='nccl') " + reason) == 2, done.stderr[-3000:]
    assert "has 2 ranks and 1 GPU." in done.stderr, done.stderr[-3000:]
    write_striped_dataset(tmp_path / "tiny", (8, 4))
    cli = train_command(tmp_path, tmp_path / "run", "--distributed", "--device", "cuda")
    done = launch_standin(cli, devices=1, processes=2, timeout=120)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "tinygrad-caps train: error: init(backend='nccl') " + reason in done.stderr


def test_nccl_collectives_and_ddp_on_one_stand_in_rank():
    assert run_standin([str(TESTS / "standin_scenarios.py"), "nccl_one_rank"]).strip() == "ok"
