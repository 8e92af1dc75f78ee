"""Weight initializers, filling a Tensor in place from the engine's seeded CPU generator.

Names follow PyTorch (``xavier_uniform_``).
"""
from __future__ import annotations

import math

from .. import backend, random
from ..tensor import Tensor


def fan_in_and_fan_out(shape) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight: (out, in) for linear, (out, in, kh, kw) for conv, as PyTorch computes."""
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a weight with at least 2 dimensions, got shape {tuple(shape)}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _fill(t: Tensor, values) -> Tensor:
    t.data = backend.to_device(values.astype(t.dtype), t.device)
    return t


def uniform_(t: Tensor, low: float = 0.0, high: float = 1.0) -> Tensor:
    """Fill with uniform draws in [low, high); returns t."""
    return _fill(t, random.uniform(t.shape, low, high, t.dtype))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with normal draws; returns t."""
    return _fill(t, random.normal(t.shape, mean, std, t.dtype))


def trunc_normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
    """Fill with normal draws redrawn until they lie in [a, b] (absolute bounds, as PyTorch's
    ``trunc_normal_``; TensorFlow's ``truncated_normal_initializer`` is a, b = mean -+ 2 std); returns t."""
    if not a < b or std <= 0:
        raise ValueError(f"trunc_normal_: need a < b and std > 0, got a={a}, b={b}, std={std}")
    rng = random.generator("cpu")
    values = rng.normal(mean, std, size=t.shape)
    outside = (values < a) | (values > b)
    while outside.any():
        values[outside] = rng.normal(mean, std, size=int(outside.sum()))
        outside = (values < a) | (values > b)
    return _fill(t, values)


def constant_(t: Tensor, value: float) -> Tensor:
    """Fill with ``value``; returns t."""
    with backend.on_device_of(t.data):  # (CuPy makes arrays on the current GPU)
        t.data = t.xp.full(t.shape, value, dtype=t.dtype)
    return t


def zeros_(t: Tensor) -> Tensor:
    """Fill ``t`` with 0 in place (no graph); returns ``t``."""
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    """Fill ``t`` with 1 in place (no graph); returns ``t``."""
    return constant_(t, 1.0)


def calculate_gain(nonlinearity: str = "leaky_relu", param: float | None = None) -> float:
    """The recommended gain for a nonlinearity, as in PyTorch."""
    if nonlinearity in ("linear", "conv2d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}")


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = fan_in_and_fan_out(t.shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)


def xavier_normal_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot normal: N(0, gain^2 * 2 / (fan_in + fan_out))."""
    fan_in, fan_out = fan_in_and_fan_out(t.shape)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def _kaiming_std(t, a, mode, nonlinearity):
    fan_in, fan_out = fan_in_and_fan_out(t.shape)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """He uniform: U(-b, b) with b = gain * sqrt(3 / fan)."""
    bound = math.sqrt(3.0) * _kaiming_std(t, a, mode, nonlinearity)
    return uniform_(t, -bound, bound)


def kaiming_normal_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """He normal: N(0, (gain / sqrt(fan))^2)."""
    return normal_(t, 0.0, _kaiming_std(t, a, mode, nonlinearity))
