"""Devices and array modules: NumPy on the CPU, CuPy on an NVIDIA GPU.

The engine never switches a global array module. Every op asks ``array_module(array)`` for the
module that owns its data, so a graph stays on the device its leaves were created on.

Device names are ``"cpu"`` and ``"cuda"``. The default device is ``"cuda"`` when CuPy imports
and a GPU answers, else ``"cpu"``; the environment variable ``TINYGRAD_CAPS_DEVICE`` overrides it.
Asking for ``"cuda"`` where there is no usable GPU raises :class:`DeviceError`: never a silent
fallback to the CPU.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from .errors import DeviceError

DEVICES = ("cpu", "cuda")


@functools.lru_cache(maxsize=None)
def cupy_module():
    """Return the ``cupy`` module, or None when CuPy is not installed or fails to import."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return None
    return cupy


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
    """Map a device name (``"cpu"``, ``"cuda"``, ``"cuda:0"``, ``"gpu"``, ``"auto"``, None) to ``"cpu"`` or ``"cuda"``.

    ``None`` and ``"auto"`` give the default device. Raises :class:`DeviceError` for an unknown
    name or for ``"cuda"`` on a machine without a usable GPU.
    """
    if device is None or device == "auto":
        return default_device()
    name = str(device).lower()
    if name in ("gpu", "cuda:0"):
        name = "cuda"
    if name not in DEVICES:
        raise DeviceError(f"unknown device {device!r}; expected one of {DEVICES} or 'auto'")
    if name == "cuda":
        ok, why = _gpu_status()
        if not ok:
            raise DeviceError(f"device 'cuda' was requested but no usable GPU is here: {why}")
    return name


def default_device() -> str:
    """The default device: ``$TINYGRAD_CAPS_DEVICE`` if set, else ``"cuda"`` with a usable GPU, else ``"cpu"``."""
    forced = os.environ.get("TINYGRAD_CAPS_DEVICE", "").strip().lower()
    if forced and forced != "auto":
        return normalize_device(forced)
    return "cuda" if gpu_available() else "cpu"


def is_cupy_array(array) -> bool:
    """True when ``array`` is a ``cupy.ndarray`` (without importing CuPy when it was never imported)."""
    cp = cupy_module() if type(array).__module__.startswith("cupy") else None
    return cp is not None and isinstance(array, cp.ndarray)


def array_module(array):
    """Return ``numpy`` or ``cupy``: the module that owns ``array``."""
    return cupy_module() if is_cupy_array(array) else np


def device_of(array) -> str:
    """``"cuda"`` for a CuPy array, ``"cpu"`` for anything else."""
    return "cuda" if is_cupy_array(array) else "cpu"


def module_for(device: str):
    """The array module that holds data on ``device`` (a normalized name)."""
    return cupy_module() if device == "cuda" else np


def to_device(array, device: str):
    """Return ``array`` on ``device`` (``"cpu"`` or ``"cuda"``), copying only when it moves."""
    device = normalize_device(device)
    if device == "cuda":
        return cupy_module().asarray(array)
    if is_cupy_array(array):
        return array.get()
    return np.asarray(array)


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (a host copy for CuPy arrays)."""
    return array.get() if is_cupy_array(array) else np.asarray(array)
