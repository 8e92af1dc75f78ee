"""conv2d, conv_transpose2d, im2col and col2im: against naive loops, and their gradients of both orders."""
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, check_both


def naive_conv2d(x, w, b, stride, padding):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(n):
        for j in range(o):
            for r in range(oh):
                for s in range(ow):
                    patch = xp[i, :, r * stride:r * stride + kh, s * stride:s * stride + kw]
                    y[i, j, r, s] = (patch * w[j]).sum() + (b[j] if b is not None else 0.0)
    return y


def naive_conv_transpose2d(x, w, b, stride, padding, output_padding):
    n, cin, h, wd = x.shape
    _, cout, kh, kw = w.shape
    oh = (h - 1) * stride - 2 * padding + kh + output_padding
    ow = (wd - 1) * stride - 2 * padding + kw + output_padding
    full = np.zeros((n, cout, oh + 2 * padding + kh, ow + 2 * padding + kw))
    for i in range(n):
        for ci in range(cin):
            for r in range(h):
                for s in range(wd):
                    full[i, :, r * stride:r * stride + kh, s * stride:s * stride + kw] += x[i, ci, r, s] * w[ci]
    y = full[:, :, padding:padding + oh, padding:padding + ow]
    return y + (b[None, :, None, None] if b is not None else 0.0)


@st.composite
def conv_case(draw):
    n = draw(st.sampled_from([1, 2, 8, 9]))  # 8 and up put the batch innermost in the column matrix
    c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride, padding = draw(st.integers(1, 3)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, kh - 2 * padding), 5))
    w = draw(st.integers(max(1, kw - 2 * padding), 5))
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
    extra = data.draw(st.integers(0, stride - 1))
    assume((min(y.shape[2:]) - 1) * stride - 2 * padding + min(w.shape[2:]) >= 1)  # else no transposed output
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
