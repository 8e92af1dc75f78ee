"""A captured step's private memory pool (``tinygrad_caps.graph_pool``): on the CPU stand-in (whose
pool models CuPy's chunk by chunk, and overwrites what is freed), then on a real GPU."""
import json
import shutil

import numpy as np
import pytest

from paths import SUPPORT
from standin import run_standin

NEEDS_GXX = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="the stand-in runs the kernels on their g++ emulation")


@NEEDS_GXX
@pytest.mark.slow
def test_a_capture_reuses_the_memory_it_frees_and_a_late_read_shows():
    assert run_standin([str(SUPPORT / "graph_pool_scenarios.py"), "a_capture_reuses_what_it_frees"]).split() == ["ok"]


@NEEDS_GXX
@pytest.mark.slow
def test_a_captured_capsnet_step_needs_at_most_1_1x_the_eager_peak_on_the_stand_in():
    lines = run_standin([str(SUPPORT / "graph_pool_scenarios.py"),
                         "a_captured_capsnet_step_needs_about_the_eager_peak"]).strip().splitlines()
    assert lines[-1] == "ok"
    figures = json.loads(lines[-2])
    assert figures["captured_bytes"] <= 1.1 * figures["eager_peak_bytes"]


def test_a_buffer_freed_under_a_live_graph_is_caught_on_the_stand_in():
    """The stand-in records every buffer a capture touches and sees each way one can go back to the
    device while its graph lives (the pool given back, a default-pool array dying, cuBLAS's workspace
    let go), and nothing when the graph goes first."""
    assert run_standin([str(SUPPORT / "graph_pool_scenarios.py"),
                        "freeing_a_buffer_a_live_graph_uses_is_caught"]).split() == ["ok"]


@NEEDS_GXX
@pytest.mark.slow
def test_no_buffer_of_a_captured_step_is_freed_while_its_graph_lives():
    """A captured CapsNet step amid what train_step.py does in the same process (another capture
    dropped without close, CuPy's pool emptied, eager steps, a second capture, a peak measured):
    its pool, parameters, Adam's state, static inputs and cuBLAS workspace all stay allocated."""
    assert run_standin([str(SUPPORT / "graph_pool_scenarios.py"),
                        "a_captured_step_keeps_every_buffer_it_uses"]).split() == ["ok"]


@pytest.mark.gpu
def test_a_captured_capsnet_step_needs_at_most_1_1x_the_eager_peak_on_the_gpu():
    """The paper's CapsNet (B=16) on the GPU: the graph's pool against the eager step's peak (without
    the previous step's gradients), equal losses, and close() gives the pool's memory back."""
    import cupy

    import tinygrad_caps as tc
    from capsnet_steps import capsnet_training
    from tinygrad_caps import graph_pool

    from tinygrad_caps.models import CapsNet
    from tinygrad_caps.models.app.training.step import capsnet_training_step

    rng = np.random.default_rng(0)
    batches = [(rng.random((16, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 16)) for _ in range(2)]
    tc.manual_seed(0)
    model = CapsNet().to(device="cuda")
    x = tc.tensor(batches[0][0], device="cuda")
    optimizer, step = capsnet_training_step(model, x, cupy.asarray(batches[0][1]), capturable=True)
    step(), step()
    optimizer.zero_grad()
    eager_peak = graph_pool.step_peak_bytes(step, "cuda")
    eager_losses, _, _, _ = capsnet_training(batches, 6, captured=False)
    losses, _, _, runner = capsnet_training(batches, 6, captured=True)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    captured = runner.captured_bytes
    print(f"captured {captured / 2 ** 20:.1f} MiB, eager peak {eager_peak / 2 ** 20:.1f} MiB")
    assert 0 < captured <= 1.1 * eager_peak
    runner.close()
    assert runner.captured_bytes == 0
