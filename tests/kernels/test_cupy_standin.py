"""The GPU code path without a GPU: the GPU tests and a training run under the CPU stand-in for
CuPy (``tests/support/cupy_standin``: NumPy arrays that refuse what CuPy refuses, our kernels on the
CPU emulation, two stand-in GPUs). Each run is a process of its own, with the stand-in first on the
path. It catches what only a GPU run would show otherwise: an implicit copy to NumPy, an array
made on the current GPU instead of its tensor's, a kernel argument of the wrong width. The
stand-in's NCCL and multi-rank runs are in distributed/test_distributed_standin.py."""
import json
import shutil

import pytest

from op_table import OPS, case_params
from paths import ROOT, SUPPORT
from standin import run_standin, summary

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernels' CPU emulation needs g++")


def test_the_stand_in_refuses_what_cupy_refuses_and_tensors_stay_on_their_gpu():
    output = run_standin([str(SUPPORT / "standin_scenarios.py"),
                          "standin_refuses_what_cupy_refuses,tensor_api_on_the_second_gpu"])
    assert output.split() == ["ok", "ok"]


def test_gpu_op_and_device_tests_pass_on_two_stand_in_gpus():
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/engine/test_gpu_ops.py",
                          "tests/engine/test_devices.py", "-k", "not nccl"])
    # every GPU and two-GPU test ran; the 4 skips are the no-GPU message checks. test_gpu_ops.py has a
    # test per op of the op table and per fixed case of it, and 3 more; test_devices.py has 12 that run
    gpu_op_tests = len([op for op in OPS if op.tested("gpu")]) + len(case_params(OPS, "gpu")) + 3
    assert summary(output) == {"passed": gpu_op_tests + 12, "skipped": 4}, output[-3000:]
    assert output.count("checks the message on a machine without a GPU") == 1, output[-3000:]


@pytest.mark.slow
def test_gpu_kernel_tests_pass_on_the_stand_in_below_capsnet_sizes():
    # shape2 and case1 are CapsNet's own sizes: about 4 minutes here, so they are left to the GPU run
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_gpu_kernels.py",
                          "-k", "not shape2 and not case1"])
    assert summary(output) == {"passed": 24, "deselected": 8}, output[-3000:]


@pytest.mark.slow
def test_routing_speed_gpu_branches_run_on_the_stand_in():
    """Everything routing_speed.py does only on a GPU (CUDA events, the pool's peak, every kernel
    replayed alone), at small sizes: a slip there would otherwise cost the first GPU run."""
    output = run_standin(["routing_speed.py", "--impl", "cupy", "raw", "fused", "--batch", "2", "--in-caps", "16",
                          "--primary-channels", "8", "--repeat", "1", "--warmup", "0", "--json"], cwd=ROOT / "benchmarks")
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
        "softmax_rows", "softmax_rows_grad", "adam_step", "adam_step_capturable", "im2col",
        "im2col, one element per thread", "col2im"}
    for name, kernel in kernels.items():
        assert kernel["kernel_seconds"] > 0 and kernel["op_seconds"] > 0 and kernel["launches"] >= 1, (name, kernel)
        assert kernel["bytes"] > 0 and kernel["fraction_of_copy_bandwidth"] > 0, (name, kernel)
        # beside each kernel its variant: the fixed default of a kernel with variants (the stand-in's
        # runs measure nothing), the one the row forces, or none to choose
        if "forced" in name:
            assert kernel["variant"] == "forced", (name, kernel)
        elif name.split(" (")[0] in ("capsule_predict", "capsule_grad", "routing_agreement", "routing_forward", "im2col"):
            assert kernel["variant_how"].startswith("default"), (name, kernel)
        else:
            assert kernel["variant_how"] == "one variant", (name, kernel)
    assert kernels["capsule_predict"]["variant"] == "shared" and kernels["im2col (PrimaryCaps)"]["variant"] == "planes"


def test_training_on_the_second_gpu_equals_the_cpu(tmp_path):
    output = run_standin([str(SUPPORT / "standin_scenarios.py"), "train_on_the_second_gpu", str(tmp_path)])
    assert output.strip() == "ok"


def test_every_routing_algorithm_runs_on_the_stand_in():
    output = run_standin(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/models/test_routing_algorithms_gpu.py"])
    assert summary(output) == {"passed": 5}, output[-3000:]
