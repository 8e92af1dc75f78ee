"""benchmarks/step_cost.py (a training step's FLOPs and least bytes), gpu_peaks.py (datasheet peaks by
device name), _train_step_report.py (the figures and goals train_step.py derives) and
_torch_variants.py's CPU answers, without running a step: small sizes counted by hand."""
import sys
import time

import pytest

from paths import ROOT

sys.path.append(str(ROOT / "benchmarks"))  # after every folder of the suite: no name of it shadows theirs

from gpu_peaks import peak_for  # noqa: E402
from step_cost import CapsNetSizes, step_cost  # noqa: E402

# B=2 images of 1x6x6, 3x3 kernels: conv1 2 channels (H1 = 4), PrimaryCaps 2 types of 2 (H2 = 1, so
# I = 2 capsules), 3 classes of 2 values, 2 routing iterations, a decoder 6 -> 4 -> 36
SMALL = CapsNetSizes(in_channels=1, image_size=6, kernel_size=3, conv1_channels=2, types=2, dim=2, num_classes=3,
                     digit_dim=2, iterations=2, decoder=(4,))


def by_name(cost):
    return {layer.name: layer for layer in cost.layers}


def test_each_layer_of_a_small_step_matches_a_hand_count():
    layers = by_name(step_cost(2, SMALL, itemsize=4))
    assert list(layers) == ["conv1", "primary", "predict", "routing", "fc1", "fc2", "adam"]
    # conv1: GEMM (2*4*4 rows, 1*3*3) x (9, 2); weights 9*2 + 2 = 20; image 2*36 = 72; output 2*2*16 = 64;
    # backward: the weight's gradient only (output gradient 64 + image 72 read, 20 written)
    assert tuple(layers["conv1"])[1:] == (2 * 32 * 9 * 2, 2 * 32 * 9 * 2, (72 + 20 + 64) * 4, (64 + 72 + 20) * 4)
    # primary: GEMM (2*1*1 rows, 2*9) x (18, 4); weights 18*4 + 4 = 76; input 64; output 2*4 = 8;
    # backward: both gradients (8 + 64 + 76 read, 76 + 64 written)
    assert tuple(layers["primary"])[1:] == (2 * 2 * 18 * 4, 2 * 2 * 2 * 18 * 4, (64 + 76 + 8) * 4,
                                            (8 + 64 + 76 + 76 + 64) * 4)
    # predict: u_hat 2*2*3*2 = 24 values, each a sum over P = 2; W 2*3*2*2 = 24; u 2*2*2 = 8
    assert tuple(layers["predict"])[1:] == (2 * 24 * 2, 4 * 24 * 2, (8 + 24 + 24) * 4, (2 * 24 + 24 + 8) * 4)
    # routing: 2 weighted sums + 1 agreement over u_hat (24) with logits 2*2*3 = 12
    assert tuple(layers["routing"])[1:] == (3 * 2 * 24, 3 * 4 * 24, 3 * (24 + 12) * 4, 3 * (2 * 24 + 12) * 4)
    # fc1: (2, 6) x (6, 4), weights 28; fc2: (2, 4) x (4, 36), weights 180
    assert tuple(layers["fc1"])[1:] == (2 * 2 * 6 * 4, 2 * 2 * 2 * 6 * 4, (12 + 28 + 8) * 4, (8 + 12 + 28 + 28 + 12) * 4)
    assert tuple(layers["fc2"])[1:] == (2 * 2 * 4 * 36, 2 * 2 * 2 * 4 * 36, (8 + 180 + 72) * 4,
                                        (72 + 8 + 180 + 180 + 8) * 4)
    # adam: 20 + 76 + 24 + 28 + 180 = 328 parameters, 7 values each
    assert tuple(layers["adam"])[1:] == (0, 0, 0, 7 * 328 * 4)


def test_a_step_sums_its_layers_and_scales_with_the_item_size():
    cost = step_cost(2, SMALL)
    assert cost.parameters == 20 + 76 + 24 + 28 + 180
    assert cost.flops == 2304 + 864 + 288 + 432 + 288 + 1728
    assert cost.bytes == 1248 + 1744 + 544 + 1152 + 544 + 2832 + 9184
    double = step_cost(2, SMALL, itemsize=8)
    assert double.flops == cost.flops and double.bytes == 2 * cost.bytes


def test_activations_scale_with_the_batch_and_weights_do_not():
    one, three = step_cost(1), step_cost(3)
    assert three.flops == 3 * one.flops  # every contraction runs once per image
    weights_only = step_cost(0)
    assert weights_only.flops == 0 and weights_only.bytes > 0  # weights, their gradients and Adam's state
    assert three.bytes - weights_only.bytes == pytest.approx(3 * (one.bytes - weights_only.bytes), abs=0.5)


def test_the_paper_sizes_count_the_models_parameters_and_routing_speeds_bytes():
    from types import SimpleNamespace

    from routing_speed import minimum_bytes
    from tinygrad_caps.models import CapsNet

    cost = step_cost(100)
    assert cost.parameters == sum(p.data.size for p in CapsNet().parameters())
    sizes = CapsNetSizes()
    args = SimpleNamespace(batch=100, in_caps=sizes.in_caps, out_caps=sizes.num_classes, dim=sizes.digit_dim,
                           in_dim=sizes.dim, iterations=sizes.iterations)
    layers = by_name(cost)
    assert layers["predict"].bytes + layers["routing"].bytes == minimum_bytes(args, 4, backward=True)
    assert sizes.in_caps == 1152


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA A100-SXM4-80GB", None), (None, None)])
def test_the_peaks_are_picked_by_the_device_name(name, expected):
    peak = peak_for(name)
    assert (peak.name if peak else None) == expected


def test_dense_tf32_is_half_the_datasheets_sparse_figure():
    peak = peak_for("NVIDIA H100 80GB HBM3")
    assert peak.flops("highest") == pytest.approx(67e12, abs=1e9)
    assert peak.flops("high") == pytest.approx(494.5e12, abs=1e9)
    assert peak.memory_bytes_per_s == pytest.approx(3.35e12, abs=1e9)


def row_with(**seconds):
    names = {"ours_eager": "ours-eager", "ours_captured": "ours-captured", "torch_eager": "torch-eager",
             "torch_graph": "torch-graph", "torch_compile_ro": "torch-compile-reduce-overhead"}
    variants = {names[k]: {"s": v} for k, v in seconds.items()}
    return {"batch": 2, "precision": "high", "variants": variants}


def test_the_report_compares_our_fastest_step_with_pytorchs_fastest():
    from _train_step_report import summarize

    cost = step_cost(2, SMALL)
    row = row_with(ours_eager=0.010, ours_captured=0.0016, torch_eager=0.008, torch_graph=0.002, torch_compile_ro=0.003)
    row["variants"]["torch-compile-max-autotune"] = {"skipped": "the compile budget was spent"}
    summarize(row, cost, peak_for("NVIDIA H200"), copy_bandwidth=4e12)
    goal = row["goal"]
    assert (goal["ours"], goal["fastest_torch"]) == ("ours-captured", "torch-graph")
    assert goal["ratio"] == pytest.approx(0.8, abs=1e-12)
    assert goal["met"] is True and goal["moonshot_met"] is True  # 0.8 is at the moonshot, which it meets
    captured = row["variants"]["ours-captured"]
    assert captured["tflops"] == pytest.approx(cost.flops / 0.0016 / 1e12, abs=1e-12)
    assert captured["fraction_of_peak"] == pytest.approx(cost.flops / 0.0016 / (989e12 / 2), abs=1e-12)
    assert captured["fraction_of_copy_bandwidth"] == pytest.approx(cost.bytes / 0.0016 / 4e12, abs=1e-12)
    assert row["cost"]["peak_kind"] == "TF32" and "tflops" not in row["variants"]["torch-compile-max-autotune"]
    assert row["memory"]["met"] is None  # nothing measured: no verdict


def test_each_first_loss_is_compared_with_ours():
    from _train_step_report import summarize, table

    row = row_with(ours_eager=0.01, torch_graph=0.002)
    row["variants"]["ours-eager"]["first_loss"] = 0.8418
    row["variants"]["torch-graph"]["first_loss"] = 0.8419
    summarize(row, step_cost(2, SMALL), None, None)
    assert row["variants"]["torch-graph"]["first_loss_diff"] == pytest.approx(1e-4, abs=1e-12)
    assert "first loss 0.841900 (ours +- 1.0e-04)" in "\n".join(table([row]))


def test_without_a_capture_or_pytorch_the_goals_say_what_is_missing():
    from _train_step_report import summarize, table

    row = summarize(row_with(ours_eager=0.5), step_cost(2, SMALL), None, None)
    assert row["goal"]["ours"] == "ours-eager" and row["goal"]["ratio"] is None and row["goal"]["met"] is None
    text = "\n".join(table([row]))
    assert "time goal (ours / PyTorch's fastest <= 1.0x): not measured" in text
    assert "no datasheet peak for this device" in text and "nan" not in text


def test_the_memory_goal_compares_the_graphs_bytes_with_the_eager_peak():
    from _train_step_report import summarize

    row = row_with(ours_eager=0.01, ours_captured=0.002)
    row["variants"]["ours-eager"]["peak_bytes"] = 100 * 2 ** 20
    row["variants"]["ours-captured"]["graph_bytes"] = 120 * 2 ** 20
    memory = summarize(row, step_cost(2, SMALL), None, 1e12)["memory"]
    assert memory["captured_to_eager"] == pytest.approx(1.2, abs=1e-12) and memory["met"] is False


def test_pytorchs_gpu_variants_say_why_they_do_not_run_on_the_cpu():
    from _torch_variants import VARIANTS, unavailable_reason

    reasons = {variant: unavailable_reason(variant, "cpu") for variant in VARIANTS}
    assert reasons["eager"] is None and "CUDA graphs need a GPU" in reasons["graph"]
    assert all("torch.compile is not tried on the CPU" in reasons[v] for v in VARIANTS if v.startswith("compile"))
    assert all(unavailable_reason(variant, "cuda:0") is None for variant in VARIANTS)


def test_the_compile_time_limit_interrupts_what_runs_past_it():
    from _torch_variants import CompileTimeLimit, time_limit

    start = time.perf_counter()
    with pytest.raises(CompileTimeLimit, match="over 0 s"):
        with time_limit(0.05):
            time.sleep(5)
    assert time.perf_counter() - start < 2
    with time_limit(5):  # within the limit: nothing happens, and the alarm is off afterwards
        pass
    time.sleep(0.01)


def test_the_kernel_table_sets_each_goal_beside_its_figure_and_the_fused_forward_its_speedup():
    from routing_speed import KERNEL_BANDWIDTH_GOALS, fused_forward_speedup, with_goal

    assert KERNEL_BANDWIDTH_GOALS["capsule_predict"] == 0.8 and KERNEL_BANDWIDTH_GOALS["routing_agreement"] == 0.6
    assert KERNEL_BANDWIDTH_GOALS["capsule_grad_u"] == KERNEL_BANDWIDTH_GOALS["capsule_grad_w"] == 0.5
    met = with_goal("capsule_predict", {"fraction_of_copy_bandwidth": 0.81})
    assert met["goal_fraction_of_copy_bandwidth"] == 0.8 and met["goal_met"] is True
    assert with_goal("im2col (PrimaryCaps)", {"fraction_of_copy_bandwidth": 0.49})["goal_met"] is False
    assert "goal_met" not in with_goal("softmax_rows (coupling)", {"fraction_of_copy_bandwidth": 0.3})
    rows = [{"impl": "raw", "pass": "forward", "precision": "highest", "median_s": 1.0e-3},
            {"impl": "fused", "pass": "forward", "precision": "highest", "median_s": 0.25e-3},
            {"impl": "raw", "pass": "forward+backward", "precision": "highest", "median_s": 9.0}]
    speedup = fused_forward_speedup(rows)
    assert speedup["speedup"] == pytest.approx(4.0, abs=1e-12) and speedup["goal"] == 5.0 and not speedup["met"]
    assert fused_forward_speedup(rows[:1]) is None
