"""Deferred gradients (autograd.DeferredGradient): routing's broadcast products are summed into the
walk's buffer without being built, and every gradient is exactly the one of the plain product."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps import _parallel
from tinygrad_caps.autograd import DeferredGradient
from tinygrad_caps.ops import capsule
from tinygrad_caps.ops._common import BroadcastProduct
from tinygrad_caps.models.routing import dynamic_routing


def _routing_grads(monkeypatch, deferred, *, hook=False, retain=False, anomaly=False, profile=False):
    if not deferred:
        monkeypatch.setattr(capsule, "broadcast_product", lambda a, b: a * b)
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
    with tc.detect_anomaly() if anomaly else _nothing(), tc.profile() if profile else _nothing():
        v.backward(upstream)
    extra = [u_hat.grad.numpy()] if retain else []
    return [u.grad.numpy(), W.grad.numpy()] + extra + seen


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("options", [{}, {"hook": True}, {"retain": True}, {"anomaly": True}, {"profile": True}])
def test_deferred_routing_gradients_equal_the_plain_products_bit_for_bit(monkeypatch, options):
    deferred = _routing_grads(monkeypatch, True, **options)
    monkeypatch.undo()
    plain = _routing_grads(monkeypatch, False, **options)
    assert len(deferred) == len(plain)
    for a, b in zip(deferred, plain):
        assert np.array_equal(a, b)


def test_routing_backward_hands_over_deferred_products_only_when_nothing_is_recorded():
    rng = np.random.default_rng(1)
    c = tc.tensor(rng.random((2, 7, 3)), requires_grad=True)
    u_hat = tc.tensor(rng.standard_normal((2, 7, 3, 4)), requires_grad=True)
    s = F.routing_weighted_sum(c, u_hat)
    node, gs = s.creator, tc.tensor(rng.standard_normal(s.shape))
    with tc.no_grad():
        _, gu = node.backward(gs)
    assert isinstance(gu, DeferredGradient) and gu.shape == u_hat.shape
    np.testing.assert_array_equal(gu.materialize().numpy(), c.numpy()[..., None] * gs.numpy()[:, None])
    _, gu_recorded = node.backward(gs)  # grad mode on (create_graph): a recorded Tensor
    assert isinstance(gu_recorded, tc.Tensor) and gu_recorded.shape == u_hat.shape


def test_second_derivatives_through_routing_do_not_use_deferred_products():
    rng = np.random.default_rng(2)
    u_hat = tc.tensor(rng.standard_normal((2, 6, 3, 4)), requires_grad=True)
    (g,) = tc.grad(F.sum(dynamic_routing(u_hat, 2) ** 2), [u_hat], create_graph=True)
    (h,) = tc.grad(F.sum(g * g), [u_hat])
    assert isinstance(g, tc.Tensor) and np.all(np.isfinite(h.numpy()))


def test_add_product_into_equals_the_plain_update_in_any_layout(monkeypatch):
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "2")
    monkeypatch.setattr(_parallel, "MIN_BYTES_PER_THREAD", 1)
    monkeypatch.setattr(_parallel, "ADD_PRODUCT_CHUNK_BYTES", 64)  # several pieces per thread
    rng = np.random.default_rng(3)
    target = rng.standard_normal((6, 5, 4, 3)).astype(np.float32).transpose(3, 0, 1, 2)
    a = rng.standard_normal((3, 6, 5, 1)).astype(np.float32)
    b = rng.standard_normal((1, 6, 1, 4)).astype(np.float32)
    expected = target + a * b
    _parallel.add_product_into(target, a, b)
    assert np.array_equal(target, expected)
    term = BroadcastProduct(a, b)
    assert term.shape == target.shape and term.dtype == np.float32
    assert np.array_equal(term.materialize().numpy(), a * b)
