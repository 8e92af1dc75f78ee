"""CapsNet against the same network written in plain PyTorch (float64, weights copied from ours):
v, lengths, reconstruction, loss and every parameter's gradient, for 1 and 3 routing iterations and
both gradient modes; and a Hessian-vector product through the whole loss."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet, capsule_loss
from torch_reference import torch_capsnet

CONFIG = dict(image_size=16, kernel_size=5, conv1_channels=8, primary_types=4, primary_dim=8, digit_dim=16)


def relative_error(ours, ref):
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("gradient", ["full", "detach"])
@pytest.mark.parametrize("iterations", [1, 3])
def test_capsnet_matches_pytorch_in_float64(iterations, gradient):
    torch = pytest.importorskip("torch")
    tc.manual_seed(iterations)
    model = CapsNet(routing_iterations=iterations, routing_gradient=gradient, **CONFIG).to(dtype="float64")
    model.digit.weight.data = model.digit.weight.data * 20  # stronger routing than at initialization
    rng = np.random.default_rng(0)
    x = rng.random((3, 1, 16, 16))
    y = np.array([2, 7, 2])
    v, lengths, recon = model(x, y)
    loss = capsule_loss(lengths, recon, x, y)
    loss.backward()

    state = {k: torch.tensor(np.array(a), requires_grad=True) for k, a in model.state_dict().items()}
    tv, tl, tr, tloss = torch_capsnet(torch, state, torch.tensor(x), torch.tensor(y), iterations, gradient,
                                      types=4, dim=8)
    tloss.backward()
    errors = {"v": relative_error(v.numpy(), tv.detach().numpy()),
              "lengths": relative_error(lengths.numpy(), tl.detach().numpy()),
              "reconstruction": relative_error(recon.numpy(), tr.detach().numpy()),
              "loss": relative_error(np.array(loss.item()), tloss.detach().numpy())}
    for name, p in model.named_parameters():
        errors[f"grad {name}"] = relative_error(p.grad.numpy(), state[name].grad.numpy())
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-6, f"worst relative error {errors[worst]:.2e} in {worst}"


def test_hessian_vector_product_through_the_capsnet_loss():
    tc.manual_seed(5)
    config = dict(CONFIG, conv1_channels=4, primary_types=2)
    model = CapsNet(routing_iterations=3, **config).to(dtype="float64")
    params = list(model.parameters())
    rng = np.random.default_rng(1)
    x, y = rng.random((2, 1, 16, 16)), np.array([1, 4])
    direction = [rng.standard_normal(p.shape) for p in params]
    norm = np.sqrt(sum((d ** 2).sum() for d in direction))
    direction = [d / norm for d in direction]

    def gradients():
        _, lengths, recon = model(x, y)
        return tc.grad(capsule_loss(lengths, recon, x, y), params, create_graph=True)

    grads = gradients()
    hvp = tc.grad(sum((g * tc.tensor(d)).sum() for g, d in zip(grads, direction)), params)
    eps = 1e-5
    originals = [p.data.copy() for p in params]
    shifted = []
    for sign in (1, -1):
        for p, o, d in zip(params, originals, direction):
            p.data = o + sign * eps * d
        shifted.append([g.numpy() for g in gradients()])
    for p, o in zip(params, originals):
        p.data = o
    numeric = [(a - b) / (2 * eps) for a, b in zip(*shifted)]
    analytic = np.concatenate([h.numpy().ravel() for h in hvp])
    numeric = np.concatenate([n.ravel() for n in numeric])
    assert np.abs(analytic).max() > 1e-6
    np.testing.assert_allclose(analytic, numeric, rtol=1e-4, atol=1e-6 * np.abs(numeric).max())
