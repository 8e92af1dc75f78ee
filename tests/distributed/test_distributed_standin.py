"""Distribution on the CPU stand-in for CuPy (``tests/support/cupy_standin``, see
kernels/test_cupy_standin.py): NCCL collectives and DDP on one stand-in rank, the GPU tests of
test_distributed.py and a distributed training under ``mpirun -n 2`` with one stand-in GPU per
rank, and the clear error when ranks outnumber the GPUs. Each run is a process of its own."""
import shutil
import sys

import pytest

from helpers import assert_metrics_close, metrics_without_times, needs_mpi, train_command, write_striped_dataset
from paths import SUPPORT
from standin import launch_standin, run_standin, summary

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernels' CPU emulation needs g++")


@pytest.mark.slow
@needs_mpi
def test_nccl_tests_pass_on_one_and_two_stand_in_gpus():
    """The GPU tests of test_distributed.py: NCCL collectives and DDP under mpirun, one stand-in GPU
    per rank, the stand-in's NCCL reducing through MPI. No GPU machine lent to this project has two
    GPUs, so this is where the two-rank path runs."""
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
                          "tests/distributed/test_distributed.py"])
    assert summary(output) == {"passed": 3, "deselected": 31}, output[-3000:]


@pytest.mark.slow
@needs_mpi
def test_distributed_training_on_two_stand_in_gpus_equals_one_gpu(tmp_path):
    """`train --distributed --device cuda` under mpirun -n 2 (NCCL, one stand-in GPU per rank), then
    --resume from its checkpoint for a second epoch, against one process on one GPU for two epochs."""
    data = tmp_path / "data"  # 32 training and 16 test images: two steps an epoch, the ranks 8 images each
    write_striped_dataset(data / "tiny", (32, 16), size=12, cycle_labels=True, stripe_end=9)

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
    output = run_standin([str(SUPPORT / "standin_scenarios.py"), "nccl_runs_when_waited_for"], processes=2, timeout=120)
    assert output.split() == ["ok", "ok"], output[-3000:]


@needs_mpi
def test_more_ranks_than_gpus_is_one_clear_error_on_every_rank(tmp_path):
    """With one stand-in GPU, mpirun -n 2 would put both ranks on GPU 0, which NCCL refuses: every
    rank stops at init with the reason (one line from the CLI, exit 2), and none waits for the other."""
    reason = "needs one GPU per rank (NCCL refuses two ranks on one GPU): "
    done = launch_standin([sys.executable, str(SUPPORT / "distributed_worker.py"), "nccl"], devices=1, processes=2,
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
    assert run_standin([str(SUPPORT / "standin_scenarios.py"), "nccl_one_rank"]).strip() == "ok"
