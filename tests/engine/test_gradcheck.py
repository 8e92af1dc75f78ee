"""The gradient checker itself must fail on a wrong gradient, or every property test is hollow."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.autograd import Function
from tinygrad_caps.gradcheck import GradcheckError, check_double_grad, check_grad


class WrongSquare(Function):
    """x^2 with a gradient off by a factor 1.01."""

    def forward(self, x):
        return x * x

    def backward(self, gy):
        return gy * self.inputs[0] * 2.02


class RawSquare(Function):
    """x^2 whose backward is computed on raw arrays: right once, but not differentiable again."""

    def forward(self, x):
        return x * x

    def backward(self, gy):
        return tc.Tensor(gy.data * 2 * self.inputs[0].data)


def test_check_grad_reports_the_input_and_worst_element():
    x = np.array([1.0, 2.0, 3.0])
    with pytest.raises(GradcheckError, match=r"input 0 \(shape \(3,\)\) at element \(2,\)"):
        check_grad(lambda t: WrongSquare()(t), [x])


def test_check_grad_along_random_directions_for_large_inputs():
    x = np.random.default_rng(0).standard_normal(500)
    assert check_grad(lambda t: t * t, [x])
    with pytest.raises(GradcheckError, match="random direction"):
        check_grad(lambda t: WrongSquare()(t), [x])


def test_check_double_grad_catches_a_non_differentiable_backward():
    x = np.array([1.0, 2.0])
    assert check_grad(lambda t: RawSquare()(t), [x])
    with pytest.raises(GradcheckError):
        check_double_grad(lambda t: RawSquare()(t) * t, [x])
    assert check_double_grad(lambda t: t * t * t, [x])
