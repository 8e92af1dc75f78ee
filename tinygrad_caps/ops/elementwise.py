"""Elementwise arithmetic with NumPy broadcasting: add, sub, mul, div, neg, pow, exp, log, sqrt,
abs, maximum, minimum, clip, where. Each backward undoes broadcasting with ``sum_to``."""
from __future__ import annotations

import numbers

import numpy as np

from ..autograd.function import Function
from ..backend import array_module
from ..tensor import Tensor, as_tensor
from .. import _parallel as parallel
from ._common import Bilinear, constant, operands, sum_to


class Add(Function):
    save_inputs = ()

    def forward(self, a, b):
        return parallel.binary(np.add, a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy, a.shape) if self.needs_grad[0] else None
        return ga, sum_to(gy, b.shape) if self.needs_grad[1] else None


class Sub(Function):
    save_inputs = ()

    def forward(self, a, b):
        return parallel.binary(np.subtract, a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy, a.shape) if self.needs_grad[0] else None
        return ga, sum_to(-gy, b.shape) if self.needs_grad[1] else None


class Mul(Bilinear):
    def forward(self, a, b):
        return parallel.binary(np.multiply, a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy * b, a.shape) if self.needs_grad[0] else None
        gb = sum_to(gy * a, b.shape) if self.needs_grad[1] else None
        return ga, gb


class Div(Function):
    def inputs_to_save(self, needs_grad):
        return (0, 1) if needs_grad[1] else (1,)

    def forward(self, a, b):
        return parallel.binary(np.divide, a, b)

    def backward(self, gy):
        a, b = self.inputs
        g_over_b = gy / b
        ga = sum_to(g_over_b, a.shape) if self.needs_grad[0] else None
        gb = sum_to(-g_over_b * a / b, b.shape) if self.needs_grad[1] else None
        return ga, gb


class Neg(Function):
    save_inputs = ()

    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


class PowScalar(Function):
    """x ** c for a constant Python number c."""

    save_inputs = (0,)

    def __init__(self, exponent):
        self.exponent = exponent

    def forward(self, x):
        return x ** self.exponent

    def backward(self, gy):
        c = self.exponent
        if c == 0:
            return gy * 0
        if c == 1:
            return gy
        return gy * (c * pow(self.inputs[0], c - 1))


class Pow(Function):
    """a ** b for two tensors (broadcasting); d/db uses log(a), so a must be positive there."""

    save_output = True

    def forward(self, a, b):
        return a ** b

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy * b * a ** (b - 1), a.shape) if self.needs_grad[0] else None
        gb = sum_to(gy * self.output() * log(a), b.shape) if self.needs_grad[1] else None
        return ga, gb


class Exp(Function):
    save_inputs, save_output = (), True

    def forward(self, x):
        return array_module(x).exp(x)

    def backward(self, gy):
        return gy * self.output()


class Log(Function):
    save_inputs = (0,)

    def forward(self, x):
        return array_module(x).log(x)

    def backward(self, gy):
        return gy / self.inputs[0]


class Sqrt(Function):
    save_inputs, save_output = (), True

    def forward(self, x):
        return array_module(x).sqrt(x)

    def backward(self, gy):
        return gy / (2 * self.output())


class Abs(Function):
    save_inputs = (0,)

    def forward(self, x):
        return array_module(x).abs(x)

    def backward(self, gy):
        x = self.inputs[0].data
        return gy * constant(array_module(x).sign(x))


class Maximum(Function):
    """Elementwise max; where both are equal the gradient is split in half (as PyTorch does)."""

    save_inputs = ()

    def __init__(self, take_larger: bool = True):
        self.take_larger = take_larger

    def forward(self, a, b):
        xp = array_module(a)
        return xp.maximum(a, b) if self.take_larger else xp.minimum(a, b)

    def keep_for_backward(self, arrays, y):
        a, b = arrays
        self.weight_a = ((a > b) if self.take_larger else (a < b)) + 0.5 * (a == b)

    def backward(self, gy):
        a, b = self.inputs
        w = self.weight_a.astype(gy.dtype)
        ga = sum_to(gy * constant(w), a.shape) if self.needs_grad[0] else None
        gb = sum_to(gy * constant(1 - w), b.shape) if self.needs_grad[1] else None
        return ga, gb


class Clip(Function):
    """Clamp to [low, high] (either may be None); the gradient passes where low <= x <= high."""

    save_inputs = (0,)

    def __init__(self, low, high):
        self.low, self.high = low, high

    def forward(self, x):
        return array_module(x).clip(x, self.low, self.high)

    def backward(self, gy):
        x = self.inputs[0].data
        inside = array_module(x).ones(x.shape, dtype=bool)
        if self.low is not None:
            inside &= x >= self.low
        if self.high is not None:
            inside &= x <= self.high
        return gy * constant(inside.astype(gy.dtype))


class Where(Function):
    """``cond ? a : b`` with a constant boolean condition."""

    save_inputs = ()

    def __init__(self, condition):
        self.condition = condition

    def forward(self, a, b):
        return array_module(a).where(self.condition, a, b)

    def backward(self, gy):
        a, b = self.inputs
        zero = constant(array_module(gy.data).zeros((), dtype=gy.dtype))
        ga = sum_to(where(self.condition, gy, zero), a.shape) if self.needs_grad[0] else None
        gb = sum_to(where(self.condition, zero, gy), b.shape) if self.needs_grad[1] else None
        return ga, gb


def add(a, b) -> Tensor:
    """a + b with broadcasting; returns the broadcast shape."""
    return Add()(*operands(a, b))


def sub(a, b) -> Tensor:
    """a - b with broadcasting; returns the broadcast shape."""
    return Sub()(*operands(a, b))


def mul(a, b) -> Tensor:
    """a * b with broadcasting; returns the broadcast shape."""
    return Mul()(*operands(a, b))


def div(a, b) -> Tensor:
    """a / b with broadcasting; returns the broadcast shape."""
    return Div()(*operands(a, b))


def neg(x) -> Tensor:
    """-x, same shape."""
    return Neg()(as_tensor(x))


def pow(a, b) -> Tensor:  # noqa: A001  (the natural name)
    """a ** b. A Python-number exponent is a constant; a Tensor exponent is differentiated too."""
    if isinstance(a, Tensor) and isinstance(b, numbers.Number) and not isinstance(b, bool):
        return PowScalar(b)(a)
    return Pow()(*operands(a, b))


def exp(x) -> Tensor:
    """e ** x, same shape."""
    return Exp()(as_tensor(x))


def log(x) -> Tensor:
    """Natural logarithm, same shape."""
    return Log()(as_tensor(x))


def sqrt(x) -> Tensor:
    """Square root, same shape."""
    return Sqrt()(as_tensor(x))


def abs(x) -> Tensor:  # noqa: A001
    """|x|, same shape; the gradient at 0 is 0."""
    return Abs()(as_tensor(x))


def maximum(a, b) -> Tensor:
    """Elementwise max with broadcasting; ties split the gradient evenly."""
    return Maximum(True)(*operands(a, b))


def minimum(a, b) -> Tensor:
    """Elementwise min with broadcasting; ties split the gradient evenly."""
    return Maximum(False)(*operands(a, b))


def clip(x, low=None, high=None) -> Tensor:
    """x clamped to [low, high] (Python numbers; either may be None), same shape."""
    if low is None and high is None:
        raise ValueError("clip: give low, high or both")
    return Clip(low, high)(as_tensor(x))


def where(condition, a, b) -> Tensor:
    """Elementwise ``condition ? a : b`` with broadcasting; ``condition`` is a boolean array or Tensor."""
    a, b = operands(a, b)
    cond = condition.data if isinstance(condition, Tensor) else condition
    xp = a.xp
    cond = xp.asarray(cond, dtype=bool)
    return Where(cond)(a, b)
