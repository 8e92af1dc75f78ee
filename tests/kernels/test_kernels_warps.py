"""The CPU emulation models what our kernels use: warps that meet in lockstep at shuffles, ballots
and __syncwarp with their masks checked; float4/double2 with an alignment check; dynamic shared
memory of the launch's size; CUDA's launch limits; two blocks at a time; a max_blocks cap.
Each planted bug here must be caught (in a subprocess where a sanitizer or a crash is expected)."""
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tinygrad_caps.kernels import capsule, routing
from tinygrad_caps.kernels.checking.emulation import EmulationError, Emulator, sanitizer_environment
from tinygrad_caps.kernels.launch import KernelLaunch, LaunchError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")

KERNELS = {
    "warp_ops.cu": """
        // out[0:32] warp sum (xor), out[32:64] shfl_up by 1, out[64:96] shfl within 16-lane halves,
        // out[96:98] the ballot of odd lanes (low and high 16 bits), for a block of 32 threads.
        extern "C" __global__ void warp_ops(float* __restrict__ out, int n)
        {
            const int lane = threadIdx.x;
            float v = (float)(lane + 1);
            float total = v;
            for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
            out[lane] = total;
            out[32 + lane] = __shfl_up_sync(0xffffffffu, v, 1);
            out[64 + lane] = __shfl_sync(0xffffffffu, v, 3, 16);
            const unsigned odd = __ballot_sync(0xffffffffu, lane % 2);
            __syncwarp();
            if (lane == 0) { out[96] = (float)(odd & 0xffffu); out[97] = (float)(odd >> 16); }
        }
    """,
    "wrong_mask.cu": """
        // planted: the mask leaves out the upper half-warp, which takes part all the same
        extern "C" __global__ void wrong_mask(float* __restrict__ out, int n)
        {
            float v = (float)threadIdx.x;
            for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0x0000ffffu, v, offset);
            if (threadIdx.x == 0) out[0] = v;
        }
    """,
    "exited_lanes.cu": """
        // planted: lanes past n return, and the full-mask shuffle then reads them
        extern "C" __global__ void exited_lanes(float* __restrict__ out, int n)
        {
            const int i = threadIdx.x;
            if (i >= n) return;
            float v = out[i];
            v += __shfl_down_sync(0xffffffffu, v, 16);
            if (i < 16) out[i] = v;
        }
    """,
    "divergent.cu": """
        // planted: half of the warp waits at __syncwarp while the other half shuffles
        extern "C" __global__ void divergent(float* __restrict__ out, int n)
        {
            float v = (float)threadIdx.x;
            if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
            else __syncwarp();
            out[threadIdx.x] = v;
        }
    """,
    "lane_race.cu": """
        // planted when n == 0: a lane reads its neighbour's shared slot without __syncwarp
        extern "C" __global__ void lane_race(float* __restrict__ out, int n)
        {
            __shared__ float slot[32];
            slot[threadIdx.x] = (float)threadIdx.x;
            if (n) __syncwarp();
            out[threadIdx.x] = slot[(threadIdx.x + 1) % 32];
        }
    """,
    "stuck.cu": """
        // planted: half of the warp waits at __syncthreads, the other half at a full-mask shuffle
        extern "C" __global__ void stuck(float* __restrict__ out, int n)
        {
            float v = (float)threadIdx.x;
            if (threadIdx.x < 16) __syncthreads();
            else v = __shfl_sync(0xffffffffu, v, 0);
            out[threadIdx.x] = v;
        }
    """,
    "block_race.cu": """
        // planted: every block writes out[0]
        extern "C" __global__ void block_race(float* __restrict__ out, int n)
        {
            if (threadIdx.x == 0) out[0] = (float)blockIdx.x;
        }
    """,
    "concurrent_blocks.cu": """
        // block 0 waits until block 1 has run: finishes only if two blocks run at once
        extern "C" __global__ void concurrent_blocks(float* __restrict__ out, int n)
        {
            int* flag = (int*)out;
            if (blockIdx.x == 1) atomicAdd(flag, 1);
            if (blockIdx.x == 0) while (atomicAdd(flag, 0) == 0) {}
        }
    """,
    "vectors.cu": """
        // out[k] = in[k + offset] through float4 loads and stores (needs offset % 4 == 0)
        extern "C" __global__ void vectors(const float* __restrict__ in, float* __restrict__ out, int n, int offset)
        {
            const float4* src = (const float4*)(in + offset);
            for (int q = threadIdx.x; q < n / 4; q += blockDim.x) ((float4*)out)[q] = src[q];
        }
    """,
    "dynamic_shared.cu": """
        // reverses n values through dynamic shared memory; reading past the launch's bytes when n < 0
        extern "C" __global__ void dynamic_shared(float* __restrict__ out, int n)
        {
            float* buffer = (float*)dynamic_shared_memory();
            const int count = n < 0 ? -n : n;
            for (int k = threadIdx.x; k < count; k += blockDim.x) buffer[k] = out[k];
            __syncthreads();
            float v = 0.0f;
            if (threadIdx.x == 0) v = buffer[n < 0 ? count : 0];  // one past the end when planted
            for (int k = threadIdx.x; k < count; k += blockDim.x) out[k] = buffer[count - 1 - k] + v * 0.0f;
        }
    """,
}


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("warp_kernels")
    for name, text in KERNELS.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


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
