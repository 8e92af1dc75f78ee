"""Devices and array modules: NumPy on the CPU, CuPy on an NVIDIA GPU.

The engine never switches a global array module. Every op asks ``array_module(array)`` for the
module that owns its data, so a graph stays on the device its leaves were created on.

Device names are ``"cpu"``, ``"cuda"`` (the current CUDA device) and ``"cuda:N"`` (GPU N). An
array's device is named ``"cuda"`` when it lives on the current device and ``"cuda:N"`` otherwise,
so a single-GPU program only ever sees ``"cuda"``. The default device is ``"cuda"`` when CuPy
imports and a GPU answers, else ``"cpu"``; the environment variable ``TINYGRAD_CAPS_DEVICE``
overrides it.
Asking for ``"cuda"`` where there is no usable GPU raises :class:`DeviceError`: never a silent
fallback to the CPU.
"""
from __future__ import annotations

import functools
import os

import numpy as np

# The device helpers both layers use (the kernels import nothing of the engine, so they live there),
# each under the one name both layers call it by. on_device_of(array): ``on_device`` for the device
# that holds ``array`` (CuPy allocates on the current device); absolute_device_of(array): "cpu" or
# "cuda:N" for the device holding ``array`` (never "cuda", whose meaning changes with the current GPU).
from .kernels.device import (DeviceError, absolute_device_of, array_module, cuda_device_name,  # noqa: F401
                             cuda_index, cupy_module, current_cuda_device, device_of, is_cupy_array, module_for,
                             on_device, on_device_of, parse_cuda_index as _parse_cuda_index)


@functools.lru_cache(maxsize=None)
def _gpu_status() -> tuple[bool, str]:
    cp = cupy_module()
    if cp is None:
        return False, "CuPy is not installed (pip install 'tinygrad-caps[cuda]')"
    try:
        if not cp.cuda.is_available():
            return False, "CuPy is installed but finds no CUDA device"
        cp.cuda.Device(0).compute_capability  # touches the driver: fails on a broken setup
    except Exception as exc:
        return False, f"CuPy cannot use the GPU: {exc}"
    return True, "ok"


def gpu_available() -> bool:
    """True when CuPy imports and a CUDA device answers (checked once per process)."""
    return _gpu_status()[0]


def normalize_device(device) -> str:
    """Map a device name (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"gpu"``, ``"auto"``, None) to its
    canonical name: ``"cpu"``, ``"cuda"`` (the current CUDA device) or ``"cuda:N"`` (another GPU).

    ``None`` and ``"auto"`` give the default device. Raises :class:`DeviceError` for an unknown
    name, for a CUDA device on a machine without a usable GPU, or for a GPU index that is not there.
    """
    if device is None or device == "auto":
        return default_device()
    name = str(device).lower()
    if name == "gpu":
        name = "cuda"
    if name == "cpu":
        return name
    if not name.startswith("cuda"):
        raise DeviceError(f"unknown device {device!r}; expected 'cpu', 'cuda', 'cuda:N' or 'auto'")
    index = _parse_cuda_index(name, device)
    ok, why = _gpu_status()
    if not ok:
        raise DeviceError(f"device {device!r} was requested but no usable GPU is here: {why}")
    if index is None:
        return "cuda"
    count = cupy_module().cuda.runtime.getDeviceCount()
    if index >= count:
        raise DeviceError(f"device {device!r} does not exist: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
    return cuda_device_name(index)


def absolute_device(device) -> str:
    """``"cpu"`` or ``"cuda:N"`` for a device name: unlike the canonical ``"cuda"``, it names the
    same GPU whichever GPU is current later (an op that runs inside another GPU's context needs
    this). DeviceError as ``normalize_device``."""
    device = normalize_device(device)
    return device if device == "cpu" else f"cuda:{cuda_index(device)}"


def use_device(device) -> str:
    """Normalize ``device`` and, for a GPU, make it the current one for this thread (CuPy then
    allocates and launches there unless told otherwise, as after ``torch.cuda.set_device``).
    Returns its canonical name afterwards ("cuda" for a GPU); DeviceError as ``normalize_device``."""
    device = normalize_device(device)
    if device.startswith("cuda"):
        cupy_module().cuda.Device(cuda_index(device)).use()
        return "cuda"
    return device


def default_device() -> str:
    """The default device: ``$TINYGRAD_CAPS_DEVICE`` if set, else ``"cuda"`` with a usable GPU, else ``"cpu"``."""
    forced = os.environ.get("TINYGRAD_CAPS_DEVICE", "").strip().lower()
    if forced and forced != "auto":
        return normalize_device(forced)
    return "cuda" if gpu_available() else "cpu"


def to_device(array, device: str):
    """Return ``array`` on ``device`` ("cpu", "cuda" or "cuda:N"), copying only when it moves."""
    device = normalize_device(device)
    if device.startswith("cuda"):
        cp = cupy_module()
        index = cuda_index(device)
        if is_cupy_array(array) and array.device.id == index:
            return array
        with on_device(device):
            return cp.array(array, copy=True) if is_cupy_array(array) else cp.asarray(array)
    if is_cupy_array(array):
        return array.get()
    return np.asarray(array)


def asarray_like(data, like, dtype=None):
    """``data`` (a list, NumPy or CuPy array) as an array on the device of the array ``like``,
    copied only when it moves or changes dtype (CuPy would put it on the current GPU)."""
    with on_device_of(like):
        return array_module(like).asarray(data, dtype=dtype)


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (a host copy for CuPy arrays)."""
    return array.get() if is_cupy_array(array) else np.asarray(array)
