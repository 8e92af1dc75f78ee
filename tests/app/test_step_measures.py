"""What train_step.py measures on a GPU besides time: host and GPU time of a step apart
(benchmarks/_timing.py), the device memory a step needs and the bytes a captured step's graph keeps
(benchmarks/_step_memory.py, ``CapturedStep.captured_bytes``). On the CuPy stand-in (events timed on
the host, the pool's hooks) and, marked gpu, on a real GPU."""
import json
import sys

import numpy as np
import pytest

from paths import ROOT
from standin import run_standin

BENCHMARKS = ROOT / "benchmarks"

STANDIN_MEASURES = f"""
import sys, time
sys.path.append({str(BENCHMARKS)!r})
import cupy
from _step_memory import ours_step_peak_bytes
from _timing import host_and_gpu_times

kept = []
def step():
    a = cupy.ones(1024, cupy.float32)      # 4096 bytes (whole 512-byte blocks, as the pool rounds), then freed
    b = cupy.ones(512, cupy.float32)       # 2048 bytes, kept
    del a
    kept.append(b)
    time.sleep(0.002)

times = host_and_gpu_times(step, "cupy", repeat=3)
assert len(times["host_samples"]) == len(times["gpu_samples"]) == 3, times
assert times["host_s"] >= 0.002 and times["gpu_s"] >= 0, times
print(ours_step_peak_bytes(step))
"""


@pytest.mark.slow
def test_host_time_gpu_time_and_a_steps_peak_bytes_on_the_stand_in():
    output = run_standin(["-c", STANDIN_MEASURES], devices=1)
    assert int(output.split()[-1]) == 4096 + 2048  # both arrays live at the peak


def captured_measures() -> dict:
    """A reduced CapsNet's step (B=8, 12x12 images) captured after two warm-up steps on "cuda": the
    bytes its graph keeps, a replay's peak, its host and GPU time, and the bytes kept after close."""
    import cupy

    import tinygrad_caps as tc
    from tinygrad_caps.cuda_graphs import CapturedStep
    from tinygrad_caps.models import CapsNet
    from tinygrad_caps.models.app.training.step import capsnet_training_step

    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    from _step_memory import captured_bytes, ours_step_peak_bytes
    from _timing import host_and_gpu_times

    rng = np.random.default_rng(0)
    images, labels = rng.random((8, 1, 12, 12), dtype=np.float32), rng.integers(0, 10, 8)
    tc.manual_seed(0)
    model = CapsNet(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3,
                    image_size=12).to(device="cuda")
    x, y = tc.tensor(images, device="cuda"), tc.tensor(labels, device="cuda")
    _, step = capsnet_training_step(model, x, y.data, capturable=True)
    runner = CapturedStep(step, [x, y], warmup=2)
    batch = [cupy.asarray(images), cupy.asarray(labels)]
    for _ in range(3):  # two eager steps, then the capture
        runner(*batch)
    runner.synchronize()
    figures = {"kept": captured_bytes(runner), "property": runner.captured_bytes,
               "replay_peak": ours_step_peak_bytes(lambda: runner(*batch)),
               "times": host_and_gpu_times(lambda: runner(*batch), "cupy", repeat=3)}
    runner.close()
    figures["after_close"] = runner.captured_bytes
    return figures


def check_captured_measures(figures: dict) -> None:
    assert figures["kept"] > 0 and figures["kept"] == figures["property"]
    assert figures["replay_peak"] == 0  # a replay allocates nothing
    assert figures["times"]["gpu_s"] > 0 and figures["times"]["host_s"] > 0
    assert figures["after_close"] == 0


@pytest.mark.slow
def test_a_captured_steps_measures_on_the_stand_in():
    code = (f"import sys, json; sys.path[:0] = [{str(ROOT / 'tests' / 'app')!r}]; "
            "from test_step_measures import captured_measures; f = captured_measures(); "
            "print(json.dumps({k: v for k, v in f.items() if k != 'times'} | {'times': {k: f['times'][k] "
            "for k in ('host_s', 'gpu_s')}}))")
    check_captured_measures(json.loads(run_standin(["-c", code], devices=1).strip().splitlines()[-1]))


@pytest.mark.gpu
def test_a_captured_steps_graph_keeps_what_its_step_allocates_and_a_replay_allocates_nothing():
    check_captured_measures(captured_measures())
