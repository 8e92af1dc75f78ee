"""The edges a backward passes gradients along, as the walk, anomaly mode and post-accumulate hooks
see them: only inputs that need a gradient, a gradient of the wrong shape refused by name, and a
hooked leaf finished once its last edge is done."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.autograd import Function


class ReturnsGradients(Function):
    """y = a + b (forward), whose backward returns ``make(gy)`` for each input as given."""

    def __init__(self, make_a, make_b):
        self.make_a, self.make_b = make_a, make_b

    def forward(self, a, b):
        return a + b

    def backward(self, gy):
        return self.make_a(gy), self.make_b(gy)


def test_a_gradient_of_the_wrong_shape_is_refused_naming_the_op_and_shapes():
    a = tc.tensor(np.ones((2, 3)), requires_grad=True)
    b = tc.tensor(np.ones((2, 3)), requires_grad=True)
    y = ReturnsGradients(lambda g: g, lambda g: tc.tensor(np.ones((3, 2))))(a, b)
    with pytest.raises(tc.GraphError, match=r"ReturnsGradients.backward returned a gradient of shape \(3, 2\) "
                                            r"for an input of shape \(2, 3\)"):
        y.sum().backward()


def test_anomaly_mode_leaves_a_misshapen_gradient_to_the_walk():
    a = tc.tensor(np.ones((2, 3)), requires_grad=True)
    b = tc.tensor(np.ones((2, 3)), requires_grad=True)
    with tc.detect_anomaly():
        y = ReturnsGradients(lambda g: g, lambda g: tc.tensor(np.full((3, 2), np.nan)))(a, b)
        with pytest.raises(tc.GraphError, match=r"shape \(3, 2\) for an input of shape \(2, 3\)"):
            y.sum().backward()


def test_anomaly_mode_checks_only_the_gradients_passed_on():
    a = tc.tensor(np.ones(3), requires_grad=True)
    b = tc.tensor(np.ones(3))  # needs no gradient: a NaN returned for it goes nowhere
    with tc.detect_anomaly():
        y = ReturnsGradients(lambda g: g * 2.0, lambda g: tc.tensor(np.full(3, np.nan)))(a, b)
        y.sum().backward()
        np.testing.assert_array_equal(a.grad.numpy(), [2.0, 2.0, 2.0])
        c = tc.tensor(np.ones(3), requires_grad=True)
        z = ReturnsGradients(lambda g: g, lambda g: tc.tensor(np.full(3, np.nan)))(a, c)
        with pytest.raises(tc.AnomalyError, match="ReturnsGradients"):
            z.sum().backward()


def test_a_leaf_on_several_edges_is_finished_once_its_last_edge_is_done():
    w = tc.tensor(np.full(3, 2.0), requires_grad=True)
    x = tc.tensor(np.ones(3), requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append((p.grad.numpy().copy(), x.grad)))
    h = x * 3.0              # runs last in backward: x's gradient comes after w is finished
    y = (w * w) * h + w      # w: twice from one node, once from another
    y.sum().backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0][0], 2 * 2.0 * 3.0 + 1.0)
    assert seen[0][1] is None
    np.testing.assert_allclose(x.grad.numpy(), 4.0 * 3.0)


def test_a_hooked_leaf_that_no_gradient_reaches_is_not_finished():
    a = tc.tensor(np.ones(3), requires_grad=True)
    b = tc.tensor(np.ones(3), requires_grad=True)
    calls = []
    b.register_post_accumulate_grad_hook(calls.append)
    ReturnsGradients(lambda g: g, lambda g: None)(a, b).sum().backward()
    assert calls == [] and b.grad is None
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 1.0, 1.0])
