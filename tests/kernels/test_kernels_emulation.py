"""Every CUDA kernel, run on the CPU through the emulation harness, equals a NumPy reference:
small shapes with partial blocks, sizes that are not multiples of the block, B=1, float64, vector
and scalar paths, 32- and 64-bit indices, and grids capped so grid-stride loops take several
passes. Under ThreadSanitizer and AddressSanitizer too (in subprocesses, with the runtimes preloaded)."""
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tinygrad_caps.kernels import activation, capsule, conv, optim, routing
from tinygrad_caps.kernels.checking.emulation import Emulator, sanitizer_environment, selfcheck
from tinygrad_caps.kernels.checking.reference import reference_col2im, reference_im2col
from tinygrad_caps.kernels.launch import KernelLaunch, cuda_sources, source_text

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")


@pytest.fixture(scope="module")
def emulator():
    return Emulator()


def tolerance(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)


CAPSULE_SHAPES = [(1, 1, 1, 1, 1), (1, 3, 2, 5, 2), (2, 7, 3, 4, 3), (3, 5, 10, 3, 8)]  # (B, I, J, D, K)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", CAPSULE_SHAPES)
def test_capsule_kernels_equal_numpy(emulator, shape, dtype):
    b, i, j, d, k = shape
    rng = np.random.default_rng(sum(shape))
    u = rng.standard_normal((b, i, k)).astype(dtype)
    w = rng.standard_normal((i, j, d, k)).astype(dtype)
    g = rng.standard_normal((b, i, j, d)).astype(dtype)
    threads = 32  # a partial last block for every shape here
    np.testing.assert_allclose(capsule.capsule_predict(u, w, emulator, threads), np.einsum("ijdk,bik->bijd", w, u), **tolerance(dtype))
    np.testing.assert_allclose(capsule.capsule_grad_u(g, w, emulator, threads), np.einsum("ijdk,bijd->bik", w, g), **tolerance(dtype))
    np.testing.assert_allclose(capsule.capsule_grad_w(g, u, emulator, threads), np.einsum("bijd,bik->ijdk", g, u), **tolerance(dtype))
    grad_u, grad_w = capsule.capsule_grad(g, u, w, emulator)  # both adjoints in one pass
    np.testing.assert_allclose(grad_u, np.einsum("ijdk,bijd->bik", w, g), **tolerance(dtype))
    np.testing.assert_allclose(grad_w, np.einsum("bijd,bik->ijdk", g, u), **tolerance(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 2, 2, 2, 3), (10, 3, 2, 8, 2), (4, 5, 3, 3, 1)])  # B > 8 warps: several chunks
def test_capsule_kernels_with_grid_stride_passes(shape, dtype):
    emulator = Emulator(max_blocks=2)  # I > 2: each block handles several input capsules
    b, i, j, d, k = shape
    rng = np.random.default_rng(7)
    u, w = rng.standard_normal((b, i, k)).astype(dtype), rng.standard_normal((i, j, d, k)).astype(dtype)
    g = rng.standard_normal((b, i, j, d)).astype(dtype)
    np.testing.assert_allclose(capsule.capsule_predict(u, w, emulator, 32), np.einsum("ijdk,bik->bijd", w, u), **tolerance(dtype))
    grad_u, grad_w = capsule.capsule_grad(g, u, w, emulator)
    np.testing.assert_allclose(grad_u, np.einsum("ijdk,bijd->bik", w, g), **tolerance(dtype))
    np.testing.assert_allclose(grad_w, np.einsum("bijd,bik->ijdk", g, u), **tolerance(dtype))
    assert max(grid[0] for _, grid, _, _ in emulator.launches) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 9, 3, 5), (2, 17, 4, 9), (2, 3, 10, 16)])  # (B, I, J, D)
def test_routing_kernels_equal_numpy(emulator, shape, dtype):
    b, i, j, d = shape
    rng = np.random.default_rng(sum(shape))
    c = rng.standard_normal((b, i, j)).astype(dtype)
    u_hat = rng.standard_normal((b, i, j, d)).astype(dtype)
    v = rng.standard_normal((b, j, d)).astype(dtype)
    np.testing.assert_allclose(routing.routing_weighted_sum(c, u_hat, emulator), np.einsum("bij,bijd->bjd", c, u_hat), **tolerance(dtype))
    np.testing.assert_allclose(routing.routing_agreement(u_hat, v, emulator, 32), np.einsum("bijd,bjd->bij", u_hat, v), **tolerance(dtype))



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 9, 3, 5), (3, 7, 10, 16), (2, 5, 2, 64)])  # (B, I, J, D)
def test_fused_routing_forward_equals_numpy(emulator, shape, dtype):
    from tinygrad_caps.kernels.checking.reference import reference_routing

    u_hat = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    for iterations in (1, 3):
        v, c, logits = routing.routing_forward(u_hat, iterations, 1e-8, emulator, threads=64)
        want_v, want_c, want_logits = reference_routing(u_hat, iterations, 1e-8)
        np.testing.assert_allclose(v, want_v, **tolerance(dtype))
        np.testing.assert_allclose(c, want_c, **tolerance(dtype))
        np.testing.assert_allclose(logits, want_logits, **tolerance(dtype))


@pytest.mark.parametrize("ways", [dict(fiber_switch="ucontext"), dict(os_threads=True)],
                         ids=["fibers-ucontext", "os-threads"])
@pytest.mark.slow
def test_every_kernel_agrees_with_numpy_whichever_way_threads_run(ways):
    """The default (fibers with the x86-64 switch) runs every other test; the portable switch that
    ARM machines use, and OS threads without a sanitizer, must agree as well."""
    assert selfcheck(Emulator(max_blocks=3, **ways)) == []


@pytest.mark.parametrize("name", cuda_sources())
def test_the_emulation_finds_every_kernel_of_a_source(name):
    from tinygrad_caps.kernels.checking.emulation import kernel_signatures

    text = source_text(name)
    found = kernel_signatures(text)
    assert len(found) == text.count('extern "C" __global__') > 0
    assert all(types and all(types) for types in found.values())


def test_fused_routing_forward_refuses_blocks_over_its_launch_bounds(emulator):
    u_hat = np.zeros((1, 2, 2, 2))
    with pytest.raises(ValueError, match="routing_forward: threads must be from 1 to 1024"):
        routing.routing_forward(u_hat, 3, 1e-8, emulator, threads=2048)


def test_weighted_sum_is_deterministic_and_splits_i_into_chunks():
    emulator = Emulator()
    rng = np.random.default_rng(3)
    c, u_hat = rng.standard_normal((2, 300, 3)).astype(np.float32), rng.standard_normal((2, 300, 3, 8)).astype(np.float32)
    first = routing.routing_weighted_sum(c, u_hat, emulator, threads=64)
    assert routing.weighted_sum_chunks(2, 300) == 300  # B * chunks >= WEIGHTED_SUM_TILES where I allows
    np.testing.assert_array_equal(routing.routing_weighted_sum(c, u_hat, emulator, threads=64), first)
    np.testing.assert_allclose(first, np.einsum("bij,bijd->bjd", c, u_hat), rtol=1e-5, atol=1e-5)

CONV_CASES = [  # image shape, kernel, stride, padding
    ((1, 1, 3, 3), (1, 1), (1, 1), (0, 0)),
    ((1, 2, 5, 4), (3, 2), (2, 1), (1, 0)),
    ((2, 3, 6, 7), (3, 3), (2, 2), (1, 2)),
    ((9, 1, 4, 4), (2, 2), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("batch_last", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_and_col2im_kernels_equal_numpy(emulator, case, dtype, batch_last):
    from tinygrad_caps.ops.conv import col2im_array

    shape, kernel, stride, padding = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(dtype)
    col = conv.im2col(x, kernel, stride, padding, batch_last, emulator, threads=32)
    np.testing.assert_array_equal(col, reference_im2col(x, kernel, stride, padding, batch_last))
    np.testing.assert_array_equal(conv.im2col(x, kernel, stride, padding, batch_last, emulator, 32, index_bits=64), col)
    first = "im2col_i32_" if batch_last else "im2col_rows_"  # (n, oy, ox) columns: one grid row per col row
    assert emulator.launches[-2][0].startswith(first) and not emulator.launches[-1][0].startswith("im2col_i32_")
    np.testing.assert_array_equal(conv.im2col(x, kernel, stride, padding, batch_last, emulator, 32, by_rows=False), col)
    r = rng.standard_normal(col.shape).astype(dtype)
    back = conv.col2im(r, shape, kernel, stride, padding, batch_last, emulator, threads=32)
    np.testing.assert_array_equal(conv.col2im(r, shape, kernel, stride, padding, batch_last, emulator, 32, 64), back)
    np.testing.assert_allclose(back, reference_col2im(r, shape, kernel, stride, padding, batch_last), **tolerance(dtype))
    # the engine's NumPy col2im in the same column order
    if batch_last == (shape[0] >= 8):
        np.testing.assert_allclose(back, col2im_array(r, shape, kernel, stride, padding), **tolerance(dtype))
    np.testing.assert_allclose((x * back).sum(), (col * r).sum(), **tolerance(dtype))


def test_launchers_check_shapes_dtypes_and_devices(emulator):
    u, w = np.zeros((2, 3, 4)), np.zeros((3, 2, 2, 5))
    with pytest.raises(ValueError, match="capsule_predict"):
        capsule.capsule_predict(u, w, emulator)
    with pytest.raises(TypeError, match="dtype"):
        capsule.capsule_predict(u.astype(np.float32), np.zeros((3, 2, 2, 4)), emulator)
    with pytest.raises(TypeError, match="float32 or float64"):
        routing.routing_agreement(np.zeros((1, 2, 3, 4), np.int64), np.zeros((1, 3, 4), np.int64), emulator)
    with pytest.raises(TypeError, match="CuPy arrays"):
        capsule.capsule_predict(u, np.zeros((3, 2, 2, 4)))
    with pytest.raises(ValueError, match="shared memory"):  # W[i] of 7000 doubles is over 48 KiB
        capsule.capsule_predict(np.zeros((1, 1, 7)), np.zeros((1, 1000, 1, 7)), emulator)


def test_new_launchers_name_the_op_and_the_shapes(emulator):
    with pytest.raises(ValueError, match=r"squash_rows_grad: g of shape \(2, 4\) differs from x of shape \(2, 3\)"):
        activation.squash_rows_grad(np.zeros((2, 3)), np.zeros((2, 4)), runner=emulator)
    with pytest.raises(ValueError, match="softmax_rows: x must have at least one axis"):
        activation.softmax_rows(np.zeros(()), runner=emulator)
    with pytest.raises(ValueError, match=r"routing_outer_products: q of shape \(2, 1, 3, 4\) does not fit p"):
        routing.routing_outer_products(np.zeros((2, 1, 5, 4)), np.zeros((2, 1, 3, 4)), emulator)
    state = [np.zeros((3, 2)) for _ in range(4)]
    with pytest.raises(ValueError, match=r"adam_step: exp_avg_sq of shape \(2, 3\) differs"):
        optim.adam_step(*state[:3], np.zeros((2, 3)), None, 1, 1e-3, (0.9, 0.999), 1e-8, runner=emulator)
    with pytest.raises(ValueError, match="adam_step: exp_avg must be C-contiguous"):
        optim.adam_step(state[0], state[1], np.zeros((2, 3)).T, state[3], None, 1, 1e-3, (0.9, 0.999), 1e-8,
                        runner=emulator)


def test_launchers_accept_non_contiguous_views(emulator):
    rng = np.random.default_rng(3)
    u = rng.standard_normal((4, 3, 2)).transpose(1, 0, 2)  # (3, 4, 2) view
    w = rng.standard_normal((4, 2, 3, 2))
    np.testing.assert_allclose(capsule.capsule_predict(u, w, emulator, 32), np.einsum("ijdk,bik->bijd", w, u), rtol=1e-12)


BROKEN_SOURCES = {
    "skips_last.cu": """
        extern "C" __global__ void skips_last(float* __restrict__ out, int n)
        {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n - 1) out[i] = 1.0f;
        }
    """,
    "racy.cu": """
        extern "C" __global__ void racy(float* __restrict__ out, int n)
        {
            __shared__ float partial[64];
            partial[threadIdx.x] = threadIdx.x;
            // missing __syncthreads(): reads a neighbour's slot that may not be written yet
            out[threadIdx.x] = partial[(threadIdx.x + 1) % blockDim.x];
        }
    """,
    "out_of_bounds.cu": """
        extern "C" __global__ void out_of_bounds(float* __restrict__ out, int n)
        {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = out[i + 1];  // reads one past the end
        }
    """,
}


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("broken_kernels")
    for name, text in BROKEN_SOURCES.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_an_unwritten_output_element_shows_as_nan(broken_dir):
    out = np.zeros(5, np.float32)
    Emulator(source_dir=broken_dir)(KernelLaunch("skips_last.cu", "skips_last", (1,), (8,), (out, np.int32(5)), (0,)))
    assert np.isnan(out[-1]) and np.all(out[:-1] == 1.0)


def run_sanitized(kind, code):
    return subprocess.run([sys.executable, "-c", code], env=sanitizer_environment(kind), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "address"])
def test_all_kernels_pass_under_sanitizers(kind):
    result = subprocess.run([sys.executable, "-m", "tinygrad_caps.kernels.checking.emulation", "--sanitize", kind],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all kernels agree with NumPy" in result.stdout


@pytest.mark.parametrize("kind, kernel, warning", [
    ("thread", "racy", "ThreadSanitizer: data race"),
    ("address", "out_of_bounds", "AddressSanitizer"),
])
@pytest.mark.slow
def test_sanitizers_catch_a_race_and_an_out_of_bounds_read(broken_dir, kind, kernel, warning):
    code = textwrap.dedent(f"""
        import numpy as np
        from tinygrad_caps.kernels.checking.emulation import Emulator
        from tinygrad_caps.kernels.launch import KernelLaunch
        out = np.zeros(16, np.float32)
        Emulator(sanitize={kind!r}, source_dir={str(broken_dir)!r})(
            KernelLaunch("{kernel}.cu", "{kernel}", (1,), (16,), (out, np.int32(16)), ()))
    """)
    result = run_sanitized(kind, code)
    assert result.returncode != 0 and warning in result.stderr, result.stderr[-2000:]
