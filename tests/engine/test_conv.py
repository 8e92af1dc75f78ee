"""conv2d, conv_transpose2d, im2col and col2im: against naive loops, and their gradients of both orders."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from conv_cases import ASYMMETRIC, BATCHES, conv_case
from helpers import check_both
from naive_conv import naive_col2im, naive_conv2d, naive_conv_transpose2d, naive_im2col
from tinygrad_caps.ops.conv import batch_last


@given(case=conv_case())
def test_conv2d_matches_naive_loops_and_has_correct_gradients(case):
    x, w, b, stride, padding = case
    y = F.conv2d(tc.tensor(x), tc.tensor(w), tc.tensor(b), stride, padding).numpy()
    np.testing.assert_allclose(y, naive_conv2d(x, w, b, stride, padding), rtol=1e-10, atol=1e-12)
    check_both(lambda s, t, u: F.conv2d(s, t, u, stride, padding), [x, w, b], max_elementwise=40, directions=3)


@given(case=conv_case(), data=st.data())
def test_conv_transpose2d_matches_naive_loops_and_is_the_adjoint(case, data):
    x, w, b, stride, padding = case
    wt = w  # conv2d's (o, c, kh, kw) weight is conv_transpose2d's (in, out, kh, kw): the adjoint
    y = F.conv2d(tc.tensor(x), tc.tensor(w), None, stride, padding).numpy()
    extra = (data.draw(st.integers(0, stride[0] - 1)), data.draw(st.integers(0, stride[1] - 1)))
    assume(all((y.shape[2 + a] - 1) * stride[a] - 2 * padding[a] + w.shape[2 + a] >= 1 for a in (0, 1)))
    g = np.random.default_rng(1).standard_normal(y.shape)
    back = F.conv_transpose2d(tc.tensor(g), tc.tensor(wt), None, stride, padding).numpy()
    if back.shape == x.shape:  # <conv(x), g> == <x, conv_transpose(g)>
        np.testing.assert_allclose((y * g).sum(), (x * back).sum(), rtol=1e-10, atol=1e-10)
    bias = b[:1].repeat(w.shape[1])
    out = F.conv_transpose2d(tc.tensor(g), tc.tensor(wt), tc.tensor(bias), stride, padding, extra).numpy()
    np.testing.assert_allclose(out, naive_conv_transpose2d(g, wt, bias, stride, padding, extra), rtol=1e-10, atol=1e-12)
    check_both(lambda s, t: F.conv_transpose2d(s, t, None, stride, padding, extra), [g, wt],
               max_elementwise=40, directions=3)


@given(case=conv_case())
def test_im2col_and_col2im_are_adjoint(case):
    x, w, _, stride, padding = case
    kernel = w.shape[2:]
    col = F.im2col(tc.tensor(x), kernel, stride, padding).numpy()
    r = np.random.default_rng(2).standard_normal(col.shape)
    back = F.col2im(tc.tensor(r), x.shape, kernel, stride, padding).numpy()
    np.testing.assert_allclose((col * r).sum(), (x * back).sum(), rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(col, naive_im2col(x, kernel, stride, padding))
    np.testing.assert_allclose(back, naive_col2im(r, x.shape, kernel, stride, padding), rtol=1e-12, atol=1e-12)
    check_both(lambda t: F.im2col(t, kernel, stride, padding), [x], max_elementwise=40, directions=3)
    check_both(lambda t: F.col2im(t, x.shape, kernel, stride, padding), [r], max_elementwise=40, directions=3)


@pytest.mark.parametrize("n", BATCHES)
@pytest.mark.parametrize("kernel, stride, padding, output_padding", ASYMMETRIC)
def test_asymmetric_convolutions_equal_naive_loops_on_both_column_orders(n, kernel, stride, padding, output_padding):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 2, 6, 5))
    w = rng.standard_normal((3, 2) + kernel)
    b = rng.standard_normal(3)
    np.testing.assert_allclose(F.conv2d(tc.tensor(x), tc.tensor(w), tc.tensor(b), stride, padding).numpy(),
                               naive_conv2d(x, w, b, stride, padding), rtol=1e-10, atol=1e-12)
    col = F.im2col(tc.tensor(x), kernel, stride, padding).numpy()
    np.testing.assert_array_equal(col, naive_im2col(x, kernel, stride, padding))
    r = rng.standard_normal(col.shape)
    np.testing.assert_allclose(F.col2im(tc.tensor(r), x.shape, kernel, stride, padding).numpy(),
                               naive_col2im(r, x.shape, kernel, stride, padding), rtol=1e-12, atol=1e-12)
    g = rng.standard_normal((n, 3, 4, 3))
    np.testing.assert_allclose(
        F.conv_transpose2d(tc.tensor(g), tc.tensor(w), tc.tensor(b[:2]), stride, padding, output_padding).numpy(),
        naive_conv_transpose2d(g, w, b[:2], stride, padding, output_padding), rtol=1e-10, atol=1e-12)


def test_conv2d_weight_double_backward():
    """DeZero's conv weight gradient breaks on double backward; a gradient penalty on ours must work."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3))
    check_both(lambda t: F.conv2d(tc.tensor(x), t, None, 2, 1) ** 2, [w], max_elementwise=60)
    wt = tc.tensor(w, requires_grad=True)
    y = F.conv2d(tc.tensor(x), wt, None, 1, 0)
    (gw,) = tc.grad((y ** 2).sum(), wt, create_graph=True)
    (gw * gw).sum().backward()
    assert wt.grad is not None and np.abs(wt.grad.numpy()).sum() > 0


@pytest.mark.parametrize("bad", [
    lambda: F.conv2d(tc.tensor(np.zeros((1, 3, 5, 5))), tc.tensor(np.zeros((2, 4, 3, 3)))),
    lambda: F.conv2d(tc.tensor(np.zeros((3, 5, 5))), tc.tensor(np.zeros((2, 3, 3, 3)))),
    lambda: F.conv2d(tc.tensor(np.zeros((1, 3, 2, 2))), tc.tensor(np.zeros((2, 3, 3, 3)))),
    lambda: F.conv2d(tc.tensor(np.zeros((1, 3, 5, 5))), tc.tensor(np.zeros((2, 3, 3, 3))), tc.tensor(np.zeros(3))),
])
def test_conv2d_rejects_bad_shapes_with_a_clear_error(bad):
    with pytest.raises(ValueError, match="conv2d"):
        bad()


def test_the_drawn_batch_sizes_straddle_the_column_order_switch():
    """BATCHES must reach both column orders (and the edge), or the properties above test only one of them."""
    orders = [batch_last(n) for n in BATCHES]
    assert orders == sorted(orders) and orders[0] is False and orders[-1] is True
    edge = orders.index(True)
    assert BATCHES[edge] - BATCHES[edge - 1] == 1, "the two batch sizes around the switch must be adjacent"
    assert batch_last(BATCHES[-1], xp=None) is False  # off NumPy the image row stays innermost
