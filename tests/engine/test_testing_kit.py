"""tinygrad_caps.testing: the strategies draw what they promise, and check_op passes correct ops
(our own broadcasting ops among them) and catches wrong gradients and ops that write into their
inputs or into the upstream gradient."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinygrad_caps.functional as F
from tinygrad_caps.autograd import Function
from tinygrad_caps.gradcheck import GradcheckError
from tinygrad_caps.testing import broadcastable_shapes, check_op, tensors

small_shapes = st.lists(st.integers(2, 4), min_size=1, max_size=3).map(tuple)


@given(t=tensors(shape=small_shapes, contiguous=False))
def test_non_contiguous_tensors_are_views(t):
    assert not t.data.flags["C_CONTIGUOUS"] and t.data.dtype == np.float64


@given(t=tensors(shape=(3, 2), dtype=np.float32, contiguous=True, elements=st.floats(0.5, 1.0, width=32)))
def test_contiguous_float32_tensors_with_chosen_elements(t):
    assert t.shape == (3, 2) and t.dtype == np.float32 and t.data.flags["C_CONTIGUOUS"]
    assert not t.requires_grad and ((t.numpy() >= 0.5) & (t.numpy() <= 1.0)).all()


@given(shapes=broadcastable_shapes(3))
def test_broadcastable_shapes_broadcast_together(shapes):
    assert len(shapes) == 3 and all(isinstance(s, tuple) for s in shapes)
    np.broadcast_shapes(*shapes)


def pair_of_broadcastable_tensors():
    return broadcastable_shapes(2).flatmap(lambda shapes: st.tuples(*(tensors(shape=s) for s in shapes)))


@pytest.mark.parametrize("op", [F.add, F.mul, F.sub, lambda a, b: F.tanh(a) * F.exp(b)])
def test_check_op_passes_our_broadcasting_ops(op):
    check_op(op, pair_of_broadcastable_tensors())


def test_check_op_passes_a_reduction_with_separate_strategies():
    check_op(lambda x, w: F.sum(F.tanh(x) * w, axis=1), tensors(shape=(2, 3)), tensors(shape=(3,)))


class WrongExp(Function):
    def forward(self, x):
        return np.exp(x)

    def backward(self, gy):
        return gy * F.exp(self.inputs[0]) * 1.01


class WritesIntoInput(Function):
    def forward(self, x):
        x += 1.0
        return x * 2

    def backward(self, gy):
        return gy * 2


class WritesIntoUpstream(Function):
    def forward(self, x):
        return -x

    def backward(self, gy):
        result = -gy
        gy.data[...] = 0.0
        return result


@pytest.mark.parametrize("function, message", [
    (WrongExp, "gradient mismatch"),
    (WritesIntoInput, "wrote into input 0"),
    (WritesIntoUpstream, "wrote into the upstream gradient"),
])
def test_check_op_catches_broken_ops(function, message):
    with pytest.raises(GradcheckError, match=message):
        check_op(lambda x: function()(x), tensors(shape=(2, 2)), double=False)


def test_check_op_needs_a_strategy():
    with pytest.raises(ValueError, match="check_op"):
        check_op(F.exp)
