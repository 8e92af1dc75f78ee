"""Reductions over axes: sum, mean, max, min (with keepdims)."""
from __future__ import annotations

import math

from ..autograd.function import Function
from ..tensor import Tensor, as_tensor
from ._common import broadcast_to, constant, max_array, normalize_axes, sum_array


def _keepdims_shape(shape, axes):
    if axes is None:
        return (1,) * len(shape)
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


class Sum(Function):
    save_inputs = ()

    def __init__(self, axes, keepdims):
        self.axes, self.keepdims = axes, keepdims

    def forward(self, x):
        return sum_array(x, self.axes, self.keepdims)

    def backward(self, gy):
        shape = self.inputs[0].shape
        if not self.keepdims:
            gy = reshape_for_broadcast(gy, _keepdims_shape(shape, self.axes))
        return broadcast_to(gy, shape)


class Extreme(Function):
    """max (or min) over axes; the gradient is shared evenly among tied extremes."""

    save_inputs = ()

    def __init__(self, axes, keepdims, largest):
        self.axes, self.keepdims, self.largest = axes, keepdims, largest

    def forward(self, x):
        if x.size == 0:
            raise ValueError("max/min of an empty tensor")
        y = max_array(x, self.axes, True, self.largest)
        return y if self.keepdims else y.reshape(_squeezed_shape(x.shape, self.axes))

    def keep_for_backward(self, arrays, y):
        x = arrays[0]
        hits = x == (y if self.keepdims else y.reshape(_keepdims_shape(x.shape, self.axes)))
        self.share = hits / hits.sum(axis=self.axes, keepdims=True, dtype=x.dtype)

    def backward(self, gy):
        shape = self.inputs[0].shape
        gy = reshape_for_broadcast(gy, _keepdims_shape(shape, self.axes))
        return broadcast_to(gy, shape) * constant(self.share.astype(gy.dtype))


def _squeezed_shape(shape, axes):
    return () if axes is None else tuple(n for i, n in enumerate(shape) if i not in axes)


def reshape_for_broadcast(gy: Tensor, shape) -> Tensor:
    """``gy`` reshaped to ``shape`` (a reduction's output with its reduced axes kept as size 1), so it
    broadcasts back over the input; ``gy`` itself when it has that shape already."""
    from .shape import reshape

    return gy if gy.shape == tuple(shape) else reshape(gy, shape)


def sum(x, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (None: all; int or tuple); keeps reduced axes as size 1 if ``keepdims``."""
    x = as_tensor(x)
    return Sum(normalize_axes(axis, x.ndim, "sum"), keepdims)(x)


def mean(x, axis=None, keepdims=False) -> Tensor:
    """Mean over ``axis`` (None: all; int or tuple); shape as for ``sum``."""
    x = as_tensor(x)
    axes = normalize_axes(axis, x.ndim, "mean")
    count = x.size if axes is None else math.prod(x.shape[a] for a in axes)
    if count == 0:
        raise ValueError(f"mean: reducing over an empty axis of a tensor of shape {x.shape}")
    return Sum(axes, keepdims)(x) * (1.0 / count)


def max(x, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    """Maximum over ``axis`` (None: all); ties share the gradient evenly."""
    x = as_tensor(x)
    return Extreme(normalize_axes(axis, x.ndim, "max"), keepdims, True)(x)


def min(x, axis=None, keepdims=False) -> Tensor:  # noqa: A001
    """Minimum over ``axis`` (None: all); ties share the gradient evenly."""
    x = as_tensor(x)
    return Extreme(normalize_axes(axis, x.ndim, "min"), keepdims, False)(x)
