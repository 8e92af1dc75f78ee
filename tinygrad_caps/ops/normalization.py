"""Regularization and normalization: dropout and batch_norm, written from primitives."""
from __future__ import annotations

from .. import backend, random
from ..errors import ShapeError
from ..tensor import Tensor, as_tensor
from ._common import constant
from .elementwise import sqrt
from .reduce import mean
from .shape import reshape


def dropout(x, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p); identity when not training.

    The mask comes from the engine's generator for ``x``'s device (seeded by ``manual_seed``).
    """
    x = as_tensor(x)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    mask = random.bernoulli_keep_mask(x.shape, 1.0 - p, x.dtype, x.device)
    with backend.on_device_of(x.data):
        scaled = mask * x.xp.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    return x * constant(scaled)


def batch_norm(x, running_mean=None, running_var=None, weight=None, bias=None, training=False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over every axis but the channel axis 1, as PyTorch's ``batch_norm``.

    Args:
        x: (N, C) or (N, C, ...). running_mean, running_var: (C,) arrays or Tensors, updated in
            place when training (the variance with Bessel's correction); used when not training.
        weight, bias: (C,) or None. momentum: weight of the new batch statistics.
    Returns:
        Same shape as x.
    """
    x = as_tensor(x)
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: expected (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    stat_shape = (1, c) + (1,) * (x.ndim - 2)
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise ShapeError(f"batch_norm: {name} has shape {tuple(t.shape)}, expected ({c},) for input {x.shape}")
    axes = (0,) + tuple(range(2, x.ndim))
    if training:
        count = x.size // c
        if count < 2:
            raise ValueError(f"batch_norm: training needs more than one value per channel, got input {x.shape}")
        mu = mean(x, axes, keepdims=True)
        centered = x - mu
        var = mean(centered * centered, axes, keepdims=True)
        if running_mean is not None and running_var is not None:
            with backend.on_device_of(x.data):  # the running statistics live beside x
                _update_running(running_mean, mu.data.reshape(c), momentum)
                _update_running(running_var, var.data.reshape(c) * (count / (count - 1)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: evaluation mode needs running_mean and running_var")
        with backend.on_device_of(x.data):
            mu = constant(_array(running_mean).reshape(stat_shape).astype(x.dtype, copy=False))
            var = constant(_array(running_var).reshape(stat_shape).astype(x.dtype, copy=False))
        centered = x - mu
    y = centered / sqrt(var + eps)
    if weight is not None:
        y = y * reshape(as_tensor(weight), stat_shape)
    if bias is not None:
        y = y + reshape(as_tensor(bias), stat_shape)
    return y


def _array(t):
    return t.data if isinstance(t, Tensor) else t


def _update_running(buffer, batch_value, momentum):
    array = _array(buffer)
    array *= 1.0 - momentum
    array += momentum * batch_value.astype(array.dtype, copy=False)

