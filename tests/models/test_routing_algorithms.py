"""EM routing, self-attention routing and self-routing: forward values and couplings against the
independent NumPy loops of tests/oracles/reference_routing_algorithms.py, gradients against central
differences (first and second order), the uniform-at-start properties, the traces' paths, the
gradient modes, and each in a CapsNet that learns."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from reference_routing import central_differences
from reference_routing_algorithms import (efficient_squash, em_route, sabour_squash, self_attention_route,
                                          self_route)
from tinygrad_caps.gradcheck import check_double_grad, check_grad
from tinygrad_caps.models import (CapsNet, capsule_loss, em_routing, gradient_flow_report, routing_names,
                                  self_attention_routing, self_routing)
from tinygrad_caps.models.capsnet.squash import efficient_squash as engine_efficient_squash

B, I, J, D, K = 2, 4, 3, 2, 3


def em_inputs(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, I, J, D)) * scale, rng.uniform(0.2, 1.0, (B, I)),
            rng.standard_normal(J) * 0.3, rng.standard_normal(J) * 0.3)


def tensors(*arrays, grad=False):
    return [tc.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad) for a in arrays]


# ----- EM routing -----
@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_em_routing_equals_procedure_1_and_records_every_r(iterations):
    u_hat, a, beta_u, beta_a = em_inputs(iterations)
    lambdas = [0.5, 1.0, 2.0][:iterations]
    poses, out_a, trace = em_routing(*tensors(u_hat, a, beta_u, beta_a), iterations, lambdas, trace=True)
    ref_poses, ref_a, ref_r = em_route(u_hat, a, beta_u, beta_a, iterations, lambdas)
    np.testing.assert_allclose(poses.numpy(), ref_poses, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out_a.numpy(), ref_a, rtol=1e-10, atol=1e-12)
    assert trace.iterations == iterations and trace.routing == "em" and not trace.dot_agreement
    assert len(trace.u_hat_agreement) == len(trace.agreement) == iterations - 1
    for ours, ref in zip(trace.coupling, ref_r):
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace.activations[-1].numpy(), ref_a, rtol=1e-10)
    if iterations > 1:
        assert np.abs(ref_r[-1] - 1 / J).max() > 0.05, "the case must move R away from uniform"


def test_em_with_one_iteration_is_one_m_step_with_uniform_r():
    u_hat, a, beta_u, beta_a = em_inputs(7)
    poses, out_a, trace = em_routing(*tensors(u_hat, a, beta_u, beta_a), 1, trace=True)
    np.testing.assert_array_equal(trace.coupling[0].numpy(), np.full((B, I, J), 1 / J))
    weights = a[:, :, None] / J
    mu = np.einsum("bij,bijd->bjd", weights, u_hat) / (weights.sum(1)[:, :, None] + 1e-8)
    np.testing.assert_allclose(poses.numpy(), mu, rtol=1e-12)


@pytest.mark.parametrize("gradient", ["full", "detach"])
def test_em_routing_gradients_equal_central_differences_of_the_reference(gradient):
    u_hat, a, beta_u, beta_a = em_inputs(11)
    cot_p, cot_a = np.random.default_rng(12).standard_normal((B, J, D)), np.random.default_rng(13).standard_normal((B, J))
    leaves = tensors(u_hat, a, beta_u, beta_a, grad=True)
    poses, out_a = em_routing(*leaves, 3, gradient=gradient)
    (F.sum(poses * tc.tensor(cot_p)) + F.sum(out_a * tc.tensor(cot_a))).backward()
    frozen = (u_hat, a, beta_u, beta_a) if gradient == "detach" else None

    def loss(**changed):
        args = {**dict(u_hat=u_hat, activations=a, beta_u=beta_u, beta_a=beta_a), **changed}
        p, act, _ = em_route(args["u_hat"], args["activations"], args["beta_u"], args["beta_a"], 3, 1.0, frozen)
        return (p * cot_p).sum() + (act * cot_a).sum()

    for leaf, name, value in zip(leaves, ("u_hat", "activations", "beta_u", "beta_a"), (u_hat, a, beta_u, beta_a)):
        expected = central_differences(lambda x, name=name: loss(**{name: x}), value)
        np.testing.assert_allclose(leaf.grad.numpy(), expected, rtol=1e-5, atol=1e-7, err_msg=name)


def test_em_detach_drops_a_nonzero_part_of_the_gradient():
    u_hat, a, beta_u, beta_a = em_inputs(21)
    grads = {}
    for mode in ("full", "detach"):
        leaves = tensors(u_hat, a, beta_u, beta_a, grad=True)
        poses, out_a = em_routing(*leaves, 3, gradient=mode)
        (F.sum(poses) + F.sum(out_a)).backward()
        grads[mode] = leaves[0].grad.numpy()
    assert np.abs(grads["full"] - grads["detach"]).max() > 1e-4


def test_em_routing_first_and_second_order_gradients():
    u_hat, a, beta_u, beta_a = em_inputs(31)
    def f(u, act, bu, ba):
        poses, out_a = em_routing(u, act, bu, ba, 2)
        return F.sum(out_a) + F.sum(poses)

    check_grad(f, [u_hat, a, beta_u, beta_a])
    check_double_grad(f, [u_hat, a, beta_u, beta_a])


def test_em_routing_refuses_bad_arguments():
    u_hat, a, beta_u, beta_a = tensors(*em_inputs(0))
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        em_routing(u_hat, a, beta_u, beta_a, 0)
    with pytest.raises(ValueError, match="3 iterations"):
        em_routing(u_hat, a, beta_u, beta_a, 3, inverse_temperature=[1.0, 2.0])
    with pytest.raises(ValueError, match="beta_u must have shape"):
        em_routing(u_hat, a, tc.tensor(np.zeros(J + 1)), beta_a)
    with pytest.raises(ValueError, match="gradient must be one of"):
        em_routing(u_hat, a, beta_u, beta_a, gradient="half")
    with pytest.raises(ValueError, match="beta_a must have shape"):
        em_routing(u_hat, a, beta_u, tc.tensor(np.zeros((1, J))))
    with pytest.raises(ValueError, match="activations must have shape"):
        em_routing(u_hat, tc.tensor(np.zeros((B, I + 1))), beta_u, beta_a)
    with pytest.raises(ValueError, match="inverse_temperature must be a number"):
        em_routing(u_hat, a, beta_u, beta_a, inverse_temperature=True)


# ----- self-attention routing -----
@pytest.mark.parametrize("squash", ["efficient", "sabour"])
def test_self_attention_routing_equals_fccaps(squash):
    rng = np.random.default_rng(41)
    u_hat, bias = rng.standard_normal((B, I, J, D)), rng.standard_normal((I, J)) * 0.1
    v, trace = self_attention_routing(*tensors(u_hat, bias), squash=squash, trace=True)
    ref_v, ref_c = self_attention_route(u_hat, bias, efficient_squash if squash == "efficient" else sabour_squash)
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace.coupling[0].numpy(), ref_c, rtol=1e-10, atol=1e-12)
    assert trace.iterations == 1 and len(trace.u_hat_agreement) == 1 and trace.routing == "self-attention"


def test_self_attention_gradients_equal_central_differences_of_the_reference():
    rng = np.random.default_rng(43)
    u_hat, bias, cot = rng.standard_normal((B, I, J, D)), rng.standard_normal((I, J)) * 0.1, rng.standard_normal((B, J, D))
    leaves = tensors(u_hat, bias, grad=True)
    F.sum(self_attention_routing(*leaves) * tc.tensor(cot)).backward()
    np.testing.assert_allclose(leaves[0].grad.numpy(), central_differences(
        lambda x: (self_attention_route(x, bias)[0] * cot).sum(), u_hat), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(leaves[1].grad.numpy(), central_differences(
        lambda x: (self_attention_route(u_hat, x)[0] * cot).sum(), bias), rtol=1e-5, atol=1e-7)


def test_self_attention_first_and_second_order_gradients():
    rng = np.random.default_rng(47)
    u_hat, bias = rng.standard_normal((B, I, J, D)), rng.standard_normal((I, J)) * 0.1
    check_grad(lambda u, b: self_attention_routing(u, b), [u_hat, bias])
    check_double_grad(lambda u, b: self_attention_routing(u, b), [u_hat, bias])


def test_efficient_squash_is_mazzia_et_al_s():
    s = np.random.default_rng(48).standard_normal((3, 5, 4)) * np.array([1e-3, 0.1, 1.0, 10.0, 3.0])[None, :, None]
    expected = np.stack([[efficient_squash(row) for row in block] for block in s])
    np.testing.assert_allclose(engine_efficient_squash(tc.tensor(s)).numpy(), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_self_attention_routing_of_zero_votes_has_a_finite_gradient(dtype):
    u_hat = tc.tensor(np.zeros((1, I, J, D), dtype=dtype), requires_grad=True)
    v = self_attention_routing(u_hat, tc.tensor(np.zeros((I, J), dtype=dtype)))
    F.sum(v).backward()
    assert np.all(v.numpy() == 0) and np.all(np.isfinite(u_hat.grad.numpy()))


def test_self_attention_routing_refuses_a_bias_of_the_wrong_shape():
    u_hat = tc.tensor(np.zeros((B, I, J, D)))
    with pytest.raises(ValueError, match=r"self_attention_routing: bias must have shape \(4, 3\)"):
        self_attention_routing(u_hat, tc.tensor(np.zeros((J, I))))


# ----- self-routing -----
def self_routing_inputs(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, I, J, D)), rng.standard_normal((B, I, K)), rng.uniform(0.2, 1.0, (B, I)),
            rng.standard_normal((I, J, K)) * scale, rng.standard_normal((I, J)) * scale)


def test_self_routing_equals_hahn_et_al():
    inputs = self_routing_inputs(51)
    v, a, trace = self_routing(*tensors(*inputs), trace=True)
    ref_v, ref_a, ref_c = self_route(*inputs)
    np.testing.assert_allclose(v.numpy(), ref_v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.numpy(), ref_a, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace.coupling[0].numpy(), ref_c, rtol=1e-10, atol=1e-12)
    assert trace.u_hat_agreement[0].shape == (B, I, K)  # the routing path starts at u, not at u_hat


def test_self_routing_with_zero_routing_weights_is_uniform():
    u_hat, u, a, _, _ = self_routing_inputs(53)
    v, out_a, trace = self_routing(*tensors(u_hat, u, a, np.zeros((I, J, K)), np.zeros((I, J))), trace=True)
    np.testing.assert_allclose(trace.coupling[0].numpy(), 1 / J, rtol=1e-15)
    total = a.sum(1)[:, None]
    np.testing.assert_allclose(out_a.numpy(), np.broadcast_to(total / (total + 1e-8) / J, (B, J)), rtol=1e-14)
    weighted = np.einsum("bi,bijd->bjd", a, u_hat) / (a.sum(1)[:, None, None] + J * 1e-8)
    np.testing.assert_allclose(v.numpy(), weighted, rtol=1e-10)


def test_self_routing_refuses_arguments_of_the_wrong_shapes():
    u_hat, u, a, w, b = tensors(*self_routing_inputs(54))
    wrong = {"u": tc.tensor(np.zeros((B, I + 1, K))), "activations": tc.tensor(np.zeros((B, I + 1))),
             "route_weight": tc.tensor(np.zeros((I, J, K + 1))), "route_bias": tc.tensor(np.zeros((J, I)))}
    for name, value in wrong.items():
        args = {"u": u, "activations": a, "route_weight": w, "route_bias": b, name: value}
        with pytest.raises(ValueError, match=f"self_routing: {name} must have shape"):
            self_routing(u_hat, args["u"], args["activations"], args["route_weight"], args["route_bias"])


def test_self_routing_with_zero_input_activations_gives_zero_scores_not_nan():
    u_hat, u, _, w, b = self_routing_inputs(58)
    v, a = self_routing(*tensors(u_hat, u, np.zeros((B, I)), w, b))
    assert np.all(a.numpy() == 0) and np.all(v.numpy() == 0)


def test_self_routing_gradients_equal_central_differences_of_the_reference():
    inputs = self_routing_inputs(55, scale=0.5)
    rng = np.random.default_rng(56)
    cot_v, cot_a = rng.standard_normal((B, J, D)), rng.standard_normal((B, J))
    leaves = tensors(*inputs, grad=True)
    v, a = self_routing(*leaves)
    (F.sum(v * tc.tensor(cot_v)) + F.sum(a * tc.tensor(cot_a))).backward()
    for k, leaf in enumerate(leaves):
        def loss(x, k=k):
            args = list(inputs)
            args[k] = x
            ref_v, ref_a, _ = self_route(*args)
            return (ref_v * cot_v).sum() + (ref_a * cot_a).sum()
        np.testing.assert_allclose(leaf.grad.numpy(), central_differences(loss, inputs[k]), rtol=1e-5, atol=1e-7)


def test_self_routing_first_and_second_order_gradients():
    inputs = self_routing_inputs(57, scale=0.5)

    def f(*xs):
        v, a = self_routing(*xs)
        return F.sum(v * v) + F.sum(a * a)
    check_grad(f, list(inputs))
    check_double_grad(f, list(inputs))


# ----- traces: the paths -----
def test_full_mode_paths_sum_to_the_gradient_of_u_hat_for_em_and_self_attention():
    u_hat, a, beta_u, beta_a = em_inputs(61)
    leaves = tensors(u_hat, a, beta_u, beta_a, grad=True)
    poses, out_a, trace = em_routing(*leaves, 3, trace=True)
    trace.retain_grad()
    (F.sum(poses) + F.sum(out_a * out_a)).backward()
    paths = [t.grad.numpy() for t in trace.u_hat_sum + trace.u_hat_agreement]
    np.testing.assert_allclose(sum(paths), leaves[0].grad.numpy(), rtol=1e-10, atol=1e-12)
    assert all(np.abs(p).max() > 0 for p in paths)
    u = tensors(u_hat, grad=True)[0]
    v, trace = self_attention_routing(u, tc.tensor(np.zeros((I, J))), trace=True)
    trace.retain_grad()
    F.sum(v * v).backward()
    np.testing.assert_allclose(trace.u_hat_sum[0].grad.numpy() + trace.u_hat_agreement[0].grad.numpy(),
                               u.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_em_detach_gives_the_inner_paths_no_gradient():
    leaves = tensors(*em_inputs(63), grad=True)
    poses, out_a, trace = em_routing(*leaves, 3, gradient="detach", trace=True)
    trace.retain_grad()
    F.sum(poses).backward()
    assert not any(t.requires_grad for t in trace.u_hat_sum[:-1] + trace.u_hat_agreement)
    np.testing.assert_allclose(trace.u_hat_sum[-1].grad.numpy(), leaves[0].grad.numpy(), rtol=1e-12)


# ----- in a CapsNet -----
SMALL = dict(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=4,
             num_classes=3)


def tiny_batch(n=6, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    x = rng.random((n, 1, 12, 12)) * 0.2
    for k, label in enumerate(labels):  # a class is a bright band
        x[k, 0, 4 * label:4 * label + 4, :] += 0.8
    return x, labels


@pytest.mark.parametrize("routing", ["em", "self-attention", "self-routing"])
def test_capsnet_routing_parameters_start_as_documented(routing):
    tc.manual_seed(0)
    model = CapsNet(routing=routing, **SMALL)
    params = dict(model.named_parameters())
    extra = {"em": ("digit.beta_u", "digit.beta_a"), "self-attention": ("digit.attention_bias",),
             "self-routing": ("digit.route_weight", "digit.route_bias")}[routing]
    for name in extra:
        assert np.all(params[name].numpy() == 0), name
    x, y = tiny_batch()
    out = model(x, y, return_trace=True)
    assert out.lengths.shape == (6, 3) and out.traces[0].routing == routing
    if routing == "self-routing":  # uniform routing at initialisation: c = 1/J, every class score 1/J
        np.testing.assert_allclose(out.traces[0].coupling[0].numpy(), 1 / 3, rtol=1e-6)
        np.testing.assert_allclose(out.lengths.numpy(), 1 / 3, rtol=1e-5)
    if routing == "em":  # the class scores are the output activations
        np.testing.assert_array_equal(out.lengths.numpy(), out.traces[0].activations[-1].numpy())


@pytest.mark.parametrize("routing", ["dynamic", "uniform", "em", "self-attention", "self-routing"])
def test_capsnet_learns_a_tiny_set_with_every_routing(routing):
    tc.manual_seed(1)
    # EM's cost grows with the input capsules and pose values: with 8 inputs a larger lambda than the default
    model = CapsNet(routing=routing, em_inverse_temperature=1e-2, **SMALL)
    optimizer = tc.optim.Adam(model.parameters(), lr=0.01)
    x, y = tiny_batch()
    losses = []
    for _ in range(20):
        out = model(tc.tensor(x), y)
        loss = capsule_loss(out.lengths, out.reconstruction, tc.tensor(x), y, 0.0005)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("routing", ["em", "self-attention", "self-routing"])
def test_gradflow_report_on_every_new_routing(routing):
    tc.manual_seed(2)
    model = CapsNet(routing=routing, **SMALL).to(dtype="float64")
    x, y = tiny_batch(4)
    report = gradient_flow_report(model, x, y)
    modes = ("full", "detach") if routing == "em" else ("full",)
    assert tuple(report["modes"]) == modes
    rows = report["modes"]["full"]["layers"][0]["iterations"]
    assert len(rows) == (3 if routing == "em" else 1)
    assert rows[0]["grad_norm_sum"] > 0
    if routing == "self-routing":  # W_route = 0: the coupling does not depend on u yet
        assert rows[0]["grad_norm_agreement"] == 0.0
    else:
        assert rows[0]["grad_norm_agreement"] > 0
    if routing == "em":  # the last iteration makes no next coupling
        assert rows[-1]["grad_norm_agreement"] is None
    if routing == "em":  # detach zeroes the inner paths
        detached = report["modes"]["detach"]["layers"][0]["iterations"]
        assert all(row["grad_norm_sum"] == 0.0 and row["grad_norm_agreement"] == 0.0 for row in detached[:-1])
        assert detached[-1]["grad_norm_sum"] > 0
    else:
        with pytest.raises(ValueError, match=f"routing '{routing}' is not iterative: it has no 'detach'"):
            gradient_flow_report(model, x, y, modes=("full", "detach"))


@pytest.mark.parametrize("routing", ["self-attention", "self-routing"])
def test_one_step_routings_refuse_detach_in_one_line(routing):
    with pytest.raises(ValueError, match=f"^routing '{routing}' is not iterative: it has no 'detach' gradient mode"):
        CapsNet(routing=routing, routing_gradient="detach", **SMALL)
    model = CapsNet(routing=routing, **SMALL)
    with pytest.raises(ValueError, match="not iterative"):
        model.digit.gradient = "detach"
    assert model.digit.gradient == "full"


def test_new_routings_refuse_options_they_do_not_take():
    for routing in ("em", "self-attention", "self-routing"):
        with pytest.raises(ValueError, match="takes no capsule bias"):
            CapsNet(routing=routing, capsule_bias=True, **SMALL)
        with pytest.raises(ValueError, match="takes no leaky routing"):
            CapsNet(routing=routing, leaky_routing=True, **SMALL)
    assert routing_names()[:5] == ("dynamic", "uniform", "em", "self-attention", "self-routing")


def test_em_hidden_layers_pass_their_activations_up():
    tc.manual_seed(3)
    model = CapsNet(routing="em", hidden_capsules=[(4, 3)], **SMALL).to(dtype="float64")
    x, _ = tiny_batch(2)
    u = model.primary(F.relu(model.conv1(tc.tensor(x))))
    hidden = model.hidden[0].route(u)
    top = model.digit.route(hidden.poses, hidden.activations)
    np.testing.assert_allclose(model(x).lengths.numpy(), top.activations.numpy(), rtol=1e-12)


class PlainLayer(tc.nn.Module):
    """Not a RoutingLayer: a Module with a forward and nothing a CapsNet's routing layers have."""

    def __init__(self, *args, **options):
        super().__init__()

    def forward(self, u):
        return u


@pytest.mark.parametrize("factory, message", [
    (PlainLayer, r"^routing 'user-plain': its layer factory returned a [\w.]*PlainLayer, not a RoutingLayer \(it has "
                 r"no route\(\), no weight, no bias\); the factory must return a RoutingLayer"),
    (lambda *args, **options: None, r"^routing 'user-plain': its layer factory returned None, not a layer; the factory "
                                    r"must return a RoutingLayer"),
])
@pytest.mark.parametrize("hidden", [[], [(4, 3)]])
def test_a_routing_factory_that_returns_no_routing_layer_is_refused_when_the_model_is_built(factory, message, hidden):
    from tinygrad_caps.models import register_routing, unregister_routing

    register_routing("user-plain", factory)
    try:
        with pytest.raises(TypeError, match=message):
            CapsNet(routing="user-plain", hidden_capsules=hidden, **SMALL)
    finally:
        unregister_routing("user-plain")
