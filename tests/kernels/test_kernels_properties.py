"""Every capsule and routing kernel against NumPy over generated shapes, dtypes, block sizes and
grid caps, on the CPU emulation (fibers make a launch cheap enough for Hypothesis). The fixed
cases in test_kernels_emulation.py name the awkward shapes we thought of; these find the ones we
did not: odd D with and without the vector path, partial warps and blocks, several rows or
chunks per block, grid-stride loops of one to three blocks."""
import functools
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygrad_caps.kernels import activation, capsule, optim, routing
from tinygrad_caps.kernels.checking.emulation import Emulator
from tinygrad_caps.kernels.checking.reference import (reference_adam, reference_routing, reference_softmax,
                                                      reference_softmax_grad, reference_squash, reference_squash_grad)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")

WARPS = st.sampled_from([32, 64, 96, 128, 256])  # block sizes in whole warps
DTYPES = st.sampled_from([np.float32, np.float64])
GRID_CAPS = st.sampled_from([None, 1, 2, 3])     # None: CUDA's limits; else grid-stride passes


@functools.lru_cache(maxsize=None)
def emulator(max_blocks):
    return Emulator(max_blocks=max_blocks)


def close(got, want, dtype):
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0))))


@given(b=st.integers(1, 12), i=st.integers(1, 24), j=st.integers(1, 6), d=st.integers(1, 18), k=st.integers(1, 9),
       dtype=DTYPES, threads=WARPS, max_blocks=GRID_CAPS, registers=st.sampled_from([None, False]),
       tile_rows=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2 ** 16))
def test_capsule_kernels_over_generated_shapes(b, i, j, d, k, dtype, threads, max_blocks, registers, tile_rows, seed):
    """K up to 9: the register kernels (K <= 8, tiles of g of 1, 3 or 32 rows) and the shared-memory ones."""
    rng = np.random.default_rng(seed)
    u, w = rng.standard_normal((b, i, k)).astype(dtype), rng.standard_normal((i, j, d, k)).astype(dtype)
    g = rng.standard_normal((b, i, j, d)).astype(dtype)
    run = emulator(max_blocks)
    in_registers = k <= capsule.PREDICT_KMAX if registers is None else registers  # None: registers where K allows
    close(capsule.capsule_predict(u, w, run, threads, registers=in_registers), np.einsum("ijdk,bik->bijd", w, u), dtype)
    grad_u, grad_w = capsule.capsule_grad(g, u, w, run, threads, registers=registers, tile_rows=tile_rows)
    close(grad_u, np.einsum("ijdk,bijd->bik", w, g), dtype)
    close(grad_w, np.einsum("bijd,bik->ijdk", g, u), dtype)
    close(capsule.capsule_grad_u(g, w, run, threads), np.einsum("ijdk,bijd->bik", w, g), dtype)
    close(capsule.capsule_grad_w(g, u, run, threads), np.einsum("bijd,bik->ijdk", g, u), dtype)


@given(b=st.integers(1, 12), i=st.integers(1, 40), j=st.integers(1, 10), d=st.integers(1, 20),
       dtype=DTYPES, threads=WARPS, max_blocks=GRID_CAPS, seed=st.integers(0, 2 ** 16))
def test_routing_contractions_over_generated_shapes(b, i, j, d, dtype, threads, max_blocks, seed):
    rng = np.random.default_rng(seed)
    c, u_hat = rng.standard_normal((b, i, j)).astype(dtype), rng.standard_normal((b, i, j, d)).astype(dtype)
    v = rng.standard_normal((b, j, d)).astype(dtype)
    run = emulator(max_blocks)
    summed = routing.routing_weighted_sum(c, u_hat, run, threads)
    close(summed, np.einsum("bij,bijd->bjd", c, u_hat), dtype)
    np.testing.assert_array_equal(routing.routing_weighted_sum(c, u_hat, run, threads), summed)  # deterministic
    close(routing.routing_agreement(u_hat, v, run, threads), np.einsum("bijd,bjd->bij", u_hat, v), dtype)


@given(terms=st.integers(1, 6), b=st.integers(1, 6), i=st.integers(1, 20), j=st.integers(1, 10), d=st.integers(1, 20),
       dtype=DTYPES, threads=WARPS, max_blocks=GRID_CAPS, wide=st.sampled_from([None, True]), seed=st.integers(0, 2 ** 16))
def test_routing_outer_products_over_generated_shapes(terms, b, i, j, d, dtype, threads, max_blocks, wide, seed):
    """32- and 64-bit index math (the 64-bit path is forced here; real sizes that need it are GiBs)."""
    rng = np.random.default_rng(seed)
    p, q = rng.standard_normal((terms, b, i, j)).astype(dtype), rng.standard_normal((terms, b, j, d)).astype(dtype)
    got = routing.routing_outer_products(p, q, emulator(max_blocks), threads, wide_indices=wide)
    close(got, np.einsum("tbij,tbjd->bijd", p, q), dtype)


@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), scale=st.sampled_from([1e-3, 1.0, 30.0]),
       dtype=DTYPES, threads=WARPS, max_blocks=GRID_CAPS, seed=st.integers(0, 2 ** 16))
def test_row_activation_kernels_over_generated_shapes(shape, scale, dtype, threads, max_blocks, seed):
    """squash and softmax over the last axis, and their adjoints, from tiny to large rows of values."""
    rng = np.random.default_rng(seed)
    x, g = (rng.standard_normal(shape) * scale).astype(dtype), rng.standard_normal(shape).astype(dtype)
    run = emulator(max_blocks)
    close(activation.squash_rows(x, 1e-8, run, threads), reference_squash(x.astype(np.float64), 1e-8), dtype)
    close(activation.squash_rows_grad(x, g, 1e-8, run, threads),
          reference_squash_grad(x.astype(np.float64), g.astype(np.float64), 1e-8), dtype)
    y = reference_softmax(x.astype(np.float64))
    close(activation.softmax_rows(x, run, threads), y, dtype)
    close(activation.softmax_rows_grad(y.astype(dtype), g, run, threads), reference_softmax_grad(y, g), dtype)


@given(b=st.integers(1, 4), i=st.integers(1, 24), j=st.integers(1, 10), d=st.integers(1, 20),
       iterations=st.integers(1, 3), dtype=DTYPES, threads=st.sampled_from([1, 7, 32, 64, 256, 1024]),
       slices=st.sampled_from([None, routing.SINGLE_BLOCK, 1, 2, 5, 30]), max_blocks=GRID_CAPS,
       seed=st.integers(0, 2 ** 16))
def test_fused_routing_forward_over_generated_shapes(b, i, j, d, iterations, dtype, threads, slices, max_blocks, seed):
    """Both kernels: one block per example, and S blocks per example (several, or more than I)."""
    u_hat = np.random.default_rng(seed).standard_normal((b, i, j, d)).astype(dtype) * 0.3
    got = routing.routing_forward(u_hat, iterations, 1e-8, emulator(max_blocks), threads=threads, slices=slices)
    for name, value, want in zip(("v", "c", "logits"), got, reference_routing(u_hat, iterations, 1e-8)):
        close(value, want, dtype)


@given(size=st.integers(1, 700), step=st.integers(1, 60), amsgrad=st.booleans(), weight_decay=st.sampled_from([0.0, 0.05]),
       decoupled=st.booleans(), dtype=DTYPES, threads=WARPS, max_blocks=GRID_CAPS, seed=st.integers(0, 2 ** 16))
def test_adam_step_kernel_over_generated_sizes_and_hyperparameters(size, step, amsgrad, weight_decay, decoupled, dtype,
                                                                   threads, max_blocks, seed):
    rng = np.random.default_rng(seed)
    param, grad, exp_avg = (rng.standard_normal(size).astype(dtype) for _ in range(3))
    exp_avg_sq, max_exp_avg_sq = (np.abs(rng.standard_normal(size)).astype(dtype) for _ in range(2))
    hyper = dict(step=step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay, decoupled=decoupled)
    want = reference_adam(*(a.astype(np.float64) for a in (param, grad, exp_avg, exp_avg_sq)),
                          max_exp_avg_sq.astype(np.float64) if amsgrad else None, **hyper)
    state = [a.copy() for a in (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)]
    optim.adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq if amsgrad else None, **hyper,
                    runner=emulator(max_blocks), threads=threads)
    for got, expected in zip((param, exp_avg, exp_avg_sq, max_exp_avg_sq), want):
        if expected is not None:
            close(got, expected, dtype)
    # the capturable form gives the same update, bit for bit, from the rate and count on the device
    count = np.array([step - 1], dtype=np.int32)
    optim.adam_step_capturable(*state[:4], state[4] if amsgrad else None, count, np.array([hyper["lr"]]),
                               hyper["betas"], hyper["eps"], weight_decay, decoupled, emulator(max_blocks), threads)
    for got, expected in zip((state[0], state[2], state[3], state[4] if amsgrad else None),
                             (param, exp_avg, exp_avg_sq, max_exp_avg_sq if amsgrad else None)):
        if expected is not None:
            np.testing.assert_array_equal(got, expected)
