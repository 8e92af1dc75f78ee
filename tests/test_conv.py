"""conv2d, conv_transpose2d, im2col and col2im: against naive loops, and their gradients of both orders."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, check_both
from tinygrad_caps.ops.conv import batch_last


def naive_conv2d(x, w, b, stride, padding):
    """Cross-correlation by loops in float64; stride and padding are (h, w) pairs."""
    (sh, sw), (ph, pw) = stride, padding
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(n):
        for j in range(o):
            for r in range(oh):
                for s in range(ow):
                    patch = xp[i, :, r * sh:r * sh + kh, s * sw:s * sw + kw]
                    y[i, j, r, s] = (patch * w[j]).sum() + (b[j] if b is not None else 0.0)
    return y


def naive_conv_transpose2d(x, w, b, stride, padding, output_padding):
    """Scatter of every input pixel times the kernel, then the crop; all arguments are (h, w) pairs."""
    (sh, sw), (ph, pw), (eh, ew) = stride, padding, output_padding
    n, cin, h, wd = x.shape
    _, cout, kh, kw = w.shape
    oh = (h - 1) * sh - 2 * ph + kh + eh
    ow = (wd - 1) * sw - 2 * pw + kw + ew
    full = np.zeros((n, cout, oh + 2 * ph + kh, ow + 2 * pw + kw))
    for i in range(n):
        for ci in range(cin):
            for r in range(h):
                for s in range(wd):
                    full[i, :, r * sh:r * sh + kh, s * sw:s * sw + kw] += x[i, ci, r, s] * w[ci]
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    return y + (b[None, :, None, None] if b is not None else 0.0)


def naive_patches(x, kernel, stride, padding):
    """(N, C, H, W) -> (C, kh, kw, N, OH, OW) by loops: patches[c, ky, kx, n, oy, ox]."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((c, kh, kw, n, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            for oy in range(oh):
                for ox in range(ow):
                    out[:, ky, kx, :, oy, ox] = xp[:, :, oy * sh + ky, ox * sw + kx].T
    return out


def naive_im2col(x, kernel, stride, padding, columns_batch_last=None):
    """The column matrix in the engine's documented order: (oy, ox, n) columns when batch_last, else (n, oy, ox).

    ``columns_batch_last``: that order (default: the engine's choice for this batch on NumPy)."""
    p = naive_patches(x, kernel, stride, padding)
    if batch_last(x.shape[0]) if columns_batch_last is None else columns_batch_last:
        p = p.transpose(0, 1, 2, 4, 5, 3)
    return p.reshape(p.shape[0] * p.shape[1] * p.shape[2], -1)


def naive_col2im(col, image_shape, kernel, stride, padding, columns_batch_last=None):
    """Adds every column entry back into its pixel, by loops (the adjoint of naive_im2col)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, wd = image_shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    if batch_last(n) if columns_batch_last is None else columns_batch_last:
        p = col.reshape(c, kh, kw, oh, ow, n).transpose(0, 1, 2, 5, 3, 4)
    else:
        p = col.reshape(c, kh, kw, n, oh, ow)
    out = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    for ky in range(kh):
        for kx in range(kw):
            for oy in range(oh):
                for ox in range(ow):
                    out[:, :, oy * sh + ky, ox * sw + kx] += p[:, ky, kx, :, oy, ox].T
    return out[:, :, ph:ph + h, pw:pw + wd]


BATCHES = [1, 2, 7, 8, 9]  # batch_last switches the column order at 8 on NumPy: both sides, and the edge


@st.composite
def conv_case(draw):
    """Per-axis kernel, stride and padding (asymmetric ones included), a batch from BATCHES."""
    n = draw(st.sampled_from(BATCHES))
    c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(max(1, kh - 2 * padding[0]), 5))
    w = draw(st.integers(max(1, kw - 2 * padding[1]), 5))
    x = draw(arrays((n, c, h, w)))
    weight = draw(arrays((o, c, kh, kw)))
    bias = draw(arrays((o,)))
    return x, weight, bias, stride, padding


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


ASYMMETRIC = [  # kernel, stride, padding, output_padding: every pair differs between the axes
    ((3, 2), (2, 1), (1, 0), (1, 0)),
    ((2, 3), (1, 3), (0, 2), (0, 2)),
    ((1, 3), (3, 2), (2, 1), (2, 1)),
    ((3, 2), (1, 2), (2, 3), (0, 1)),  # padding wider than the kernel
    ((2, 3), (1, 2), (0, 3), (0, 1)),  # the last window ends exactly on the far padding
]


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
