"""The capsule contractions as engine ops: values against einsum, gradients of first and second
order against central differences, and clear shape errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, check_both

sizes = st.integers(1, 3)


@st.composite
def capsule_shapes(draw):
    return tuple(draw(sizes) for _ in range(5))  # B, I, J, D, K


@given(shape=capsule_shapes(), data=st.data())
def test_capsule_predict(shape, data):
    b, i, j, d, k = shape
    u, w = data.draw(arrays((b, i, k))), data.draw(arrays((i, j, d, k)))
    np.testing.assert_allclose(F.capsule_predict(tc.tensor(u), tc.tensor(w)).numpy(), np.einsum("ijdk,bik->bijd", w, u), rtol=1e-12, atol=1e-14)
    check_both(F.capsule_predict, [u, w])
    check_both(lambda s, t: F.capsule_predict(s, t) ** 2, [u, w])  # exercises the adjoints' own backward


@given(shape=capsule_shapes(), data=st.data())
def test_routing_weighted_sum(shape, data):
    b, i, j, d, _ = shape
    c, u_hat = data.draw(arrays((b, i, j))), data.draw(arrays((b, i, j, d)))
    np.testing.assert_allclose(F.routing_weighted_sum(tc.tensor(c), tc.tensor(u_hat)).numpy(), np.einsum("bij,bijd->bjd", c, u_hat), rtol=1e-12, atol=1e-14)
    check_both(lambda s, t: F.routing_weighted_sum(s, t) ** 2, [c, u_hat])


@given(shape=capsule_shapes(), data=st.data())
def test_routing_agreement(shape, data):
    b, i, j, d, _ = shape
    u_hat, v = data.draw(arrays((b, i, j, d))), data.draw(arrays((b, j, d)))
    np.testing.assert_allclose(F.routing_agreement(tc.tensor(u_hat), tc.tensor(v)).numpy(), np.einsum("bijd,bjd->bij", u_hat, v), rtol=1e-12, atol=1e-14)
    check_both(lambda s, t: F.routing_agreement(s, t) ** 2, [u_hat, v])


def test_a_full_routing_pass_has_correct_first_and_second_derivatives():
    rng = np.random.default_rng(0)
    u, w = rng.standard_normal((2, 4, 3)), rng.standard_normal((4, 3, 2, 3)) * 0.5

    def routing(u_t, w_t):
        u_hat = F.capsule_predict(u_t, w_t)
        b = tc.tensor(np.zeros((2, 4, 3)))
        for r in range(3):
            v = F.squash(F.routing_weighted_sum(F.softmax(b, axis=2), u_hat))
            if r < 2:
                b = b + F.routing_agreement(u_hat, v)
        return v

    check_both(routing, [u, w], max_elementwise=80)


@pytest.mark.parametrize("call", [
    lambda: F.capsule_predict(np.zeros((2, 3, 4)), np.zeros((3, 2, 2, 5))),
    lambda: F.capsule_predict(np.zeros((2, 3, 4)), np.zeros((4, 2, 2, 4))),
    lambda: F.routing_weighted_sum(np.zeros((2, 3, 4)), np.zeros((2, 3, 5, 6))),
    lambda: F.routing_agreement(np.zeros((2, 3, 4, 5)), np.zeros((2, 4, 6))),
])
def test_capsule_ops_reject_bad_shapes(call):
    with pytest.raises(ValueError, match=r"(capsule_predict|routing_weighted_sum|routing_agreement): incompatible shapes"):
        call()
