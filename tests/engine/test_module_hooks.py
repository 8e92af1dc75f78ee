"""Module.register_forward_hook / register_forward_pre_hook and their handles."""
import numpy as np

import tinygrad_caps as tc
from tinygrad_caps import nn


def linear():
    tc.manual_seed(0)
    return nn.Linear(3, 2)


def test_forward_hook_sees_module_inputs_and_output_and_can_replace_the_output():
    layer = linear()
    x = tc.Tensor(np.ones((4, 3)))
    seen = []

    def observe(module, inputs, output):
        seen.append((module, inputs, output))

    handle = layer.register_forward_hook(observe)
    y = layer(x)
    assert len(seen) == 1 and seen[0][0] is layer and seen[0][1] == (x,) and seen[0][2] is y
    doubling = layer.register_forward_hook(lambda module, inputs, output: output * 2)
    np.testing.assert_allclose(layer(x).numpy(), 2 * y.numpy())
    assert len(seen) == 2
    handle.remove()
    doubling.remove()
    doubling.remove()  # a second remove does nothing
    np.testing.assert_array_equal(layer(x).numpy(), y.numpy())
    assert len(seen) == 2


def test_forward_pre_hook_runs_before_and_can_replace_the_inputs():
    layer = linear()
    x = tc.Tensor(np.ones((4, 3)))
    order = []
    pre = layer.register_forward_pre_hook(lambda module, inputs: order.append(("pre", inputs[0].shape)))
    post = layer.register_forward_hook(lambda module, inputs, output: order.append(("post", output.shape)))
    layer(x)
    assert order == [("pre", (4, 3)), ("post", (4, 2))]
    zeroing = layer.register_forward_pre_hook(lambda module, inputs: (inputs[0] * 0,))
    np.testing.assert_allclose(layer(x).numpy(), np.broadcast_to(layer.bias.numpy(), (4, 2)))
    for handle in (pre, post, zeroing):
        handle.remove()
    assert not np.allclose(layer(x).numpy(), np.broadcast_to(layer.bias.numpy(), (4, 2)))


def test_hooks_on_a_submodule_fire_inside_the_parent_and_gradients_flow_through_replacements():
    model = nn.Sequential(linear(), nn.Linear(2, 1))
    captured = {}
    handle = model[0].register_forward_hook(lambda m, i, o: captured.setdefault("hidden", o))
    model[0].register_forward_hook(lambda m, i, o: o * 3)
    x = tc.Tensor(np.ones((1, 3)))
    out = model(x)
    assert captured["hidden"].shape == (1, 2)
    out.sum().backward()
    expected = 3 * model[1].weight.numpy().T @ np.ones((1, 1))  # d out / d hidden, times the hook's factor
    np.testing.assert_allclose(model[0].bias.grad.numpy(), expected.ravel(), rtol=1e-6)
    handle.remove()
