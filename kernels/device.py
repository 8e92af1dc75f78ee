"""Devices and array modules, shared by the kernels and the engine: :class:`DeviceError`, which
module (NumPy or CuPy) holds an array, what its device is called, and contexts that make its GPU
current.

Imports nothing of the engine, and CuPy only when it is handed a CuPy array or asked about a GPU.
The engine's device policy (the default device, ``normalize_device``, moving data) is
``tinygrad_caps.backend``, built on this module.

Device names: ``"cpu"``; ``"cuda"`` for the current CUDA device and ``"cuda:N"`` for another GPU
(:func:`device_of`, the names a Tensor reports); or ``"cpu"`` and ``"cuda:N"`` whichever GPU is
current (:func:`absolute_device_of`, for what must name one GPU later too: a launch, a recorded node).
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from . import moved


class DeviceError(RuntimeError, ValueError):
    """A device is unavailable, unknown, or the arrays of one op or kernel call live on different
    devices (NumPy and CuPy, or two GPUs). The engine's ``tinygrad_caps.DeviceError`` is this class."""


@functools.lru_cache(maxsize=None)
def cupy_module():
    """Return the ``cupy`` module, or None when CuPy is not installed or fails to import."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return None
    return cupy


def is_cupy_array(array) -> bool:
    """True for a CuPy array, told by the module its type comes from: CuPy is never imported to
    ask, and a NumPy array (the common case: every op asks) is answered first."""
    return type(array) is not np.ndarray and type(array).__module__.startswith("cupy")


def array_module(array):
    """Return ``numpy`` or ``cupy``: the module that owns ``array``."""
    return cupy_module() if is_cupy_array(array) else np


def module_for(device: str):
    """The array module that holds data on ``device`` (a canonical name)."""
    return cupy_module() if device.startswith("cuda") else np


def parse_cuda_index(name: str, original):
    """None for "cuda", N for "cuda:N"; DeviceError (naming ``original``) for anything else that
    starts with "cuda"."""
    if name == "cuda":
        return None
    index = name[len("cuda:"):]
    if not name.startswith("cuda:") or not index.isdigit():
        raise DeviceError(f"unknown device {original!r}; expected 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return int(index)


def current_cuda_device() -> int:
    """The index of CuPy's current CUDA device."""
    return cupy_module().cuda.Device().id


def cuda_device_name(index: int) -> str:
    """The canonical name of GPU ``index``: "cuda" for the current device, else "cuda:N"."""
    return "cuda" if index == current_cuda_device() else f"cuda:{index}"


def cuda_index(device: str) -> int:
    """The GPU index of a canonical CUDA device name ("cuda" is the current device)."""
    index = parse_cuda_index(device, device)
    return current_cuda_device() if index is None else index


def device_of(array) -> str:
    """The device holding ``array``: "cpu" for NumPy and anything else, "cuda" for a CuPy array on
    the current device, "cuda:N" for one on another GPU."""
    return cuda_device_name(array.device.id) if is_cupy_array(array) else "cpu"


def absolute_device_of(array) -> str:
    """"cpu" for a NumPy array, "cuda:N" for a CuPy array on GPU N (never "cuda", whose meaning
    changes with the current GPU)."""
    return f"cuda:{array.device.id}" if is_cupy_array(array) else "cpu"


def on_device_of(array):
    """A ``with`` context that makes the GPU holding ``array`` current (nothing for NumPy arrays):
    CuPy allocates and launches on the current GPU."""
    return array.device if is_cupy_array(array) else contextlib.nullcontext()


def on_device(device: str):
    """A ``with`` context in which CuPy allocates and launches on ``device`` (a canonical name);
    for "cpu", a context that does nothing."""
    if device.startswith("cuda"):
        return cupy_module().cuda.Device(cuda_index(device))
    return contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(device_id: int) -> int:
    return int(cupy_module().cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def multiprocessor_count(array, default: int) -> int:
    """The SM count of the GPU that holds ``array`` (asked once per GPU), or ``default`` for a
    NumPy array (the CPU emulation): what a launcher sizes a grid by."""
    return _multiprocessor_count(array.device.id) if is_cupy_array(array) else default


# these two's names before the kernels and the engine shared one name each (CHANGELOG.md): they warn, go in 0.2
moved.renamed(__name__, {"device_context": "on_device_of", "device_name": "absolute_device_of"})
