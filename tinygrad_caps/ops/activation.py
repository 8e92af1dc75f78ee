"""Activations: relu, leaky_relu, sigmoid, tanh, softmax, log_softmax, and the capsule squash."""
from __future__ import annotations

import numpy as np

from ..autograd.function import Function
from ..autograd.grad_mode import is_grad_enabled
from ..backend import array_module
from ..kernels import activation as activation_kernels
from ..kernels import launch as kernel_launch
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
        runner = _row_kernel_runner(x, self.axis)
        if runner is not None:
            return activation_kernels.softmax_rows(x, runner=runner)
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
            runner = _row_kernel_runner(y.data, self.axis)
            if runner is not None and gy.dtype == y.dtype:
                return Tensor._wrap(activation_kernels.softmax_rows_grad(y.data, gy.data, runner=runner))
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


def _row_kernel_runner(x, axis):
    """The kernel runner for a row-wise activation of ``x`` over ``axis``, or None: the kernels take
    float32/float64 rows along the last axis (the engine's array formulas serve the rest)."""
    if x.ndim == 0 or axis % x.ndim != x.ndim - 1 or not kernel_launch.has_kernels_for(x.dtype):
        return None
    return kernel_launch.kernel_runner_for(x)


class Squash(Function):
    """v = s f(|s|^2) along ``axis``, f(q) = q / ((1 + q) sqrt(q + eps)).

    Its adjoint, dL/ds = g f + 2 s f'(|s|^2) (g . s) with f'(q) = h (1 - q/(1+q) - q/(2(q+eps)))
    and h = 1 / ((1+q) sqrt(q+eps)), runs as one kernel (or a few array ops) when nothing is
    recorded, and as differentiable ops under ``create_graph``."""

    save_inputs = (0,)

    def __init__(self, axis, eps):
        self.axis, self.eps = axis, eps

    def forward(self, s):
        runner = _row_kernel_runner(s, self.axis)
        if runner is not None:
            return activation_kernels.squash_rows(s, self.eps, runner=runner)
        xp = array_module(s)
        norm2 = sum_array(s * s, (self.axis,), True)
        return s * (norm2 / (1 + norm2) / xp.sqrt(norm2 + self.eps))

    def backward(self, g):
        s = self.inputs[0]
        if not is_grad_enabled():
            runner = _row_kernel_runner(s.data, self.axis)
            if runner is not None and g.dtype == s.dtype:
                return Tensor._wrap(activation_kernels.squash_rows_grad(s.data, g.data, self.eps, runner=runner))
            return Tensor._wrap(self._adjoint(array_module(s.data), s.data, g.data, lambda a: sum_array(a, (self.axis,), True)))
        from .elementwise import sqrt
        return self._adjoint(None, s, g, lambda a: reduce_sum(a, self.axis, keepdims=True), sqrt)

    def _adjoint(self, xp, s, g, row_sum, sqrt=None):
        """g f + 2 s f' (g . s) on arrays (xp) or on Tensors (differentiable: sqrt given)."""
        sqrt = sqrt or xp.sqrt
        norm2 = row_sum(s * s)
        h = 1 / ((1 + norm2) * sqrt(norm2 + self.eps))
        slope = h * (1 - norm2 / (1 + norm2) - norm2 / (2 * (norm2 + self.eps)))
        return g * (norm2 * h) + s * (2 * slope * row_sum(g * s))


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

    ``eps`` keeps the gradient finite at s = 0. One node of the graph (one kernel launch each way
    on the GPU); its adjoint is written out in ``Squash``, and under ``create_graph`` that adjoint
    is built from differentiable ops, so second derivatives are derived by the engine.
    """
    s = as_tensor(s)
    return Squash(_one_axis(s, axis, "squash"), eps)(s)
