"""The paper's CNN baseline: layer shapes, the paper's parameter count, gradients, and learning."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import functional as F
from tinygrad_caps.gradcheck import check_grad
from tinygrad_caps.models import BaselineCNN


def test_layer_shapes_and_the_papers_parameter_count():
    model = BaselineCNN()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {"conv1.weight": (256, 1, 5, 5), "conv1.bias": (256,), "conv2.weight": (256, 256, 5, 5),
                      "conv2.bias": (256,), "conv3.weight": (128, 256, 5, 5), "conv3.bias": (128,),
                      "fc1.weight": (328, 128 * 28 * 28), "fc1.bias": (328,), "fc2.weight": (192, 328),
                      "fc2.bias": (192,), "fc3.weight": (10, 192), "fc3.bias": (10,)}
    count = sum(int(np.prod(s)) for s in shapes.values())
    assert round(count / 1e6, 1) == 35.4  # Sabour et al., section 5: "35.4M parameters"


def test_forward_shape_dropout_and_errors():
    tc.manual_seed(0)
    model = BaselineCNN(in_channels=3, image_size=8, num_classes=4, channels=(4, 4, 2), hidden=(6, 5))
    x = np.random.default_rng(0).random((2, 3, 8, 8))
    assert model(x).shape == (2, 4)
    model.eval()
    np.testing.assert_array_equal(model(x).numpy(), model(x).numpy())  # no dropout at evaluation
    model.train()
    tc.manual_seed(1)
    a = model(x).numpy()
    tc.manual_seed(2)
    assert not np.array_equal(a, model(x).numpy())  # dropout in training
    with pytest.raises(ValueError, match="BaselineCNN: expected images"):
        model(np.zeros((2, 1, 8, 8)))


def test_gradients_match_central_differences():
    tc.manual_seed(3)
    model = BaselineCNN(image_size=6, num_classes=3, channels=(2, 2, 2), hidden=(4, 3), dropout=0.0).to(dtype="float64")
    x = np.random.default_rng(1).random((2, 1, 6, 6))
    y = np.array([0, 2])
    names = [name for name, _ in model.named_parameters()]

    def loss(*weights):
        for name, w in zip(names, weights):
            module, attribute = name.rsplit(".", 1)
            setattr(getattr(model, module), attribute, w)
        return F.cross_entropy(model(x), y)

    check_grad(loss, [p.numpy() for p in model.parameters()])


def test_baseline_learns_a_separable_pattern():
    tc.manual_seed(4)
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, 60)
    images = rng.random((60, 1, 10, 10)).astype(np.float32) * 0.2
    for k, label in enumerate(labels):
        images[k, 0, 2 + 3 * label:4 + 3 * label, 2:8] = 1.0
    model = BaselineCNN(image_size=10, num_classes=3, channels=(8, 8, 4), hidden=(16, 8), dropout=0.2)
    optimizer = tc.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    accuracy = (model(images).numpy().argmax(1) == labels).mean()
    assert losses[-1] < 0.3 * losses[0] and accuracy >= 0.95
