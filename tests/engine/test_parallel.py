"""Work split over the cores (tinygrad_caps/_parallel.py) gives exactly the one-thread result."""
import numpy as np
import pytest

import tinygrad_caps as tc
from tinygrad_caps import _parallel
from tinygrad_caps.ops.capsule import agreement_array, grad_u_array, grad_w_array, predict_array, weighted_sum_array
from tinygrad_caps.ops.conv import col2im_array, im2col_array


def test_over_slices_covers_the_range_once_in_order_of_slices(monkeypatch):
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "3")
    seen = []
    _parallel.over_slices(10, lambda start, stop: seen.append((start, stop)), nbytes=1 << 30)
    assert sorted(seen) == [(0, 3), (3, 6), (6, 10)]
    seen.clear()
    _parallel.over_slices(10, lambda start, stop: seen.append((start, stop)), nbytes=10)  # small: inline
    assert seen == [(0, 10)]


def test_an_error_in_a_slice_reaches_the_caller(monkeypatch):
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "2")

    def work(start, stop):
        if start > 0:
            raise ValueError("slice failed")

    with pytest.raises(ValueError, match="slice failed"):
        _parallel.over_slices(4, work, nbytes=1 << 30)


def _with_threads(monkeypatch, count, fn):
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", str(count))
    return fn()


@pytest.mark.parametrize("ufunc", [np.add, np.subtract, np.multiply, np.divide])
def test_binary_equals_the_plain_ufunc(monkeypatch, ufunc):
    monkeypatch.setattr(_parallel, "PARALLEL_ELEMENTWISE_BYTES", 0)
    rng = np.random.default_rng(0)
    a, b = rng.random((7, 5, 1, 3), dtype=np.float32) + 0.5, rng.random((1, 5, 4, 3), dtype=np.float32) + 0.5
    expected = ufunc(a, b)
    got = _with_threads(monkeypatch, 2, lambda: _parallel.binary(ufunc, a, b))
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    mixed = _with_threads(monkeypatch, 2, lambda: _parallel.binary(ufunc, a, b.astype(np.float64)))
    assert mixed.dtype == np.float64 and np.array_equal(mixed, ufunc(a, b.astype(np.float64)))


@pytest.mark.parametrize("ufunc, other", [(np.add, "same"), (np.multiply, "bool"), (np.maximum, "zero"),
                                          (np.greater, "zero")])
def test_binary_keeps_the_layout_of_a_transposed_operand(monkeypatch, ufunc, other):
    monkeypatch.setattr(_parallel, "PARALLEL_ELEMENTWISE_BYTES", 0)
    monkeypatch.setattr(_parallel, "MIN_BYTES_PER_THREAD", 1)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 3, 4, 6)).astype(np.float32).transpose(3, 0, 1, 2)  # NCHW view of (C, H, W, N)
    b = {"same": rng.standard_normal((5, 3, 4, 6)).astype(np.float32).transpose(3, 0, 1, 2), "bool": a > 0,
         "zero": np.zeros((), np.float32)}[other]
    expected = ufunc(a, b)
    got = _with_threads(monkeypatch, 2, lambda: _parallel.binary(ufunc, a, b))
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert got.strides == expected.strides  # the memory order NumPy itself picks for a transposed input


def test_add_into_sums_in_place_in_any_layout(monkeypatch):
    monkeypatch.setattr(_parallel, "PARALLEL_ELEMENTWISE_BYTES", 0)
    monkeypatch.setattr(_parallel, "MIN_BYTES_PER_THREAD", 1)
    rng = np.random.default_rng(3)
    target = rng.standard_normal((7, 4, 5)).astype(np.float32).transpose(2, 0, 1)
    value = rng.standard_normal((7, 1)).astype(np.float32)  # broadcasts to (5, 7, 4)
    expected = target + value
    got = _with_threads(monkeypatch, 2, lambda: _parallel.add_into(target, value))
    assert got is target and np.array_equal(target, expected)
    assert _parallel.add_into(np.float64(1.5), np.array(2.0)) == 3.5  # a NumPy scalar: the sum is returned


def test_conv_routing_and_adam_are_identical_with_one_and_two_threads(monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 6, 11, 10)).astype(np.float32)
    c = rng.random((9, 40, 5)).astype(np.float32)
    u_hat = rng.standard_normal((9, 40, 5, 4)).astype(np.float32)
    v = rng.standard_normal((9, 5, 4)).astype(np.float32)
    u = rng.standard_normal((9, 40, 3)).astype(np.float32)
    W = rng.standard_normal((40, 5, 4, 3)).astype(np.float32)
    logits = rng.standard_normal((9, 40, 5)).astype(np.float32)
    monkeypatch.setattr(_parallel, "MIN_BYTES_PER_THREAD", 1)
    monkeypatch.setattr(tc.optim.Adam, "chunk", 5)  # several chunks in each thread's range

    def compute():
        col = im2col_array(x, (3, 4), (2, 1), (1, 2))
        image = col2im_array(col, x.shape, (3, 4), (2, 1), (1, 2))
        p = tc.tensor(rng_params.copy(), requires_grad=True)
        p.grad = tc.Tensor(grads.copy())
        opt = tc.optim.Adam([p], lr=0.1, weight_decay=0.01, amsgrad=True)
        opt.step()
        opt.step()
        capsules = predict_array(u, W), grad_u_array(u_hat, W), grad_w_array(u_hat, u)
        return (col, image, weighted_sum_array(c, u_hat), agreement_array(u_hat, v), p.numpy(), *capsules,
                tc.functional.softmax(tc.tensor(logits), axis=2).numpy())

    rng_params = rng.standard_normal((6, 7)).astype(np.float32)
    grads = rng.standard_normal((6, 7)).astype(np.float32)
    one = _with_threads(monkeypatch, 1, compute)
    two = _with_threads(monkeypatch, 2, compute)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)
    # float32 sums of 40 terms: an absolute tolerance too, as Intel and AMD CPUs round them differently
    np.testing.assert_allclose(one[2], np.einsum("bij,bijd->bjd", c, u_hat), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(one[3], np.einsum("bijd,bjd->bij", u_hat, v), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one[5], np.einsum("ijdk,bik->bijd", W, u), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(one[6], np.einsum("bijd,ijdk->bik", u_hat, W), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(one[7], np.einsum("bijd,bik->ijdk", u_hat, u), rtol=1e-5, atol=1e-5)


def test_binary_keeps_c_order_when_the_full_shape_operand_is_a_broadcast(monkeypatch):
    monkeypatch.setattr(_parallel, "PARALLEL_ELEMENTWISE_BYTES", 0)
    row = np.arange(4.0)
    got = _parallel.binary(np.add, np.broadcast_to(row, (3, 4)), np.ones((3, 4)))
    assert got.flags.c_contiguous and np.array_equal(got, np.broadcast_to(row + 1, (3, 4)))


def test_add_into_overlapping_operands_equals_one_numpy_call(monkeypatch):
    monkeypatch.setenv("TINYGRAD_CAPS_NUM_THREADS", "2")
    monkeypatch.setattr(_parallel, "PARALLEL_ELEMENTWISE_BYTES", 0)
    monkeypatch.setattr(_parallel, "MIN_BYTES_PER_THREAD", 1)
    for view in (lambda t: t.T, lambda t: t[::-1]):
        target = np.arange(64.0).reshape(8, 8)
        expected = target.copy()
        expected += view(expected)
        _parallel.add_into(target, view(target))
        assert np.array_equal(target, expected)


def test_split_work_keeps_numpy_dtypes_for_integer_inputs():
    from tinygrad_caps.ops._common import sum_to_array

    soft = tc.functional.softmax(tc.tensor(np.arange(6).reshape(2, 3)), axis=1).numpy()
    np.testing.assert_allclose(soft, np.exp(np.arange(3)) / np.exp(np.arange(3)).sum() * np.ones((2, 1)))
    counts = sum_to_array(np.ones((2, 3000, 8), dtype=bool), (2, 3000, 1))
    assert counts.dtype == np.ones(1, bool).sum().dtype and (counts == 8).all()
    wide = sum_to_array(np.full((2, 3000, 8), 100, dtype=np.int8), (2, 3000, 1))
    assert (wide == 800).all()
