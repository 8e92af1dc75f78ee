"""Bad input gives a clear error that names the op and the shapes, dtypes or devices involved."""
import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F


def t(*shape):
    return tc.tensor(np.zeros(shape))


@pytest.mark.parametrize("call, pattern", [
    (lambda: t(2, 3) + t(4, 3), r"Add.*\(2, 3\).*\(4, 3\)"),
    (lambda: t(2, 3) @ t(2, 3), r"matmul.*\(2, 3\).*\(2, 3\)"),
    (lambda: F.linear(t(5, 3), t(4, 2)), r"linear.*\(5, 3\).*\(4, 2\)"),
    (lambda: F.mse_loss(t(4, 1), t(4)), r"mse_loss.*\(4, 1\).*\(4,\)"),
    (lambda: F.binary_cross_entropy(t(3), t(3, 1)), r"binary_cross_entropy"),
    (lambda: F.cross_entropy(t(4, 3), np.zeros(5, dtype=int)), r"cross_entropy.*\(5,\)"),
    (lambda: F.reshape(t(2, 3), (4, 2)), r"reshape.*\(2, 3\).*\(4, 2\)"),
    (lambda: F.sum(t(2, 3), axis=2), r"sum: axis 2"),
    (lambda: F.transpose(t(2, 3), (0, 0)), r"transpose"),
    (lambda: F.squeeze(t(2, 3), 0), r"squeeze.*size 2"),
    (lambda: F.concatenate([t(2, 3), t(2, 4)], axis=0), r"concatenate"),
    (lambda: F.stack([t(2), t(3)]), r"stack"),
    (lambda: F.broadcast_to(t(2, 3), (3, 3)), r"BroadcastTo"),
    (lambda: F.batch_norm(t(4, 3), np.zeros(2), np.ones(2)), r"batch_norm.*running_mean"),
    (lambda: F.softmax(t(2, 3), axis=5), r"softmax: axis 5"),
])
def test_bad_shapes_raise_value_errors_naming_the_op(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_backward_of_a_non_scalar_needs_a_gradient():
    x = tc.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="non-scalar"):
        (x * 2.0).backward()
    with pytest.raises(ValueError, match="gradient shape"):
        (x * 2.0).backward(np.ones(4))


def test_backward_without_a_graph_is_refused():
    with pytest.raises(RuntimeError, match="does not require grad"):
        tc.tensor(np.ones(1)).backward()


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="floating"):
        tc.tensor(np.arange(3), requires_grad=True)


def test_asking_for_cuda_without_a_gpu_says_so():
    if tc.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(tc.DeviceError, match="no usable GPU"):
        tc.tensor([1.0], device="cuda")
    with pytest.raises(tc.DeviceError, match="unknown device"):
        tc.tensor([1.0], device="tpu")


def test_python_scalars_do_not_upcast_float32():
    x = tc.tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    y = (2.5 * x + 1) / 3 - x ** 2
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32
    assert tc.tensor([1.0, 2.0]).dtype == np.float32  # Python floats take the default dtype


def test_numpy_arrays_combine_with_tensors_from_either_side():
    x = tc.tensor(np.ones(2), requires_grad=True)
    y = np.array([2.0, 3.0]) * x + x * np.array([1.0, 1.0])
    assert isinstance(y, tc.Tensor)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])


def test_ops_accept_non_contiguous_inputs():
    a = np.arange(12.0).reshape(3, 4)
    x = tc.tensor(a.T.copy(order="K"))  # may keep the transposed layout
    xt = tc.Tensor(a.T)
    assert not xt.data.flags.c_contiguous
    np.testing.assert_allclose(F.matmul(xt, tc.tensor(a)).numpy(), a.T @ a)
    np.testing.assert_allclose(F.softmax(xt, axis=0).numpy().sum(axis=0), 1.0)
    assert x.shape == (4, 3)


def test_a_device_error_inside_an_op_stays_a_device_error():
    # Function turns ValueErrors from a forward into ShapeErrors that name the shapes; a DeviceError
    # (a kernel finding arrays on two GPUs) is also a ValueError and must come through as itself
    from tinygrad_caps.autograd import Function

    class OnTwoDevices(Function):
        def forward(self, x):
            raise tc.DeviceError("kernel: arrays on cuda:0 and cuda:1")

    with pytest.raises(tc.DeviceError, match="cuda:0 and cuda:1") as caught:
        OnTwoDevices()(t(2))
    assert not isinstance(caught.value, tc.ShapeError)


def test_a_value_error_from_a_forward_that_is_not_about_shapes_stays_a_value_error():
    from tinygrad_caps.autograd import Function

    class NeedsPositive(Function):
        def forward(self, x):
            raise ValueError("k must be positive, got -1")

    with pytest.raises(ValueError, match="^k must be positive, got -1$") as caught:
        NeedsPositive()(t(2, 3))
    assert not isinstance(caught.value, tc.ShapeError)


@pytest.mark.parametrize("combine, shapes", [
    (lambda a, b: a + b, r"\(2, 3\), \(4, 3\)"),        # operands could not be broadcast together
    (lambda a, b: a @ b, r"\(2, 3\), \(4, 3\)"),        # matmul: ... mismatch in its core dimension
    (lambda a, b: np.dot(a, b), r"\(2, 3\), \(4, 3\)"),  # shapes (2,3) and (4,3) not aligned
    (lambda a, b: a.reshape(b.shape), r"\(2, 3\), \(4, 3\)"),  # cannot reshape array of size 6
])
def test_a_shape_mismatch_inside_a_forward_is_a_shape_error_naming_the_op_and_shapes(combine, shapes):
    from tinygrad_caps.autograd import Function

    class Combine(Function):
        def forward(self, a, b):
            return combine(a, b)

    with pytest.raises(tc.ShapeError, match=f"^Combine: .*input shapes {shapes}"):
        Combine()(t(2, 3), t(4, 3))
