"""PyTorch as a second oracle for ops, in float64 (skipped where PyTorch is not installed)."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F

torch = pytest.importorskip("torch")
rng = np.random.default_rng(0)
LABELS = np.array([1, 0, 3])

CASES = {
    "matmul_broadcast": (lambda m, a, b: m.matmul(a, b), [(2, 1, 3, 4), (5, 4, 2)]),
    "log_softmax": (lambda m, a: (m.log_softmax(a, 1) if m is F else torch.log_softmax(a, 1)), [(3, 5)]),
    "softmax": (lambda m, a: (m.softmax(a, 0) if m is F else torch.softmax(a, 0)), [(3, 5)]),
    "cross_entropy": (lambda m, a: (F.cross_entropy(a, LABELS) if m is F
                                    else torch.nn.functional.cross_entropy(a, torch.from_numpy(LABELS))), [(3, 4)]),
    "bce": (lambda m, a, b: (F.binary_cross_entropy(F.sigmoid(a), F.sigmoid(b)) if m is F else
                             torch.nn.functional.binary_cross_entropy(torch.sigmoid(a), torch.sigmoid(b))), [(3, 4), (3, 4)]),
    "max_axis": (lambda m, a: (F.max(a, axis=1) if m is F else torch.amax(a, dim=1)), [(3, 4)]),
    "leaky_relu": (lambda m, a: (F.leaky_relu(a, 0.2) if m is F else torch.nn.functional.leaky_relu(a, 0.2)), [(3, 4)]),
    "conv2d_strided": (lambda m, x, w: (F.conv2d(x, w, None, 2, 1) if m is F else
                                        torch.nn.functional.conv2d(x, w, None, 2, 1)), [(2, 3, 9, 9), (4, 3, 3, 3)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradient_match_pytorch(name):
    fn, shapes = CASES[name]
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = [tc.tensor(a, requires_grad=True) for a in arrays]
    refs = [torch.from_numpy(a).requires_grad_() for a in arrays]
    y = fn(F, *ours)
    y_ref = fn(torch, *refs)
    np.testing.assert_allclose(y.numpy(), y_ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    weight = rng.standard_normal(y.shape)
    (y * weight).sum().backward()
    (y_ref * torch.from_numpy(weight)).sum().backward()
    for a, b in zip(ours, refs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-12)
