"""Every op of the op table (tests/support/op_table.py) on CuPy equals the NumPy path: forward,
gradient and second-order gradient, on the op's drawn domain and on its fixed cases (shapes that
reach the kernels). Skipped without a GPU."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from op_table import OPS, bound, case_params, ids, reference

pytestmark = pytest.mark.gpu

GPU = [op for op in OPS if op.tested("gpu")]
GPU_CASES = case_params(OPS, "gpu")


def _numpy(tensors, like):
    return [np.zeros(a.shape) if g is None else g.numpy() for g, a in zip(tensors, like)]


def on_device(op, sample, device):
    """The op's value, gradient and second-order gradient at ``sample`` on ``device``, as NumPy arrays."""
    arrays = sample.arrays()
    differentiable = op.tested("grad") and bool(arrays)
    inputs = [tc.tensor(a, device=device, requires_grad=differentiable) for a in arrays]

    def constant(value):
        return tc.tensor(np.array(value), device=device)

    y = bound(op, sample, constant)(*inputs)
    assert y.device == device
    results = {"forward": y.numpy()}
    if differentiable:
        weight = tc.tensor(np.linspace(-1, 1, y.size).reshape(y.shape), device=device)
        results["gradient"] = _numpy(tc.grad((y * weight).sum(), inputs, allow_unused=True), arrays)
    if differentiable and op.tested("second_order"):
        y = bound(op, sample, constant, square=op.square_for_second_order)(*inputs)
        firsts = tc.grad((y * weight).sum(), inputs, create_graph=True, allow_unused=True)
        terms = [(g * tc.tensor(np.cos(np.arange(a.size)).reshape(a.shape), device=device)).sum()
                 for g, a in zip(firsts, arrays) if g is not None and g.requires_grad]
        if terms:
            results["second order"] = _numpy(tc.grad(sum(terms[1:], terms[0]), inputs, allow_unused=True), arrays)
    return results


def check_devices(op, sample):
    gpu = on_device(op, sample, "cuda")
    if op.tested("forward"):
        cpu = on_device(op, sample, "cpu")
    else:  # no NumPy path (a kernel only): NumPy's reference
        cpu = {"forward": reference(op, sample)}
    assert gpu.keys() == cpu.keys()
    for key in gpu:
        pairs = [(gpu[key], cpu[key])] if key == "forward" else zip(gpu[key], cpu[key])
        for k, (ours, expected) in enumerate(pairs):
            assert ours.shape == expected.shape and ours.dtype == expected.dtype, (key, k, ours.dtype, expected.dtype)
            what = key if key == "forward" else f"{key} of input {k}"
            np.testing.assert_allclose(ours, expected, err_msg=f"{op.name}: {what}", **op.oracle_tol)


@pytest.mark.parametrize("op", GPU, ids=ids(GPU))
@given(data=st.data())
def test_op_on_cupy_equals_numpy(op, data):
    check_devices(op, data.draw(op.checked_sample))


@pytest.mark.parametrize("op, case", GPU_CASES, ids=ids(GPU_CASES))
def test_fixed_case_on_cupy_equals_numpy(op, case):
    check_devices(op, op.cases[case](np.random.default_rng(0)))


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
