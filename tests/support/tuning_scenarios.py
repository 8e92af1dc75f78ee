"""Kernel tuning (tinygrad_caps.kernels.tune) on the GPU code path under the CPU stand-in for CuPy, in
a process of its own with tuning on (support/standin.py turns it off for the other scenarios):
``python tuning_scenarios.py NAME DIR``, DIR the tuning cache. Prints "ok" at its end. The stand-in's
timings are the emulation's: what is checked is where and when choices are made, never which."""
import json
import sys
from pathlib import Path

import numpy as np

from tinygrad_caps.backend import to_numpy
from tinygrad_caps.kernels import tune


class CountingTimer:
    """The GPU timer (CUDA events: the stand-in's host clock), one round of one replay, counted."""

    def __init__(self):
        self.calls = []

    def __call__(self, variant, replay):
        self.calls.append(variant)
        return tune.gpu_timer(variant, replay)


def warm_up_steps_tune_and_the_capture_reuses(cache_dir):
    """A captured CapsNet step: its first warm-up step measures every kernel with variants at its
    shapes and writes the choices; the second warm-up step, the capture and the replays measure
    nothing; the captured step equals an eager one of the same choices; a new tuner (as a later
    process would make) finds every choice on disk and measures nothing either."""
    import cupy
    from graph_pool_scenarios import _capsnet
    from tinygrad_caps.cuda_graphs import CapturedStep

    assert tune.tuning_enabled() and tune.tune_dir() == Path(cache_dir)
    tune.TIMED_ROUNDS = tune.TIMED_REPEATS = 1
    rng = np.random.default_rng(0)
    batches = [(rng.random((4, 1, 10, 10), dtype=np.float32), rng.integers(0, 3, 4)) for _ in range(2)]
    timer = CountingTimer()
    with tune.using_tuner(tune.Tuner(cache_dir, timer)), tune.recording() as log:
        model, _, step, x, y, losses = _capsnet(batches)
        runner = CapturedStep(step, [x, y], warmup=2)
        runner(*batches[0])
        measured = {choice.kernel for choice in log if choice.how == "tuned"}
        assert measured == {"capsule_predict", "capsule_grad", "routing_agreement", "im2col"}, log
        calls = len(timer.calls)
        for k in range(1, 5):
            runner(*batches[k % 2])
        runner.synchronize()
        assert len(timer.calls) == calls, timer.calls[calls:]  # the capture and replays measured nothing
        captured = {name: to_numpy(value) for name, value in model.state_dict().items()}
        eager, _, eager_step, ex, ey, _ = _capsnet(batches)
        for k in range(5):
            ex.data[...] = cupy.asarray(batches[k % 2][0])
            ey.data[...] = cupy.asarray(batches[k % 2][1])
            eager_step()
        for name, value in eager.state_dict().items():
            np.testing.assert_allclose(captured[name], to_numpy(value), rtol=1e-6, atol=1e-7, err_msg=name)
        runner.close()
    data = json.loads(tune.Tuner(cache_dir).path(tune.gpu_name(0)).read_text())
    assert set(data["kernels"]) == measured and data["gpu"] == "CPU stand-in for CuPy"
    later = CountingTimer()
    with tune.using_tuner(tune.Tuner(cache_dir, later)), tune.recording() as log:
        _, _, step, x, y, _ = _capsnet(batches)
        step()
    assert later.calls == [] and {c.how for c in log} == {"cached"}, (later.calls, log)
    print("ok")


SCENARIOS = {f.__name__: f for f in (warm_up_steps_tune_and_the_capture_reuses,)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2])
