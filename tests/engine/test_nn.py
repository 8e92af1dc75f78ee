"""Modules: parameter registration, modes, devices and dtypes, state_dict, init, PyTorch layouts."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * 3 * 3, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))))


def test_parameters_are_found_with_dotted_names_and_pytorch_shapes():
    net = Net()
    shapes = {name: p.shape for name, p in net.named_parameters()}
    assert shapes == {
        "conv.weight": (2, 1, 3, 3), "conv.bias": (2,), "bn.weight": (2,), "bn.bias": (2,),
        "head.1.weight": (4, 18), "head.1.bias": (4,), "head.3.weight": (2, 4), "head.3.bias": (2,),
    }
    assert set(net.state_dict()) == set(shapes) | {"bn.running_mean", "bn.running_var"}
    assert [type(m).__name__ for m in net.children()] == ["Conv2d", "BatchNorm2d", "Sequential"]


def test_forward_backward_zero_grad_and_modes():
    tc.manual_seed(0)
    net = Net()
    x = tc.randn(4, 1, 5, 5)
    F.cross_entropy(net(x), np.array([0, 1, 1, 0])).backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.eval()
    assert not net.bn.training and not net.head.training
    before = net.bn.running_mean.copy()
    net(x)
    np.testing.assert_array_equal(net.bn.running_mean, before)


def test_to_dtype_converts_parameters_and_buffers_in_place():
    net = Net()
    weight = net.conv.weight
    net.to(dtype="float64")
    assert net.conv.weight is weight and weight.dtype == np.float64
    assert net.bn.running_var.dtype == np.float64
    assert net(tc.tensor(np.zeros((2, 1, 5, 5)))).dtype == np.float64


def test_state_dict_round_trip_and_errors_name_every_bad_key():
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    state = dict(a.state_dict())
    state.pop("conv.bias")
    state["extra.weight"] = np.zeros(1)
    state["head.1.weight"] = np.zeros((5, 18))
    with pytest.raises(tc.StateDictError) as info:
        b.load_state_dict(state)
    message = str(info.value)
    assert "conv.bias" in message and "extra.weight" in message and "head.1.weight" in message and "(5, 18)" in message
    state["head.1.weight"] = a.state_dict()["head.1.weight"]
    result = b.load_state_dict(state, strict=False)
    assert result.missing_keys == ["conv.bias"] and result.unexpected_keys == ["extra.weight"]


def test_init_is_seeded_and_has_the_documented_spread():
    tc.manual_seed(3)
    w1 = nn.init.xavier_uniform_(nn.Parameter(np.zeros((200, 300))))
    tc.manual_seed(3)
    w2 = nn.init.xavier_uniform_(nn.Parameter(np.zeros((200, 300))))
    np.testing.assert_array_equal(w1.numpy(), w2.numpy())
    bound = np.sqrt(6 / 500)
    assert np.abs(w1.numpy()).max() <= bound and np.abs(w1.numpy()).max() > 0.95 * bound
    k = nn.init.kaiming_normal_(nn.Parameter(np.zeros((256, 64, 3, 3))), nonlinearity="relu")
    assert abs(k.numpy().std() - np.sqrt(2 / (64 * 9))) < 0.01 * np.sqrt(2 / (64 * 9)) * 10
    n = nn.init.normal_(nn.Parameter(np.zeros(10000)), 1.0, 0.5)
    assert abs(n.numpy().mean() - 1.0) < 0.03 and abs(n.numpy().std() - 0.5) < 0.03


def test_layers_match_pytorch_in_float64():
    torch = pytest.importorskip("torch")
    tc.manual_seed(1)
    x = np.random.default_rng(0).standard_normal((3, 2, 6, 6))
    ours = nn.Sequential(nn.Conv2d(2, 3, 3, stride=2, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                         nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1), nn.Sigmoid())
    ours.to(dtype="float64")
    ref = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, stride=2, padding=1), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
                              torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
                              torch.nn.Sigmoid()).double()
    ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ours.state_dict().items()}, strict=False)
    xt = torch.from_numpy(x).requires_grad_()
    y_ref = ref(xt)
    y = ours(tc.tensor(x))
    np.testing.assert_allclose(y.numpy(), y_ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    (y * y).sum().backward()
    (y_ref * y_ref).sum().backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(ours[1].running_var, ref[1].running_var.numpy(), rtol=1e-12)
