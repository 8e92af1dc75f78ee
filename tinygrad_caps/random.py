"""The engine's random sources, seeded together by ``manual_seed``.

CPU draws come from one ``numpy.random.Generator``; GPU draws from one CuPy generator per GPU,
created on first use on that GPU (seeded alike). ``nn.init`` draws on the CPU generator (so initial weights do not depend on the
device), dropout on the generator of its data's device.
"""
from __future__ import annotations

import numpy as np

from . import backend

_seed = None
_numpy_rng = np.random.default_rng()
_cupy_rngs = {}  # GPU index -> CuPy Generator


def manual_seed(seed: int) -> None:
    """Seed every random source the engine uses, on the CPU and (when present) the GPU."""
    global _seed, _numpy_rng
    _seed = int(seed)
    _numpy_rng = np.random.default_rng(_seed)
    _cupy_rngs.clear()
    if backend.gpu_available():
        backend.cupy_module().random.seed(_seed)


def generator(device: str = "cpu"):
    """The engine's generator for ``device``: a NumPy Generator (cpu) or that GPU's CuPy Generator."""
    if device.startswith("cuda"):
        device = backend.normalize_device(device)
        index = backend.cuda_index(device)
        rng = _cupy_rngs.get(index)
        if rng is None:
            with backend.on_device(device):
                rng = _cupy_rngs[index] = backend.cupy_module().random.default_rng(_seed)
        return rng
    return _numpy_rng


def get_rng_state() -> dict:
    """The CPU generator's state (a JSON-able dict), for checkpoints."""
    return _numpy_rng.bit_generator.state


def set_rng_state(state: dict) -> None:
    """Restore a state returned by ``get_rng_state``."""
    _numpy_rng.bit_generator.state = state


def uniform(shape, low=0.0, high=1.0, dtype=np.float32):
    """A NumPy array of uniform draws in [low, high) from the CPU generator."""
    return _numpy_rng.uniform(low, high, size=shape).astype(dtype)


def normal(shape, mean=0.0, std=1.0, dtype=np.float32):
    """A NumPy array of normal draws from the CPU generator."""
    return _numpy_rng.normal(mean, std, size=shape).astype(dtype)


def bernoulli_keep_mask(shape, keep: float, dtype, device: str):
    """An array on ``device`` with 1 where a uniform draw < ``keep``, else 0."""
    rng = generator(device)
    with backend.on_device(backend.normalize_device(device)):  # (nothing to do for "cpu")
        return (rng.random(shape) < keep).astype(dtype)
