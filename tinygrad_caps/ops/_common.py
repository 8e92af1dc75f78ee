"""Helpers shared by the op families: operand conversion, axes, and undoing broadcasting."""
from __future__ import annotations

import numpy as np

from ..autograd.function import Function
from ..errors import ShapeError
from ..tensor import Tensor, as_tensor, leaf, zero_dim_dtype


def operands(a, b):
    """Both operands as Tensors, promoted as PyTorch does.

    A Python number takes the other operand's dtype and device (a float beside an integer tensor
    gives the default float dtype); a zero-dimensional operand of the same or a lower category
    takes the dtype of a dimensioned one (a differentiable cast, so its gradient comes back in its
    own dtype); otherwise NumPy's promotion applies (float32 with float64 gives float64).
    """
    if isinstance(a, Tensor):
        b = as_tensor(b, like=a)
    elif isinstance(b, Tensor):
        a = as_tensor(a, like=b)
    else:
        a = as_tensor(a)
        b = as_tensor(b, like=a)
    if a.dtype != b.dtype:
        if a.ndim == 0 and b.ndim > 0:
            a, b = _cast_zero_dim(a, b)
        elif b.ndim == 0 and a.ndim > 0:
            b, a = _cast_zero_dim(b, a)
    return a, b


def _cast_zero_dim(x, like):
    """Cast the zero-dim ``x`` to ``like``'s dtype, or, when x's category is higher (a float beside
    integers), ``like`` to x's dtype; returns the pair in the order (x, like)."""
    dtype = zero_dim_dtype(x.dtype, like)
    if dtype != x.dtype:
        return x.astype(dtype), like
    return x, like.astype(x.dtype)


def constant(array) -> Tensor:
    """An array as a Tensor outside the graph (a mask, a scale): ``leaf(array)``, no copy."""
    return leaf(array)


def normalize_axes(axis, ndim: int, op: str):
    """``axis`` (None, int or sequence) as None or a sorted tuple of non-negative axes; checks range."""
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{op}: axis {a} is out of range for a tensor with {ndim} dimensions")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis}")
    return tuple(sorted(out))


SHORT_AXIS = 32


def _short_last_axis(x, axes) -> bool:
    return (type(x) is np.ndarray and axes is not None and axes == (x.ndim - 1,)
            and 1 < x.shape[-1] <= SHORT_AXIS and x.size >= 4096)


def sum_array(x, axes, keepdims):
    """``x.sum(axes, keepdims)``; a short last axis is summed by a matrix-vector product.

    NumPy reduces a short innermost axis (routing's 10 output capsules) one short loop at a
    time; a product with a ones vector runs as one BLAS call.
    """
    if _short_last_axis(x, axes) and x.dtype.kind in "fc":  # integers and booleans: NumPy's widening sum
        y = x @ np.ones((x.shape[-1], 1), dtype=x.dtype)
        return y if keepdims else y[..., 0]
    return x.sum(axis=axes, keepdims=keepdims)


def max_array(x, axes, keepdims, largest=True):
    """``x.max`` (or ``x.min``) over ``axes``; a short last axis by a running elementwise extreme."""
    if _short_last_axis(x, axes):
        pick = np.maximum if largest else np.minimum
        y = x[..., 0].copy()
        for k in range(1, x.shape[-1]):
            pick(y, x[..., k], out=y)
        return y[..., None] if keepdims else y
    return x.max(axis=axes, keepdims=keepdims) if largest else x.min(axis=axes, keepdims=keepdims)


def sum_to_array(x, shape):
    """Sum the array ``x`` down to ``shape``, undoing NumPy broadcasting (shape must broadcast to x.shape)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return sum_array(x, axes, True).reshape(shape)


class Bilinear(Function):
    """An op f(a, b) linear in each input: the gradient for a reads only b, and the one for b only a."""

    def inputs_to_save(self, needs_grad):
        return tuple(1 - k for k in (0, 1) if needs_grad[k])


class SumTo(Function):
    """Sum over broadcast axes down to a target shape; the adjoint of BroadcastTo."""

    save_inputs = ()

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        return sum_to_array(x, self.shape)

    def backward(self, gy):
        return BroadcastTo(self.inputs[0].shape)(gy)


class BroadcastTo(Function):
    """Broadcast to a target shape (a read-only view); the adjoint of SumTo."""

    save_inputs = ()

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        from ..backend import array_module

        return array_module(x).broadcast_to(x, self.shape)

    def backward(self, gy):
        return sum_to(gy, self.inputs[0].shape)


def sum_to(x: Tensor, shape) -> Tensor:
    """Differentiable: sum ``x`` (shape S) down to ``shape`` that broadcasts to S; x itself if equal.

    The one helper that every broadcasting op's backward uses.
    """
    shape = tuple(shape)
    return x if x.shape == shape else SumTo(shape)(x)


def broadcast_to(x: Tensor, shape) -> Tensor:
    """Differentiable broadcast of ``x`` to ``shape`` (NumPy rules); x itself if the shape is equal."""
    shape = tuple(shape)
    return x if x.shape == shape else BroadcastTo(shape)(x)
