"""Every routing algorithm on CuPy arrays through the engine's ops equals the NumPy path: a small
float64 CapsNet's class scores, trace and every parameter gradient (skipped without a GPU; also run
on the CPU stand-in for CuPy by tests/kernels/test_cupy_standin.py)."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps.models import CapsNet, capsule_loss, routing_names

pytestmark = pytest.mark.gpu

SMALL = dict(image_size=12, kernel_size=5, conv1_channels=4, primary_types=2, primary_dim=3, digit_dim=4,
             num_classes=3)


@pytest.mark.parametrize("routing", routing_names(builtin=True))
def test_routing_on_the_gpu_equals_the_cpu(routing):
    rng = np.random.default_rng(0)
    x, y = rng.random((3, 1, 12, 12)), np.array([0, 1, 2])
    results = {}
    for device in ("cpu", "cuda"):
        tc.manual_seed(4)
        model = CapsNet(routing=routing, hidden_capsules=[(4, 3)], em_inverse_temperature=1e-2, **SMALL)
        model = model.to(dtype="float64").to(device=device)
        images = tc.tensor(x, device=device)
        out = model(images, y, return_trace=True)
        capsule_loss(out.lengths, out.reconstruction, images, y).backward()
        couplings = [c.numpy() for trace in out.traces for c in trace.coupling]  # every layer, every iteration
        results[device] = (out.lengths.numpy(), couplings,
                           {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None})
        assert out.lengths.device == device
    (cpu_scores, cpu_c, cpu_grads), (gpu_scores, gpu_c, gpu_grads) = results["cpu"], results["cuda"]
    np.testing.assert_allclose(gpu_scores, cpu_scores, rtol=1e-9, atol=1e-12)
    assert len(gpu_c) == len(cpu_c)
    for gpu_coupling, cpu_coupling in zip(gpu_c, cpu_c):
        np.testing.assert_allclose(gpu_coupling, cpu_coupling, rtol=1e-9, atol=1e-12)
    assert gpu_grads.keys() == cpu_grads.keys()
    for name in cpu_grads:
        np.testing.assert_allclose(gpu_grads[name], cpu_grads[name], rtol=1e-7, atol=1e-12, err_msg=name)
