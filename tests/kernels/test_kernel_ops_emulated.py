"""The engine's ops on the kernel path, without a GPU: inside ``run_numpy_arrays_with(Emulator())``
NumPy arrays go through the very launchers and kernels the GPU runs, executed by the CPU
emulation (grids capped at two blocks, so every grid-stride loop takes several passes). Their
gradients (first and second order) must pass the float64 finite-difference checks and equal the
NumPy path; the fused routing forward must serve no_grad evaluation and nothing else."""
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.gradcheck import check_double_grad, check_grad
from tinygrad_caps.kernels.checking.emulation import Emulator
from tinygrad_caps.kernels.launch import run_numpy_arrays_with

from helpers import routing_and_conv_gradients

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")

EMULATOR = Emulator(max_blocks=2)


def kernels_used(action):
    """Run ``action`` on the kernel path; return its result and the names of the kernels it launched."""
    before = len(EMULATOR.launches)
    with run_numpy_arrays_with(EMULATOR):
        result = action()
    return result, {name.rsplit("_", 1)[0] for name, *_ in EMULATOR.launches[before:]}


@settings(max_examples=4)
@given(b=st.integers(1, 3), i=st.integers(1, 4), j=st.integers(1, 3), d=st.integers(1, 5), k=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16))
def test_capsule_predict_gradient_on_the_kernel_path(b, i, j, d, k, seed):
    rng = np.random.default_rng(seed)
    u, w = rng.standard_normal((b, i, k)), rng.standard_normal((i, j, d, k))
    _, used = kernels_used(lambda: check_grad(F.capsule_predict, [u, w], max_elementwise=0, directions=3))
    # the fixed defaults (tune.KERNELS; the emulation measures nothing): the prediction with W[i] in
    # shared memory, both adjoints from the one-pass kernel
    assert {"capsule_predict_shared", "capsule_grad"} <= used


@settings(max_examples=4)
@given(b=st.integers(1, 3), i=st.integers(1, 6), j=st.integers(1, 3), d=st.integers(1, 9), seed=st.integers(0, 2 ** 16))
def test_routing_contraction_gradients_on_the_kernel_path(b, i, j, d, seed):
    rng = np.random.default_rng(seed)
    c, u_hat, v = rng.standard_normal((b, i, j)), rng.standard_normal((b, i, j, d)), rng.standard_normal((b, j, d))
    _, used = kernels_used(lambda: (check_grad(F.routing_weighted_sum, [c, u_hat], max_elementwise=0, directions=3),
                                    check_grad(F.routing_agreement, [u_hat, v], max_elementwise=0, directions=3)))
    assert {"routing_weighted_sum_partial", "routing_weighted_sum_finish", "routing_agreement"} <= used


@settings(max_examples=4)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 2 ** 16))
def test_squash_and_softmax_gradients_on_the_kernel_path(shape, seed):
    """One kernel each way over the last axis; first and second derivatives still pass (the second
    is derived by the engine from the adjoint written with differentiable ops)."""
    x = np.random.default_rng(seed).standard_normal(shape)
    for op in (F.squash, F.softmax):
        _, used = kernels_used(lambda: (check_grad(lambda a: op(a, -1), [x], max_elementwise=0, directions=3),
                                        check_double_grad(lambda a: op(a, -1), [x])))
        assert {f"{op.__name__}_rows", f"{op.__name__}_rows_grad"} <= used


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer, options", [(tc.optim.Adam, {}), (tc.optim.Adam, dict(weight_decay=0.1, amsgrad=True)),
                                                (tc.optim.AdamW, dict(amsgrad=True))])
def test_adam_steps_on_the_kernel_path_equal_the_array_path(optimizer, options, dtype):
    """The one-launch update the GPU runs gives the array formulation's parameters, step after step."""
    start = np.random.default_rng(5).standard_normal((6, 7)).astype(dtype)
    results = []
    for on_kernels in (False, True):
        p = tc.tensor(start.copy(), requires_grad=True)
        opt = optimizer([p], lr=1e-2, **options)
        for step in range(4):
            grad = np.sin(p.data * (step + 1)).astype(dtype)
            # odd steps: a strided gradient (a transposed layer's), which the kernel path copies
            p.grad = tc.Tensor._wrap(grad.T.copy().T if step % 2 else grad)
            if on_kernels:
                _, used = kernels_used(opt.step)
                assert used == {"adam_step"}
            else:
                opt.step()
        results.append(p.data)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(results[1], results[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("w_shape, kernels_expected, kernels_not_expected", [
    # float64: 6,144 values fit a block's 48 KiB. K = 48 is over the register kernels' 8: W[i]
    # fits the shared-memory prediction, but not with its gradient and the staged rows: the
    # adjoints run as two kernels
    ((2, 4, 16, 48), {"capsule_predict_shared", "capsule_grad_u", "capsule_grad_w"},
     {"capsule_predict", "capsule_grad", "capsule_grad_shared"}),
    # W[i] alone does not fit (6,272 values): the prediction takes the NumPy path
    ((2, 8, 28, 28), {"capsule_grad_u", "capsule_grad_w"},
     {"capsule_predict", "capsule_predict_shared", "capsule_grad", "capsule_grad_shared"}),
])
def test_capsule_layers_too_large_for_shared_memory_take_another_path(w_shape, kernels_expected,
                                                                      kernels_not_expected):
    rng = np.random.default_rng(3)
    u, w = rng.standard_normal((2, w_shape[0], w_shape[3])), rng.standard_normal(w_shape) * 0.1
    _, used = kernels_used(lambda: check_grad(F.capsule_predict, [u, w], max_elementwise=0, directions=2))
    assert kernels_expected <= used and not kernels_not_expected & used


def test_second_derivatives_on_the_kernel_path():
    rng = np.random.default_rng(1)
    u, w = rng.standard_normal((2, 3, 2)), rng.standard_normal((3, 2, 4, 2))
    x, kernel = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    _, used = kernels_used(lambda: (check_double_grad(F.capsule_predict, [u, w], max_elementwise=0, directions=3),
                                    check_double_grad(lambda a, b: F.conv2d(a, b, None, 2, 1), [x, kernel],
                                                      max_elementwise=0, directions=3)))
    # the adjoints' own ops (second order) ran on their kernels too (im2col of 2 images: (n, oy, ox)
    # columns from staged image planes)
    assert {"capsule_predict_shared", "capsule_grad_u", "capsule_grad_w", "im2col_planes", "col2im_i32"} <= used


def routing_loss_and_gradients():
    # batch >= 8 for the image: the batch-last columns
    return routing_and_conv_gradients((3, 11, 4), (11, 3, 8, 4), 0.3, (9, 2, 7, 7), (3, 2, 3, 3))


def test_routing_and_convolution_gradients_equal_the_numpy_path():
    reference = routing_loss_and_gradients()
    emulated, used = kernels_used(routing_loss_and_gradients)
    assert {"capsule_predict_shared", "capsule_grad", "routing_agreement", "im2col_i32", "col2im_i32"} <= used
    for got, want in zip(emulated, reference):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_fused_routing_serves_no_grad_evaluation_only():
    from tinygrad_caps.models.capsnet.routing import dynamic_routing

    u_hat = tc.tensor(np.random.default_rng(2).standard_normal((3, 13, 4, 8)))
    reference = dynamic_routing(u_hat, iterations=3).numpy()
    with tc.no_grad():
        fused, used = kernels_used(lambda: dynamic_routing(u_hat, iterations=3))
    assert used == {"routing_forward"}
    np.testing.assert_allclose(fused.numpy(), reference, rtol=1e-12, atol=1e-12)
    recorded = tc.tensor(u_hat.numpy(), requires_grad=True)
    v, used = kernels_used(lambda: dynamic_routing(recorded, iterations=3))
    assert "routing_forward" not in used and v.requires_grad  # with a gradient: op by op
    np.testing.assert_allclose(v.numpy(), reference, rtol=1e-12, atol=1e-12)
    with pytest.raises(tc.GraphError, match="no_grad"):
        kernels_used(lambda: F.routing_forward(recorded, 3))
    with pytest.raises(RuntimeError, match="no kernel path"):
        with tc.no_grad():
            F.routing_forward(u_hat, 3)  # NumPy arrays outside the emulation context


@pytest.mark.parametrize("shape, agreement_kernel", [
    # float64 (6,144 values fit a block's 48 KiB). J*D = 3,100: v and one row of partial sums
    # (6,200 values) overflow the fused kernel's block; the agreement kernel's v[b] still fits
    ((2, 3, 2, 1550), True),
    # J*D = 6,400: v[b] alone overflows, so the agreement takes the NumPy path too
    ((1, 2, 2, 3200), False),
])
def test_output_capsules_too_large_for_shared_memory_route_op_by_op(shape, agreement_kernel):
    from tinygrad_caps.models.capsnet.routing import dynamic_routing

    u_hat = tc.tensor(np.random.default_rng(4).standard_normal(shape) * 0.01)
    reference = dynamic_routing(u_hat, iterations=3).numpy()
    with tc.no_grad():
        v, used = kernels_used(lambda: dynamic_routing(u_hat, iterations=3))
    assert "routing_forward" not in used and "routing_weighted_sum_partial" in used
    assert ("routing_agreement" in used) == agreement_kernel
    np.testing.assert_allclose(v.numpy(), reference, rtol=1e-12, atol=1e-14)
