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


def test_import_changes_nothing_process_wide_and_tune_allocator_is_explicit():
    import platform
    import subprocess
    import sys

    code = (
        "import numpy\n"
        "from numpy._core.multiarray import _set_madvise_hugepage as switch\n"
        "before = switch(True); switch(before)\n"
        "import tinygrad_caps as tc\n"
        "from tinygrad_caps import _allocator\n"
        "after = switch(before); switch(after)\n"
        "assert before == after, (before, after)\n"
        "assert not _allocator.applied and not _allocator.hugepage_madvise_disabled\n"
        "state = tc.tune_allocator()\n"
        "print(state['mallopt'], state['numpy_hugepage_madvise_off'], switch(True))\n"
        "restored = tc.tune_allocator(enabled=False)\n"
        "print(restored['mallopt'], restored['numpy_hugepage_madvise_off'])\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("MALLOC_", "NUMPY_MADVISE"))}
    env.pop("TINYGRAD_CAPS_MALLOC_TUNING", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    tuned, restored = out.stdout.splitlines()
    mallopt, madvise_off, hugepage_was_on = tuned.split()
    assert madvise_off == "True" and hugepage_was_on == "False"
    if platform.libc_ver()[0] == "glibc":
        assert mallopt == "True"
    assert restored == "False False"


def test_tune_allocator_respects_the_off_switch(monkeypatch):
    from tinygrad_caps import _allocator

    monkeypatch.setenv("TINYGRAD_CAPS_MALLOC_TUNING", "0")
    before = (_allocator.applied, _allocator.hugepage_madvise_disabled)
    assert tc.tune_allocator() == {"mallopt": before[0], "numpy_hugepage_madvise_off": before[1]}
    assert (_allocator.applied, _allocator.hugepage_madvise_disabled) == before
