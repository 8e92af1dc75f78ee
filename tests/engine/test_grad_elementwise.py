"""Gradient property tests (first and second order, float64 central differences) for elementwise ops."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import tinygrad_caps.functional as F
from helpers import arrays, away_from_zero, check_both, floats, on_grid, shapes

BINARY = {
    "add": (F.add, floats(), floats()),
    "sub": (F.sub, floats(), floats()),
    "mul": (F.mul, floats(), floats()),
    "div": (F.div, floats(), away_from_zero(0.5, 2.0)),
    "pow": (F.pow, floats(0.5, 2.0), floats(-2.0, 2.0)),
    "maximum": (F.maximum, on_grid(0.05), on_grid(0.0)),
    "minimum": (F.minimum, on_grid(0.05), on_grid(0.0)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_op_gradients_with_broadcasting(name, data):
    op, left, right = BINARY[name]
    shape_a, shape_b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=0, max_side=3)).input_shapes
    a = data.draw(arrays(shape_a, left))
    b = data.draw(arrays(shape_b, right))
    check_both(op, [a, b])


UNARY = {
    "neg": (F.neg, floats()),
    "exp": (F.exp, floats()),
    "log": (F.log, floats(0.2, 3.0)),
    "sqrt": (F.sqrt, floats(0.2, 3.0)),
    "abs": (F.abs, away_from_zero()),
    "relu": (F.relu, away_from_zero()),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), away_from_zero()),
    "sigmoid": (F.sigmoid, floats(-4.0, 4.0)),
    "tanh": (F.tanh, floats(-3.0, 3.0)),
    "clip": (lambda x: F.clip(x, -1.0, 1.0), st.one_of(floats(-2, -1.1), floats(-0.9, 0.9), floats(1.1, 2))),
    "clip_low_only": (lambda x: F.clip(x, 0.0, None), away_from_zero()),
    "square": (lambda x: x ** 2, floats()),
    "cube": (lambda x: x ** 3, floats()),
    "pow_half": (lambda x: x ** 0.5, floats(0.3, 3.0)),
    "pow_negative": (lambda x: x ** -1.5, floats(0.3, 3.0)),
    "rpow": (lambda x: 2.0 ** x, floats()),
    "scalar_arith": (lambda x: (3.0 - x) / 2.0 + 1.0 / (x * x + 1.0), floats()),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_op_gradients(name, data):
    op, elements = UNARY[name]
    x = data.draw(arrays(data.draw(shapes(min_side=0)), elements))
    check_both(op, [x])


@given(data=st.data())
def test_where_gradients(data):
    shape_c, shape_a, shape_b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3)).input_shapes
    cond = data.draw(hnp.arrays(bool, shape_c))
    a, b = data.draw(arrays(shape_a)), data.draw(arrays(shape_b))
    check_both(lambda x, y: F.where(cond, x, y), [a, b])


def test_maximum_splits_gradient_on_ties():
    import tinygrad_caps as tc

    a = tc.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = tc.tensor(np.array([1.0, 5.0, 0.0]), requires_grad=True)
    F.maximum(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(b.grad.numpy(), [0.5, 1.0, 0.0])
