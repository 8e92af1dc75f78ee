"""Data-parallel training: the process group, DistributedDataParallel, sharded batches, the CLI.

The multi-process tests start ``mpirun -n 2`` in a subprocess with a timeout (never a hang) and
skip, saying why, only where mpi4py or an MPI launcher is missing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.distributed as dist
from tinygrad_caps.data import BatchIterator
from tinygrad_caps.distributed.launch import mpirun_command

from helpers import (MPI_OK, arrays, assert_metrics_close, check_both, gpu_count, metrics_without_times as metric_lines,
                     needs_mpi, on_grid, run_with_group_timeout, shapes, single_thread_env, train_command,
                     write_tiny_data)
from paths import SUPPORT

WORKER = SUPPORT / "distributed_worker.py"


def mpirun(args, processes=2, timeout=240, cwd=None):
    return run_with_group_timeout(mpirun_command(processes) + args, timeout, env=single_thread_env(), cwd=cwd)


def run_scenario(name, processes=2, timeout=240):
    done = mpirun([sys.executable, str(WORKER), name], processes, timeout)
    assert done.returncode == 0, f"mpirun {name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"expected one RESULT line from rank 0:\n{done.stdout}\n{done.stderr}"
    return json.loads(lines[0][len("RESULT "):])


# ----- one process: no MPI needed -----
def test_a_process_outside_mpi_is_a_group_of_one(monkeypatch):
    for name in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    assert not dist.launched_by_mpi()
    assert (dist.rank(), dist.world_size(), dist.local_rank(), dist.is_initialized()) == (0, 1, 0, False)
    x = np.arange(4.0)
    assert dist.all_reduce(x) is x and np.array_equal(x, np.arange(4.0))
    assert dist.all_gather_object("meta") == ["meta"]
    dist.init(backend="mpi")
    try:
        assert dist.is_initialized() and dist.get_backend() == "mpi" and dist.world_size() == 1
        with pytest.raises(RuntimeError, match="already initialized"):
            dist.init()
        t = tc.tensor(np.ones(3))
        dist.all_reduce(t, op="mean")
        dist.broadcast(t)
        dist.barrier()
        assert np.array_equal(t.numpy(), np.ones(3))
    finally:
        dist.finalize()
    assert not dist.is_initialized()


def test_outside_mpi_mpi4py_is_never_imported():
    code = ("import sys, numpy as np, tinygrad_caps as tc, tinygrad_caps.distributed as dist; dist.init(); "
            "x = np.ones(2); dist.all_reduce(x); dist.DistributedDataParallel(tc.nn.Linear(2, 2)); "
            "print(dist.world_size(), 'mpi4py' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=single_thread_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="backend"):
        dist.init(backend="gloo")
    with pytest.raises(ValueError, match="op must be one of"):
        dist.all_reduce(np.zeros(2), op="median")
    with pytest.raises(TypeError, match="expected a Tensor"):
        dist.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="floating"):
        dist.all_reduce(np.zeros(2, dtype=np.int64), op="mean")
    with pytest.raises(ValueError, match="bucket_mb"):
        dist.DistributedDataParallel(tc.nn.Linear(2, 2), bucket_mb=0)


def test_collectives_under_mpirun_need_init(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="call tinygrad_caps.distributed.init"):
        dist.all_reduce(np.zeros(2))
    with pytest.raises(RuntimeError, match="call tinygrad_caps.distributed.init"):
        dist.DistributedDataParallel(tc.nn.Linear(2, 2))


def test_ddp_of_one_process_is_the_module():
    tc.manual_seed(0)
    module = tc.nn.Sequential(tc.nn.Linear(3, 4), tc.nn.ReLU(), tc.nn.Linear(4, 2))
    ddp = dist.DistributedDataParallel(module, bucket_mb=1e-4)
    assert list(ddp.state_dict()) == list(module.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = tc.tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    tc.functional.sum(ddp(x)).backward()
    with ddp.no_sync():
        pass
    grads = [p.grad.numpy().copy() for p in module.parameters()]
    module.zero_grad()
    tc.functional.sum(module(x)).backward()
    for g, p in zip(grads, module.parameters()):
        assert np.array_equal(g, p.grad.numpy())
    ddp.load_state_dict({k: np.zeros_like(v) for k, v in module.state_dict().items()})
    assert all(not p.numpy().any() for p in module.parameters())


def test_buckets_follow_reverse_registration_order_and_size():
    module = tc.nn.Sequential(tc.nn.Linear(100, 100), tc.nn.Linear(100, 100), tc.nn.Linear(100, 10))
    sizes = [p.data.nbytes for p in module.parameters()]
    one = dist.DistributedDataParallel(module)
    assert len(one.buckets) == 1 and one.buckets[0].names[0] == "2.bias"
    small = dist.DistributedDataParallel(module, bucket_mb=(sizes[0] + sizes[1]) / 2 ** 20)
    names = [b.names for b in small.buckets]
    assert names == [["2.bias", "2.weight", "1.bias"], ["1.weight", "0.bias"], ["0.weight"]]


# ----- the differentiable collectives, in a group of one (several ranks: the scenarios below) -----
@given(data=st.data())
def test_all_reduce_sum_gradients(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1))))
    check_both(lambda t: dist.all_reduce_sum(t) * np.arange(t.size).reshape(t.shape), [x])


@given(data=st.data())
def test_sync_batch_norm_gradients_and_values_equal_batch_norm(data):
    n, c = data.draw(st.integers(2, 4)), data.draw(st.integers(1, 3))
    spatial = data.draw(shapes(min_dims=0, max_dims=2, max_side=2))
    x = data.draw(arrays((n, c) + spatial, on_grid(), unique=True))
    w, b = data.draw(arrays((c,))), data.draw(arrays((c,)))
    weight = np.arange(x.size).reshape(x.shape)
    check_both(lambda s, g, h: dist.sync_batch_norm(s, None, None, g, h) * weight, [x, w, b])
    mean, var, plain_mean, plain_var = np.zeros(c), np.ones(c), np.zeros(c), np.ones(c)
    synced = dist.sync_batch_norm(tc.tensor(x), mean, var, tc.tensor(w), tc.tensor(b), momentum=0.3).numpy()
    plain = tc.functional.batch_norm(tc.tensor(x), plain_mean, plain_var, tc.tensor(w), tc.tensor(b), training=True,
                                     momentum=0.3).numpy()
    np.testing.assert_allclose(synced, plain, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean, plain_mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(var, plain_var, rtol=1e-12)


def test_convert_sync_batchnorm_shares_parameters_and_buffers():
    from tinygrad_caps.models.capsnet.decoders import DeconvDecoder

    decoder = DeconvDecoder(20, 1, 12, batch_norm=True)
    before = dict(decoder.named_parameters())
    running = decoder.bn1.running_mean
    assert dist.convert_sync_batchnorm(decoder) is decoder
    assert isinstance(decoder.bn1, dist.SyncBatchNorm) and isinstance(decoder.bn2, dist.SyncBatchNorm)
    after = dict(decoder.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert decoder.bn1.running_mean is running
    out = decoder(tc.tensor(np.random.default_rng(0).random((3, 20), dtype=np.float32)))
    assert out.shape == (3, 144)
    with pytest.raises(ValueError, match="SyncBatchNorm: expected an input with"):
        decoder.bn1(tc.tensor(np.zeros((2, 3, 4, 5, 6, 7), dtype=np.float32)))


# ----- sharded batches -----
@pytest.mark.parametrize("augment", [None, "shift+flip"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shards_together_are_the_single_process_batches(world_size, augment):
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (70, 1, 6, 6), dtype=np.uint8), np.arange(70)
    single = list(BatchIterator(images, labels, 16, shuffle=True, augment=augment, seed=5))
    shards = [list(BatchIterator(images, labels, 16, shuffle=True, augment=augment, seed=5, shard=(r, world_size)))
              for r in range(world_size)]
    assert all(len(s) == len(single) == 5 for s in shards)
    for k, (x, y) in enumerate(single):
        parts = [s[k] for s in shards]
        if k < 4:
            assert all(len(p[1]) == 16 // world_size for p in parts)
        assert np.array_equal(np.concatenate([p[0] for p in parts]), x)
        assert np.array_equal(np.concatenate([p[1] for p in parts]), y)
    seen = np.concatenate([p[1] for s in shards for p in s])
    assert sorted(seen.tolist()) == list(range(70))


def test_shard_arguments_are_checked():
    images, labels = np.zeros((8, 1, 2, 2), np.uint8), np.zeros(8, np.int64)
    with pytest.raises(ValueError, match="does not divide by the world size 3"):
        BatchIterator(images, labels, 32, shard=(0, 3))
    with pytest.raises(ValueError, match="shard rank 2"):
        BatchIterator(images, labels, 4, shard=(2, 2))
    with pytest.raises(ValueError, match="shard must be"):
        BatchIterator(images, labels, 4, shard=3)
    # a last global batch smaller than the number of ranks is skipped on every rank
    assert len(BatchIterator(images[:5], labels[:5], 4, shard=(1, 4))) == 1
    assert len(BatchIterator(images[:5], labels[:5], 4)) == 2


# ----- several processes -----
def _without_ssh(monkeypatch):
    """Makes the launcher see a container with neither ssh nor rsh and no agent chosen by the user."""
    import tinygrad_caps.distributed.launch as launch
    real_which = launch.shutil.which
    monkeypatch.setattr(launch.shutil, "which", lambda name, *a, **k: None if name in ("ssh", "rsh") else real_which(name, *a, **k))
    for name in ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent", "PRTE_MCA_plm_ssh_agent"):
        monkeypatch.delenv(name, raising=False)


@needs_mpi
def test_mpirun_in_a_container_without_ssh_starts_its_ranks(monkeypatch):
    """Open MPI 4 starts no rank where ssh and rsh are missing unless told its agent; the command says it."""
    from tinygrad_caps.distributed.launch import find_mpirun, is_open_mpi
    if not is_open_mpi(find_mpirun()):
        pytest.skip("the launch agent is Open MPI's")
    _without_ssh(monkeypatch)
    command = mpirun_command(2)
    assert command[command.index("plm_rsh_agent") - 1:command.index("plm_rsh_agent") + 2] == ["--mca", "plm_rsh_agent", "false"]
    done = run_with_group_timeout(command + [sys.executable, "-c", "print('rank up')"], 60, env=single_thread_env())
    assert done.returncode == 0 and done.stdout.count("rank up") == 2, done.stdout + done.stderr
    monkeypatch.setenv("OMPI_MCA_plm_rsh_agent", "my-agent")  # the user's own choice is left alone
    assert "plm_rsh_agent" not in mpirun_command(2)


@needs_mpi
def test_collectives_on_two_ranks():
    result = run_scenario("collectives")
    assert result["world_size"] == 2
    assert result["local_ranks"] == [0, 1]
    assert result["gathered"] == [{"rank": 0}, {"rank": 1}]
    assert "median" in result["bad_op"]


@needs_mpi
def test_ddp_two_ranks_equal_one_process_to_1e_10():
    result = run_scenario("ddp_equivalence")
    assert result["0.01"]["buckets"] > 3 and result["25"]["buckets"] == 1
    # every bucket but conv1's started its all-reduce while backward was still computing conv1's gradient
    assert result["0.01"]["launched_before_conv1"] == [result["0.01"]["buckets"] - 1] * 3
    for bucket_mb, entry in result.items():
        assert entry["max_relative_difference"] < 1e-10, (bucket_mb, entry)


@needs_mpi
def test_no_sync_accumulates_then_averages():
    result = run_scenario("no_sync_accumulation")
    assert result["local_gradients_differ"]
    assert result["max_relative_difference"] < 1e-10


@needs_mpi
def test_sync_batchnorm_matches_one_process_and_plain_batchnorm_does_not():
    result = run_scenario("sync_batchnorm")
    assert result["sync"] < 1e-10
    assert result["per_rank"] > 1e-8  # per-rank statistics: a different computation (documented)


@needs_mpi
def test_a_parameter_without_gradient_is_named():
    result = run_scenario("unused_parameter")
    for error in (result["after_backward"], result["at_forward"]):
        assert "1.weight" in error and "1.bias" in error and "0.weight" not in error


@needs_mpi
def test_a_failing_rank_ends_every_rank_with_its_message():
    done = mpirun([sys.executable, str(WORKER), "failing_rank"], timeout=120)
    assert done.returncode != 0
    assert "the dataset is unreadable on this rank" in done.stderr
    assert "[rank 1]" in done.stderr


# ----- the train command -----
@pytest.fixture
def tiny_data(tmp_path):
    return write_tiny_data(tmp_path / "data")


def run_single(args, timeout=240):
    return run_with_group_timeout(args, timeout, env=single_thread_env())


@needs_mpi
def test_train_distributed_matches_one_process_and_only_rank_0_writes(tiny_data, tmp_path):
    single = run_single(train_command(tiny_data, tmp_path / "one", "--epochs", "1"))
    assert single.returncode == 0, single.stderr
    both = mpirun(train_command(tiny_data, tmp_path / "two", "--epochs", "1", "--distributed", "--log-gradflow", "2"))
    assert both.returncode == 0, both.stdout + both.stderr
    assert_metrics_close(metric_lines(tmp_path / "two"), metric_lines(tmp_path / "one"))
    assert both.stdout.count("epoch 1:") == 1 and both.stdout.count("run folder:") == 1  # rank 0 prints
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["checkpoints", "config.json", "gradflow.jsonl",
                                                                  "metrics.jsonl"]
    assert [json.loads(line)["step"] for line in (tmp_path / "two" / "gradflow.jsonl").read_text().splitlines()] == [2, 4]
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["best.npz", "last.npz"]
    # the checkpoint has the model's own keys: it loads into a single-process model
    one, two = tc.load(tmp_path / "one" / "checkpoints" / "last.npz"), tc.load(tmp_path / "two" / "checkpoints" / "last.npz")
    assert list(two["model"]) == list(one["model"])
    evaluated = run_single([sys.executable, "-m", "tinygrad_caps.models.cli", "evaluate", "--checkpoint",
                            str(tmp_path / "two" / "checkpoints" / "last.npz"), "--data-dir", str(tiny_data)])
    assert evaluated.returncode == 0, evaluated.stderr


@pytest.mark.slow
@needs_mpi
def test_train_distributed_resume_continues_exactly(tiny_data, tmp_path):
    whole = mpirun(train_command(tiny_data, tmp_path / "whole", "--epochs", "2", "--distributed"))
    assert whole.returncode == 0, whole.stderr
    first = mpirun(train_command(tiny_data, tmp_path / "split", "--epochs", "1", "--distributed"))
    assert first.returncode == 0, first.stderr
    second = mpirun(train_command(tiny_data, tmp_path / "split", "--epochs", "2", "--distributed", "--resume"))
    assert second.returncode == 0, second.stderr
    assert_metrics_close(metric_lines(tmp_path / "split"), metric_lines(tmp_path / "whole"))


@needs_mpi
def test_a_global_batch_that_does_not_divide_is_a_clear_error(tiny_data, tmp_path):
    done = mpirun(train_command(tiny_data, tmp_path / "run", "--epochs", "1", "--distributed", "--batch-size", "15"))
    assert done.returncode == 2
    assert "--batch-size 15 is the global batch and must divide by the number of processes, 2" in done.stderr


def test_sync_batchnorm_needs_distributed(tiny_data, tmp_path):
    done = run_single(train_command(tiny_data, tmp_path / "run", "--epochs", "1", "--sync-batchnorm"))
    assert done.returncode == 2 and "--sync-batchnorm needs --distributed" in done.stderr


def test_post_accumulate_hooks_fire_during_backward():
    """The hook DDP builds on: a leaf's hook fires once its gradient is complete, before backward
    reaches the earlier layers (so an all-reduce can overlap the rest of the backward)."""
    tc.manual_seed(0)
    first, last = tc.nn.Linear(3, 4), tc.nn.Linear(4, 2)
    seen = []
    last.weight.register_post_accumulate_grad_hook(
        lambda p: seen.append((p.grad is not None, first.weight.grad is None)))
    x = tc.tensor(np.ones((2, 3), dtype=np.float32))
    tc.functional.sum(last(tc.functional.relu(first(x)))).backward()
    assert seen == [(True, True)]
    assert first.weight.grad is not None


# ----- NCCL (GPUs) -----
def on_two_gpus(test):
    """Marks a GPU test that runs one mpirun rank on each of two GPUs (left out by ``-m "not multigpu"``)."""
    for mark in (pytest.mark.gpu, pytest.mark.multigpu, needs_mpi,
                 pytest.mark.skipif(gpu_count() < 2, reason="needs 2 GPUs")):
        test = mark(test)
    return test


@pytest.mark.gpu
def test_nccl_one_rank_on_one_gpu():
    """Under mpirun -n 1 where an MPI is installed, else as a plain process (NCCL needs no MPI for one rank)."""
    if MPI_OK:
        result = run_scenario("nccl", processes=1, timeout=120)
    else:
        done = run_single([sys.executable, str(WORKER), "nccl"], timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["world_size"] == 1 and result["buckets"] > 3
    assert result["max_relative_difference"] < 1e-10


@on_two_gpus
def test_nccl_two_ranks_on_two_gpus_equal_one_process():
    result = run_scenario("nccl", processes=2)
    assert result["world_size"] == 2
    assert result["max_relative_difference"] < 1e-10


@on_two_gpus
def test_sync_batchnorm_over_nccl_on_two_gpus_matches_one_process():
    result = run_scenario("sync_batchnorm_nccl", processes=2)
    assert result["sync"] < 1e-10
    assert result["per_rank"] > 1e-8


@needs_mpi
def test_train_distributed_a_rank_without_its_data_ends_every_rank(tiny_data, tmp_path):
    """Rank 1 (another host, say) lacks the dataset while rank 0 waits for it in the first collective:
    both exit at once with status 2 and rank 1's message."""
    good = train_command(tiny_data, tmp_path / "run", "--epochs", "1", "--distributed")
    bad = train_command(tmp_path / "nothing-here", tmp_path / "run", "--epochs", "1", "--distributed")
    command = mpirun_command(1) + good + [":", "-n", "1"] + bad
    done = run_with_group_timeout(command, 120, env=single_thread_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "[rank 1] tinygrad-caps train: error: dataset 'tiny' not found" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@needs_mpi
def test_train_under_mpirun_without_distributed_is_refused(tiny_data, tmp_path):
    done = mpirun(train_command(tiny_data, tmp_path / "run", "--epochs", "1"))
    assert done.returncode == 2
    assert "mpirun started 2 processes: add --distributed" in done.stderr
    assert not (tmp_path / "run").exists()


def rank_processes(launcher_pid):
    """PIDs of the training processes below ``launcher_pid`` (from /proc: Linux only)."""
    found, stack = [], [launcher_pid]
    while stack:
        pid = stack.pop()
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            for child in children.read_text().split():
                stack.append(int(child))
                if b"tinygrad_caps.models.cli" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
    return sorted(found)


@pytest.mark.slow
@needs_mpi
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the ranks through /proc")
def test_train_distributed_stops_on_sigint_saves_global_sums_and_resumes_exactly(tmp_path):
    """SIGINT to ONE rank: every rank stops at the same batch, rank 0 saves the sums of all ranks.
    (mpirun itself ends the job at once on SIGINT; signal the training processes for a clean stop.)
    Every rank is held after its 2nd batch (run_state.py's TINYGRAD_CAPS_TEST_HOLD) until the signal is
    sent, so the stop lands mid-epoch, at the same batch, on any machine."""
    from tinygrad_caps.data import write_idx

    folder = tmp_path / "data" / "tiny"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for stem, n in (("train", 96), ("t10k", 32)):  # 6 batches of 16 an epoch
        write_idx(folder / f"{stem}-images-idx3-ubyte.gz", (rng.random((n, 12, 12)) * 255).astype(np.uint8), compress=True)
        write_idx(folder / f"{stem}-labels-idx1-ubyte", (np.arange(n) % 3).astype(np.uint8))
    data, hold = tmp_path / "data", tmp_path / "hold"
    hold.mkdir()
    env = dict(single_thread_env(), TINYGRAD_CAPS_TEST_HOLD=f"optimizer-step@2:{hold}")
    cut = subprocess.Popen(mpirun_command(2) + train_command(data, tmp_path / "cut", "--epochs", "1", "--distributed"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while len(list(hold.glob("held-*"))) < 2 and cut.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = rank_processes(cut.pid)
        assert sorted(ranks) == sorted(int(p.name.split("-")[1]) for p in hold.glob("held-*")) and len(ranks) == 2
        os.kill(ranks[-1], subprocess.signal.SIGINT)
        (hold / "release").touch()
        rest = cut.communicate(timeout=120)[0]
    finally:
        (hold / "release").touch()
        cut.kill()
    assert cut.returncode != 0 and "interrupted: saved" in rest
    progress = tc.load(tmp_path / "cut" / "checkpoints" / "last.npz")["progress"]
    assert progress["epoch"] == 0 and progress["step"] == 2  # where every rank was held
    assert progress["sums"]["seen"] == 16 * progress["step"]  # the sums of both ranks
    resumed = mpirun(train_command(data, tmp_path / "cut", "--epochs", "1", "--distributed", "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    whole = mpirun(train_command(data, tmp_path / "whole", "--epochs", "1", "--distributed"))
    assert whole.returncode == 0, whole.stderr
    assert_metrics_close(metric_lines(tmp_path / "cut"), metric_lines(tmp_path / "whole"))
