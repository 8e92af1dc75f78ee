"""The CPU emulation models what our kernels use: warps that meet in lockstep at shuffles, ballots
and __syncwarp with their masks checked; float4/double2 with an alignment check; dynamic shared
memory of the launch's size; CUDA's launch limits; two blocks at a time; a max_blocks cap.
Each planted bug here must be caught (in a subprocess where a sanitizer or a crash is expected)."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from planted_kernels import write_planted_kernels
from tinygrad_caps.kernels import capsule, routing
from tinygrad_caps.kernels.checking.emulation import EmulationError, Emulator, sanitizer_environment
from tinygrad_caps.kernels.launch import KernelLaunch, LaunchError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return write_planted_kernels(tmp_path_factory.mktemp("planted_kernels"))


@pytest.fixture(scope="module", params=["fibers", "fibers-ucontext", "os-threads"])
def emulator(kernel_dir, request):
    """Every way of running CUDA threads must follow the same rules and report the same errors
    (fibers-ucontext: the portable fiber switch that ARM machines use, tested here on x86-64)."""
    return Emulator(source_dir=kernel_dir, os_threads=request.param == "os-threads",
                    fiber_switch="ucontext" if request.param == "fibers-ucontext" else "auto")


def launch(name, grid, block, args, outputs=(), shared=0):
    return KernelLaunch(f"{name}.cu", name, grid, block, args, outputs, shared)


def test_shuffles_ballot_and_syncwarp_follow_cuda(emulator):
    out = np.zeros(98, np.float32)
    emulator(launch("warp_ops", (1,), (32,), (out, np.int32(0))))
    lanes = np.arange(32)
    np.testing.assert_array_equal(out[:32], np.full(32, 32 * 33 / 2))
    np.testing.assert_array_equal(out[32:64], np.where(lanes == 0, 1, lanes))  # lane 0 keeps its own
    np.testing.assert_array_equal(out[64:96], np.where(lanes < 16, 4, 20))      # lane 3 of each half
    assert int(out[96]) == int(out[97]) == 0xAAAA  # lanes 1, 3, 5, ...


@pytest.mark.parametrize("kernel, block, n, message", [
    ("wrong_mask", 32, 0, "excludes the lane itself"),
    ("exited_lanes", 32, 20, "returned or did not reach it"),
    ("divergent", 32, 0, "diverged"),
])
def test_planted_warp_errors_are_reported(emulator, kernel, block, n, message):
    out = np.arange(32, dtype=np.float32)
    with pytest.raises(EmulationError, match=message):
        emulator(launch(kernel, (1,), (block,), (out, np.int32(n))))


@pytest.mark.parametrize("switch", ["auto", "ucontext"])
def test_fibers_report_a_deadlock_instead_of_hanging(kernel_dir, switch):
    # with OS threads this launch would hang: every thread waits for one that waits elsewhere
    emulator = Emulator(source_dir=kernel_dir, os_threads=False, fiber_switch=switch)
    with pytest.raises(EmulationError, match=r"deadlock in block 1: 32 live threads wait forever "
                                             r"\(16 at __syncthreads, 16 at a warp intrinsic"):
        emulator(launch("stuck", (2,), (32,), (np.zeros(64, np.float32), np.int32(0))))
    out = np.zeros(98, np.float32)
    emulator(launch("warp_ops", (1,), (32,), (out, np.int32(0))))  # the emulator still works after it
    assert out[0] == 32 * 33 / 2


def test_a_full_mask_in_a_partial_warp_is_fine_but_reading_a_missing_lane_is_not(emulator):
    emulator(launch("lane_race", (1,), (16,), (np.zeros(32, np.float32), np.int32(1))))  # __syncwarp, 16 lanes
    out = np.arange(48, dtype=np.float32)
    with pytest.raises(EmulationError, match=r"lane 0 of warp 1 \(block 0\) reads lane 16"):
        emulator(launch("exited_lanes", (1,), (48,), (out, np.int32(48))))  # warp 1 has lanes 0..15 only


@pytest.mark.parametrize("limits, message", [
    (dict(grid=(1,), block=(1025,)), "1 to 1024"),
    (dict(grid=(1,), block=(64, 32)), "at most 1024"),
    (dict(grid=(1, 65536), block=(32,)), "grid dimension y"),
    (dict(grid=(0,), block=(32,)), "grid dimension x is 0"),
    (dict(grid=(1,), block=(32,), shared=48 * 1024 + 4), "dynamic shared memory"),
])
def test_launch_limits_are_checked_as_cuda_does(emulator, limits, message):
    out = np.zeros(4, np.float32)
    with pytest.raises(LaunchError, match=message):
        emulator(launch("dynamic_shared", limits["grid"], limits["block"], (out, np.int32(4)), (),
                        limits.get("shared", 16)))


def test_dynamic_shared_memory_is_sized_by_the_launch(emulator):
    out = np.arange(50, dtype=np.float32)
    emulator(launch("dynamic_shared", (1,), (32,), (out, np.int32(50)), (), 50 * 4))
    np.testing.assert_array_equal(out, np.arange(50)[::-1])


def test_vector_loads_and_stores(emulator):
    data = np.arange(20, dtype=np.float32)
    out = np.zeros(16, np.float32)
    emulator(launch("vectors", (1,), (32,), (data, out, np.int32(16), np.int32(4))))
    np.testing.assert_array_equal(out, data[4:20])


def test_two_blocks_run_at_the_same_time(kernel_dir):
    code = textwrap.dedent(f"""
        import numpy as np
        from tinygrad_caps.kernels.checking.emulation import Emulator
        from tinygrad_caps.kernels.launch import KernelLaunch
        flag = np.zeros(1, np.float32)
        Emulator(source_dir={str(kernel_dir)!r})(
            KernelLaunch("concurrent_blocks.cu", "concurrent_blocks", (2,), (32,), (flag, np.int32(0)), ()))
        print("finished")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "finished" in result.stdout, result.stderr[-2000:]


def test_max_blocks_makes_grid_stride_loops_take_several_passes():
    emulator = Emulator(max_blocks=2)
    rng = np.random.default_rng(0)
    u_hat, v = rng.standard_normal((3, 70, 2, 8)), rng.standard_normal((3, 2, 8))
    c = rng.standard_normal((3, 70, 2))
    np.testing.assert_allclose(routing.routing_agreement(u_hat, v, emulator, threads=32),
                               np.einsum("bijd,bjd->bij", u_hat, v), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(routing.routing_weighted_sum(c, u_hat, emulator, threads=32),
                               np.einsum("bij,bijd->bjd", c, u_hat), rtol=1e-12, atol=1e-12)
    u, w = rng.standard_normal((3, 5, 4)), rng.standard_normal((5, 2, 8, 4))
    np.testing.assert_allclose(capsule.capsule_predict(u, w, emulator, threads=32),
                               np.einsum("ijdk,bik->bijd", w, u), rtol=1e-12, atol=1e-12)
    assert all(grid[0] * grid[1] * grid[2] <= 2 for _, grid, _, _ in emulator.launches)
    # the agreement alone needs 3 * ceil(70 / 32) = 9 tiles of 32 rows (8 vectors per thread): several passes per block
    assert len(emulator.launches) == 4


def run_in_subprocess(kind, kernel_dir, kernel, grid, block, args_code, shared=0):
    code = textwrap.dedent(f"""
        import numpy as np
        from tinygrad_caps.kernels.checking.emulation import Emulator
        from tinygrad_caps.kernels.launch import KernelLaunch
        args = {args_code}
        Emulator(sanitize={kind!r}, source_dir={str(kernel_dir)!r})(
            KernelLaunch("{kernel}.cu", "{kernel}", {grid}, {block}, args, (), {shared}))
        print("finished")
    """)
    env = sanitizer_environment(kind) if kind else None
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_a_misaligned_float4_access_stops_the_process(kernel_dir):
    args = "(np.arange(20, dtype=np.float32), np.zeros(16, np.float32), np.int32(16), np.int32(1))"
    result = run_in_subprocess(None, kernel_dir, "vectors", (1,), (32,), args)
    assert result.returncode != 0 and "misaligned address" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("n, racy", [(0, True), (1, False)])
def test_thread_sanitizer_sees_a_missing_syncwarp(kernel_dir, n, racy):
    result = run_in_subprocess("thread", kernel_dir, "lane_race", (1,), (32,), f"(np.zeros(32, np.float32), np.int32({n}))")
    if racy:
        assert result.returncode != 0 and "ThreadSanitizer: data race" in result.stderr, result.stderr[-2000:]
    else:
        assert result.returncode == 0 and "finished" in result.stdout, result.stderr[-2000:]


def test_thread_sanitizer_sees_two_blocks_writing_one_element(kernel_dir):
    result = run_in_subprocess("thread", kernel_dir, "block_race", (2,), (32,), "(np.zeros(1, np.float32), np.int32(0))")
    assert result.returncode != 0 and "ThreadSanitizer: data race" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_address_sanitizer_sees_shared_memory_past_the_launch_size(kernel_dir):
    result = run_in_subprocess("address", kernel_dir, "dynamic_shared", (1,), (32,),
                               "(np.arange(8, dtype=np.float32), np.int32(-8))", shared=8 * 4)
    assert result.returncode != 0 and "heap-buffer-overflow" in result.stderr, result.stderr[-2000:]


def test_builds_are_keyed_by_the_sources_text_not_their_folder(kernel_dir, tmp_path):
    """Two folders with the same kernels share one build; a changed source gets a build of its own."""
    (tmp_path / "same").mkdir()
    same = write_planted_kernels(tmp_path / "same")
    built = Emulator(source_dir=kernel_dir)._build()
    assert Emulator(source_dir=same)._build() == built
    (tmp_path / "changed").mkdir()
    changed = write_planted_kernels(tmp_path / "changed")
    (changed / "skips_last.cu").write_text((changed / "skips_last.cu").read_text() + "\n// changed\n")
    other = Emulator(source_dir=changed)._build()
    assert other != built and other.exists()
    # (this process's own temporary files: another worker may be building beside it)
    assert not list(other.parent.glob(f"*.{os.getpid()}.tmp")) + list(other.parent.glob(f"wrapper-*.{os.getpid()}.cpp"))
