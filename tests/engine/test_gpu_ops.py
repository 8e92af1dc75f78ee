"""Every op on CuPy equals the NumPy path, forward and gradient (skipped without a GPU)."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F

pytestmark = pytest.mark.gpu

rng = np.random.default_rng(0)
LABELS = np.array([0, 2, 1, 2])

CASES = {
    "add": (lambda a, b: a + b, [(4, 3), (3,)]),
    "sub_mul_div": (lambda a, b: (a - b) * a / (b * b + 1.0), [(4, 3), (4, 1)]),
    "pow_exp_log_sqrt": (lambda a: F.sqrt(F.exp(a) + 1.0) ** 1.5 + F.log(a * a + 1.0), [(5, 2)]),
    "abs_max_min_clip": (lambda a, b: F.maximum(a, b) * F.minimum(a, b) + F.clip(a, -0.5, 0.5) + F.abs(b), [(3, 4), (3, 4)]),
    "where": (lambda a, b: F.where(a.data > 0, a, b), [(3, 4), (3, 4)]),
    "reductions": (lambda a: F.sum(a, 1) + F.mean(a, 1) + F.max(a, 1) + F.min(a, 1), [(3, 4)]),
    "shapes": (lambda a: F.stack([F.transpose(F.reshape(a, (4, 3))), F.squeeze(F.expand_dims(a, 0), 0)]), [(3, 4)]),
    "index_concat_pad": (lambda a: F.concatenate([a[np.array([0, 0, 2])], F.pad(a, 1)[1:4, 1:5]], 0), [(3, 4)]),
    "broadcast_to": (lambda a: F.broadcast_to(a, (2, 3, 4)), [(3, 1)]),
    "matmul_linear": (lambda a, b, c: F.linear(F.matmul(a, b), c), [(2, 3, 4), (4, 5), (2, 5)]),
    "activations": (lambda a: F.relu(a) + F.leaky_relu(a, 0.1) + F.sigmoid(a) + F.tanh(a), [(3, 4)]),
    "softmax_family": (lambda a: F.softmax(a, 0) + F.log_softmax(a, 1) + F.squash(a, 1), [(3, 4)]),
    "row_kernels_squash_softmax": (lambda a: F.squash(a, -1) * F.softmax(a, -1) + F.squash(a * 1e-3, 2), [(5, 3, 4)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, 2, 1), [(2, 3, 7, 7), (4, 3, 3, 3), (4,)]),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, None, 2, 1, 1), [(2, 3, 4, 4), (3, 2, 3, 3)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(4, 3, 2, 2), (3,), (3,)]),
    "losses": (lambda a, b: F.mse_loss(a, b) + F.binary_cross_entropy(F.sigmoid(a), F.sigmoid(b)) + F.cross_entropy(a, LABELS),
               [(4, 3), (4, 3)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_on_cupy_equals_numpy(name):
    fn, shapes = CASES[name]
    arrays = [rng.standard_normal(s) for s in shapes]
    results = {}
    for device in ("cpu", "cuda"):
        xs = [tc.tensor(a, device=device, requires_grad=True) for a in arrays]
        y = fn(*xs)
        weight = tc.tensor(np.linspace(-1, 1, y.size).reshape(y.shape), device=device)
        (y * weight).sum().backward()
        results[device] = (y.numpy(), [x.grad.numpy() for x in xs])
        assert y.device == device
    np.testing.assert_allclose(results["cuda"][0], results["cpu"][0], rtol=1e-10, atol=1e-12)
    for g_gpu, g_cpu in zip(results["cuda"][1], results["cpu"][1]):
        np.testing.assert_allclose(g_gpu, g_cpu, rtol=1e-10, atol=1e-12)


def test_mixing_devices_names_both():
    a = tc.tensor(np.ones(2), device="cuda")
    b = tc.tensor(np.ones(2), device="cpu")
    with pytest.raises(tc.DeviceError, match="cuda.*cpu|cpu.*cuda"):
        a + b


def test_gradient_flows_back_across_a_device_move():
    x = tc.tensor(np.array([1.0, 2.0]), device="cpu", requires_grad=True)
    y = (x.to("cuda") ** 2).sum()
    y.backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_double_backward_on_the_gpu():
    x = tc.tensor(np.array([0.5, -0.3]), device="cuda", requires_grad=True)
    (g,) = tc.grad(F.tanh(x).sum(), x, create_graph=True)
    g.sum().backward()
    t = np.tanh(x.numpy())
    np.testing.assert_allclose(x.grad.numpy(), -2 * t * (1 - t ** 2), rtol=1e-12)
