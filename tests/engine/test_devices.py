"""Device names "cpu", "cuda" (the current GPU) and "cuda:N"; kernels launch on the GPU that holds
their arrays, and arrays on different devices in one op or launch are a DeviceError. The parts
that need GPUs are marked ``gpu`` (two-GPU tests skip on a one-GPU machine)."""
import types

import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps import backend
from tinygrad_caps.kernels import capsule, launch

from helpers import gpu_count


class FakeGpuArray:
    """Stands in for a CuPy array on GPU ``index`` (only what the device checks read)."""

    def __init__(self, index, shape=(2, 3, 4)):
        self.device = types.SimpleNamespace(id=index)
        self.data = types.SimpleNamespace(ptr=0)
        self.shape, self.ndim, self.dtype = shape, len(shape), np.dtype(np.float32)


FakeGpuArray.__module__ = "cupy._fake"


@pytest.mark.parametrize("name", ["cuda:x", "cuda:-1", "cuda1", "tpu", "cuda:0:1"])
def test_unknown_device_names_are_refused(name):
    with pytest.raises(tc.DeviceError, match="unknown device"):
        backend.normalize_device(name)


@pytest.mark.skipif(tc.gpu_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:1", "gpu"])
def test_cuda_devices_without_a_gpu_are_an_error(name):
    with pytest.raises(tc.DeviceError, match="no usable GPU"):
        backend.normalize_device(name)


def test_a_kernel_call_on_two_gpus_is_a_device_error():
    with pytest.raises(tc.DeviceError, match="W is on cuda:1 but u is on cuda:0"):
        capsule.capsule_predict(FakeGpuArray(0), FakeGpuArray(1, (3, 2, 2, 4)))
    with pytest.raises(tc.DeviceError, match="on cpu but u is on cuda:0"):
        capsule.capsule_predict(FakeGpuArray(0), np.zeros((3, 2, 2, 4), np.float32))


def test_a_launch_goes_to_the_gpu_of_its_arrays():
    record = launch.KernelLaunch("capsule.cu", "k", (1,), (32,), (FakeGpuArray(2), np.int32(3)), ())
    assert launch.launch_device_id(record) == 2
    mixed = launch.KernelLaunch("capsule.cu", "k", (1,), (32,), (FakeGpuArray(2), FakeGpuArray(0)), ())
    with pytest.raises(tc.DeviceError, match=r"GPUs \[0, 2\]"):
        launch.launch_device_id(mixed)




@pytest.mark.gpu
def test_cuda_zero_is_the_current_device_by_default():
    assert backend.normalize_device("cuda:0") == "cuda"
    x = tc.tensor(np.ones(3), device="cuda:0")
    assert x.device == "cuda"


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_kernels_run_on_the_second_gpu_and_mixing_gpus_is_an_error():
    rng = np.random.default_rng(0)
    u = tc.tensor(rng.standard_normal((2, 5, 4)).astype(np.float32), device="cuda:1")
    w = tc.tensor(rng.standard_normal((5, 3, 8, 4)).astype(np.float32), device="cuda:1")
    assert u.device == "cuda:1"
    u_hat = F.capsule_predict(u, w)
    assert u_hat.device == "cuda:1" and u_hat.data.device.id == 1
    np.testing.assert_allclose(u_hat.numpy(), np.einsum("ijdk,bik->bijd", w.numpy(), u.numpy()), rtol=1e-4, atol=1e-4)
    with pytest.raises(tc.DeviceError, match="cuda:1"):
        F.capsule_predict(u.to("cuda:0"), w)
def test_device_contexts_on_the_cpu_do_nothing():
    with backend.on_device("cpu"), backend.on_device_of(np.zeros(2)):
        assert tc.tensor(np.ones(2), device="cpu").device == "cpu"
    assert backend.use_device("cpu") == "cpu"
    with pytest.raises(tc.DeviceError, match="unknown device"):
        backend.use_device("tpu")
    if not tc.gpu_available():
        with pytest.raises(tc.DeviceError, match="no usable GPU"):
            backend.use_device("cuda")


@pytest.mark.gpu
def test_use_device_makes_a_gpu_current():
    assert backend.use_device("cuda:0") == "cuda"
    assert backend.current_cuda_device() == 0
    with backend.on_device("cuda:0"):
        assert backend.cupy_module().zeros(1).device.id == 0


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_an_optimizer_keeps_its_state_on_the_gpu_of_each_parameter():
    backend.use_device("cuda:0")
    p = tc.tensor(np.ones((3, 2), np.float32), device="cuda:1", requires_grad=True)
    F.sum(p * p).backward()
    optimizer = tc.optim.Adam([p], lr=0.1)
    optimizer.step()
    assert {optimizer.state[0][key].device.id for key in ("exp_avg", "exp_avg_sq")} == {1}
    np.testing.assert_allclose(p.numpy(), np.full((3, 2), 0.9), rtol=1e-6)
    try:
        assert backend.use_device("cuda:1") == "cuda" and p.device == "cuda"  # names follow the current GPU
    finally:
        backend.use_device("cuda:0")
