"""CapsNet's layers against NumPy without PyTorch: PrimaryCaps (with the official one-iteration
coupling), CapsuleLayer's defaults and routing, the initializations, and the size checks at
their boundaries."""
import numpy as np
import pytest

import tinygrad_caps as tc
from naive_conv import naive_conv2d
from reference_routing import route, squash
from tinygrad_caps.models import CapsNet
from tinygrad_caps.models.capsnet import CapsuleLayer, PrimaryCaps, parse_hidden_capsules


@pytest.mark.parametrize("coupling", [1.0, 0.25])
def test_primary_caps_equal_a_naive_convolution_regrouped_and_squashed(coupling):
    tc.manual_seed(0)
    layer = PrimaryCaps(3, types=2, dim=4, kernel_size=3, stride=2, coupling=coupling).to(dtype="float64")
    layer.bias.data = np.random.default_rng(1).standard_normal(8)  # nonzero, so its place matters
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 7))
    conv = naive_conv2d(x, layer.weight.numpy(), None, (2, 2), (0, 0)) * coupling + layer.bias.numpy()[None, :, None, None]
    b, _, h, w = conv.shape
    capsules = conv.reshape(b, 2, 4, h, w).transpose(0, 1, 3, 4, 2).reshape(b, 2 * h * w, 4)
    np.testing.assert_allclose(layer(tc.tensor(x)).numpy(), squash(capsules), rtol=1e-12, atol=1e-14)


def test_capsule_layer_defaults_route_three_iterations_without_bias():
    tc.manual_seed(3)
    layer = CapsuleLayer(5, 2, 3, 4).to(dtype="float64")
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    layer.weight.data = layer.weight.data * 100  # routing far from uniform
    u = np.random.default_rng(4).standard_normal((2, 5, 2))
    u_hat = np.einsum("ijdk,bik->bijd", layer.weight.numpy(), u)
    ref, couplings = route(u_hat, 3)
    assert np.abs(couplings[-1] - 1 / 3).max() > 1e-3
    np.testing.assert_allclose(layer(tc.tensor(u)).numpy(), ref, rtol=1e-12, atol=1e-14)


def test_capsule_weights_start_from_the_papers_normal():
    tc.manual_seed(5)
    model = CapsNet(image_size=12, kernel_size=3, conv1_channels=4, primary_types=4, primary_dim=8, digit_dim=16)
    w = model.digit.weight.numpy()
    assert w.size > 10000
    assert abs(w.mean()) < 1e-3 and abs(w.std() - 0.01) < 1e-3


@pytest.mark.parametrize("decoder", ["fc", "deconv"])
def test_official_initialization_leaves_a_non_official_decoder_alone(decoder):
    tc.manual_seed(6)
    model = CapsNet(image_size=12, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4,
                    num_classes=3, decoder=decoder, conventions="official")
    decoder_biases = [p.numpy() for name, p in model.named_parameters()
                      if name.startswith("decoder.") and name.endswith("bias")]
    official = all(np.all(b == np.float32(0.1)) for b in decoder_biases)
    assert official == (decoder == "fc")
    assert np.all(model.conv1.bias.numpy() == np.float32(0.1))


def test_size_checks_at_their_boundaries():
    assert CapsNet(image_size=5, kernel_size=3, conv1_channels=2, primary_types=1, primary_dim=2,
                   digit_dim=2, num_classes=2).num_primary == 1  # the primary grid is exactly 1x1
    assert CapsNet(image_size=1, kernel_size=1, conv1_channels=2, primary_types=1, primary_dim=2,
                   digit_dim=2, num_classes=2).num_primary == 1
    with pytest.raises(ValueError, match="CapsNet"):
        CapsNet(image_size=4, kernel_size=3)
    assert parse_hidden_capsules("1x1") == [[1, 1]]
    assert parse_hidden_capsules([(1, 2)]) == [[1, 2]]
    with pytest.raises(ValueError, match="hidden capsules"):
        parse_hidden_capsules([(0, 2)])
