"""Op arguments at their boundaries: the largest invalid value raises a ValueError (ShapeError is
one) naming the op, the smallest valid one works. Per axis for the convolutions."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F


def zeros(*shape):
    return tc.tensor(np.zeros(shape))


@pytest.mark.parametrize("call, op", [
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, 0), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, (1, 0)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, 1, -1), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, 1, (0, -1)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), zeros(2)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), zeros(3, 1)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 1, 3, 3)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 2), zeros(3, 2, 3, 3)), "conv2d"),  # too narrow, tall enough
    (lambda: F.conv2d(zeros(1, 2, 2, 5), zeros(3, 2, 3, 3)), "conv2d"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, (1, 2, 1)), "conv"),
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, 1, (0, -0.5)), "conv"),  # not an int
    (lambda: F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, (2.5, 1)), "conv"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(2, 4, 3, 3), None, 2, 0, 2), "conv_transpose2d"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(2, 4, 3, 3), None, (2, 3), 0, (0, 3)), "conv_transpose2d"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(2, 4, 3, 3), None, (3, 2), 0, (3, 0)), "conv_transpose2d"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(2, 4, 3, 3), None, 2, 0, (0, -1)), "conv_transpose2d"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(3, 4, 3, 3)), "conv_transpose2d"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(2, 4, 3, 3), zeros(2)), "conv_transpose2d"),
    (lambda: F.conv_transpose2d(zeros(1, 2, 1, 1), zeros(2, 4, 1, 1), None, 1, (0, 1)), "conv_transpose2d"),
    (lambda: F.im2col(zeros(2, 5, 5), 3), "im2col"),
    (lambda: F.transpose(zeros(2, 3), (1, 1)), "transpose"),
    (lambda: F.transpose(zeros(2, 3), (0, 0)), "transpose"),
    (lambda: F.transpose(zeros(2, 3, 4), (0, 1)), "transpose"),
    (lambda: F.concatenate([zeros(2, 3), zeros(3, 3)], axis=1), "concatenate"),
    (lambda: F.concatenate([zeros(2, 3), zeros(2, 3, 1)]), "concatenate"),
    (lambda: F.sum(zeros(2, 3), axis=2), "sum"),
    (lambda: F.sum(zeros(2, 3), axis=(0, -2)), "sum"),
    (lambda: F.softmax(zeros(2, 3), axis=-3), "softmax"),
    (lambda: F.reshape(zeros(0, 3), (-1, 0)), "reshape"),  # -1 is ambiguous beside a zero
    (lambda: F.reshape(zeros(2, 3), (-1, -1)), "reshape"),
    (lambda: F.reshape(zeros(2, 3), (4, -1)), "reshape"),
    (lambda: F.reshape(zeros(2, 3), (5,)), "reshape"),
    (lambda: F.linear(zeros(2, 3), zeros(4, 5)), "linear"),
    (lambda: F.mse_loss(zeros(3, 5), zeros(3, 4)), "mse_loss"),
    (lambda: F.mse_loss(zeros(3, 4), zeros(3, 5)), "mse_loss"),
    (lambda: F.binary_cross_entropy(zeros(3, 5), zeros(3, 1)), "binary_cross_entropy"),
    (lambda: F.expand_dims(zeros(2, 3), -4), "expand_dims"),
    (lambda: F.expand_dims(zeros(2, 3), 3), "expand_dims"),
    (lambda: F.linear(zeros(2, 3), zeros(4, 3, 1)), "linear"),
    (lambda: F.routing_forward(zeros(2, 3, 4), 3), "routing_forward"),
])
def test_invalid_arguments_raise_naming_the_op(call, op):
    with pytest.raises(ValueError, match=f"^{op}: "):  # our message, not one NumPy raises further down
        call()


def test_smallest_valid_convolution_arguments_work():
    # the kernel exactly fills the padded input: one output pixel per axis
    assert F.conv2d(zeros(1, 2, 3, 1), zeros(3, 2, 3, 3), None, 1, (0, 1)).shape == (1, 3, 1, 1)
    assert F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, (1, 4), (0, 0)).shape == (1, 3, 3, 1)
    assert F.conv2d(zeros(1, 2, 5, 5), zeros(3, 2, 3, 3), None, (2, 2.0)).shape == (1, 3, 2, 2)
    # output_padding up to stride - 1 on each axis
    y = F.conv_transpose2d(zeros(1, 2, 3, 3), zeros(2, 4, 3, 3), None, (2, 3), 0, (1, 2))
    assert y.shape == (1, 4, (3 - 1) * 2 + 3 + 1, (3 - 1) * 3 + 3 + 2)
    assert F.conv_transpose2d(zeros(1, 2, 1, 1), zeros(2, 4, 1, 1), None, 1, 0).shape == (1, 4, 1, 1)
    assert F.conv_transpose2d(zeros(1, 2, 2, 1), zeros(2, 4, 2, 2), None, 1, (0, 0)).shape == (1, 4, 3, 2)


def test_output_size_formula():
    assert F.conv_output_size(28, 9, 1, 0) == 20
    assert F.conv_output_size(20, 9, 2, 0) == 6
    assert F.conv_output_size(5, 3, 2, 1) == 3
    assert F.conv_output_size(6, 3, 2, 1) == 3


def test_convolution_defaults_are_stride_1_and_no_padding():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((3, 2, 3, 2))
    explicit = F.conv2d(tc.tensor(x), tc.tensor(w), None, 1, 0).numpy()
    np.testing.assert_array_equal(F.conv2d(tc.tensor(x), tc.tensor(w)).numpy(), explicit)
    col = F.im2col(tc.tensor(x), (3, 2)).numpy()
    np.testing.assert_array_equal(col, F.im2col(tc.tensor(x), (3, 2), 1, 0).numpy())
    r = rng.standard_normal(col.shape)
    np.testing.assert_array_equal(F.col2im(tc.tensor(r), x.shape, (3, 2)).numpy(),
                                  F.col2im(tc.tensor(r), x.shape, (3, 2), 1, 0).numpy())
    g = rng.standard_normal((2, 3, 3, 3))
    np.testing.assert_array_equal(F.conv_transpose2d(tc.tensor(g), tc.tensor(w)).numpy(),
                                  F.conv_transpose2d(tc.tensor(g), tc.tensor(w), None, 1, 0, 0).numpy())


def test_reshape_infers_one_axis():
    assert F.reshape(zeros(2, 3), (-1,)).shape == (6,)
    assert F.reshape(zeros(2, 3), (3, -1)).shape == (3, 2)
    assert F.reshape(zeros(0, 3), (-1, 3)).shape == (0, 3)
