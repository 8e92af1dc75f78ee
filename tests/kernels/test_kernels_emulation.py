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

from planted_kernels import write_planted_kernels
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
    for registers in (True, False):  # K <= 8: the register kernels, and the shared-memory ones
        np.testing.assert_allclose(capsule.capsule_predict(u, w, emulator, threads, registers=registers),
                                   np.einsum("ijdk,bik->bijd", w, u), **tolerance(dtype))
        grad_u, grad_w = capsule.capsule_grad(g, u, w, emulator, registers=registers)  # both adjoints in one pass
        np.testing.assert_allclose(grad_u, np.einsum("ijdk,bijd->bik", w, g), **tolerance(dtype))
        np.testing.assert_allclose(grad_w, np.einsum("bijd,bik->ijdk", g, u), **tolerance(dtype))
    assert [name for name, *_ in emulator.launches[-4:]] == [f"capsule_{op}_{suffix}" for op in
                                                            ("predict", "grad", "predict_shared", "grad_shared")
                                                            for suffix in [("f32" if dtype == np.float32 else "f64")]]


# (B, I, J, D, K, threads): B over several chunks (predict) and tiles (grad), a last chunk and
# tile shorter, K = 8 (the most in registers) and K = 9 and 12 (the shared-memory kernels), J*D
# with and without the vector path, blocks of 7 threads (no whole warp)
CAPSULE_REGISTER_CASES = [(70, 2, 2, 4, 3, 32), (70, 2, 2, 4, 3, 7), (45, 3, 3, 5, 8, 64), (33, 2, 2, 8, 9, 64),
                          (5, 2, 1, 3, 12, 32), (1, 4, 10, 16, 8, 256)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CAPSULE_REGISTER_CASES)
def test_capsule_register_kernels_over_chunks_and_tiles(emulator, monkeypatch, case, dtype):
    b, i, j, d, k, threads = case
    rng = np.random.default_rng(sum(case))
    u, w = rng.standard_normal((b, i, k)).astype(dtype), rng.standard_normal((i, j, d, k)).astype(dtype)
    g = rng.standard_normal((b, i, j, d)).astype(dtype)
    monkeypatch.setattr(capsule, "PREDICT_ROWS_PER_THREAD", 1)  # as many chunks as B allows
    predicted = capsule.capsule_predict(u, w, emulator, threads, registers=k <= capsule.PREDICT_KMAX)
    np.testing.assert_allclose(predicted, np.einsum("ijdk,bik->bijd", w, u), **tolerance(dtype))
    kernel, grid, block, _ = emulator.launches[-1]
    assert kernel.startswith("capsule_predict_shared" if k > 8 else "capsule_predict_f")
    if k <= 8:
        width = 4 if dtype == np.float32 else 2
        groups = j * d // width if (j * d) % width == 0 else j * d
        rows = -(-b // capsule.predict_chunks(b, i, max(1, threads // groups)))
        assert grid[0] == i * -(-b // rows) and block[0] == threads
    for tile_rows in (None, 1, 4, 32):
        grad_u, grad_w = capsule.capsule_grad(g, u, w, emulator, tile_rows=tile_rows)
        np.testing.assert_allclose(grad_u, np.einsum("ijdk,bijd->bik", w, g), **tolerance(dtype))
        np.testing.assert_allclose(grad_w, np.einsum("bijd,bik->ijdk", g, u), **tolerance(dtype))
        again = capsule.capsule_grad(g, u, w, Emulator(max_blocks=1, slots=1), tile_rows=tile_rows)
        np.testing.assert_array_equal(again[0], grad_u)  # deterministic, however blocks are spread
        np.testing.assert_array_equal(again[1], grad_w)
        # the register kernel where its tile fits (32 rows of 160 doubles do not: the shared-memory one)
        fits = any(capsule.grad_registers_plan(w.shape, dtype, vec, tile_rows) for vec in (True, False))
        assert emulator.launches[-1][0].startswith("capsule_grad_f" if fits else "capsule_grad_shared")
        assert fits or k > 8 or (tile_rows == 32 and dtype == np.float64)


def test_capsule_register_kernels_take_the_scalar_path_for_misaligned_arrays(emulator):
    rng = np.random.default_rng(9)
    storage = rng.standard_normal(3 * 2 * 2 * 8 + 1).astype(np.float32)
    g = storage[1:].reshape(3, 2, 2, 8)  # 4 bytes past a 16-byte boundary
    u, w = rng.standard_normal((3, 2, 4)).astype(np.float32), rng.standard_normal((2, 2, 8, 4)).astype(np.float32)
    grad_u, grad_w = capsule.capsule_grad(g, u, w, emulator, tile_rows=2)
    np.testing.assert_allclose(grad_u, np.einsum("ijdk,bijd->bik", w, g), **tolerance(np.float32))
    np.testing.assert_allclose(grad_w, np.einsum("bijd,bik->ijdk", g, u), **tolerance(np.float32))


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


# (B, I, J, D, slices): several slices per example, I not a multiple of the slice (the last one
# shorter), slices = I (one row each) and more slices than rows (capped at I), B = 1, J = 1, the
# vector path (D % 4 == 0, float32; D % 2 == 0, float64) and the scalar one (odd D)
SLICED_CASES = [(1, 70, 3, 5, 3), (2, 37, 10, 16, 4), (3, 9, 1, 8, 2), (1, 5, 4, 3, 5), (2, 4, 2, 4, 9),
                (4, 33, 2, 2, 1), (1, 300, 3, 4, 7)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", SLICED_CASES)
def test_sliced_routing_forward_equals_numpy(emulator, case, dtype):
    from tinygrad_caps.kernels.checking.reference import reference_routing

    b, i, j, d, slices = case
    u_hat = (np.random.default_rng(sum(case)).standard_normal((b, i, j, d)) * 0.5).astype(dtype)
    for iterations, threads in ((1, 64), (2, 32), (3, 96), (4, 7)):  # 7: threads that fill no warp
        before = len(emulator.launches)
        v, c, logits = routing.routing_forward(u_hat, iterations, 1e-8, emulator, threads=threads, slices=slices)
        for got, want in zip((v, c, logits), reference_routing(u_hat, iterations, 1e-8)):
            np.testing.assert_allclose(got, want, **tolerance(dtype))
        launches = emulator.launches[before:]
        rows = -(-i // min(slices, i))
        kernel = f"routing_forward_sliced_{'f32' if dtype == np.float32 else 'f64'}"
        assert [name for name, *_ in launches] == [kernel] * iterations
        assert all(grid == (b * -(-i // rows), 1, 1) and block == (threads, 1, 1) for _, grid, block, _ in launches)


@pytest.mark.parametrize("tile_bytes", [1, 972, 1896])  # tiles of 1, 3 and 10 rows (float32)
def test_sliced_routing_forward_stages_a_slice_in_several_tiles(emulator, monkeypatch, tile_bytes):
    """Tiles of one row, of a few rows (the last one shorter) and of more rows than the block has
    thread rows: the running sums carry over from tile to tile."""
    from tinygrad_caps.kernels.checking.reference import reference_routing

    monkeypatch.setattr(routing, "FORWARD_TILE_BYTES", tile_bytes)
    for dtype, shape, threads in ((np.float32, (2, 45, 3, 8), 32), (np.float64, (1, 50, 2, 5), 64)):
        u_hat = np.random.default_rng(tile_bytes).standard_normal(shape).astype(dtype)
        plan = routing.sliced_plan(shape, dtype, 2, threads, vec=dtype == np.float32)
        assert plan.tile_rows < plan.rows_per_slice
        got = routing.routing_forward(u_hat, 3, 1e-8, emulator, threads=threads, slices=2)
        for a, b in zip(got, reference_routing(u_hat, 3, 1e-8)):
            np.testing.assert_allclose(a, b, **tolerance(dtype))


def sliced_forward(runner, u_hat, iterations=3, slices=4, threads=64):
    return routing.routing_forward(u_hat, iterations, 1e-8, runner, threads=threads, slices=slices)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sliced_routing_forward_is_bitwise_deterministic(dtype):
    """The slices' partial sums are added in slice order by whichever block finishes an example
    last: blocks run two or three at a time, one at a time, or few blocks loop over many
    (example, slice) tasks, and the results stay bitwise the same."""
    u_hat = np.random.default_rng(11).standard_normal((3, 61, 5, 8)).astype(dtype)
    first = sliced_forward(Emulator(), u_hat)
    for runner in (Emulator(), Emulator(slots=1), Emulator(slots=3), Emulator(max_blocks=1), Emulator(max_blocks=5)):
        for got, want in zip(sliced_forward(runner, u_hat), first):
            np.testing.assert_array_equal(got, want)
    # the block size changes how a block adds its rows, so only the tolerance holds across it
    for got, want in zip(sliced_forward(Emulator(), u_hat, threads=256), first):
        np.testing.assert_allclose(got, want, **tolerance(dtype))


def test_sliced_routing_forward_takes_the_scalar_path_for_misaligned_u_hat(emulator):
    from tinygrad_caps.kernels.checking.reference import reference_routing

    storage = np.random.default_rng(5).standard_normal(2 * 20 * 3 * 8 + 1).astype(np.float32)
    u_hat = storage[1:].reshape(2, 20, 3, 8)  # 4 bytes past a 16-byte boundary: float4 loads would fault
    assert u_hat.ctypes.data % 16
    for got, want in zip(sliced_forward(emulator, u_hat), reference_routing(u_hat, 3, 1e-8)):
        np.testing.assert_allclose(got, want, **tolerance(np.float32))


def test_routing_forward_chooses_slices_from_the_batch_i_and_the_sm_count():
    f32 = np.float32
    assert routing.forward_slices(100, 1152, 132) == 10   # 8 blocks per SM, one wave: 1,000 blocks of 116 rows
    assert routing.forward_slices(1, 1152, 132) == 36     # no slice under 32 rows
    assert routing.forward_slices(2000, 1152, 132) == 1   # the batch alone fills the GPU
    assert routing.forward_slices(4, 20, 132) == 1        # I too short to split
    assert routing.choose_forward_slices((100, 1152, 10, 16), f32, 132) == 10
    assert routing.choose_forward_slices((2000, 1152, 10, 16), f32, 132) == 1  # 737 KB per example: sliced, S = 1
    assert routing.choose_forward_slices((3, 20, 10, 16), f32, 132) == routing.SINGLE_BLOCK  # 12.8 KB per example
    plan = routing.sliced_plan((100, 1152, 10, 16), f32, 10, vec=True)
    assert (plan.slices, plan.rows_per_slice, plan.groups, plan.thread_rows) == (10, 116, 40, 6)
    assert plan.tile_rows % plan.thread_rows == 0 and plan.shared_values * 4 <= routing.FORWARD_TILE_BYTES
    assert (routing.sliced_plan((1, 10, 4, 4), f32, 3).slices, routing.sliced_plan((1, 10, 4, 4), f32, 3).rows_per_slice) \
        == (3, 4)
    assert routing.sliced_plan((1, 2, 2, 7000), np.float64, 1) is None  # one staged row is over 48 KiB


def test_the_sliced_routing_forward_replayed_computes_the_same(emulator):
    """Its launches replayed as recorded (as a CUDA graph or a timing loop replays them, without the
    launcher's fresh zeroed counters): each launch's last blocks set the ticket counters back to 0."""
    u_hat = np.random.default_rng(4).standard_normal((3, 70, 3, 4)).astype(np.float32)
    records = []

    def recording(launch):
        records.append(launch)
        emulator(launch)

    v, c, logits = (a.copy() for a in routing.routing_forward(u_hat, 3, 1e-8, recording, slices=4))
    assert {launch.kernel for launch in records} == {"routing_forward_sliced_f32"} and len(records) == 3
    for _ in range(2):
        for launch in records:
            emulator(launch)
        np.testing.assert_array_equal(records[-1].args[2], v)  # v_next of the last launch: v
        np.testing.assert_array_equal(records[-1].args[4], c)
        np.testing.assert_array_equal(records[-1].args[3], logits)
        assert not records[-1].args[6].any()  # the counters are back at 0


def test_routing_forward_asks_the_gpu_for_its_sm_count(emulator, monkeypatch):
    u_hat = np.random.default_rng(2).standard_normal((2, 300, 2, 4))
    routing.routing_forward(u_hat, 2, 1e-8, emulator, sm_count=2)  # 16 blocks: 8 slices of 38 rows
    assert emulator.launches[-1][0] == "routing_forward_sliced_f64" and emulator.launches[-1][1] == (16, 1, 1)
    monkeypatch.setattr(routing, "multiprocessor_count", lambda array, default: 1)
    routing.routing_forward(u_hat, 2, 1e-8, emulator)  # 8 blocks: 4 slices of 75 rows
    assert emulator.launches[-1][1] == (8, 1, 1)
    routing.routing_forward(u_hat[:, :40], 2, 1e-8, emulator)  # 40 rows: one slice, 2,560 bytes per example
    assert emulator.launches[-1][0] == "routing_forward_f64"


@pytest.mark.slow
def test_every_kernel_agrees_with_numpy_with_the_portable_fiber_switch():
    """The default (fibers with the x86-64 switch) runs every other test; the portable switch that
    ARM machines use must agree as well. (OS threads run every kernel under ThreadSanitizer in
    test_all_kernels_pass_under_sanitizers: the same code with the sanitizer's checks added, so a
    build of its own without them would only cost a compile.)"""
    assert selfcheck(Emulator(max_blocks=3, fiber_switch="ucontext")) == []


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


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "address"])
def test_sliced_routing_forward_under_sanitizers(kind):
    """Several slices per example, blocks two at a time on OS threads: no race between a block's
    partial sums and the block that adds them (ThreadSanitizer), no access past any array or the
    launch's shared memory (AddressSanitizer)."""
    code = textwrap.dedent("""
        import numpy as np
        from tinygrad_caps.kernels import routing
        from tinygrad_caps.kernels.checking.emulation import Emulator
        from tinygrad_caps.kernels.checking.reference import reference_routing
        for dtype, shape, slices in ((np.float32, (2, 11, 3, 4), 3), (np.float64, (1, 9, 2, 3), 4)):
            u_hat = np.random.default_rng(0).standard_normal(shape).astype(dtype)
            for max_blocks in (None, 2):
                got = routing.routing_forward(u_hat, 3, 1e-8, Emulator(sanitize=%r, max_blocks=max_blocks), threads=32,
                                              slices=slices)
                for a, b in zip(got, reference_routing(u_hat, 3, 1e-8)):
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        print("finished")
    """ % kind)
    result = run_sanitized(kind, code)
    assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_thread_sanitizer_sees_a_sliced_forward_that_adds_the_slices_without_its_ticket(tmp_path):
    """Planted: the block of the last slice adds every slice's partial sums whether or not the
    other blocks are done (no ticket): ThreadSanitizer must report the race. The two blocks run side by
    side for certain: each waits at its start until both have started (counters[b], which the ticket no
    longer uses); otherwise, on a busy machine, the first slot's thread can end before the second's
    starts, and the interpreter's lock between them orders the two for the sanitizer (no race seen)."""
    text = source_text("routing.cu")
    start = "const int i_begin = slice * rows_per_slice, i_end = min(I, i_begin + rows_per_slice);"
    planted = text.replace("last_block = atomicAdd(counters + b, 1u) == (unsigned int)(S - 1);",
                           "last_block = slice == S - 1;").replace(start, start + """
        if (threadIdx.x == 0) {
            atomicAdd(counters + b, 1u);
            while (atomicAdd(counters + b, 0u) < (unsigned int)S) {}
        }""")
    assert planted.count("last_block = slice == S - 1;") == 1 and planted.count("atomicAdd(counters + b, 0u)") == 1
    (tmp_path / "routing.cu").write_text(planted)
    code = textwrap.dedent(f"""
        import numpy as np
        from tinygrad_caps.kernels import routing
        from tinygrad_caps.kernels.checking.emulation import Emulator
        u_hat = np.random.default_rng(0).standard_normal((1, 12, 2, 4)).astype(np.float32)
        routing.routing_forward(u_hat, 1, 1e-8, Emulator(sanitize="thread", source_dir={str(tmp_path)!r}), threads=32,
                                slices=2)
        print("finished")
    """)
    result = run_sanitized("thread", code)
    assert result.returncode != 0 and "ThreadSanitizer: data race" in result.stderr, result.stderr[-3000:]


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
    ((2, 2, 6, 6), (3, 3), (1, 1), (1, 1)),   # 72 columns: im2col_rows' float4 / double2 stores
    ((1, 3, 8, 8), (2, 2), (2, 2), (0, 0)),   # 16 columns
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
    first = "im2col_i32_" if batch_last else "im2col_planes_"  # (n, oy, ox) columns: staged image planes
    assert emulator.launches[-2][0].startswith(first) and not emulator.launches[-1][0].startswith("im2col_i32_")
    if not batch_last:  # one grid row per col row, the kernel before im2col_planes
        np.testing.assert_array_equal(conv.im2col(x, kernel, stride, padding, False, emulator, 32, planes=False), col)
        assert emulator.launches[-1][0].startswith("im2col_rows_")
    np.testing.assert_array_equal(conv.im2col(x, kernel, stride, padding, batch_last, emulator, 32, by_rows=False), col)
    r = rng.standard_normal(col.shape).astype(dtype)
    back = conv.col2im(r, shape, kernel, stride, padding, batch_last, emulator, threads=32)
    np.testing.assert_array_equal(conv.col2im(r, shape, kernel, stride, padding, batch_last, emulator, 32, 64), back)
    np.testing.assert_allclose(back, reference_col2im(r, shape, kernel, stride, padding, batch_last), **tolerance(dtype))
    # the engine's NumPy col2im in the same column order
    if batch_last == (shape[0] >= 8):
        np.testing.assert_allclose(back, col2im_array(r, shape, kernel, stride, padding), **tolerance(dtype))
    np.testing.assert_allclose((x * back).sum(), (col * r).sum(), **tolerance(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case, threads, plane_bytes, expect", [
    # 8 images per block and a group of 3 after them, one row group
    (((11, 2, 5, 5), (3, 3), (1, 1), (1, 1)), 64, None, (8, 1)),
    # 4 images of 2x2 outputs per block (vector stores), then 2; 4 row groups of one row each
    (((6, 3, 4, 4), (2, 2), (2, 2), (0, 0)), 32, None, (4, 4)),
    # one image per block, the 9 rows (ky, kx) in 9 row groups
    (((5, 2, 6, 6), (3, 3), (1, 1), (1, 1)), 256, "one plane", (1, 9)),
    # a plane larger than the budget: im2col_rows instead
    (((2, 2, 6, 6), (3, 3), (1, 1), (1, 1)), 64, 8, None),
])
def test_im2col_planes_over_image_groups_and_row_groups(emulator, monkeypatch, case, threads, plane_bytes, expect,
                                                         dtype):
    shape, kernel, stride, padding = case
    itemsize = np.dtype(dtype).itemsize
    if plane_bytes is not None:
        one_plane = shape[2] * shape[3] * itemsize
        monkeypatch.setattr(conv, "PLANE_BYTES", one_plane if plane_bytes == "one plane" else plane_bytes)
    x = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    col = conv.im2col(x, kernel, stride, padding, False, emulator, threads)
    np.testing.assert_array_equal(col, reference_im2col(x, kernel, stride, padding, False))
    name, grid, block, shared = emulator.launches[-1]
    if expect is None:
        assert name.startswith("im2col_rows_")
        return
    images, row_groups = expect
    columns_per_image = col.shape[1] // shape[0]
    quads = -(-images * columns_per_image // 4)
    assert name.startswith("im2col_planes_") and shared == images * shape[2] * shape[3] * itemsize
    assert block == (quads * row_groups, 1, 1) and grid == (shape[1] * -(-shape[0] // images), 1, 1)


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
        capsule.capsule_predict(np.zeros((1, 1, 7)), np.zeros((1, 1000, 1, 7)), emulator, registers=False)
    # ... which the register kernel does not stage
    assert capsule.capsule_predict(np.ones((1, 1, 7)), np.ones((1, 1000, 1, 7)), emulator).shape == (1, 1, 1000, 1)
    with pytest.raises(ValueError, match="K <= 8"):
        capsule.capsule_predict(np.zeros((1, 1, 9)), np.zeros((1, 2, 1, 9)), emulator, registers=True)
    with pytest.raises(ValueError, match="K <= 8"):
        capsule.capsule_grad(np.zeros((1, 1, 2, 1)), np.zeros((1, 1, 9)), np.zeros((1, 2, 1, 9)), emulator,
                             registers=True)


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


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory):
    """The planted kernels (tests/support/planted_kernels.py), the same folder's text as
    test_kernels_warps.py's: one build of each kind serves both files."""
    return write_planted_kernels(tmp_path_factory.mktemp("planted_kernels"))


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
