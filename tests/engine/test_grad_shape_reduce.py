"""Gradient property tests (first and second order) for reductions and shape ops."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import tinygrad_caps.functional as F
from helpers import arrays, check_both, on_grid, shapes
from op_table import axes_for


@pytest.mark.parametrize("name", ["sum", "mean"])
@given(data=st.data())
def test_sum_and_mean_gradients(name, data):
    x = data.draw(arrays(data.draw(shapes(min_side=1))))
    axis, keepdims = data.draw(axes_for(x.ndim)), data.draw(st.booleans())
    op = getattr(F, name)
    check_both(lambda t: op(t, axis, keepdims), [x])


def test_sum_of_empty_tensor_has_empty_gradient():
    import tinygrad_caps as tc

    x = tc.tensor(np.zeros((0, 3)), requires_grad=True)
    F.sum(x).backward()
    assert x.grad.shape == (0, 3)


@pytest.mark.parametrize("name", ["max", "min"])
@given(data=st.data())
def test_max_and_min_gradients(name, data):
    x = data.draw(arrays(data.draw(shapes(min_side=1)), on_grid(), unique=True))  # distinct by >= 0.1
    axis, keepdims = data.draw(axes_for(x.ndim)), data.draw(st.booleans())
    op = getattr(F, name)
    check_both(lambda t: op(t, axis, keepdims), [x])


def test_max_shares_gradient_among_ties():
    import tinygrad_caps as tc

    x = tc.tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]]), requires_grad=True)
    F.max(x, axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1, 0, 0]])


@given(data=st.data())
def test_reshape_and_flatten_gradients(data):
    x = data.draw(arrays(data.draw(shapes(min_side=1, max_dims=4))))
    target = (-1,) + x.shape[2:] if x.ndim >= 2 else (x.size,)
    check_both(lambda t: F.reshape(t, target) * F.reshape(t, target), [x])
    if x.ndim >= 1:
        check_both(lambda t: F.flatten(t, x.ndim - 1) * 2.0, [x])


@given(data=st.data())
def test_transpose_and_permute_gradients(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1, max_dims=4))))
    axes = tuple(data.draw(st.permutations(range(x.ndim))))
    weight = np.arange(x.size, dtype=np.float64).reshape(tuple(x.shape[a] for a in axes))
    check_both(lambda t: F.transpose(t, axes) * weight, [x])
    check_both(lambda t: F.permute(t, axes) ** 2, [x])


@given(data=st.data())
def test_expand_dims_and_squeeze_gradients(data):
    x = data.draw(arrays(data.draw(shapes(max_dims=3))))
    axis = data.draw(st.integers(-x.ndim - 1, x.ndim))
    check_both(lambda t: F.squeeze(F.expand_dims(t, axis) ** 2, axis), [x])
    check_both(lambda t: F.squeeze(t) * 3.0, [x])


@given(data=st.data())
def test_broadcast_to_gradients(data):
    shape = data.draw(shapes(min_side=1))
    x = data.draw(arrays(shape))
    target = (2,) + tuple(3 if n == 1 and data.draw(st.booleans()) else n for n in shape)
    weight = np.random.default_rng(0).standard_normal(target)
    check_both(lambda t: F.broadcast_to(t, target) * weight, [x])


@given(data=st.data())
def test_basic_slicing_gradients(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=2, max_dims=3, min_side=2, max_side=4))))
    index = (slice(None, None, -1), slice(1, None))
    check_both(lambda t: t[index] ** 2, [x])
    check_both(lambda t: t[0] * t[-1], [x])
    check_both(lambda t: t[..., None, 1:2] * 2.0, [x])


@given(data=st.data())
def test_integer_array_indexing_accumulates_repeats(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1, max_dims=3, min_side=2, max_side=4))))
    rows = np.array(data.draw(st.lists(st.integers(0, x.shape[0] - 1), min_size=1, max_size=6)))
    check_both(lambda t: t[rows] ** 2, [x])
    if x.ndim >= 2:
        cols = np.array(data.draw(st.lists(st.integers(0, x.shape[1] - 1), min_size=len(rows), max_size=len(rows))))
        check_both(lambda t: t[rows, cols] ** 2, [x])


def test_boolean_mask_indexing_gradient():
    x = np.random.default_rng(1).standard_normal((3, 4))
    mask = x > 0
    check_both(lambda t: t[mask] ** 2, [x])


@given(data=st.data())
def test_concatenate_and_stack_gradients(data):
    shape = data.draw(shapes(min_dims=1, max_dims=3))
    axis = data.draw(st.integers(0, len(shape) - 1))
    other = shape[:axis] + (data.draw(st.integers(0, 3)),) + shape[axis + 1:]
    a, b = data.draw(arrays(shape)), data.draw(arrays(other))
    check_both(lambda s, t: F.concatenate([s, t * t], axis), [a, b])
    c = data.draw(arrays(shape))
    new_axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check_both(lambda s, t: F.stack([s * t, t], new_axis), [a, c])


@given(data=st.data())
def test_pad_gradients(data):
    x = data.draw(arrays(data.draw(shapes(min_dims=1, max_dims=3))))
    widths = [tuple(data.draw(st.lists(st.integers(0, 2), min_size=2, max_size=2))) for _ in range(x.ndim)]
    check_both(lambda t: F.pad(t, widths) ** 2, [x])


def test_cast_gradient_comes_back_in_the_input_dtype():
    import tinygrad_caps as tc

    x = tc.tensor(np.array([1.0, 2.0], dtype=np.float64), requires_grad=True)
    y = x.astype("float32")
    assert y.dtype == np.float32
    (y * y).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


@given(data=st.data())
def test_sum_to_undoes_broadcasting(data):
    shape_a, shape_b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3)).input_shapes
    full = np.broadcast_shapes(shape_a, shape_b)
    x = data.draw(arrays(full))
    check_both(lambda t: F.sum_to(t, shape_a) ** 2, [x])


def test_short_last_axis_fast_paths_match_numpy_and_have_correct_gradients():
    """Large arrays with a short last axis take a BLAS / running-max path in sum, max and softmax."""
    import tinygrad_caps as tc

    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 70, 10))
    t = tc.tensor(x)
    np.testing.assert_allclose(F.sum(t, -1).numpy(), x.sum(-1), rtol=1e-12)
    np.testing.assert_array_equal(F.max(t, 2, keepdims=True).numpy(), x.max(-1, keepdims=True))
    np.testing.assert_array_equal(F.min(t, -1).numpy(), x.min(-1))
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(F.softmax(t, -1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-12)
    check_both(lambda s: F.softmax(s, -1) * x + F.max(s, -1, keepdims=True) * F.sum(s, -1, keepdims=True), [x])
