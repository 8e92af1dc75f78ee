"""Devices: defaults, the environment override, transfers, and mixing devices."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import backend


def test_default_device_follows_the_gpu_and_the_environment(monkeypatch):
    monkeypatch.delenv("TINYGRAD_CAPS_DEVICE", raising=False)
    assert tc.default_device() == ("cuda" if tc.gpu_available() else "cpu")
    monkeypatch.setenv("TINYGRAD_CAPS_DEVICE", "cpu")
    assert tc.default_device() == "cpu"
    assert tc.tensor([1.0]).device == "cpu"
    if not tc.gpu_available():
        monkeypatch.setenv("TINYGRAD_CAPS_DEVICE", "cuda")
        with pytest.raises(tc.DeviceError, match="no usable GPU"):
            tc.default_device()


def test_array_module_and_device_of_numpy():
    a = np.zeros(2)
    assert backend.array_module(a) is np and backend.device_of(a) == "cpu"
    assert isinstance(backend.to_numpy(a), np.ndarray)


def test_tensor_attributes_and_conversions():
    x = tc.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    assert x.shape == (2, 3) and x.ndim == 2 and x.dtype == np.float64 and x.device == "cpu" and x.requires_grad
    assert x[1, 2].item() == 5.0
    d = x.detach()
    assert not d.requires_grad and d.data is x.data
    assert x.to("cpu") is x
    y = x.astype(np.float32)
    assert y.dtype == np.float32 and y.requires_grad


def test_manual_seed_repeats_random_draws():
    tc.manual_seed(5)
    a = tc.randn(4).numpy()
    tc.manual_seed(5)
    np.testing.assert_array_equal(a, tc.randn(4).numpy())


def test_allocator_tuning_was_applied_on_glibc():
    import platform

    from tinygrad_caps import _allocator

    if platform.libc_ver()[0] == "glibc":
        assert _allocator.applied
