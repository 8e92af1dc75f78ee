"""Deep capsule stacks, capsule bias and uniform routing: parameter names and shapes, the routing
variants' semantics, gradients against central differences, the stacked model against PyTorch,
and checkpoints that carry the options."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tinygrad_caps as tc
from helpers import arrays, floats
from torch_reference import torch_capsnet
from tinygrad_caps.gradcheck import check_double_grad, check_grad
from tinygrad_caps.models import CapsNet, CapsuleLayer, capsule_loss, dynamic_routing, uniform_routing
from tinygrad_caps.models.capsnet import parse_hidden_capsules

SMALL = dict(image_size=12, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=5)


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_default_model_has_the_papers_parameters_only():
    names = set(shapes(CapsNet(**SMALL)))
    assert names == {"conv1.weight", "conv1.bias", "primary.weight", "primary.bias", "digit.weight",
                     "decoder.fc1.weight", "decoder.fc1.bias", "decoder.fc2.weight", "decoder.fc2.bias",
                     "decoder.fc3.weight", "decoder.fc3.bias"}


@pytest.mark.parametrize("bias", [False, True])
def test_hidden_stack_parameter_names_and_shapes(bias):
    model = CapsNet(hidden_capsules=[(6, 3), (5, 7)], capsule_bias=bias, **SMALL)
    s = shapes(model)
    primary_caps = 2 * 4 * 4  # 12 -> conv 10 -> primary (10 - 3) // 2 + 1 = 4
    assert s["hidden.0.weight"] == (primary_caps, 6, 3, 4)
    assert s["hidden.1.weight"] == (6, 5, 7, 3)
    assert s["digit.weight"] == (5, 10, 5, 7)
    bias_keys = {k for k in s if k.endswith(".bias") and k.split(".")[0] in ("hidden", "digit")}
    if bias:
        assert bias_keys == {"hidden.0.bias", "hidden.1.bias", "digit.bias"}
        assert s["hidden.0.bias"] == (6, 3) and s["hidden.1.bias"] == (5, 7) and s["digit.bias"] == (10, 5)
        assert all(np.all(model.state_dict()[k] == 0) for k in bias_keys)
    else:
        assert bias_keys == set()
    assert [name for name, _ in model.routing_layers()] == ["hidden.0", "hidden.1", "digit"]
    v, lengths, recon = model(np.random.default_rng(0).random((3, 1, 12, 12)), np.array([0, 1, 2]))
    assert v.shape == (3, 10, 5) and lengths.shape == (3, 10) and recon.shape == (3, 144)


def test_hidden_capsules_text_and_errors():
    assert parse_hidden_capsules("32x12,32x12") == [[32, 12], [32, 12]]
    assert parse_hidden_capsules("") == [] and parse_hidden_capsules(()) == []
    for bad in ("32", "32x", "0x3", "axb", [(3,)], [(0, 2)]):
        with pytest.raises(ValueError, match="hidden capsules"):
            parse_hidden_capsules(bad)
    with pytest.raises(ValueError, match="routing"):
        CapsNet(routing="agreement", **SMALL)


def test_uniform_routing_gives_exactly_one_over_j_and_ignores_iterations():
    rng = np.random.default_rng(1)
    u_hat = tc.tensor(rng.standard_normal((2, 5, 4, 3)))
    v, (c,) = uniform_routing(u_hat, return_coupling=True)
    assert np.all(c.numpy() == 0.25)
    expected = tc.functional.squash(tc.tensor(u_hat.numpy().sum(1) / 4), axis=-1).numpy()
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-14)
    tc.manual_seed(0)
    one = CapsNet(routing="uniform", routing_iterations=1, **SMALL).to(dtype="float64")
    tc.manual_seed(0)
    five = CapsNet(routing="uniform", routing_iterations=5, **SMALL).to(dtype="float64")
    x = rng.random((2, 1, 12, 12))
    np.testing.assert_array_equal(one(x)[0].numpy(), five(x)[0].numpy())
    _, _, _, couplings = five(x, return_coupling=True)
    assert len(couplings) == 1 and np.all(couplings[0].numpy() == 0.1)


def test_uniform_routing_equals_the_first_dynamic_iteration():
    u_hat = tc.tensor(np.random.default_rng(2).standard_normal((2, 5, 4, 3)))
    bias = tc.tensor(np.random.default_rng(3).standard_normal((4, 3)))
    for leaky in (False, True):
        np.testing.assert_allclose(uniform_routing(u_hat, bias, leaky_routing=leaky).numpy(),
                                   dynamic_routing(u_hat, 1, leaky_routing=leaky, bias=bias).numpy(), rtol=1e-14)


def test_bias_enters_before_the_squash_in_every_iteration():
    rng = np.random.default_rng(4)
    u = rng.standard_normal((2, 5, 3, 4))
    beta = rng.standard_normal((3, 4))
    v, couplings = dynamic_routing(tc.tensor(u), 3, bias=tc.tensor(beta), return_coupling=True)
    logits = np.zeros((2, 5, 3))
    for r in range(3):
        c = np.exp(logits) / np.exp(logits).sum(2, keepdims=True)
        np.testing.assert_allclose(couplings[r].numpy(), c, rtol=1e-12, atol=1e-15)
        s = np.einsum("bij,bijd->bjd", c, u) + beta
        sq = (s * s).sum(-1, keepdims=True)
        ref = sq / (1 + sq) * s / np.sqrt(sq + 1e-8)
        logits = logits + np.einsum("bijd,bjd->bij", u, ref)
    np.testing.assert_allclose(v.numpy(), ref, rtol=1e-12)
    with pytest.raises(ValueError, match="dynamic_routing: bias must have shape"):
        dynamic_routing(tc.tensor(u), 3, bias=tc.tensor(beta.T))


def draw_routing_inputs(data):
    """u_hat (2, 3, 2, 3) in [-0.3, 0.3] and a bias (2, 3) in [1, 2]: every s_j stays at least 0.7 from
    zero (the couplings of an input sum to at most 1), away from the squash's steep region near |s| = 1e-4
    where central differences with step 1e-6 are not accurate."""
    u_hat = data.draw(arrays((2, 3, 2, 3), elements=floats(-0.3, 0.3)))
    beta = data.draw(arrays((2, 3), elements=floats(1.0, 2.0)))
    return u_hat, beta


@settings(deadline=None)
@given(st.data(), st.integers(1, 3), st.booleans())
def test_routing_with_bias_and_leak_gradients_match_central_differences(data, iterations, leaky):
    # "full" only: "detach" deliberately differs from the derivative (checked against PyTorch below)
    u_hat, beta = draw_routing_inputs(data)
    f = lambda u, b: dynamic_routing(u, iterations, "full", leaky_routing=leaky, bias=b)  # noqa: E731
    check_grad(f, [u_hat, beta])
    check_double_grad(f, [u_hat, beta])


@settings(deadline=None)
@given(st.data(), st.booleans())
def test_uniform_routing_gradients_match_central_differences(data, leaky):
    u_hat, beta = draw_routing_inputs(data)
    f = lambda u, b: uniform_routing(u, b, leaky_routing=leaky)  # noqa: E731
    check_grad(f, [u_hat, beta])
    check_double_grad(f, [u_hat, beta])


@pytest.mark.parametrize("routing", ["dynamic", "uniform"])
def test_capsule_layer_gradients_match_central_differences(routing):
    tc.manual_seed(7)
    layer = CapsuleLayer(4, 3, 2, 3, iterations=3, routing=routing, bias=True).to(dtype="float64")
    u = np.random.default_rng(5).standard_normal((2, 4, 3)) * 0.7
    weight = layer.weight.numpy() * 30  # strong enough that routing moves c
    bias = np.random.default_rng(6).standard_normal((2, 3)) * 0.3

    def f(u_t, w_t, b_t):
        layer.weight, layer.bias = w_t, b_t
        return layer(u_t)

    check_grad(f, [u, weight, bias])


@pytest.mark.parametrize("gradient", ["full", "detach"])
def test_stacked_capsnet_with_bias_matches_pytorch_in_float64(gradient):
    torch = pytest.importorskip("torch")
    tc.manual_seed(11)
    config = dict(image_size=16, kernel_size=5, conv1_channels=6, primary_types=3, primary_dim=4, digit_dim=6)
    model = CapsNet(hidden_capsules=[(5, 4)], capsule_bias=True, routing_gradient=gradient, **config).to(dtype="float64")
    rng = np.random.default_rng(12)
    model.hidden[0].weight.data = model.hidden[0].weight.data * 40  # routing far from uniform in both layers
    model.digit.weight.data = model.digit.weight.data * 60
    model.hidden[0].bias.data = rng.standard_normal((5, 4)) * 0.1
    model.digit.bias.data = rng.standard_normal((10, 6)) * 0.1
    x, y = rng.random((3, 1, 16, 16)), np.array([2, 7, 4])
    _, lengths, recon = model(x, y)
    loss = capsule_loss(lengths, recon, x, y)
    loss.backward()
    state = {k: torch.tensor(np.array(a), requires_grad=True) for k, a in model.state_dict().items()}
    ref = torch_capsnet(torch, state, torch.tensor(x), torch.tensor(y), 3, gradient, 3, 4, hidden_layers=1)[3]
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-10 * abs(ref.item())
    for name, p in model.named_parameters():
        expected = state[name].grad.numpy()
        error = np.abs(p.grad.numpy() - expected).max() / max(np.abs(expected).max(), 1e-300)
        assert error <= 1e-10, f"{name}: relative error {error:.2e}"
        assert np.abs(expected).max() > 0, name


def test_config_carries_the_options_and_a_mismatched_checkpoint_names_the_keys(tmp_path):
    from tinygrad_caps.models.app.training.checkpoints import build_model, load_checkpoint_model

    config = dict(SMALL, in_channels=1, num_classes=10, hidden_capsules=[[3, 4]], capsule_bias=True, routing="uniform")
    model = build_model(config)
    assert model.config["hidden_capsules"] == [[3, 4]] and model.config["capsule_bias"] is True
    assert model.config["routing"] == "uniform" and model.hidden[0].routing == "uniform"
    path = tmp_path / "ckpt.npz"
    tc.save({"model": model.state_dict(), "config": dict(model.config, dataset="tiny")}, path)
    restored, restored_config = load_checkpoint_model(path)
    assert restored_config["hidden_capsules"] == [[3, 4]] and restored.digit.routing == "uniform"
    for name, a in model.state_dict().items():
        np.testing.assert_array_equal(restored.state_dict()[name], a)
    with pytest.raises((tc.StateDictError, tc.CheckpointError), match=r"hidden\.0\.weight.*hidden\.0\.bias|digit\.weight"):
        load_checkpoint_model(path, overrides={"hidden_capsules": []})
    with pytest.raises((tc.StateDictError, tc.CheckpointError), match=r"digit\.bias"):
        load_checkpoint_model(path, overrides={"capsule_bias": False})


@pytest.mark.parametrize("routing", ["dynamic", "uniform"])
def test_every_routing_layer_returns_its_trace_bottom_to_top(routing):
    tc.manual_seed(13)
    model = CapsNet(hidden_capsules=[(4, 3), (3, 5)], capsule_bias=True, routing=routing, **SMALL).to(dtype="float64")
    x, y = np.random.default_rng(14).random((2, 1, 12, 12)), np.array([3, 1])
    v, lengths, recon = model(x, y)
    tv, tl, tr, couplings, traces = model(x, y, return_coupling=True, return_trace=True)
    assert [t.name for t in traces] == ["hidden.0", "hidden.1", "digit"]
    expected_iterations = 3 if routing == "dynamic" else 1
    assert [len(t.outputs) for t in traces] == [expected_iterations] * 3
    assert traces[0].coupling[0].shape == (2, 32, 4) and traces[2].outputs[-1].shape == (2, 10, 5)
    np.testing.assert_array_equal(tv.numpy(), v.numpy())
    np.testing.assert_array_equal(traces[-1].outputs[-1].numpy(), v.numpy())
    assert len(couplings) == expected_iterations and couplings[-1] is traces[-1].coupling[-1]
    np.testing.assert_array_equal(tr.numpy(), recon.numpy())


@pytest.mark.parametrize("options", [{}, {"decoder": "deconv"}, {"decoder": "deconv-bn"}, {"decoder_hidden": (6, 5)},
                                     {"capsule_bias": True},
                                     {"conventions": "official"}, {"hidden_capsules": [(4, 3), (2, 5)]},
                                     {"routing": "uniform", "capsule_bias": True}, {"routing": "em"},
                                     {"routing": "self-attention"}, {"routing": "self-routing", "hidden_capsules": [(4, 3)]}])
def test_the_parameter_count_comes_from_the_layers_and_equals_the_built_models(options):
    from tinygrad_caps.models.app.training.resources import capsnet_parameter_count

    config = dict(conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=3, kernel_size=3, in_channels=1,
                  image_size=12, num_classes=3, **options)
    built = sum(p.data.size for p in CapsNet(**config).parameters())
    assert CapsNet.parameter_count(**config) == built == capsnet_parameter_count(config)
