"""conventions="official", leaky routing and the official margin-loss scaling, against a reference
written here that follows the operations of the authors' TensorFlow code (Sarasra/models,
research/capsules: models/capsule_model.py, models/layers/layers.py) literally, in float64 PyTorch:
the convolutional PrimaryCaps as a one-iteration capsule layer, votes from the official weight
layout [input_dim, input_atoms, output_dim * output_atoms], the bias inside the routing loop, the
leaky softmax by concatenation, and the margin loss as ``_margin_loss`` + ``reduce_mean``.

The one deliberate difference kept in the reference: the official squash and capsule lengths use
tf.norm without an epsilon; ours add 1e-8 under the square root where the norm divides (the squash's
t / |t|) and in the lengths (a finite gradient at zero length), and so does the reference."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet, capsule_loss, dynamic_routing, margin_loss

CONFIG = dict(image_size=14, kernel_size=5, conv1_channels=6, primary_types=3, primary_dim=4, digit_dim=5)
EPS = 1e-8


def official_reference(torch, p, x, labels, types, atoms, num_routing, leaky, hidden=()):
    """The official model's total loss (margin + reconstruction), op for op; ``p`` holds our
    parameters as float64 torch tensors (our layouts, converted to the official ones here)."""
    f = torch.nn.functional

    def squash(t, axis):  # layers.py _squash: (t / |t|) * |t|^2 / (1 + |t|^2), |t| + eps where it divides
        norm_squared = (t * t).sum(axis, keepdim=True)
        return (t / torch.sqrt(norm_squared + EPS)) * (norm_squared / (1 + norm_squared))

    def route_softmax(logits, output_dim):  # layers.py: softmax or _leaky_routing over dim 2
        if not leaky:
            return torch.softmax(logits, dim=2)
        leak = torch.zeros_like(logits).sum(2, keepdim=True)
        leaky_logits = torch.cat([leak, logits], dim=2)
        return torch.split(torch.softmax(leaky_logits, dim=2), [1, output_dim], dim=2)[1]

    def update_routing(votes, biases, num_dims, input_dim, output_dim, routing):  # layers.py _update_routing
        votes_t_shape = [3, 0, 1, 2] + [i + 4 for i in range(num_dims - 4)]
        r_t_shape = [1, 2, 3, 0] + [i + 4 for i in range(num_dims - 4)]
        votes_trans = votes.permute(*votes_t_shape)
        logit_shape = (votes.shape[0], input_dim, output_dim) + tuple(votes.shape[4:])
        logits = torch.zeros(logit_shape, dtype=votes.dtype)
        for _ in range(routing):
            route = route_softmax(logits, output_dim)
            preactivate_unrolled = route * votes_trans
            preact_trans = preactivate_unrolled.permute(*r_t_shape)
            preactivate = preact_trans.sum(1) + biases
            activation = squash(preactivate, axis=2)
            act_replicated = activation.unsqueeze(1).expand(*votes.shape)
            distances = (votes * act_replicated).sum(3)
            logits = logits + distances
        return activation

    def capsule(u, weight_ijdk, bias, routing):  # layers.py capsule (fully connected)
        input_dim, output_dim, output_atoms, input_atoms = weight_ijdk.shape
        weights = weight_ijdk.permute(0, 3, 1, 2).reshape(input_dim, input_atoms, output_dim * output_atoms)
        input_tiled = u.unsqueeze(-1).expand(-1, -1, -1, output_dim * output_atoms)
        votes = (input_tiled * weights).sum(2).reshape(-1, input_dim, output_dim, output_atoms)
        return update_routing(votes, bias, 4, input_dim, output_dim, routing)

    batch = x.shape[0]
    relu1 = f.relu(f.conv2d(x, p["conv1.weight"], p["conv1.bias"]))  # capsule_model.py inference, VALID
    hidden1 = relu1.unsqueeze(1)  # [batch, 1, 256, h, w]
    # conv_slim_capsule(input_dim=1, output_dim=types, num_routing=1): _depthwise_conv3d, then routing
    _, _, in_atoms, h, w = hidden1.shape
    conv = f.conv2d(hidden1.reshape(batch * 1, in_atoms, h, w), p["primary.weight"], None, stride=2)
    votes = conv.reshape(batch, 1, types, atoms, conv.shape[2], conv.shape[3])
    biases = p["primary.bias"].reshape(types, atoms, 1, 1).expand(-1, -1, conv.shape[2], conv.shape[3])
    capsule1 = update_routing(votes, biases, 6, 1, types, 1)
    capsule1_3d = capsule1.permute(0, 1, 3, 4, 2).reshape(batch, -1, atoms)
    u = capsule1_3d
    for k in range(len(hidden)):
        u = capsule(u, p[f"hidden.{k}.weight"], p[f"hidden.{k}.bias"], 3)
    capsule_output = capsule(u, p["digit.weight"], p["digit.bias"], 3)
    logits = torch.sqrt((capsule_output * capsule_output).sum(-1) + EPS)  # tf.norm(capsule_output, axis=-1)
    one_hot = f.one_hot(labels, capsule_output.shape[1]).to(x.dtype)
    # layers.py _margin_loss, then evaluate: reduce_mean over batch and classes
    raw = logits - 0.5
    margin = 0.4
    positive_cost = one_hot * (raw < margin).to(x.dtype) * (raw - margin) ** 2
    negative_cost = (1 - one_hot) * (raw > -margin).to(x.dtype) * (raw + margin) ** 2
    classification_loss = (0.5 * positive_cost + 0.5 * 0.5 * negative_cost).mean()
    # layers.py reconstruction: masked embedding, FC 512 relu, 1024 relu, sigmoid; 0.0005 * mean(sum)
    filtered = (capsule_output * one_hot.unsqueeze(-1)).reshape(batch, -1)
    d = f.relu(f.linear(filtered, p["decoder.fc1.weight"], p["decoder.fc1.bias"]))
    d = f.relu(f.linear(d, p["decoder.fc2.weight"], p["decoder.fc2.bias"]))
    reconstruction = torch.sigmoid(f.linear(d, p["decoder.fc3.weight"], p["decoder.fc3.bias"]))
    recon_loss = 0.0005 * ((reconstruction - x.reshape(batch, -1)) ** 2).sum(-1).mean()
    return classification_loss + recon_loss


@pytest.mark.parametrize("hidden", [(), ((4, 3),)])
@pytest.mark.parametrize("leaky", [False, True])
def test_official_model_loss_and_gradients_equal_the_literal_reference(leaky, hidden):
    torch = pytest.importorskip("torch")
    tc.manual_seed(3)
    model = CapsNet(conventions="official", leaky_routing=leaky, hidden_capsules=hidden, **CONFIG).to(dtype="float64")
    rng = np.random.default_rng(4)
    x, y = rng.random((3, 1, 14, 14)), np.array([1, 8, 3])
    _, lengths, recon = model(x, y)
    loss = capsule_loss(lengths, recon, x, y, convention="official")
    loss.backward()
    state = {k: torch.tensor(np.array(a), requires_grad=True) for k, a in model.state_dict().items()}
    ref = official_reference(torch, state, torch.tensor(x), torch.tensor(y), 3, 4, 3, leaky, hidden)
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-10 * abs(ref.item())
    for name, p in model.named_parameters():
        expected = state[name].grad.numpy()
        assert np.abs(expected).max() > 0, name
        error = np.abs(p.grad.numpy() - expected).max() / np.abs(expected).max()
        assert error <= 1e-10, f"{name}: relative error {error:.2e}"


def test_official_initialization_and_parameter_names():
    tc.manual_seed(0)
    paper = CapsNet(**CONFIG)
    tc.manual_seed(0)
    official = CapsNet(conventions="official", **CONFIG)
    assert set(official.state_dict()) == set(paper.state_dict()) | {"digit.bias"}
    stacked = CapsNet(conventions="official", hidden_capsules=[(4, 3)], **CONFIG)
    assert {k for k in stacked.state_dict() if k.endswith("bias")} >= {"hidden.0.bias", "digit.bias"}
    state = official.state_dict()
    for name, a in state.items():
        if name.endswith("bias"):
            assert np.all(a == np.float32(0.1)), name
        else:
            std = 5e-2 if name == "conv1.weight" else 0.1
            assert np.abs(a).max() <= 2 * std + 1e-7, name  # truncated at two standard deviations
    big = CapsNet(conventions="official", image_size=28, kernel_size=9, conv1_channels=16, primary_types=4)
    w = big.digit.weight.numpy()
    # a normal N(0, 0.1) truncated at +-0.2 has standard deviation 0.1 * 0.8796
    assert abs(w.std() - 0.08796) < 0.002 and abs(w.mean()) < 0.002
    # capsule_bias and the official convention share one bias parameter
    both = CapsNet(conventions="official", capsule_bias=True, **CONFIG)
    assert set(both.state_dict()) == set(official.state_dict())
    assert np.all(both.digit.bias.numpy() == np.float32(0.1))
    with pytest.raises(ValueError, match="conventions"):
        CapsNet(conventions="tensorflow", **CONFIG)


def test_official_margin_loss_on_hand_computed_values():
    lengths = tc.tensor(np.array([[0.95, 0.3, 0.05], [0.5, 0.2, 0.8]]))
    labels = np.array([0, 2])
    # paper: example 0 pays 0.5 * (0.3 - 0.1)^2 = 0.02; example 1 pays 0.5 * 0.4^2 + 0.5 * 0.1^2 + 0.1^2 = 0.095
    np.testing.assert_allclose(margin_loss(lengths, labels).numpy(), [0.02, 0.095], rtol=1e-12)
    # official: per class 0.5 T pos + 0.25 (1 - T) neg, mean over the 3 classes
    expected = [0.25 * 0.04 / 3, (0.25 * 0.16 + 0.25 * 0.01 + 0.5 * 0.01) / 3]
    np.testing.assert_allclose(margin_loss(lengths, labels, convention="official").numpy(), expected, rtol=1e-12)
    recon, images = tc.tensor(np.full((2, 4), 0.5)), np.zeros((2, 4))
    official = capsule_loss(lengths, recon, images, labels, convention="official").item()
    assert official == pytest.approx(np.mean(expected) + 0.0005 * 1.0, rel=1e-12)
    with pytest.raises(ValueError, match="convention"):
        margin_loss(lengths, labels, convention="tf")


def test_leaky_routing_couplings_sum_below_one_and_exactly_one_without():
    u_hat = tc.tensor(np.random.default_rng(5).standard_normal((2, 6, 4, 3)))
    _, leaky = dynamic_routing(u_hat, 3, return_coupling=True, leaky_routing=True)
    _, plain = dynamic_routing(u_hat, 3, return_coupling=True)
    for c in leaky:
        sums = c.numpy().sum(axis=2)
        assert np.all(sums < 1) and np.all(sums > 0)
    np.testing.assert_allclose(leaky[0].numpy(), 1 / 5)  # softmax of J + 1 zero logits
    for c in plain:
        np.testing.assert_allclose(c.numpy().sum(axis=2), 1.0, rtol=0, atol=1e-15)


def test_checkpoints_record_and_restore_the_conventions(tmp_path):
    from tinygrad_caps.models.app.training.checkpoints import build_model, load_checkpoint_model

    config = dict(CONFIG, in_channels=1, num_classes=10, conventions="official", leaky_routing=True)
    model = build_model(config)
    assert model.config["conventions"] == "official" and model.config["leaky_routing"] is True
    path = tmp_path / "official.npz"
    tc.save({"model": model.state_dict(), "config": dict(model.config, dataset="tiny")}, path)
    restored, restored_config = load_checkpoint_model(path)
    assert restored_config["conventions"] == "official" and restored.primary.coupling == pytest.approx(1 / 4)
    assert restored.digit.leaky_routing is True
    x = np.random.default_rng(6).random((2, 1, 14, 14)).astype(np.float32)
    np.testing.assert_array_equal(restored(x)[1].numpy(), model(x)[1].numpy())
    with pytest.raises((tc.StateDictError, tc.CheckpointError), match=r"unexpected keys: digit\.bias"):
        load_checkpoint_model(path, overrides={"conventions": "paper"})
