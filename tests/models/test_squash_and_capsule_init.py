"""The squash option (Sabour et al.'s, Peer et al.'s code's) and Peer et al.'s initialisation as model
options: the nonlinearity's values and gradients (first and second order against central
differences, at and near zero too), where a CapsNet uses it, the routing layers' initial values,
the README's hidden-capsule example that does not train with the defaults and one that does, and
the options on the command line and in checkpoints."""
import json

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, check_both, shapes, write_striped_dataset
from tinygrad_caps.models import CapsNet, capsule_loss, cli, dynamic_routing
from tinygrad_caps.models.app.training.checkpoints import load_checkpoint_model
from tinygrad_caps.models.capsnet import CapsNetConfig
from tinygrad_caps.models.capsnet.squash import SQUASHES, peer_squash, sabour_squash, squash_function

SMALL = dict(image_size=12, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=5)


def peer_reference(s, eps):
    """peerdavid/capsnet-limitations capsule/utils.py squash, in NumPy."""
    n = (s * s).sum(axis=-1, keepdims=True) + eps
    return n / (1 + n) * (s / np.sqrt(n)) + eps


@pytest.mark.parametrize("eps", [1e-8, 1e-12, 1e-3])
def test_peer_squash_is_their_formula(eps):
    s = np.random.default_rng(0).standard_normal((3, 4, 5)) * np.array([1e-6, 0.1, 1.0, 10.0, 3.0])[None, None, :]
    np.testing.assert_allclose(peer_squash(tc.tensor(s), eps).numpy(), peer_reference(s, eps), rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(SQUASHES))
@given(data=st.data())
def test_squash_gradients_first_and_second_order(name, data):
    s = data.draw(arrays(data.draw(shapes(min_dims=1, max_dims=3))))
    if name == "efficient":  # Mazzia et al.'s divides by |s| itself: no derivative at s = 0, as in their code
        s = s + np.where(np.linalg.norm(s, axis=-1, keepdims=True) < 0.1, 0.5, 0.0)
    weight = np.random.default_rng(1).standard_normal(s.shape)
    check_both(lambda t: SQUASHES[name](t, 1e-3) * weight, [s])


@pytest.mark.parametrize("name", sorted(SQUASHES))
def test_squash_gradients_near_zero(name):
    s = np.random.default_rng(2).standard_normal((2, 3, 4)) * 1e-3
    weight = np.random.default_rng(3).standard_normal(s.shape)
    check_both(lambda t: SQUASHES[name](t, 1e-4) * weight, [s])


def test_peer_squash_is_linear_near_zero_and_sabours_is_cubic():
    """d v / d s at s = 0: sqrt(eps) for Peer et al.'s (their gradient survives short capsules),
    exactly 0 for Sabour et al.'s (|v| ~ |s|^3 / sqrt(eps))."""
    eps = 1e-8
    for scale in (1e-9, 1e-8):
        s = np.full((1, 4), scale)
        peer = peer_squash(tc.tensor(s), eps).numpy() - eps
        np.testing.assert_allclose(peer / s, np.sqrt(eps), rtol=1e-5)
        sabour = sabour_squash(tc.tensor(s), eps).numpy()
        norm2 = 4 * scale ** 2
        np.testing.assert_allclose(sabour / s, norm2 / (1 + norm2) / np.sqrt(norm2 + eps), rtol=1e-12)
    for squash, slope in ((peer_squash, np.sqrt(eps)), (sabour_squash, 0.0)):
        s = tc.tensor(np.zeros((1, 4)), requires_grad=True)
        (squash(s, eps)[0, 0]).backward()
        np.testing.assert_allclose(s.grad.numpy()[0], [slope / (1 + eps), 0, 0, 0], rtol=1e-9, atol=1e-300)


def test_squash_function_names_and_refuses_an_unknown_one():
    assert squash_function("peer", 1e-12).name == "peer" and squash_function("peer", 1e-12).eps == 1e-12
    assert squash_function("efficient").eps == 1e-20 and squash_function("efficient", 1e-8).eps == 1e-8
    with pytest.raises(ValueError, match="squash must be one of sabour, peer, efficient"):
        squash_function("mazzia")
    with pytest.raises(ValueError, match="squash"):
        CapsNetConfig(squash="mazzia")
    with pytest.raises(ValueError, match="squash_eps"):
        CapsNetConfig(squash_eps=0.0)


def test_peer_squash_reaches_primary_caps_and_every_routing_layer():
    tc.manual_seed(0)
    model = CapsNet(**SMALL, hidden_capsules="3x4", squash="peer", squash_eps=1e-6).to(dtype="float64")
    x = np.random.default_rng(0).random((2, 1, 12, 12))
    tc.manual_seed(0)
    sabour = CapsNet(**SMALL, hidden_capsules="3x4").to(dtype="float64")
    sabour.load_state_dict(model.state_dict())
    primary = model.primary(F.relu(model.conv1(tc.tensor(x))))
    raw = F.relu(sabour.conv1(tc.tensor(x)))
    conv = F.conv2d(raw, sabour.primary.weight, sabour.primary.bias, stride=2).numpy()
    side = conv.shape[-1]
    caps = conv.reshape(2, 2, 4, side, side).transpose(0, 1, 3, 4, 2).reshape(2, 2 * side * side, 4)
    np.testing.assert_allclose(primary.numpy(), peer_reference(caps, 1e-6), rtol=1e-10)
    u_hat = F.capsule_predict(primary, model.hidden[0].weight)
    expected = dynamic_routing(u_hat, 3, squash=squash_function("peer", 1e-6))
    np.testing.assert_allclose(model.hidden[0](primary).numpy(), expected.numpy(), rtol=1e-12)
    assert not np.allclose(model(x).v.numpy(), sabour(x).v.numpy())


def test_routing_under_no_grad_takes_the_squash_it_is_given():
    u_hat = tc.tensor(np.random.default_rng(4).standard_normal((2, 6, 3, 4)) * 1e-7)
    with tc.no_grad():
        plain = dynamic_routing(u_hat, 2).numpy()
        peer = dynamic_routing(u_hat, 2, squash=squash_function("peer")).numpy()
    assert np.abs(peer).min() > np.abs(plain).max()  # linear near zero: far longer outputs for tiny inputs


def test_peer_initialisation_of_every_routing_layer():
    tc.manual_seed(0)
    model = CapsNet(**SMALL, hidden_capsules="30x8,30x8", capsule_bias=True, capsule_init="peer")
    for name, layer in model.routing_layers():
        w = layer.weight.numpy()
        assert abs(w.std() - 0.2) < 0.02 and abs(w.mean()) < 0.02, name
        np.testing.assert_array_equal(layer.bias.numpy(), np.float32(0.1))
    tc.manual_seed(0)
    default = CapsNet(**SMALL, hidden_capsules="30x8,30x8", capsule_bias=True)
    tc.manual_seed(0)
    unchanged = CapsNet(**SMALL, hidden_capsules="30x8,30x8", capsule_bias=True, capsule_init="default")
    for (name, a), (_, b) in zip(default.named_parameters(), unchanged.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    assert default.digit.weight.numpy().std() < 0.02 and not default.digit.bias.numpy().any()
    official = CapsNet(**SMALL, conventions="official", capsule_init="peer")  # applied after the conventions'
    assert abs(official.digit.weight.numpy().std() - 0.2) < 0.03


def hidden_gradients(**options):
    """Gradient norms of the README's hidden-capsule example (two hidden layers of 32x12 with bias)
    on a small Fashion-MNIST-sized batch, reduced conv sizes."""
    tc.manual_seed(0)
    model = CapsNet(conv1_channels=16, primary_types=4, hidden_capsules="32x12,32x12", capsule_bias=True, **options)
    x = np.random.default_rng(0).random((4, 1, 28, 28)).astype(np.float32)
    y = np.array([0, 1, 2, 3])
    outputs = model(x, y)
    capsule_loss(outputs.lengths, outputs.reconstruction, x, y).backward()
    return {name: 0.0 if p.grad is None else float(np.linalg.norm(p.grad.numpy())) for name, p in model.named_parameters()}


def test_the_readme_hidden_capsule_example_gets_no_gradient_by_default_and_trains_with_peers_settings():
    """With the default initialisation (N(0, 0.01), zero bias) and Sabour et al.'s squash every
    routing layer shrinks its capsules to ~|s|^3 / 1e-4, so below the top layer nothing reaches the
    weights in float32; Peer et al.'s squash and initialisation let every parameter learn."""
    default = hidden_gradients()
    assert default["hidden.0.weight"] == 0.0 and default["hidden.1.weight"] == 0.0
    assert default["conv1.weight"] == 0.0 and default["primary.weight"] == 0.0
    peer = hidden_gradients(squash="peer", capsule_init="peer")
    assert all(norm > 1e-6 for name, norm in peer.items() if not name.startswith("decoder")), peer


def test_squash_and_capsule_init_on_the_command_line_and_in_the_checkpoint(tmp_path):
    write_striped_dataset(tmp_path / "data" / "tiny", (16, 8), compress=False)
    common = ["--dataset", "tiny", "--data-dir", str(tmp_path / "data"), "--conv1-channels", "4", "--primary-types",
              "2", "--primary-dim", "4", "--digit-dim", "4", "--kernel-size", "3", "--batch-size", "8", "--no-progress"]
    out = tmp_path / "run"
    assert cli.main(["train", *common, "--epochs", "1", "--out", str(out), "--squash", "peer", "--squash-eps", "1e-12",
                     "--capsule-init", "peer", "--hidden-capsules", "3x4", "--capsule-bias"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["squash"], config["squash_eps"], config["capsule_init"]) == ("peer", 1e-12, "peer")
    assert cli.main(["train", *common, "--epochs", "2", "--out", str(out), "--resume"]) == 0
    assert cli.main(["train", *common, "--epochs", "3", "--out", str(out), "--resume", "--squash", "sabour"]) == 2
    model, _ = load_checkpoint_model(out / "checkpoints" / "last.npz")
    assert model.primary.squash.name == "peer" and model.digit.squash.eps == 1e-12
