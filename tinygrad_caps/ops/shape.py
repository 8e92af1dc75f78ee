"""Shape ops: reshape, transpose/permute, expand_dims, squeeze, broadcast_to, indexing,
concatenate, stack, pad; and casts and device moves, which keep the shape."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import backend
from ..autograd.function import Function
from ..errors import ShapeError
from ..tensor import Tensor, as_tensor
from ._common import normalize_axes


class Reshape(Function):
    save_inputs = ()

    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        return x.reshape(self.shape)

    def backward(self, gy):
        return reshape(gy, self.inputs[0].shape)


class Transpose(Function):
    save_inputs = ()

    def __init__(self, axes):
        self.axes = axes

    def forward(self, x):
        return x.transpose(self.axes)

    def backward(self, gy):
        return Transpose(tuple(np.argsort(self.axes)))(gy)


def _is_basic_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(isinstance(i, (slice, numbers.Integral, type(None), type(Ellipsis))) and not isinstance(i, bool)
               for i in items)


def _normalize_index(index, data):
    """Tensors become arrays, lists become integer/bool arrays, all on the device of ``data``."""
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for i in items:
        if isinstance(i, Tensor):
            i = i.data
        if isinstance(i, list):
            i = np.asarray(i)
        if isinstance(i, np.ndarray) or backend.is_cupy_array(i):
            if i.dtype.kind not in "biu":
                raise IndexError(f"getitem: index arrays must be integer or boolean, got {i.dtype}")
            i = backend.asarray_like(i, data)
        out.append(i)
    return tuple(out)


class GetItem(Function):
    save_inputs = ()

    def __init__(self, index):
        self.index = index

    def forward(self, x):
        return x[self.index]

    def backward(self, gy):
        return ScatterAdd(self.index, self.inputs[0].shape)(gy)


class ScatterAdd(Function):
    """zeros(shape) with ``gy`` added at ``index`` (repeated indices add up); adjoint of GetItem."""

    save_inputs = ()

    def __init__(self, index, shape):
        self.index, self.shape = index, shape

    def forward(self, gy):
        xp = backend.array_module(gy)
        out = xp.zeros(self.shape, dtype=gy.dtype)
        if _is_basic_index(self.index):
            out[self.index] = gy  # basic indices never repeat an element
        elif xp is np:
            np.add.at(out, self.index, gy)
        else:
            import cupyx

            cupyx.scatter_add(out, self.index, gy)
        return out

    def backward(self, ggx):
        return GetItem(self.index)(ggx)


class Concatenate(Function):
    save_inputs = ()

    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        return backend.array_module(xs[0]).concatenate(xs, axis=self.axis)

    def backward(self, gy):
        grads, start = [], 0
        for x, need in zip(self.inputs, self.needs_grad):
            stop = start + x.shape[self.axis]
            if need:
                index = (slice(None),) * self.axis + (slice(start, stop),)
                grads.append(GetItem(index)(gy))
            else:
                grads.append(None)
            start = stop
        return tuple(grads)


class Pad(Function):
    """Zero padding by ((before, after), ...) per axis; the backward crops."""

    save_inputs = ()

    def __init__(self, widths):
        self.widths = widths

    def forward(self, x):
        return backend.array_module(x).pad(x, self.widths)

    def backward(self, gy):
        index = tuple(slice(lo, n - hi) for (lo, hi), n in zip(self.widths, gy.shape))
        return GetItem(index)(gy)


class Cast(Function):
    save_inputs = ()

    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        return x.astype(self.dtype)

    def backward(self, gy):
        return Cast(self.inputs[0].dtype)(gy)


class Copy(Function):
    """A fresh copy of the array; the gradient passes through unchanged."""

    save_inputs = ()

    def forward(self, x):
        return x.copy()

    def backward(self, gy):
        return gy


class ToDevice(Function):
    save_inputs = ()

    def __init__(self, device):
        # "cuda:N", not "cuda": forward runs with the input's GPU current, where "cuda" means that GPU
        self.target = backend.absolute_device(device)

    def forward(self, x):
        return backend.to_device(x, self.target)

    def backward(self, gy):
        return ToDevice(self.inputs[0].device)(gy)


def reshape(x, shape) -> Tensor:
    """``x`` with a new shape of the same size (one entry may be -1)."""
    x = as_tensor(x)
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(int(n) for n in shape)
    if shape == x.shape:
        return x
    known = math.prod(n for n in shape if n != -1)
    if shape.count(-1) > 1 or (-1 not in shape and known != x.size) or (
        -1 in shape and (known == 0 or x.size % known)
    ):
        raise ShapeError(f"reshape: cannot reshape a tensor of shape {x.shape} (size {x.size}) to {shape}")
    return Reshape(shape)(x)


def flatten(x, start_axis: int = 0) -> Tensor:
    """Merge axes ``start_axis``.. into one: (A, B, C, D) with start_axis=1 gives (A, B*C*D)."""
    x = as_tensor(x)
    start = normalize_axes(start_axis, x.ndim, "flatten")[0]
    return reshape(x, x.shape[:start] + (math.prod(x.shape[start:]),))


def transpose(x, axes=None) -> Tensor:
    """Permute the axes (default: reverse them), as ``numpy.transpose``; a view-sized copy-free op."""
    x = as_tensor(x)
    if axes is None:
        axes = tuple(reversed(range(x.ndim)))
    axes = tuple(a % x.ndim if x.ndim else a for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ShapeError(f"transpose: axes {axes} are not a permutation of {x.ndim} dimensions (shape {x.shape})")
    if axes == tuple(range(x.ndim)):
        return x
    return Transpose(axes)(x)


def permute(x, axes) -> Tensor:
    """Reorder axes: output axis i is input axis ``axes[i]``."""
    return transpose(x, tuple(axes))


def swapaxes(x, axis1: int, axis2: int) -> Tensor:
    """Exchange two axes."""
    x = as_tensor(x)
    axes = list(range(x.ndim))
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
    return transpose(x, tuple(axes))


def expand_dims(x, axis: int) -> Tensor:
    """Insert a size-1 axis at position ``axis`` (negative counts from the new end)."""
    x = as_tensor(x)
    ndim = x.ndim + 1
    if not -ndim <= axis < ndim:
        raise ShapeError(f"expand_dims: axis {axis} out of range for shape {x.shape}")
    axis %= ndim
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


def squeeze(x, axis=None) -> Tensor:
    """Remove size-1 axes (all of them, or those in ``axis``; a named axis must have size 1)."""
    x = as_tensor(x)
    axes = normalize_axes(axis, x.ndim, "squeeze")
    if axes is None:
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"squeeze: axis {a} of shape {x.shape} has size {x.shape[a]}, not 1")
    return reshape(x, tuple(n for i, n in enumerate(x.shape) if i not in axes))


def getitem(x, index) -> Tensor:
    """``x[index]`` for basic slices, ints, None, Ellipsis, and integer or boolean arrays.

    The gradient scatters back with addition, so repeated integer indices accumulate.
    """
    x = as_tensor(x)
    return GetItem(_normalize_index(index, x.data))(x)


def concatenate(tensors, axis: int = 0) -> Tensor:
    """Join tensors along an existing ``axis``; all other axes must agree."""
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concatenate: needs at least one tensor")
    first = tensors[0]
    axis = normalize_axes(axis, first.ndim, "concatenate")[0]
    for t in tensors[1:]:
        if t.ndim != first.ndim or t.shape[:axis] + t.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:]:
            shapes = ", ".join(str(u.shape) for u in tensors)
            raise ShapeError(f"concatenate: shapes {shapes} differ outside axis {axis}")
    return Concatenate(axis)(*tensors)


def stack(tensors, axis: int = 0) -> Tensor:
    """Join same-shaped tensors along a new ``axis``."""
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ShapeError(f"stack: shapes differ: {', '.join(str(t.shape) for t in tensors)}")
    return concatenate([expand_dims(t, axis) for t in tensors], axis=axis % (tensors[0].ndim + 1))


def pad(x, pad_width) -> Tensor:
    """Zero-pad: ``pad_width`` is an int, a (before, after) pair for every axis, or one pair per axis."""
    x = as_tensor(x)
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (x.ndim, 2)) if x.ndim else np.zeros((0, 2), np.int64)
    if (widths < 0).any():
        raise ShapeError(f"pad: negative widths {pad_width}")
    return Pad(tuple((int(a), int(b)) for a, b in widths))(x)


def cast(x, dtype) -> Tensor:
    """``x`` converted to ``dtype``; the gradient is cast back."""
    x = as_tensor(x)
    dtype = np.dtype(dtype)
    return x if dtype == x.dtype else Cast(dtype)(x)


def to_device(x, device) -> Tensor:
    """``x`` moved to ``device`` ("cpu" or "cuda"); the gradient moves back."""
    x = as_tensor(x)
    device = backend.normalize_device(device)
    return x if device == x.device else ToDevice(device)(x)


def copy(x) -> Tensor:
    """A differentiable copy of ``x`` with its own array (same shape, dtype and device)."""
    return Copy()(as_tensor(x))
