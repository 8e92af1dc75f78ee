"""Tensor constructors: zeros, ones, full, arange, rand, randn (and the *_like forms)."""
from __future__ import annotations

import numpy as np

from . import backend, random
from .tensor import Tensor, get_default_dtype, leaf


def _make(array, device, requires_grad):
    return leaf(backend.to_device(array, backend.normalize_device(device)), requires_grad)


def _dtype(dtype):
    return get_default_dtype() if dtype is None else np.dtype(dtype)


def _filled_on_device(shape, value, dtype, device, requires_grad):
    """A constant tensor made where it will live (a GPU fills its own memory: no host array, no copy)."""
    device = backend.normalize_device(device)
    xp = backend.module_for(device)
    if xp is np:
        return leaf(np.full(shape, value, _dtype(dtype)), requires_grad)
    with backend.on_device(device):
        return leaf(xp.full(shape, value, _dtype(dtype)), requires_grad)


def zeros(shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A tensor of zeros of ``shape`` (default dtype float32, default device), made on that device."""
    return _filled_on_device(shape, 0, dtype, device, requires_grad)


def ones(shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A tensor of ones of ``shape``, made on its device."""
    return _filled_on_device(shape, 1, dtype, device, requires_grad)


def full(shape, value, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A tensor of ``shape`` filled with ``value``, made on its device."""
    return _filled_on_device(shape, value, dtype, device, requires_grad)


def zeros_like(t: Tensor, requires_grad=False) -> Tensor:
    """Zeros with the shape, dtype and device of ``t``."""
    with backend.on_device_of(t.data):
        return leaf(t.xp.zeros(t.shape, t.dtype), requires_grad)


def ones_like(t: Tensor, requires_grad=False) -> Tensor:
    """Ones with the shape, dtype and device of ``t``."""
    with backend.on_device_of(t.data):
        return leaf(t.xp.ones(t.shape, t.dtype), requires_grad)


def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
    """Evenly spaced values in [start, stop) as ``numpy.arange`` (integer dtype for integer arguments)."""
    values = np.arange(start, stop, step) if stop is not None else np.arange(start)
    return _make(values.astype(dtype) if dtype is not None else values, device, False)


def rand(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Uniform draws in [0, 1) from the engine's seeded CPU generator."""
    return _make(random.uniform(shape, dtype=_dtype(dtype)), device, requires_grad)


def randn(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Standard normal draws from the engine's seeded CPU generator."""
    return _make(random.normal(shape, dtype=_dtype(dtype)), device, requires_grad)
