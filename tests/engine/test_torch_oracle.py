"""PyTorch as a second oracle for every op of the op table (tests/support/op_table.py) that PyTorch
has: forward, gradient and second-order gradient in float64, on the op's drawn domain (off its
kinks) and on its fixed cases. Skipped where PyTorch is not installed."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import tinygrad_caps as tc
from op_table import OPS, bound, case_params, ids

torch = pytest.importorskip("torch")

TORCH = [op for op in OPS if op.tested("torch")]
TORCH_CASES = case_params(OPS, "torch")


def _numpy(t, shape=None):
    """Our Tensor or PyTorch's as a NumPy array; None (an unused input) as zeros of ``shape``."""
    if t is None:
        return np.zeros(shape)
    return t.detach().numpy(force=True) if isinstance(t, torch.Tensor) else t.numpy()  # force: a ZeroTensor too


def _compare(what, ours, theirs, inputs, tol):
    for k, (a, b, x) in enumerate(zip(ours, theirs, inputs)):
        np.testing.assert_allclose(_numpy(a, x.shape), _numpy(b, x.shape), err_msg=f"{what} of input {k}", **tol)


def _second_order(grad, y, inputs, weight, directions, create_graph_kw):
    """grad of sum_k <d<y, weight>/dx_k, directions_k>, or None where the first derivatives are constant."""
    firsts = grad((y * weight).sum(), inputs, **create_graph_kw)
    terms = [(g * r).sum() for g, r in zip(firsts, directions) if g is not None and g.requires_grad]
    return grad(sum(terms[1:], terms[0]), inputs, allow_unused=True) if terms else None


def check_against_torch(op, sample):
    arrays = sample.arrays()
    differentiable = op.tested("grad") and bool(arrays)
    ours = [tc.tensor(a, requires_grad=differentiable) for a in arrays]
    theirs = [torch.from_numpy(np.array(a)).requires_grad_(differentiable) for a in arrays]
    kwargs = {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in sample.kwargs.items()}

    y = bound(op, sample)(*ours)
    y_ref = op.call_torch(torch, *sample.unflatten(theirs), **kwargs)
    assert y.shape == tuple(y_ref.shape) and y.numpy().dtype == _numpy(y_ref).dtype, (y, y_ref)
    np.testing.assert_allclose(y.numpy(), _numpy(y_ref), err_msg="forward", **op.oracle_tol)
    if not differentiable:
        return
    rng = np.random.default_rng(0)
    weight = rng.standard_normal(y.shape)
    _compare("gradient", tc.grad((y * tc.tensor(weight)).sum(), ours, retain_graph=True, allow_unused=True),
             torch.autograd.grad((y_ref * torch.from_numpy(weight)).sum(), theirs, retain_graph=True, allow_unused=True),
             arrays, op.oracle_tol)
    if not op.tested("second_order"):
        return
    directions = [rng.standard_normal(a.shape) for a in arrays]
    if op.square_for_second_order:
        y, y_ref = y * y, y_ref * y_ref
    second = _second_order(tc.grad, y, ours, tc.tensor(weight), [tc.tensor(r) for r in directions],
                           dict(create_graph=True, allow_unused=True))
    second_ref = _second_order(torch.autograd.grad, y_ref, theirs, torch.from_numpy(weight),
                               [torch.from_numpy(r) for r in directions], dict(create_graph=True, allow_unused=True))
    if second is None and second_ref is None:
        return
    if second is None or second_ref is None:  # constant first derivatives: the other side's must be 0
        assert not any(np.abs(_numpy(g, x.shape)).max(initial=0) > 0 for g, x in zip(second or second_ref, arrays))
        return
    _compare("second-order gradient", second, second_ref, arrays, op.oracle_tol)


@pytest.mark.parametrize("op", TORCH, ids=ids(TORCH))
@given(data=st.data())
def test_forward_and_gradients_match_pytorch(op, data):
    sample = data.draw(op.checked_sample)
    assume(op.torch_agrees is None or op.torch_agrees(sample))
    check_against_torch(op, sample)


@pytest.mark.parametrize("op, case", TORCH_CASES, ids=ids(TORCH_CASES))
def test_fixed_case_matches_pytorch(op, case):
    check_against_torch(op, op.cases[case](np.random.default_rng(0)))
