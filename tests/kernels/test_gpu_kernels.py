"""Our RawKernels on a real GPU: each equals the NumPy path, and gradients through the kernel path
equal those through plain CuPy (skipped without a GPU)."""
import numpy as np
import pytest

from tinygrad_caps import kernels
from tinygrad_caps.kernels import activation, capsule, conv, launch, optim, routing

from helpers import routing_and_conv_gradients

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    import cupy

    return cupy


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (3, 37, 10, 16, 8), (100, 1152, 10, 16, 8)])
def test_capsule_and_routing_kernels_equal_numpy(cp, shape, dtype):
    b, i, j, d, k = shape
    rng = np.random.default_rng(0)
    u, w = rng.standard_normal((b, i, k)).astype(dtype), rng.standard_normal((i, j, d, k)).astype(dtype)
    g, c = rng.standard_normal((b, i, j, d)).astype(dtype), rng.standard_normal((b, i, j)).astype(dtype)
    v = rng.standard_normal((b, j, d)).astype(dtype)
    tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    gpu = cp.asarray
    np.testing.assert_allclose(capsule.capsule_predict(gpu(u), gpu(w)).get(), np.einsum("ijdk,bik->bijd", w, u), **tol)
    np.testing.assert_allclose(capsule.capsule_grad_u(gpu(g), gpu(w)).get(), np.einsum("ijdk,bijd->bik", w, g), **tol)
    np.testing.assert_allclose(capsule.capsule_grad_w(gpu(g), gpu(u)).get(), np.einsum("bijd,bik->ijdk", g, u), **tol)
    np.testing.assert_allclose(routing.routing_weighted_sum(gpu(c), gpu(g)).get(), np.einsum("bij,bijd->bjd", c, g), **tol)
    np.testing.assert_allclose(routing.routing_agreement(gpu(g), gpu(v)).get(), np.einsum("bijd,bjd->bij", g, v), **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 37, 10, 16), (100, 1152, 10, 16)])
def test_outer_products_and_row_activation_kernels_equal_numpy(cp, shape, dtype):
    from tinygrad_caps.kernels.checking.reference import reference_softmax, reference_softmax_grad, reference_squash, \
        reference_squash_grad

    b, i, j, d = shape
    rng = np.random.default_rng(4)
    p, q = rng.standard_normal((5, b, i, j)).astype(dtype), rng.standard_normal((5, b, j, d)).astype(dtype)
    x, g = rng.standard_normal((b, i, j, d)).astype(dtype), rng.standard_normal((b, i, j, d)).astype(dtype)
    tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    gpu = cp.asarray
    np.testing.assert_allclose(routing.routing_outer_products(gpu(p), gpu(q)).get(), np.einsum("tbij,tbjd->bijd", p, q), **tol)
    np.testing.assert_allclose(activation.squash_rows(gpu(x)).get(), reference_squash(x, 1e-8), **tol)
    np.testing.assert_allclose(activation.squash_rows_grad(gpu(x), gpu(g)).get(), reference_squash_grad(x, g, 1e-8), **tol)
    y = reference_softmax(p[0])
    np.testing.assert_allclose(activation.softmax_rows(gpu(p[0])).get(), y, **tol)
    want = reference_softmax_grad(y, g[..., 0])
    np.testing.assert_allclose(activation.softmax_rows_grad(gpu(y.astype(dtype)), gpu(g[..., 0])).get(), want, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (3, 37, 10, 16, 8), (100, 1152, 10, 16, 8), (9, 5, 3, 5, 3)])
def test_one_pass_adjoint_and_fused_routing_equal_numpy_and_are_deterministic(cp, shape, dtype):
    from tinygrad_caps.kernels.checking.reference import reference_routing

    b, i, j, d, k = shape
    rng = np.random.default_rng(3)
    u, w = rng.standard_normal((b, i, k)).astype(dtype), rng.standard_normal((i, j, d, k)).astype(dtype)
    g = rng.standard_normal((b, i, j, d)).astype(dtype)
    c = rng.standard_normal((b, i, j)).astype(dtype)
    tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    grad_u, grad_w = capsule.capsule_grad(cp.asarray(g), cp.asarray(u), cp.asarray(w))
    np.testing.assert_allclose(grad_u.get(), np.einsum("ijdk,bijd->bik", w, g), **tol)
    np.testing.assert_allclose(grad_w.get(), np.einsum("bijd,bik->ijdk", g, u), **tol)
    again_u, again_w = capsule.capsule_grad(cp.asarray(g), cp.asarray(u), cp.asarray(w))
    assert bool((again_u == grad_u).all()) and bool((again_w == grad_w).all())
    s = routing.routing_weighted_sum(cp.asarray(c), cp.asarray(g))
    assert bool((routing.routing_weighted_sum(cp.asarray(c), cp.asarray(g)) == s).all())
    u_hat = g * 0.05
    want = reference_routing(u_hat, 3, 1e-8)
    # the automatic choice, one block per example, and the sliced kernel with 1, 3 and 11 slices
    for slices in (None, routing.SINGLE_BLOCK, 1, 3, 11):
        v, coupling, logits = routing.routing_forward(cp.asarray(u_hat), 3, slices=slices)
        for got, expected in zip((v, coupling, logits), want):
            np.testing.assert_allclose(got.get(), expected, **tol)
        again = routing.routing_forward(cp.asarray(u_hat), 3, slices=slices)  # bitwise the same, run to run
        assert all(bool((x == y).all()) for x, y in zip(again, (v, coupling, logits))), slices


@pytest.mark.parametrize("amsgrad, decoupled", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_step_kernel_equals_numpy(cp, dtype, amsgrad, decoupled):
    from tinygrad_caps.kernels.checking.reference import reference_adam

    rng = np.random.default_rng(6)
    state = [rng.standard_normal(1_474_561).astype(dtype) for _ in range(5)]  # DigitCaps' W, plus one
    state[3], state[4] = np.abs(state[3]), np.abs(state[4])
    on_gpu = [cp.asarray(a) for a in state]
    hyper = dict(step=7, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, decoupled=decoupled)
    optim.adam_step(*on_gpu[:4], on_gpu[4] if amsgrad else None, **hyper)
    want = reference_adam(*state[:4], state[4] if amsgrad else None, **hyper)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    for got, expected in zip(on_gpu[:1] + on_gpu[2:], want):
        if expected is not None:
            np.testing.assert_allclose(got.get(), expected, **tol)


@pytest.mark.parametrize("batch_last", [False, True])
@pytest.mark.parametrize("case", [((2, 3, 9, 8), (3, 3), (2, 2), (1, 1)), ((100, 256, 20, 20), (9, 9), (2, 2), (0, 0))])
def test_im2col_and_col2im_kernels_equal_numpy(cp, case, batch_last):
    from tinygrad_caps.kernels.checking.reference import reference_im2col

    shape, kernel, stride, padding = case
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    col = conv.im2col(cp.asarray(x), kernel, stride, padding, batch_last).get()
    if x.size < 10_000:
        np.testing.assert_array_equal(col, reference_im2col(x, kernel, stride, padding, batch_last))
    r = np.random.default_rng(2).standard_normal(col.shape).astype(np.float32)
    back = conv.col2im(cp.asarray(r), shape, kernel, stride, padding, batch_last).get()
    np.testing.assert_allclose((x.astype(np.float64) * back).sum(), (col.astype(np.float64) * r).sum(), rtol=1e-4)


def routing_loss(device, dtype):
    return routing_and_conv_gradients((4, 37, 8), (37, 10, 16, 8), 0.1, (4, 3, 11, 11), (5, 3, 3, 3), device, dtype)


def test_gradients_through_kernels_equal_plain_cupy_and_numpy():
    results = {}
    for name, device, raw in (("numpy", "cpu", True), ("cupy", "cuda", False), ("raw", "cuda", True)):
        kernels.use_raw_kernels(raw)
        try:
            results[name] = routing_loss(device, np.float64)
        finally:
            kernels.use_raw_kernels(True)
    for a, b, c in zip(results["raw"], results["cupy"], results["numpy"]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-10)


def test_raw_kernel_switch():
    assert launch.raw_kernels_enabled()
    kernels.use_raw_kernels(False)
    assert not kernels.raw_kernels_enabled()
    kernels.use_raw_kernels(True)
