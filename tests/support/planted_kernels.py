"""Kernels with rules to follow and bugs planted on purpose, for the tests of the CPU emulation
(kernels/test_kernels_warps.py, kernels/test_kernels_emulation.py). Both write all of them into one
folder: the emulation keys its builds by the sources' text, so every build kind (fibers, OS threads,
each sanitizer) is compiled once for both files, whichever worker runs them."""
import textwrap

# What the emulation must model as CUDA does (warps, vectors, shared memory, launch limits), and the
# warp-level bugs it must report.
WARP_KERNELS = {
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

# Bugs that only a check finds: an output element never written, a missing __syncthreads, a read past
# the end.
BROKEN_KERNELS = {
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


def write_planted_kernels(folder):
    """Write every kernel of WARP_KERNELS and BROKEN_KERNELS into ``folder`` (one .cu each); returns ``folder``."""
    for name, text in {**WARP_KERNELS, **BROKEN_KERNELS}.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder
