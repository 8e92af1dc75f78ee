"""RoutingTrace from dynamic_routing(trace=True) and CapsNet.forward(return_trace=True), and
routing_statistics on real and hand-made traces."""
import math

import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.models import CapsNet, RoutingTrace, dynamic_routing, routing_statistics
from tinygrad_caps.testing import check_op, tensors

B, I, J, D = 2, 5, 3, 4


def u_hat_leaf(seed=0):
    return tc.Tensor(np.random.default_rng(seed).standard_normal((B, I, J, D)), requires_grad=True)


def loss_of(v, seed=1):
    return F.sum(v * tc.Tensor(np.random.default_rng(seed).standard_normal(v.shape)))


def softmax(b):
    e = np.exp(b - b.max(axis=2, keepdims=True))
    return e / e.sum(axis=2, keepdims=True)


def squash(s):
    n2 = (s * s).sum(-1, keepdims=True)
    return n2 / (1 + n2) * s / np.sqrt(n2 + 1e-8)


@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("gradient", ["full", "detach"])
def test_trace_records_every_iteration_with_the_documented_shapes_and_values(iterations, gradient):
    u_hat = u_hat_leaf()
    v, trace = dynamic_routing(u_hat, iterations, gradient, trace=True)
    assert isinstance(trace, RoutingTrace) and trace.gradient == gradient and trace.iterations == iterations
    assert [len(getattr(trace, a)) for a in ("logits", "coupling", "weighted", "outputs", "u_hat_sum")] == [iterations] * 5
    assert len(trace.agreement) == len(trace.u_hat_agreement) == iterations - 1
    u = u_hat.numpy()
    b = np.zeros((B, I, J))
    for r in range(iterations):
        assert trace.logits[r].shape == trace.coupling[r].shape == (B, I, J)
        assert trace.weighted[r].shape == trace.outputs[r].shape == (B, J, D)
        assert trace.u_hat_sum[r].shape == (B, I, J, D)
        np.testing.assert_allclose(trace.logits[r].numpy(), b, rtol=1e-12, atol=1e-14)
        c = softmax(b)
        np.testing.assert_allclose(trace.coupling[r].numpy(), c, rtol=1e-12)
        s = np.einsum("bij,bijd->bjd", c, u)
        np.testing.assert_allclose(trace.weighted[r].numpy(), s, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(trace.outputs[r].numpy(), squash(s), rtol=1e-10, atol=1e-14)
        np.testing.assert_array_equal(trace.u_hat_sum[r].numpy(), u)
        if r < iterations - 1:
            a = np.einsum("bijd,bjd->bij", u, trace.outputs[r].numpy())
            assert trace.agreement[r].shape == (B, I, J)
            np.testing.assert_allclose(trace.agreement[r].numpy(), a, rtol=1e-12, atol=1e-14)
            b = b + a
    assert v is trace.outputs[-1]


@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
def test_full_mode_path_gradients_sum_to_the_gradient_of_u_hat(iterations):
    u_hat = u_hat_leaf(iterations)
    v, trace = dynamic_routing(u_hat, iterations, "full", trace=True)
    assert trace.retain_grad() is trace
    loss_of(v).backward()
    paths = [t.grad.numpy() for t in trace.u_hat_sum + trace.u_hat_agreement]
    assert all(t.requires_grad for t in trace.u_hat_sum + trace.u_hat_agreement)
    np.testing.assert_allclose(sum(paths), u_hat.grad.numpy(), rtol=1e-12, atol=1e-12)
    if iterations > 1:  # the inner iterations carry gradient of their own in full mode
        assert np.abs(trace.u_hat_agreement[0].grad.numpy()).max() > 0
        assert np.abs(trace.u_hat_sum[0].grad.numpy()).max() > 0


@pytest.mark.parametrize("iterations", [2, 3])
def test_detach_mode_inner_paths_carry_no_gradient(iterations):
    u_hat = u_hat_leaf(5)
    v, trace = dynamic_routing(u_hat, iterations, "detach", trace=True)
    trace.retain_grad()
    loss_of(v).backward()
    inner = trace.u_hat_sum[:-1] + trace.u_hat_agreement
    assert not any(t.requires_grad for t in inner) and all(t.grad is None for t in inner)
    np.testing.assert_allclose(trace.u_hat_sum[-1].grad.numpy(), u_hat.grad.numpy(), rtol=1e-12, atol=1e-12)
    stats = routing_statistics(trace)
    assert stats["grad_norm_sum"][:-1] == [0.0] * (iterations - 1)
    assert stats["grad_norm_agreement"] == [0.0] * (iterations - 1) + [None]
    assert stats["grad_norm_sum"][-1] == pytest.approx(np.linalg.norm(u_hat.grad.numpy()), rel=1e-12)


def test_tracing_changes_no_output_and_matches_return_coupling():
    u_hat = u_hat_leaf(7)
    plain, couplings = dynamic_routing(u_hat, 3, return_coupling=True)
    traced, couplings_too, trace = dynamic_routing(u_hat, 3, return_coupling=True, trace=True)
    np.testing.assert_array_equal(plain.numpy(), traced.numpy())
    for c, c_traced, c_trace in zip(couplings, couplings_too, trace.coupling):
        np.testing.assert_array_equal(c.numpy(), c_traced.numpy())
        assert c_traced is c_trace
    assert not trace.logits[0].requires_grad and trace.coupling[1].requires_grad


def test_trace_gradients_through_one_iteration_pass_check_op():
    """The gradient of the first iteration's outputs and the second's couplings, of first and second order."""
    check_op(lambda u: F.sum(dynamic_routing(u, 2, trace=True)[1].coupling[1] ** 2) + F.sum(
        dynamic_routing(u, 2, trace=True)[1].outputs[0]), tensors(shape=(1, 2, 2, 2)))


def tiny_capsnet():
    tc.manual_seed(0)
    return CapsNet(conv1_channels=6, primary_types=2, primary_dim=4, digit_dim=4, num_classes=3,
                   image_size=20, kernel_size=5).to(dtype="float64")


def test_capsnet_returns_one_trace_per_routing_layer_and_unchanged_outputs():
    model = tiny_capsnet()
    x = np.random.default_rng(0).random((2, 1, 20, 20))
    y = np.array([0, 2])
    plain = model(x, y)
    v, lengths, reconstruction, traces = model(x, y, return_trace=True)
    for a, b in zip(plain, (v, lengths, reconstruction)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert len(traces) == 1 and isinstance(traces[0], RoutingTrace) and traces[0].name == "digit"
    assert traces[0].u_hat_sum[0].shape == (2, model.num_primary, 3, 4)
    traces[0].retain_grad()
    F.sum(lengths).backward()
    stats = routing_statistics(traces[0])
    assert all(value is not None for value in stats["grad_norm_sum"])
    assert stats["grad_norm_agreement"][-1] is None and None not in stats["grad_norm_agreement"][:-1]


# ----- statistics on hand-made traces -----

def hand_made(coupling, outputs, u_hat=None):
    trace = RoutingTrace(coupling=[tc.Tensor(c) for c in coupling], outputs=[tc.Tensor(v) for v in outputs])
    if u_hat is not None:
        trace.u_hat_sum = [tc.Tensor(u_hat) for _ in coupling]
    return trace


def test_uniform_coupling_has_entropy_one_and_one_hot_has_zero():
    uniform = np.full((2, 4, 5), 0.2)
    one_hot = np.zeros((2, 4, 5))
    one_hot[:, :, 3] = 1.0
    v = np.ones((2, 5, 3))
    stats = routing_statistics(hand_made([uniform, one_hot], [v, v]))
    assert stats["coupling_entropy"] == pytest.approx([1.0, 0.0], abs=1e-12)
    assert stats["t_score"] == pytest.approx([0.0, 1.0], abs=1e-12)
    assert stats["polarization"] == pytest.approx([0.2, 1.0], abs=1e-12)
    assert stats["d_score"] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert stats["agreement_cosine"] == [None, None] and stats["grad_norm_sum"] == [None, None]
    assert stats["grad_norm_agreement"] == [None, None]


def test_entropy_of_a_two_way_split_and_d_score_and_cosine_by_hand():
    c = np.zeros((1, 2, 4))
    c[0, :, :2] = 0.5  # entropy log 2 of log 4 per row
    v = np.zeros((2, 2, 3))
    v[0, 0, 0], v[1, 0, 0] = 1.0, 3.0  # |v[:, 0]| = 1 and 3: std 1
    v[0, 1, 1], v[1, 1, 1] = 2.0, 2.0  # |v[:, 1]| constant: std 0
    u = np.zeros((2, 3, 2, 3))
    u[..., 0, 0] = 1.0  # parallel to v[:, 0] (cos 1)
    u[:, :2, 1, 1], u[:, 2, 1, 1] = 1.0, -1.0  # parallel twice, opposite once (cos 1, 1, -1)
    stats = routing_statistics(hand_made([np.broadcast_to(c, (2, 2, 4)).copy()], [v], u))
    assert stats["coupling_entropy"][0] == pytest.approx(math.log(2) / math.log(4), abs=1e-12)
    assert stats["d_score"][0] == pytest.approx(1.0, abs=1e-12)
    assert stats["agreement_cosine"][0] == pytest.approx((3 + 1 + 1 - 1) / 6, abs=1e-12)


def test_statistics_reject_mismatched_traces():
    with pytest.raises(ValueError, match="routing_statistics"):
        routing_statistics(RoutingTrace(coupling=[tc.Tensor(np.ones((1, 2, 2)))]))


@pytest.mark.parametrize("gradient", ["full", "detach"])
def test_tracked_grad_norms_equal_those_of_retained_gradients(gradient):
    u_hat = u_hat_leaf(11)
    v, retained = dynamic_routing(u_hat, 3, gradient, trace=True)
    retained.retain_grad()
    loss_of(v).backward()
    u_hat_again = u_hat_leaf(11)
    v, tracked = dynamic_routing(u_hat_again, 3, gradient, trace=True)
    assert tracked.track_grad_norms() is tracked
    loss_of(v).backward()
    assert all(t.grad is None for t in tracked.u_hat_sum + tracked.u_hat_agreement)  # nothing kept
    want, got = routing_statistics(retained), routing_statistics(tracked)
    for key in ("grad_norm_sum", "grad_norm_agreement"):
        # None marks a path that no gradient reached (detach's inner agreements): the same in both
        assert [g is None for g in got[key]] == [w is None for w in want[key]]
        numbers = [(g, w) for g, w in zip(got[key], want[key]) if w is not None]
        assert [g for g, _ in numbers] == pytest.approx([w for _, w in numbers], rel=1e-12)
    assert None not in got["grad_norm_sum"]
