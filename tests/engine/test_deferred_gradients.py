"""Deferred gradients (autograd.DeferredGradient): routing's u_hat gradients wait as small factors
and are built in one pass; every gradient equals the one of the plain products (to rounding)."""
import contextlib

import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps import _parallel
from tinygrad_caps.autograd import DeferredGradient
from tinygrad_caps.ops import capsule
from tinygrad_caps.ops.capsule import OuterProducts, outer_products_array
from tinygrad_caps.models.capsnet.routing import dynamic_routing


def _routing_grads(monkeypatch, deferred, *, hook=False, retain=False, anomaly=False, profile=False):
    if not deferred:
        monkeypatch.setattr(capsule, "outer_product_gradient", lambda p, q: F.expand_dims(p, -1) * F.expand_dims(q, 1))
    rng = np.random.default_rng(0)
    u = tc.tensor(rng.standard_normal((3, 12, 4)), requires_grad=True)
    W = tc.tensor(rng.standard_normal((12, 5, 6, 4)) * 0.3, requires_grad=True)
    seen = []
    u_hat = F.capsule_predict(u, W)
    if retain:
        u_hat.retain_grad()
    if hook:
        u_hat.register_hook(lambda g: seen.append(g.numpy().copy()))
    v = dynamic_routing(u_hat, 3)
    upstream = tc.tensor(rng.standard_normal(v.shape))
    with tc.detect_anomaly() if anomaly else contextlib.nullcontext(), tc.profile() if profile else contextlib.nullcontext():
        v.backward(upstream)
    extra = [u_hat.grad.numpy()] if retain else []
    return [u.grad.numpy(), W.grad.numpy()] + extra + seen


@pytest.mark.parametrize("options", [{}, {"hook": True}, {"retain": True}, {"anomaly": True}, {"profile": True}])
def test_deferred_routing_gradients_equal_the_plain_products(monkeypatch, options):
    deferred = _routing_grads(monkeypatch, True, **options)
    monkeypatch.undo()
    plain = _routing_grads(monkeypatch, False, **options)
    assert len(deferred) == len(plain)
    for a, b in zip(deferred, plain):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_routing_backward_hands_over_deferred_products_only_when_nothing_is_recorded():
    rng = np.random.default_rng(1)
    c = tc.tensor(rng.random((2, 7, 3)), requires_grad=True)
    u_hat = tc.tensor(rng.standard_normal((2, 7, 3, 4)), requires_grad=True)
    s = F.routing_weighted_sum(c, u_hat)
    node, gs = s.creator, tc.tensor(rng.standard_normal(s.shape))
    with tc.no_grad():
        _, gu = node.backward(gs)
    assert isinstance(gu, DeferredGradient) and gu.shape == u_hat.shape and len(gu.terms) == 1
    np.testing.assert_array_equal(gu.materialize().numpy(), c.numpy()[..., None] * gs.numpy()[:, None])
    _, gu_recorded = node.backward(gs)  # grad mode on (create_graph): a recorded Tensor
    assert isinstance(gu_recorded, tc.Tensor) and gu_recorded.shape == u_hat.shape


def test_second_derivatives_through_routing_do_not_use_deferred_products():
    rng = np.random.default_rng(2)
    u_hat = tc.tensor(rng.standard_normal((2, 6, 3, 4)), requires_grad=True)
    (g,) = tc.grad(F.sum(dynamic_routing(u_hat, 2) ** 2), [u_hat], create_graph=True)
    (h,) = tc.grad(F.sum(g * g), [u_hat])
    assert isinstance(g, tc.Tensor) and np.all(np.isfinite(h.numpy()))


def test_outer_products_merge_and_build_their_sum(monkeypatch):
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "2")
    monkeypatch.setattr(_parallel, "MIN_BYTES_PER_THREAD", 1)
    rng = np.random.default_rng(3)
    pairs = [(rng.standard_normal((5, 7, 3)).astype(np.float32), rng.standard_normal((5, 3, 4)).astype(np.float32))
             for _ in range(4)]
    one = OuterProducts(pairs[:1])
    assert one.shape == (5, 7, 3, 4) and one.dtype == np.float32
    p, q = pairs[0]
    assert np.array_equal(one.materialize().numpy(), p[..., None] * q[:, None])  # one term: the product itself
    total = one
    for pair in pairs[1:]:
        total = total.merge(OuterProducts([pair]))
    assert len(total.terms) == 4
    expected = sum(p[..., None].astype(np.float64) * q[:, None] for p, q in pairs)
    np.testing.assert_allclose(total.materialize().numpy(), expected, rtol=1e-5, atol=1e-5)
    assert one.merge(OuterProducts([(p[:4], q[:4])])) is None  # another shape does not combine
    array = np.ones((5, 7, 3, 4), np.float32)
    one.add_to(array)
    assert np.array_equal(array, 1 + p[..., None] * q[:, None])
    non_finite = [(np.full((1, 2, 2), np.inf), np.ones((1, 2, 3))), (np.ones((1, 2, 2)), np.full((1, 2, 3), np.nan))]
    with np.errstate(invalid="ignore"):
        assert np.isnan(outer_products_array(non_finite)).all()  # non-finite values propagate as in the sum


def test_the_profile_shows_the_walks_gradient_sums():
    rng = np.random.default_rng(4)
    u_hat = tc.tensor(rng.standard_normal((2, 6, 3, 4)), requires_grad=True)
    with tc.profile() as prof:
        F.sum(dynamic_routing(u_hat, 3)).backward()
    sums = prof.totals()["(gradient sums)"]
    # five paths into u_hat: four merges and one build, at least; the build makes one u_hat-sized array
    assert sums["calls"] >= 5 and sums["backward_s"] > 0 and sums["bytes"] >= u_hat.data.nbytes
    x = tc.tensor(rng.standard_normal(3), requires_grad=True)
    with tc.profile() as prof:
        F.sum(x * 2).backward()  # one path everywhere: nothing is summed
    assert "(gradient sums)" not in prof.totals()


def test_deferred_gradients_are_built_before_a_hook_can_update_their_factors():
    rng = np.random.default_rng(5)
    c = tc.tensor(rng.random((2, 5, 3)), requires_grad=True)
    u_hat = tc.tensor(rng.standard_normal((2, 5, 3, 4)), requires_grad=True)
    original = c.numpy().copy()
    c.register_post_accumulate_grad_hook(lambda t: t.data.__imul__(0.0))  # an optimizer step in backward
    F.sum(F.routing_weighted_sum(c, u_hat)).backward()
    np.testing.assert_array_equal(u_hat.grad.numpy(), np.broadcast_to(original[..., None], u_hat.shape))
