// CPU emulation of the CUDA features our kernels use, so the same .cu source runs under g++.
//
// Each CUDA thread is one std::thread; the blocks of a grid run one after another, so
// __shared__ can be a function-local static. __syncthreads() waits on a std::barrier over the
// block's threads; a thread that returns drops out of the barrier. Warp intrinsics (__shfl*_sync)
// are not emulated: our kernels do not use them. Used by emulation.py (force-included with
// g++ -include); never seen by NVRTC or nvcc.
#pragma once
#include <atomic>
#include <barrier>
#include <cstdio>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

namespace emu {
inline thread_local uint3 thread_idx, block_idx;
inline thread_local dim3 block_dim, grid_dim;
inline std::barrier<>* block_barrier = nullptr;

inline void syncthreads() { block_barrier->arrive_and_wait(); }

template <class Body>
void launch(dim3 grid, dim3 block, Body body)
{
    const unsigned threads_per_block = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> barrier((std::ptrdiff_t)threads_per_block);
                block_barrier = &barrier;
                std::vector<std::thread> threads;
                threads.reserve(threads_per_block);
                for (unsigned tz = 0; tz < block.z; ++tz)
                    for (unsigned ty = 0; ty < block.y; ++ty)
                        for (unsigned tx = 0; tx < block.x; ++tx)
                            threads.emplace_back([=, &barrier, &body] {
                                thread_idx = uint3(tx, ty, tz);
                                block_idx = uint3(bx, by, bz);
                                block_dim = block;
                                grid_dim = grid;
                                body();
                                barrier.arrive_and_drop();
                            });
                for (auto& t : threads) t.join();
                block_barrier = nullptr;
            }
}
}  // namespace emu

template <typename T>
inline T atomicAdd(T* address, T value)
{
    return std::atomic_ref<T>(*address).fetch_add(value);
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() emu::syncthreads()
#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
