"""Losses (mse, binary and categorical cross-entropy) and one_hot, written from primitives."""
from __future__ import annotations

import numpy as np

from ..backend import array_module, asarray_like, on_device_of
from ..errors import ShapeError
from ..tensor import Tensor, as_tensor
from ._common import constant
from .activation import log_softmax
from .elementwise import clip, log
from .reduce import mean, sum as reduce_sum

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return reduce_sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _same_shape(op, input, target):
    if input.shape != target.shape:
        raise ShapeError(f"{op}: input shape {input.shape} and target shape {target.shape} differ")


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    """Squared error (input - target)^2, reduced by 'mean' (default), 'sum' or 'none'; shapes must match."""
    input = as_tensor(input)
    target = as_tensor(target, like=input)
    _same_shape("mse_loss", input, target)
    diff = input - target
    return _reduce(diff * diff, reduction, "mse_loss")


def binary_cross_entropy(input, target, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)) for probabilities p in [0, 1]; logs clamped at -100 as in PyTorch."""
    input = as_tensor(input)
    target = as_tensor(target, like=input)
    _same_shape("binary_cross_entropy", input, target)
    log_p = clip(log(input), -100.0, None)
    log_q = clip(log(1 - input), -100.0, None)
    return _reduce(-(target * log_p + (1 - target) * log_q), reduction, "binary_cross_entropy")


def one_hot(labels, num_classes: int, dtype=np.float32) -> Tensor:
    """Integer labels of shape S -> a (S..., num_classes) tensor of 0/1 (not differentiable).
    Labels outside [0, num_classes) are a ValueError, except while a CUDA graph is captured."""
    from ..cuda_graphs import capturing

    data = labels.data if isinstance(labels, Tensor) else labels
    if not hasattr(data, "dtype"):
        data = np.asarray(data)
    if data.dtype.kind not in "iu":
        raise ValueError(f"one_hot: labels must be integers, got {data.dtype}")
    xp = array_module(data)
    with on_device_of(data):  # CuPy computes on the current GPU
        if data.size and not capturing(data):  # (a graph's labels are checked where they are loaded)
            low, high = int(data.min()), int(data.max())
            if low < 0 or high >= num_classes:
                raise ValueError(f"one_hot: labels must lie in [0, {num_classes}), got range [{low}, {high}]")
        return Tensor._wrap((data[..., None] == xp.arange(num_classes)).astype(dtype))


def cross_entropy(logits, target, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy: logits (N, C) with integer class indices (N,) or class probabilities (N, C)."""
    logits = as_tensor(logits)
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: expected logits (N, C), got shape {logits.shape}")
    log_p = log_softmax(logits, axis=1)
    data = target.data if isinstance(target, Tensor) else np.asarray(target) if not hasattr(target, "dtype") else target
    if data.dtype.kind in "iu":
        if data.shape != logits.shape[:1]:
            raise ShapeError(f"cross_entropy: class indices of shape {data.shape} do not fit logits {logits.shape}")
        weights = one_hot(Tensor._wrap(asarray_like(data, logits.data)), logits.shape[1], logits.dtype)
    else:
        weights = target if isinstance(target, Tensor) else constant(asarray_like(data, logits.data, logits.dtype))
        _same_shape("cross_entropy", logits, weights)
    return _reduce(-reduce_sum(weights * log_p, axis=1), reduction, "cross_entropy")
