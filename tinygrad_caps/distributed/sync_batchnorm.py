"""Batch normalization with statistics over the global batch of all ranks.

Plain BatchNorm under data parallelism normalizes each rank's slice by that slice's own mean
and variance, so the result depends on the number of ranks. ``SyncBatchNorm`` sums the
per-channel sums and squared deviations over the ranks (two all-reduces per layer in the forward,
two in the backward), which makes a run on W ranks with global batch B compute what one process
computes with batch B.
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from ..autograd.function import Function
from ..nn.layers import _BatchNorm
from ..nn.module import Module
from ..ops.normalization import _update_running
from ..tensor import Tensor, as_tensor
from . import process_group as group


class AllReduceSum(Function):
    """y = the sum of x over all ranks (on every rank); its backward sums the gradients the same way."""

    save_inputs = ()

    def forward(self, x):
        y = x.copy()
        group.all_reduce(y, "sum")
        return y

    def backward(self, gy):
        return all_reduce_sum(gy)


def all_reduce_sum(x) -> Tensor:
    """Differentiable all-reduce: a Tensor of ``x``'s shape holding the sum of ``x`` over the ranks.

    The gradient reaching ``x`` on a rank is the sum over ranks of the gradients reaching the
    output, i.e. the derivative of the sum of all ranks' losses.
    """
    return AllReduceSum()(as_tensor(x))


def sync_batch_norm(x, running_mean, running_var, weight=None, bias=None, momentum: float = 0.1,
                    eps: float = 1e-5) -> Tensor:
    """Training-mode batch norm of x (N, C, ...) with the mean and variance of the global batch.

    running_mean, running_var: (C,) arrays updated in place with the global statistics (the
    variance with Bessel's correction over the global count). weight, bias: (C,) or None.
    Returns a Tensor of x's shape. Every rank must call it (it is a collective).
    """
    x = as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"sync_batch_norm: expected (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    count = group.all_reduce(np.array([x.size // c], dtype=np.int64), "sum")[0]
    if count < 2:
        raise ValueError(f"sync_batch_norm: training needs more than one value per channel, got {count} in all ranks")
    mu = all_reduce_sum(F.sum(x, axes, keepdims=True)) / float(count)
    centered = x - mu
    var = all_reduce_sum(F.sum(centered * centered, axes, keepdims=True)) / float(count)
    for buffer, value in ((running_mean, mu.data.reshape(c)), (running_var, var.data.reshape(c) * (count / (count - 1)))):
        if buffer is not None:
            _update_running(buffer, value, momentum)
    y = centered / F.sqrt(var + eps)
    stat_shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * F.reshape(weight, stat_shape)
    if bias is not None:
        y = y + F.reshape(bias, stat_shape)
    return y


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics span the global batch of all ranks (identical to
    BatchNorm in a group of one and in evaluation mode)."""

    expected_ndim = (2, 3, 4, 5)

    def forward(self, x):
        if x.ndim not in self.expected_ndim:
            raise ValueError(f"SyncBatchNorm: expected an input with {self.expected_ndim} dimensions, got {x.shape}")
        if not self.training or group.world_size() == 1:
            return super().forward(x)
        return sync_batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.momentum, self.eps)


def convert_sync_batchnorm(module: Module) -> Module:
    """Replace every BatchNorm1d/2d inside ``module`` by a SyncBatchNorm that shares its parameters
    and buffers; returns ``module`` (or the replacement, if ``module`` itself is a BatchNorm)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        return _as_sync(module)
    for _, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, _BatchNorm) and not isinstance(child, SyncBatchNorm):
                setattr(parent, name, _as_sync(child))
    return module


def _as_sync(bn):
    sync = object.__new__(SyncBatchNorm)
    sync.__dict__.update(bn.__dict__)  # the same Parameter objects, buffers and settings
    object.__setattr__(sync, "expected_ndim", type(bn).expected_ndim)
    return sync
