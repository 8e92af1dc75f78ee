"""Every op's forward against NumPy in float64 (the gradient properties check the backward only
against central differences of whatever the forward computes, so a wrong forward passes them).

``test_forward_equals_numpy`` draws every entry of the op table (tests/support/op_table.py) from
its domain; the tests below it check what one table line cannot say. Shapes are drawn on both
sides of every size-dependent code path: the short-last-axis reductions switch at 4096 elements
(``ops._common.SHORT_AXIS``), the capsule prediction runs one GEMM per input capsule, im2col's
column order switches at a batch of 8. Convolutions are checked against naive loops in
tests/engine/test_conv.py too."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from helpers import arrays, floats, shapes
from op_table import FLOAT32_TOL, OPS, TOL, bound, case_params, ids, reference
from tinygrad_caps.gradcheck import check_grad


def t(a):
    return tc.tensor(a)


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


FORWARD = [op for op in OPS if op.tested("forward")]
FORWARD_CASES = case_params(OPS, "forward")


def check_forward(op, sample):
    y = bound(op, sample)(*[t(a) for a in sample.arrays()]).numpy()
    expected = reference(op, sample)
    assert y.shape == expected.shape and y.dtype == expected.dtype, (y.shape, y.dtype, expected.shape, expected.dtype)
    np.testing.assert_allclose(y, expected, **(op.tol if y.dtype == np.float64 else FLOAT32_TOL))


@pytest.mark.parametrize("op", FORWARD, ids=ids(FORWARD))
@given(data=st.data())
def test_forward_equals_numpy(op, data):
    """Every op of the table (tests/support/op_table.py) on its drawn domain: shape, dtype and values."""
    check_forward(op, data.draw(op.sample))


@pytest.mark.parametrize("op, case", FORWARD_CASES, ids=ids(FORWARD_CASES))
def test_fixed_case_forward_equals_numpy(op, case):
    check_forward(op, op.cases[case](np.random.default_rng(0)))


@pytest.mark.parametrize("exponent", [0, 1, 2, -1, 0.5])
def test_pow_by_special_exponents(exponent):
    x = np.array([[0.5, 1.5, 2.0], [3.0, 0.25, 1.0]])
    np.testing.assert_allclose(F.pow(t(x), exponent).numpy(), x ** exponent, **TOL)
    check_grad(lambda a: F.pow(a, exponent), [x])


@given(shape=shapes(min_dims=1), data=st.data())
def test_where_forward_equals_numpy(shape, data):
    a, b = data.draw(arrays(shape)), data.draw(arrays(shape))
    cond = data.draw(hnp.arrays(bool, shape))
    np.testing.assert_array_equal(F.where(cond, t(a), t(b)).numpy(), np.where(cond, a, b))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "softmax", "log_softmax", "squash"])
def test_short_last_axis_path_gradient(name):
    """The gradients through the large short-last-axis path (the property tests' shapes are too small for it)."""
    rng = np.random.default_rng(1)
    x = rng.permutation(2 * 410 * 10).reshape(2, 410, 10) / 500.0 - 8.0  # distinct values: no ties in max/min
    fn = {"softmax": lambda a: F.softmax(a, -1), "log_softmax": lambda a: F.log_softmax(a, -1),
          "squash": lambda a: F.squash(a, -1)}.get(name) or (lambda a: getattr(F, name)(a, axis=-1))
    check_grad(fn, [x], max_elementwise=0, directions=4)


@given(x=arrays((2, 5, 3)), axis=st.integers(-3, 2))
def test_softmax_family_forward_equals_numpy(x, axis):
    np.testing.assert_allclose(F.softmax(t(x), axis).numpy(), np_softmax(x, axis), **TOL)
    np.testing.assert_allclose(F.log_softmax(t(x), axis).numpy(), np.log(np_softmax(x, axis)), rtol=1e-11, atol=1e-12)
    squared = (x * x).sum(axis=axis, keepdims=True)
    expected = squared / (1 + squared) * x / np.sqrt(squared + 1e-8)
    np.testing.assert_allclose(F.squash(t(x), axis).numpy(), expected, **TOL)


@given(batch=st.integers(1, 3), inputs=st.integers(1, 4), outputs=st.integers(1, 3), dim=st.integers(1, 3),
       k=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_capsule_ops_forward_equals_loops(batch, inputs, outputs, dim, k, seed):
    rng = np.random.default_rng(seed)
    u, w = rng.standard_normal((batch, inputs, k)), rng.standard_normal((inputs, outputs, dim, k))
    c, v = rng.standard_normal((batch, inputs, outputs)), rng.standard_normal((batch, outputs, dim))
    u_hat = np.zeros((batch, inputs, outputs, dim))
    for b in range(batch):
        for i in range(inputs):
            for j in range(outputs):
                u_hat[b, i, j] = w[i, j] @ u[b, i]
    np.testing.assert_allclose(F.capsule_predict(t(u), t(w)).numpy(), u_hat, **TOL)
    s = np.zeros((batch, outputs, dim))
    agreement = np.zeros((batch, inputs, outputs))
    for i in range(inputs):
        s += c[:, i, :, None] * u_hat[:, i]
        agreement[:, i] = (u_hat[:, i] * v).sum(-1)
    np.testing.assert_allclose(F.routing_weighted_sum(t(c), t(u_hat)).numpy(), s, **TOL)
    np.testing.assert_allclose(F.routing_agreement(t(u_hat), t(v)).numpy(), agreement, **TOL)


@given(a_shape=st.sampled_from([(3,), (2, 3), (4, 2, 3), (1, 2, 3)]), b_shape=st.sampled_from([(3,), (3, 2), (1, 3, 2)]),
       data=st.data())
def test_matmul_and_linear_forward_equal_numpy(a_shape, b_shape, data):
    a, b = data.draw(arrays(a_shape)), data.draw(arrays(b_shape))
    np.testing.assert_allclose(F.matmul(t(a), t(b)).numpy(), np.matmul(a, b), **TOL)
    w, bias = data.draw(arrays((4, 3))), data.draw(arrays((4,)))
    np.testing.assert_allclose(F.linear(t(a), t(w), t(bias)).numpy(), a @ w.T + bias, **TOL)
    np.testing.assert_allclose(F.linear(t(a), t(w)).numpy(), a @ w.T, **TOL)


@given(x=arrays((3, 4, 2)), data=st.data())
def test_shape_ops_forward_equal_numpy(x, data):
    perm = tuple(data.draw(st.permutations(range(3))))
    checks = [
        (F.reshape(t(x), (4, 6)), x.reshape(4, 6)),
        (F.reshape(t(x), (-1, 2)), x.reshape(-1, 2)),
        (F.flatten(t(x)), x.reshape(-1)),
        (F.flatten(t(x), 1), x.reshape(3, -1)),
        (F.transpose(t(x)), x.T),
        (F.transpose(t(x), perm), x.transpose(perm)),
        (F.permute(t(x), perm), x.transpose(perm)),
        (F.swapaxes(t(x), 0, 2), np.swapaxes(x, 0, 2)),
        (F.expand_dims(t(x), 1), x[:, None]),
        (F.expand_dims(t(x), -1), x[..., None]),
        (F.squeeze(t(x[:, :1]), 1), x[:, 0]),
        (F.squeeze(t(x[:1, :, :1])), x[0, :, 0]),
        (F.getitem(t(x), (slice(1, None), 2)), x[1:, 2]),
        (t(x)[::-1, 1:3], x[::-1, 1:3]),
        (t(x)[np.array([2, 0, 2])], x[[2, 0, 2]]),
        (F.concatenate([t(x), t(2 * x)], axis=1), np.concatenate([x, 2 * x], axis=1)),
        (F.concatenate([t(x), t(2 * x)], axis=-1), np.concatenate([x, 2 * x], axis=-1)),
        (F.stack([t(x), t(2 * x), t(3 * x)], axis=2), np.stack([x, 2 * x, 3 * x], axis=2)),
        (F.stack([t(x), t(2 * x)]), np.stack([x, 2 * x])),
        (F.pad(t(x), ((1, 0), (0, 2), (1, 1))), np.pad(x, ((1, 0), (0, 2), (1, 1)))),
        (F.pad(t(x), 1), np.pad(x, 1)),
        (F.broadcast_to(t(x[:, :1]), (2, 3, 4, 2)), np.broadcast_to(x[:, :1], (2, 3, 4, 2))),
        (F.sum_to(t(x), (4, 1)), x.sum(axis=0).sum(axis=-1, keepdims=True)),
        (F.sum_to(t(x), (3, 1, 2)), x.sum(axis=1, keepdims=True)),
        (F.to_device(t(x), "cpu"), x),
    ]
    for ours, expected in checks:
        assert ours.shape == expected.shape
        np.testing.assert_allclose(ours.numpy(), expected, **TOL)  # sum_to may add in another order


@given(x=arrays((4, 3), elements=floats(-3, 3)), probs=arrays((4, 3), elements=floats(0.02, 0.98)),
       reduction=st.sampled_from(["mean", "sum", "none"]), data=st.data())
def test_losses_forward_equal_numpy(x, probs, reduction, data):
    reduce = {"mean": np.mean, "sum": np.sum, "none": lambda a: a}[reduction]
    target = data.draw(arrays((4, 3), elements=floats(0.0, 1.0)))
    labels = np.array(data.draw(st.lists(st.integers(0, 2), min_size=4, max_size=4)))
    np.testing.assert_allclose(F.mse_loss(t(x), t(target), reduction).numpy(), reduce((x - target) ** 2), **TOL)
    bce = -(target * np.log(probs) + (1 - target) * np.log(1 - probs))
    np.testing.assert_allclose(F.binary_cross_entropy(t(probs), t(target), reduction).numpy(), reduce(bce), rtol=1e-11)
    log_p = np.log(np_softmax(x, 1))
    ce = -log_p[np.arange(4), labels]
    np.testing.assert_allclose(F.cross_entropy(t(x), labels, reduction).numpy(), reduce(ce), rtol=1e-11, atol=1e-12)
    soft = np_softmax(target, 1)
    np.testing.assert_allclose(F.cross_entropy(t(x), t(soft), reduction).numpy(), reduce(-(soft * log_p).sum(1)),
                               rtol=1e-11, atol=1e-12)
    np.testing.assert_array_equal(F.one_hot(labels, 3, dtype=np.float64).numpy(), np.eye(3)[labels])


def test_defaults_of_the_losses_reduce_by_mean():
    x, target = np.arange(6.0).reshape(2, 3) / 7, np.ones((2, 3)) / 3
    assert F.mse_loss(t(x), t(target)).item() == pytest.approx(((x - target) ** 2).mean(), rel=1e-14)
    assert F.binary_cross_entropy(t(x + 0.1), t(target)).item() == pytest.approx(
        (-(target * np.log(x + 0.1) + (1 - target) * np.log(0.9 - x))).mean(), rel=1e-13)
    assert F.one_hot(np.array([1]), 2).numpy().dtype == np.float32


def test_binary_cross_entropy_clamps_the_log_at_minus_100():
    y = F.binary_cross_entropy(t(np.array([0.0, 1.0])), t(np.array([1.0, 0.0])), "none").numpy()
    np.testing.assert_array_equal(y, [100.0, 100.0])


@given(x=arrays((5, 3, 2)), training=st.booleans(), with_affine=st.booleans(), data=st.data())
def test_batch_norm_forward_equals_numpy(x, training, with_affine, data):
    mean0 = data.draw(arrays((3,)))
    var0 = data.draw(arrays((3,), elements=floats(0.5, 2.0)))
    weight = data.draw(arrays((3,))) if with_affine else None
    bias = data.draw(arrays((3,))) if with_affine else None
    running_mean, running_var = mean0.copy(), var0.copy()
    y = F.batch_norm(t(x), running_mean, running_var, None if weight is None else t(weight),
                     None if bias is None else t(bias), training=training, momentum=0.2).numpy()
    if training:
        mu, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
        np.testing.assert_allclose(running_mean, 0.8 * mean0 + 0.2 * mu, **TOL)
        np.testing.assert_allclose(running_var, 0.8 * var0 + 0.2 * x.var(axis=(0, 2), ddof=1), **TOL)
    else:
        mu, var = mean0, var0
        np.testing.assert_array_equal(running_mean, mean0)
    expected = (x - mu[None, :, None]) / np.sqrt(var[None, :, None] + 1e-5)
    if with_affine:
        expected = expected * weight[None, :, None] + bias[None, :, None]
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)


def test_dropout_forward_keeps_a_fraction_and_rescales():
    tc.manual_seed(0)
    x = np.random.default_rng(0).uniform(1.0, 2.0, (200, 50))
    y = F.dropout(t(x), 0.3).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02
    np.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-14)
    np.testing.assert_array_equal(F.dropout(t(x), 0.3, training=False).numpy(), x)
    np.testing.assert_array_equal(F.dropout(t(x), 0.0).numpy(), x)
    np.testing.assert_array_equal(F.dropout(t(x), 1.0).numpy(), np.zeros_like(x))
    assert abs((F.dropout(t(x)).numpy() != 0).mean() - 0.5) < 0.02  # the default p = 0.5, training


def test_one_hot_of_a_plain_list():
    np.testing.assert_array_equal(F.one_hot([0, 2], 3).numpy(), [[1, 0, 0], [0, 0, 1]])


@pytest.mark.parametrize("op", [F.add, F.sub, F.mul, F.div, F.maximum])
def test_binary_result_dtypes_follow_pytorch_promotion(op):
    x32 = tc.tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    x64 = tc.tensor(np.array([1.5, 2.5, 3.5]))
    zero_dim64 = tc.tensor(np.array(2.0))
    ints = tc.tensor(np.array([1, 2, 3]))
    assert op(x32, zero_dim64).dtype == np.float32  # a zero-dim operand takes the dimensioned one's dtype
    assert op(zero_dim64, x32).dtype == np.float32
    assert op(x32, x64).dtype == np.float64 and op(x64, x32).dtype == np.float64
    assert op(x32, 2.0).dtype == np.float32 and op(2.0, x32).dtype == np.float32
    assert op(ints, zero_dim64).dtype == np.float64  # a float beside integers: the float's dtype
    widened = tc.tensor(x32.numpy().astype(np.float64))
    np.testing.assert_allclose(op(x32, zero_dim64).numpy(), op(widened, zero_dim64).numpy(), rtol=1e-6)


def test_default_axis_is_the_last():
    x = np.random.default_rng(2).standard_normal((3, 4, 5))
    np.testing.assert_allclose(F.softmax(t(x)).numpy(), np_softmax(x, -1), **TOL)
    np.testing.assert_allclose(F.log_softmax(t(x)).numpy(), np.log(np_softmax(x, -1)), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(F.squash(t(x)).numpy(), F.squash(t(x), axis=2).numpy(), rtol=0)
    np.testing.assert_allclose(F.transpose(t(x), (-1, 0, -2)).numpy(), x.transpose(2, 0, 1), rtol=0)
    np.testing.assert_allclose(F.permute(t(x), (-1, -3, 1)).numpy(), x.transpose(2, 0, 1), rtol=0)


def test_clip_passes_the_gradient_at_its_bounds_as_pytorch():
    """PyTorch's clamp lets the gradient through where x equals a bound (x >= min and x <= max)."""
    x = tc.tensor(np.array([-1.0, -0.5, 0.0, 1.0, 2.0]), requires_grad=True)
    F.sum(F.clip(x, -0.5, 1.0)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 1.0, 1.0, 0.0])


def test_a_zero_dim_integer_beside_floats_keeps_the_float_dtype():
    x32 = tc.tensor(np.array([1.5, 2.5], dtype=np.float32))
    y = x32 + tc.tensor(np.array(2))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.numpy(), [3.5, 4.5])


def test_stack_and_where_take_the_documented_argument_forms():
    a, b = np.arange(6.0).reshape(2, 3), -np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(F.stack([t(a), t(b)], axis=-1).numpy(), np.stack([a, b], axis=-1))
    np.testing.assert_array_equal(F.stack([t(a), t(b)], axis=-3).numpy(), np.stack([a, b], axis=0))
    np.testing.assert_array_equal(F.expand_dims(t(a), -3).numpy(), a[None])
    cond = [[True, False, True], [False, True, False]]
    np.testing.assert_array_equal(F.where(cond, t(a), t(b)).numpy(), np.where(cond, a, b))
    np.testing.assert_array_equal(F.where(t(np.array(cond)), t(a), t(b)).numpy(), np.where(cond, a, b))


def test_capsule_ops_with_more_than_256_input_capsules():
    """CapsNet has 1152 input capsules: shape checks must compare sizes by value, not identity."""
    rng = np.random.default_rng(8)
    u, w = rng.standard_normal((2, 300, 2)), rng.standard_normal((300, 3, 2, 2))
    u_hat = F.capsule_predict(t(u), t(w)).numpy()
    np.testing.assert_allclose(u_hat, np.einsum("ijdk,bik->bijd", w, u), **TOL)
    c = rng.standard_normal((2, 300, 3))
    np.testing.assert_allclose(F.routing_weighted_sum(t(c), t(u_hat)).numpy(), np.einsum("bij,bijd->bjd", c, u_hat), **TOL)
