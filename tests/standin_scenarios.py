"""Scenarios that run the GPU code path under the CPU stand-in for CuPy (``tests/cupy_standin``),
started by ``test_cupy_standin.py`` in a process of their own: ``python standin_scenarios.py NAME DIR``.
Each prints "ok" at its end; any difference or error fails the process."""
import json
import sys
from pathlib import Path

import numpy as np

import tinygrad_caps as tc
from tinygrad_caps.kernels import launch
from tinygrad_caps.models.training import batch_losses, load_checkpoint_model, train

from helpers import write_striped_dataset

TINY_MODEL = dict(conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, kernel_size=3)


def expect(error, action, what):
    try:
        action()
    except error:
        return
    raise AssertionError(f"the stand-in let this pass: {what}")


def standin_refuses_what_cupy_refuses(_):
    """The stand-in is in use and fails where CuPy fails: otherwise the other scenarios prove nothing."""
    import cupy

    assert getattr(cupy, "STANDIN", False) and tc.gpu_available() and cupy.cuda.runtime.getDeviceCount() == 2
    a = cupy.ones(3, dtype=cupy.float32)
    expect(TypeError, lambda: np.asarray(a), "an implicit conversion to NumPy")
    expect(TypeError, lambda: a + np.ones(3, np.float32), "a NumPy operand")
    with cupy.cuda.Device(1):
        expect(ValueError, lambda: a * 2, "an array of GPU 0 used while GPU 1 is current")
        assert (cupy.asarray(a) * 2).device.id == 1  # ... after a copy it works
    kernel = cupy.RawModule(code=launch.source_text("im2col.cu")).get_function("im2col_i32_f32")
    expect(TypeError, lambda: kernel((1,), (32,), (a, a, 3)), "a Python int kernel argument")
    expect(Exception, lambda: cupy.RawModule(code="").get_function("im2col_i32_f32"), "a kernel missing from its module")
    assert isinstance(a.sum(), cupy.ndarray)  # reductions stay on the device, as in CuPy
    print("ok")


def train_on_the_second_gpu(folder):
    """``train()`` with device "cuda:1" while GPU 0 is current: every array stays on GPU 1 (the
    trainer does not switch GPUs), the run equals the CPU run, and its checkpoint loads onto GPU 1."""
    folder = Path(folder)
    write_striped_dataset(folder / "data" / "tiny", (8, 4))
    config = dict(dataset="tiny", data_dir=str(folder / "data"), batch_size=4, epochs=1, lr=1e-3, lr_decay=0.9,
                  seed=0, augment=None, **TINY_MODEL)
    quiet = dict(show_progress=False, log=lambda *a: None)
    train(dict(config, device="cpu"), folder / "cpu", **quiet)
    tc.backend.use_device("cuda:0")
    train(dict(config, device="cuda:1"), folder / "gpu1", **quiet)
    assert tc.backend.current_cuda_device() == 0
    lines = {run: json.loads((folder / run / "metrics.jsonl").read_text().splitlines()[-1]) for run in ("cpu", "gpu1")}
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        np.testing.assert_allclose(lines["gpu1"][key], lines["cpu"][key], rtol=1e-5, err_msg=key)

    images = np.random.default_rng(1).random((3, 1, 10, 10)).astype(np.float32)
    labels = np.array([0, 1, 2])
    results = {}
    for run, device in (("cpu", "cpu"), ("gpu1", "cuda:1")):
        model, _ = load_checkpoint_model(folder / run / "checkpoints" / "last.npz", device=device)
        assert {p.data.device.id for p in model.parameters()} == {1} if device != "cpu" else True
        with tc.no_grad():  # the fused forward-only routing kernel on the GPU
            _, lengths, _ = model(tc.tensor(images, device=model.device))
        loss = batch_losses(model, images, labels, 0.0005, train=True)[0]
        loss.backward()
        results[run] = [lengths.numpy(), loss.numpy()] + [p.grad.numpy() for p in model.parameters()]
    for got, want in zip(results["gpu1"], results["cpu"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    print("ok")


SCENARIOS = {f.__name__: f for f in (standin_refuses_what_cupy_refuses, train_on_the_second_gpu)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else None)
