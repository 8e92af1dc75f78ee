"""Gradient property tests, first and second order (float64 central differences), for every op of
the op table (tests/support/op_table.py), each on its own domain off its kinks; and the elementwise
ops' ties, which central differences cannot see. Richer argument forms of the shape, reduction, nn
and capsule ops are in test_grad_shape_reduce.py, test_grad_nn_ops.py and test_grad_capsule_ops.py."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps.functional as F
from helpers import check_both
from op_table import OPS, bound, ids
from tinygrad_caps.testing import check_gradients

FIRST = [op for op in OPS if op.tested("grad")]
SECOND = [op for op in OPS if op.tested("second_order")]


@pytest.mark.parametrize("op", FIRST, ids=ids(FIRST))
@given(data=st.data())
def test_first_order_gradients(op, data):
    """The backward against central differences, and nothing written into the inputs or the upstream gradient."""
    sample = data.draw(op.checked_sample)
    check_gradients(bound(op, sample), sample.arrays(), double=False, **op.grad_tol)


@pytest.mark.parametrize("op", SECOND, ids=ids(SECOND))
@given(data=st.data())
def test_second_order_gradients(op, data):
    """The double backward (and the backward) against central differences; of the op's square where
    the op is (bi)linear in its inputs (``square_for_second_order``)."""
    sample = data.draw(op.checked_sample)
    check_both(bound(op, sample, square=op.square_for_second_order), sample.arrays(), **op.grad_tol)


def test_maximum_splits_gradient_on_ties():
    import tinygrad_caps as tc

    a = tc.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = tc.tensor(np.array([1.0, 5.0, 0.0]), requires_grad=True)
    F.maximum(a, b).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(b.grad.numpy(), [0.5, 1.0, 0.0])
