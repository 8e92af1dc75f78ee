"""dynamic_routing against an independent NumPy Procedure 1 (tests/oracles/reference_routing.py): the output
capsules, every iteration's coupling coefficients and the gradient, for 1, 3 and 5 iterations and
both gradient modes. Runs without PyTorch."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps as tc
from reference_routing import route, route_bias_gradient, route_gradient
from tinygrad_caps.models import dynamic_routing
from tinygrad_caps.models.capsnet.routing import uniform_routing


def routed(u_hat, iterations, gradient, cotangent):
    """Our v, couplings and d sum(cotangent * v) / d u_hat."""
    u = tc.tensor(u_hat, requires_grad=True)
    v, couplings = dynamic_routing(u, iterations, gradient, return_coupling=True)
    (v * tc.tensor(cotangent)).sum().backward()
    return v.numpy(), [c.numpy() for c in couplings], u.grad.numpy()


@pytest.mark.parametrize("gradient", ["full", "detach"])
@pytest.mark.parametrize("iterations", [1, 3, 5])
def test_routing_equals_numpy_procedure_1(iterations, gradient):
    rng = np.random.default_rng(10 * iterations + (gradient == "detach"))
    u_hat = rng.standard_normal((2, 5, 3, 4)) * 0.8  # agreements of order 1: routing moves c well away from uniform
    cotangent = rng.standard_normal((2, 3, 4))
    v, couplings, grad = routed(u_hat, iterations, gradient, cotangent)
    ref_v, ref_couplings = route(u_hat, iterations)
    np.testing.assert_allclose(v, ref_v, rtol=1e-12, atol=1e-14)
    assert len(couplings) == iterations
    for ours, ref in zip(couplings, ref_couplings):
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-14)
    if iterations > 1:
        assert np.abs(ref_couplings[-1] - 1 / 3).max() > 0.05, "the case must exercise routing"
    ref_grad = route_gradient(u_hat, iterations, gradient, cotangent)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-6, atol=1e-8)


def test_the_two_gradient_modes_differ_after_one_iteration():
    """Guards the reference itself: with 3 iterations "detach" must drop a nonzero part of the gradient."""
    rng = np.random.default_rng(3)
    u_hat, cotangent = rng.standard_normal((1, 4, 3, 2)), rng.standard_normal((1, 3, 2))
    full = route_gradient(u_hat, 3, "full", cotangent)
    detach = route_gradient(u_hat, 3, "detach", cotangent)
    assert np.abs(full - detach).max() > 1e-3
    np.testing.assert_allclose(route_gradient(u_hat, 1, "full", cotangent),
                               route_gradient(u_hat, 1, "detach", cotangent), rtol=1e-9)


@given(batch=st.integers(1, 2), inputs=st.integers(1, 4), outputs=st.integers(1, 4), dim=st.integers(1, 3),
       iterations=st.integers(1, 5), seed=st.integers(0, 2 ** 16))
def test_routing_forward_equals_numpy_for_any_shape(batch, inputs, outputs, dim, iterations, seed):
    u_hat = np.random.default_rng(seed).standard_normal((batch, inputs, outputs, dim))
    v, couplings = dynamic_routing(tc.tensor(u_hat), iterations, "full", return_coupling=True)
    ref_v, ref_couplings = route(u_hat, iterations)
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(couplings[-1].numpy(), ref_couplings[-1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("gradient", ["full", "detach"])
def test_routing_with_bias_and_leaky_routing_equals_numpy(gradient, leaky):
    rng = np.random.default_rng(7 + leaky)
    u_hat, cotangent = rng.standard_normal((2, 4, 3, 2)), rng.standard_normal((2, 3, 2))
    bias = rng.standard_normal((3, 2)) * 0.5
    u, beta = tc.tensor(u_hat, requires_grad=True), tc.tensor(bias, requires_grad=True)
    v, couplings = dynamic_routing(u, 3, gradient, return_coupling=True, leaky_routing=leaky, bias=beta)
    (v * tc.tensor(cotangent)).sum().backward()
    ref_v, ref_couplings = route(u_hat, 3, bias=bias, leaky=leaky)
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-12, atol=1e-14)
    for ours, ref in zip(couplings, ref_couplings):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-12, atol=1e-14)
    rows = ref_couplings[-1].sum(axis=2)
    assert (rows < 1 - 1e-3).all() if leaky else np.allclose(rows, 1.0)
    np.testing.assert_allclose(u.grad.numpy(), route_gradient(u_hat, 3, gradient, cotangent, bias, leaky),
                               rtol=1e-6, atol=1e-8)
    if gradient == "full":
        np.testing.assert_allclose(beta.grad.numpy(), route_bias_gradient(u_hat, 3, bias, cotangent, leaky),
                                   rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("leaky", [False, True])
def test_uniform_routing_is_one_iteration_from_zero_logits(leaky):
    rng = np.random.default_rng(11)
    u_hat, bias = rng.standard_normal((2, 4, 3, 2)), rng.standard_normal((3, 2))
    v, couplings = uniform_routing(tc.tensor(u_hat), tc.tensor(bias), return_coupling=True, leaky_routing=leaky)
    ref_v, ref_couplings = route(u_hat, 1, bias=bias, leaky=leaky)
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(couplings[0].numpy(), ref_couplings[0], rtol=1e-14)
    assert couplings[0].numpy()[0, 0, 0] == (1 / 4 if leaky else 1 / 3)


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 2, 3, 4, 5)])
def test_routing_rejects_u_hat_that_is_not_four_dimensional(shape):
    with pytest.raises(ValueError, match="^dynamic_routing: "):
        dynamic_routing(tc.tensor(np.zeros(shape)))
    with pytest.raises(ValueError, match="^uniform_routing: "):
        uniform_routing(tc.tensor(np.zeros(shape)))
