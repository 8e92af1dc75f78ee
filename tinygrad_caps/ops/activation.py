"""Activations: relu, leaky_relu, sigmoid, tanh, softmax, log_softmax, and the capsule squash."""
from __future__ import annotations

import numpy as np

from ..autograd import Function, is_grad_enabled
from ..backend import array_module
from ..tensor import Tensor, as_tensor
from .. import _parallel as parallel
from ._common import constant, max_array, normalize_axes, sum_array
from .reduce import sum as reduce_sum


class ReLU(Function):
    save_inputs = ()  # a boolean mask (1 byte an element) instead of the input

    def forward(self, x):
        xp = array_module(x)
        if xp is np:  # large maps (conv1's) are split over cores; the layout of x is kept
            return parallel.binary(np.maximum, x, np.zeros((), dtype=x.dtype))
        return xp.maximum(x, 0)

    def keep_for_backward(self, arrays, y):
        x = arrays[0]
        if type(x) is np.ndarray:
            self.positive = parallel.binary(np.greater, x, np.zeros((), dtype=x.dtype))
        else:
            self.positive = x > 0

    def backward(self, gy):
        return gy * constant(self.positive)  # float times bool keeps gy's dtype


class LeakyReLU(Function):
    save_inputs = (0,)

    def __init__(self, slope):
        self.slope = slope

    def forward(self, x):
        return array_module(x).where(x > 0, x, x * self.slope)

    def backward(self, gy):
        x = self.inputs[0].data
        return gy * constant(array_module(x).where(x > 0, 1, self.slope).astype(gy.dtype))


class Sigmoid(Function):
    save_inputs, save_output = (), True

    def forward(self, x):
        xp = array_module(x)
        return (xp.tanh(x * 0.5) + 1) * 0.5  # no overflow for large |x|

    def backward(self, gy):
        y = self.output()
        return gy * y * (1 - y)


class Tanh(Function):
    save_inputs, save_output = (), True

    def forward(self, x):
        return array_module(x).tanh(x)

    def backward(self, gy):
        y = self.output()
        return gy * (1 - y * y)


class Softmax(Function):
    save_inputs, save_output = (), True

    def __init__(self, axis):
        self.axis = axis

    def forward(self, x):
        return self._by_rows(self._softmax, x)

    def _by_rows(self, fn, *arrays):
        """``fn(*arrays)``; on NumPy, slices along axis 0 (independent rows when the softmax runs
        over another axis, as routing's coupling (B, I, J) does) go to the cores in parallel."""
        x = arrays[0]
        if type(x) is not np.ndarray or x.dtype.kind != "f" or x.ndim < 2 or self.axis % x.ndim == 0:
            return fn(*arrays)  # (an integer input gets a float softmax: no result of x's dtype)
        out = np.empty_like(x)

        def run(start, stop):
            out[start:stop] = fn(*(a[start:stop] for a in arrays))

        parallel.over_slices(x.shape[0], run, x.nbytes * 4)
        return out

    def _softmax(self, x):
        xp = array_module(x)
        e = xp.exp(x - max_array(x, (self.axis,), True))
        e /= sum_array(e, (self.axis,), True)
        return e

    def _softmax_vjp(self, y, gy):
        return y * (gy - sum_array(gy * y, (self.axis,), True))

    def backward(self, gy):
        y = self.output()
        if not is_grad_enabled():  # nothing is recorded: the same formula on the arrays, rows in parallel
            return Tensor._wrap(self._by_rows(self._softmax_vjp, y.data, gy.data))
        return y * (gy - reduce_sum(gy * y, self.axis, keepdims=True))


class LogSoftmax(Function):
    save_inputs, save_output = (), True

    def __init__(self, axis):
        self.axis = axis

    def forward(self, x):
        xp = array_module(x)
        shifted = x - max_array(x, (self.axis,), True)
        return shifted - xp.log(sum_array(xp.exp(shifted), (self.axis,), True))

    def backward(self, gy):
        from .elementwise import exp

        return gy - exp(self.output()) * reduce_sum(gy, self.axis, keepdims=True)


def relu(x) -> Tensor:
    """max(x, 0), same shape; gradient 0 at 0."""
    return ReLU()(as_tensor(x))


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x; same shape."""
    return LeakyReLU(negative_slope)(as_tensor(x))


def sigmoid(x) -> Tensor:
    """1 / (1 + exp(-x)), same shape, computed without overflow."""
    return Sigmoid()(as_tensor(x))


def tanh(x) -> Tensor:
    """Hyperbolic tangent, same shape."""
    return Tanh()(as_tensor(x))


def _one_axis(x, axis, op):
    return normalize_axes(axis, x.ndim, op)[0]


def softmax(x, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (stable: the max is subtracted first); same shape."""
    x = as_tensor(x)
    return Softmax(_one_axis(x, axis, "softmax"))(x)


def log_softmax(x, axis: int = -1) -> Tensor:
    """log(softmax(x, axis)) computed stably; same shape."""
    x = as_tensor(x)
    return LogSoftmax(_one_axis(x, axis, "log_softmax"))(x)


def squash(s, axis: int = -1, eps: float = 1e-8) -> Tensor:
    """The capsule nonlinearity ``|s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps)`` along ``axis``; same shape.

    ``eps`` keeps the gradient finite at s = 0. Written from primitives, so its gradient (and
    second derivative) is derived by the engine.
    """
    s = as_tensor(s)
    axis = _one_axis(s, axis, "squash")
    squared_norm = reduce_sum(s * s, axis, keepdims=True)
    from .elementwise import sqrt

    scale = squared_norm / (1 + squared_norm) / sqrt(squared_norm + eps)
    return s * scale
