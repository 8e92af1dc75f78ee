"""The routing and layout semantics that public CapsNet implementations got wrong, pinned down."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.models import CapsNet, FCDecoder, PrimaryCaps, capsule_loss, dynamic_routing, margin_loss

SMALL = dict(image_size=16, kernel_size=5, conv1_channels=8, primary_types=4, primary_dim=8, digit_dim=16)


def random_u_hat(b=3, i=12, j=5, d=4, seed=0):
    return tc.tensor(np.random.default_rng(seed).standard_normal((b, i, j, d)), requires_grad=True)


def test_coupling_coefficients_sum_to_one_over_output_capsules():
    v, couplings = dynamic_routing(random_u_hat(), iterations=3, return_coupling=True)
    assert len(couplings) == 3 and v.shape == (3, 5, 4)
    for c in couplings:
        np.testing.assert_allclose(c.numpy().sum(axis=2), 1.0, rtol=1e-12)  # for every example and input capsule
    assert not np.allclose(couplings[1].numpy(), couplings[2].numpy())  # the logits did change


def test_routing_logits_are_per_example():
    u_hat = random_u_hat()
    together = dynamic_routing(u_hat, 3).numpy()
    for k in range(3):
        alone = dynamic_routing(tc.tensor(u_hat.numpy()[k:k + 1]), 3).numpy()
        np.testing.assert_allclose(together[k:k + 1], alone, rtol=1e-12)


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
def test_every_configured_iteration_runs(monkeypatch, iterations):
    calls = {"weighted_sum": 0, "agreement": 0}
    weighted_sum, agreement = F.routing_weighted_sum, F.routing_agreement

    def counting_sum(*a):
        calls["weighted_sum"] += 1
        return weighted_sum(*a)

    def counting_agreement(*a):
        calls["agreement"] += 1
        return agreement(*a)

    monkeypatch.setattr(F, "routing_weighted_sum", counting_sum)
    monkeypatch.setattr(F, "routing_agreement", counting_agreement)
    dynamic_routing(random_u_hat(), iterations)
    assert calls == {"weighted_sum": iterations, "agreement": iterations - 1}
    calls.update(weighted_sum=0, agreement=0)
    model = CapsNet(routing_iterations=iterations, **SMALL)
    model(np.zeros((2, 1, 16, 16), np.float32))
    assert calls == {"weighted_sum": iterations, "agreement": iterations - 1}


def test_detach_mode_passes_gradient_through_the_last_iteration_only():
    u_hat = random_u_hat()
    weight = np.random.default_rng(1).standard_normal((3, 5, 4))
    (full,) = tc.grad((dynamic_routing(u_hat, 3, "full") * weight).sum(), u_hat)
    (detached,) = tc.grad((dynamic_routing(u_hat, 3, "detach") * weight).sum(), u_hat)
    # expected: the last iteration with its coupling coefficients held constant
    _, couplings = dynamic_routing(u_hat.detach(), 3, return_coupling=True)
    last_c = couplings[-1].detach()
    (expected,) = tc.grad((F.squash(F.routing_weighted_sum(last_c, u_hat)) * weight).sum(), u_hat)
    np.testing.assert_allclose(detached.numpy(), expected.numpy(), rtol=1e-12, atol=1e-14)
    assert not np.allclose(full.numpy(), detached.numpy())
    np.testing.assert_allclose(dynamic_routing(u_hat, 3, "full").numpy(), dynamic_routing(u_hat, 3, "detach").numpy())
    (one_full,) = tc.grad((dynamic_routing(u_hat, 1, "full") * weight).sum(), u_hat)
    (one_detached,) = tc.grad((dynamic_routing(u_hat, 1, "detach") * weight).sum(), u_hat)
    np.testing.assert_allclose(one_full.numpy(), one_detached.numpy())


def test_primary_caps_keeps_each_capsules_components_together():
    """Channel c = type*dim + component; capsule index = type*H*W + y*W + x."""
    types, dim, h, w = 3, 4, 2, 5
    layer = PrimaryCaps(types * dim, types, dim, kernel_size=1, stride=1)
    layer.weight.data = np.eye(types * dim).reshape(types * dim, types * dim, 1, 1)
    layer.bias.data = np.zeros(types * dim)
    x = np.random.default_rng(0).standard_normal((2, types * dim, h, w))
    u = layer(tc.tensor(x)).numpy()
    assert u.shape == (2, types * h * w, dim)
    for t in range(types):
        for yy in range(h):
            for xx in range(w):
                s = x[:, t * dim:(t + 1) * dim, yy, xx]
                sq = (s ** 2).sum(axis=1, keepdims=True)
                np.testing.assert_allclose(u[:, t * h * w + yy * w + xx], sq / (1 + sq) * s / np.sqrt(sq + 1e-8))
    # one channel set alone lands in exactly one component of one capsule type
    only = np.zeros_like(x)
    only[:, 2 * dim + 3] = 5.0
    hit = np.abs(layer(tc.tensor(only)).numpy()) > 0
    assert hit[:, 2 * h * w:3 * h * w, 3].all() and hit.sum() == 2 * h * w


class RecordingDecoder(tc.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, x):
        self.seen.append(x.numpy())
        return self.inner(x)


def test_decoder_masks_by_label_when_given_and_by_the_longest_capsule_otherwise():
    tc.manual_seed(0)
    model = CapsNet(**SMALL).to(dtype="float64")
    model.decoder = RecordingDecoder(model.decoder)
    x = np.random.default_rng(0).random((4, 1, 16, 16))
    labels = np.array([3, 1, 4, 1])
    v, lengths, recon = model(x, labels)
    masked = model.decoder.seen[-1].reshape(4, 10, 16)
    for k in range(4):
        np.testing.assert_array_equal(masked[k, labels[k]], v.numpy()[k, labels[k]])
        assert np.count_nonzero(np.abs(masked[k]).sum(axis=1)) == 1
    model.eval()
    v, lengths, recon = model(x)
    predicted = lengths.numpy().argmax(axis=1)
    masked = model.decoder.seen[-1].reshape(4, 10, 16)
    for k in range(4):
        np.testing.assert_array_equal(masked[k, predicted[k]], v.numpy()[k, predicted[k]])
    assert recon.shape == (4, 256)
    np.testing.assert_allclose(lengths.numpy(), np.sqrt((v.numpy() ** 2).sum(-1) + 1e-8))


def test_margin_loss_formula_and_label_types():
    lengths = tc.tensor(np.array([[0.95, 0.05, 0.5], [0.2, 0.8, 0.0]]))
    expected = [0.5 * 0.4 ** 2, 0.1 ** 2 + 0.5 * 0.1 ** 2]
    np.testing.assert_allclose(margin_loss(lengths, np.array([0, 1])).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(margin_loss(lengths, tc.tensor(np.array([0, 1]))).numpy(), expected, rtol=1e-12)
    recon = tc.tensor(np.full((2, 4), 0.5))
    images = np.zeros((2, 1, 2, 2))
    loss = capsule_loss(lengths, recon, images, np.array([0, 1]), reconstruction_weight=0.1)
    np.testing.assert_allclose(loss.item(), np.mean(np.array(expected) + 0.1 * 1.0), rtol=1e-12)


def test_model_runs_in_float64_and_float32_and_checks_input_shape():
    model = CapsNet(**SMALL)
    assert model(np.zeros((2, 1, 16, 16)))[0].dtype == np.float32
    model.to(dtype="float64")
    assert model(np.zeros((2, 1, 16, 16), np.float32))[1].dtype == np.float64
    with pytest.raises(ValueError, match="expected images"):
        model(np.zeros((2, 1, 28, 28)))


def test_sizes_derive_from_the_arguments():
    model = CapsNet(in_channels=3, image_size=32, num_classes=7, **{k: v for k, v in SMALL.items() if k != "image_size"})
    assert model.digit.weight.shape == (4 * 12 * 12, 7, 16, 8)  # conv1 28x28, primary (28-5)//2+1 = 12
    v, lengths, recon = model(np.zeros((2, 3, 32, 32), np.float32))
    assert v.shape == (2, 7, 16) and lengths.shape == (2, 7) and recon.shape == (2, 3 * 32 * 32)
    deconv = CapsNet(decoder="deconv", **SMALL)
    fc = CapsNet(decoder="fc")
    full_deconv = CapsNet(decoder="deconv")
    assert sum(p.size for p in full_deconv.decoder.parameters()) < 0.25 * sum(p.size for p in fc.decoder.parameters())
    assert deconv(np.zeros((2, 1, 16, 16), np.float32))[2].shape == (2, 256)
    bn = CapsNet(decoder="deconv-bn", **SMALL)
    assert bn(np.zeros((2, 1, 16, 16), np.float32), np.array([0, 1]))[2].shape == (2, 256)


def test_decoder_hidden_sizes_the_fc_decoder_and_nothing_else():
    model = CapsNet(decoder_hidden=(6, 5), **SMALL)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("decoder.")}
    assert shapes == {"decoder.fc1.weight": (6, 160), "decoder.fc1.bias": (6,), "decoder.fc2.weight": (5, 6),
                      "decoder.fc2.bias": (5,), "decoder.fc3.weight": (256, 5), "decoder.fc3.bias": (256,)}
    default = CapsNet(**SMALL)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith("decoder.")} == \
        {k: tuple(v.shape) for k, v in default.state_dict().items() if not k.startswith("decoder.")}
    assert model(np.zeros((2, 1, 16, 16), np.float32))[2].shape == (2, 256)
    assert model.config.to_dict()["decoder_hidden"] == [6, 5]
    with pytest.raises(ValueError, match="decoder_hidden.*fully connected decoder"):
        CapsNet(decoder="deconv", decoder_hidden=(6, 5), **SMALL)
    with pytest.raises(ValueError, match="decoder_hidden must be 2 positive integers"):
        CapsNet(decoder_hidden=(6, 0), **SMALL)
    with pytest.raises(ValueError, match="FCDecoder: hidden must be two positive unit counts"):
        FCDecoder(4, 9, hidden=(3,))


def test_default_parameter_names_and_shapes():
    shapes = {k: tuple(v.shape) for k, v in CapsNet().state_dict().items()}
    assert shapes == {
        "conv1.weight": (256, 1, 9, 9), "conv1.bias": (256,), "primary.weight": (256, 256, 9, 9),
        "primary.bias": (256,), "digit.weight": (1152, 10, 16, 8), "decoder.fc1.weight": (512, 160),
        "decoder.fc1.bias": (512,), "decoder.fc2.weight": (1024, 512), "decoder.fc2.bias": (1024,),
        "decoder.fc3.weight": (784, 1024), "decoder.fc3.bias": (784,),
    }
