// Capsule prediction (DigitCaps) and its adjoints (launcher: capsule.py).
//
//   predict: u_hat[b,i,j,d]  = sum_k W[i,j,d,k] u[b,i,k]      W (I,J,D,K), u (B,I,K)
//   grad:    grad_u[b,i,k]   = sum_{j,d} W[i,j,d,k] g[b,i,j,d] and
//            grad_W[i,j,d,k] = sum_b g[b,i,j,d] u[b,i,k]      in one pass over g
//   grad_u, grad_w: each alone (for the higher-order graph, where only one is needed)
//
// predict and grad, K <= 8 (capsule_predict_*, capsule_grad_*): W[i]'s columns and the sums in
// registers (predict_registers and grad_registers below say how). Larger K, or on request
// (capsule_predict_shared_*, capsule_grad_shared_*, the earlier kernels, kept as they were):
// predict and grad: one block per input capsule i (a grid-stride loop over i). The block copies
// W[i] into dynamic shared memory transposed to (K, J*D), so that thread q reading the VEC
// neighbouring (j,d) columns q*VEC.. of row k touches consecutive banks. With JD = J*D a
// multiple of VEC (4 floats or 2 doubles) predict writes each u_hat row with float4/double2
// stores; otherwise it takes the scalar path (vec = 1).
// grad: the block walks b in chunks of one row per warp: it stages g[b,i,:] and u[b,i,:] in
// shared memory; warp w reduces grad_u[b_w,i,:] with shuffles; then each thread adds the chunk,
// in increasing b, to the grad_W[i] entries it owns (kept in shared memory). Every sum runs in a
// fixed order, so results are deterministic.

#ifndef EMULATED_DYNAMIC_SHARED_MEMORY
// The launch's dynamic shared memory (the CPU emulation supplies its own).
__device__ __forceinline__ void* dynamic_shared_memory()
{
    extern __shared__ __align__(16) unsigned char dynamic_shared_bytes[];
    return dynamic_shared_bytes;
}
#endif

// The most input dimensions K that capsule_predict keeps in registers (capsule.py: PREDICT_KMAX).
#define PREDICT_KMAX 8
// The most input dimensions K that capsule_grad sums in registers (capsule.py: GRAD_KMAX).
#define GRAD_KMAX 8

namespace capsule_kernels {

template <typename T> struct Vec;
template <> struct Vec<float> { typedef float4 type; static constexpr int width = 4; };
template <> struct Vec<double> { typedef double2 type; static constexpr int width = 2; };

__device__ __forceinline__ void add_scaled(float4& acc, const float4& w, float x)
{
    acc.x += w.x * x; acc.y += w.y * x; acc.z += w.z * x; acc.w += w.w * x;
}

__device__ __forceinline__ void add_scaled(double2& acc, const double2& w, double x)
{
    acc.x += w.x * x; acc.y += w.y * x;
}

__device__ __forceinline__ void add_scaled(float& acc, const float& w, float x) { acc += w * x; }
__device__ __forceinline__ void add_scaled(double& acc, const double& w, double x) { acc += w * x; }

// The VEC (or one) values at p[0], p[stride], ... as one vector: a column group of W[i] at one k.
__device__ __forceinline__ void gather(float4& out, const float* __restrict__ p, int stride)
{
    out = make_float4(p[0], p[stride], p[2 * stride], p[3 * stride]);
}
__device__ __forceinline__ void gather(double2& out, const double* __restrict__ p, int stride)
{
    out = make_double2(p[0], p[stride]);
}
__device__ __forceinline__ void gather(float& out, const float* __restrict__ p, int) { out = p[0]; }
__device__ __forceinline__ void gather(double& out, const double* __restrict__ p, int) { out = p[0]; }

// capsule_predict with W[i]'s column group in registers (K <= PREDICT_KMAX): block task
// (i, chunk of B) in a grid-stride loop, consecutive tasks sharing W[i]; thread (r, q) loads the
// K values of its column group q (VEC neighbouring jd with vec, else one) once per task, then for
// rows b = chunk start + r, + R, ... reads u[b,i,:] (the same K values for the whole thread row:
// one cache line) and writes u_hat[b,i,q] with one vector store. No shared memory, no
// __syncthreads, no division in the row loop.
template <typename T, typename V, int width>
__device__ void predict_registers(const T* __restrict__ u, const T* __restrict__ W, T* __restrict__ u_hat,
                                  int B, int I, int J, int D, int K, int chunks, int rows_per_chunk)
{
    const int jd_count = J * D, groups = jd_count / width;
    const int R = max(1, (int)blockDim.x / groups), r = threadIdx.x / groups;
    const int q_step = min(groups, (int)blockDim.x);
    if (r >= R) return;  // the threads past R whole thread rows have no column group
    for (int task = blockIdx.x; task < I * chunks; task += gridDim.x) {
        const int i = task / chunks, chunk = task - i * chunks;
        const int b_end = min(B, (chunk + 1) * rows_per_chunk);
        for (int q = threadIdx.x % groups; q < groups; q += q_step) {
            const T* w_col = W + ((long long)i * jd_count + q * width) * K;
            V w[PREDICT_KMAX];
#pragma unroll
            for (int k = 0; k < PREDICT_KMAX; ++k) {
                w[k] = V{};
                if (k < K) gather(w[k], w_col + k, K);
            }
            for (int b = chunk * rows_per_chunk + r; b < b_end; b += R) {
                const long long bi = (long long)b * I + i;
                const T* u_row = u + bi * K;
                V acc = {};
#pragma unroll
                for (int k = 0; k < PREDICT_KMAX; ++k)
                    if (k < K) add_scaled(acc, w[k], u_row[k]);
                ((V*)(u_hat + bi * jd_count))[q] = acc;
            }
        }
    }
}

template <typename T>
__device__ void capsule_predict_registers_impl(const T* __restrict__ u, const T* __restrict__ W, T* __restrict__ u_hat,
                                               int B, int I, int J, int D, int K, int chunks, int rows_per_chunk, int vec)
{
    typedef Vec<T> Vt;
    if (vec)
        predict_registers<T, typename Vt::type, Vt::width>(u, W, u_hat, B, I, J, D, K, chunks, rows_per_chunk);
    else
        predict_registers<T, T, 1>(u, W, u_hat, B, I, J, D, K, chunks, rows_per_chunk);
}

__device__ __forceinline__ float dot(const float4& a, const float4& b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ __forceinline__ double dot(const double2& a, const double2& b) { return a.x * b.x + a.y * b.y; }
__device__ __forceinline__ float dot(const float& a, const float& b) { return a * b; }
__device__ __forceinline__ double dot(const double& a, const double& b) { return a * b; }
__device__ __forceinline__ float part(const float4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
__device__ __forceinline__ double part(const double2& v, int c) { return c == 0 ? v.x : v.y; }
__device__ __forceinline__ float part(const float& v, int) { return v; }
__device__ __forceinline__ double part(const double& v, int) { return v; }

// Both adjoints in one pass over g with register accumulators (K <= GRAD_KMAX): one block per
// input capsule i (a grid-stride loop). Shared memory: a tile of tile_rows rows of g[:, i, :] (row
// pitch ``pitch``: pitch / VEC odd, so that vector loads of one column group from 8 rows hit
// different banks), W[i] transposed to (K, J*D), and the tile's rows of u[:, i, :]. All threads
// stage a tile (vector loads when vec); then two kinds of thread work on it at once:
//   threads [0, tile_rows): one row b each, grad_u[b,i,:] = W[i] g[b,i,:] over the column groups
//     in order, K sums in registers (W[i]'s column group read by every such thread at once:
//     a broadcast);
//   threads [T, T + groups), T = tile_rows rounded up to whole warps: one column group (VEC
//     neighbouring jd) of grad_W[i] each, K vectors of sums in registers over every b in order,
//     written once at the end.
// Every sum has a fixed order: deterministic.
template <typename T, typename V, int width>
__device__ void grad_registers(const T* __restrict__ g, const T* __restrict__ u, const T* __restrict__ W,
                               T* __restrict__ grad_u, T* __restrict__ grad_w, int B, int I, int J, int D, int K,
                               int tile_rows, int pitch)
{
    const int jd_count = J * D, groups = jd_count / width, jdk = jd_count * K;
    T* g_s = (T*)dynamic_shared_memory();  // (tile_rows, pitch)
    T* w_s = g_s + tile_rows * pitch;      // (K, J*D)
    T* u_s = w_s + jdk;                    // (tile_rows, K)
    // this thread's column group of grad_W[i], if in [0, groups): those threads start at the first
    // whole warp after the grad_u threads, so that no warp does both
    const int column = (int)threadIdx.x - (tile_rows + 31) / 32 * 32;
    for (int i = blockIdx.x; i < I; i += gridDim.x) {
        __syncthreads();  // the previous i's readers are done with w_s
        for (int e = threadIdx.x; e < jdk; e += blockDim.x) w_s[(e % K) * jd_count + e / K] = W[(long long)i * jdk + e];
        V gw[GRAD_KMAX];
#pragma unroll
        for (int k = 0; k < GRAD_KMAX; ++k) gw[k] = V{};
        for (int b0 = 0; b0 < B; b0 += tile_rows) {
            const int rows = min(tile_rows, B - b0);
            __syncthreads();  // w_s is set; the previous tile's readers are done
            for (int e = threadIdx.x; e < rows * groups; e += blockDim.x) {
                const int row = e / groups, q = e - row * groups;
                ((V*)(g_s + row * pitch))[q] = ((const V*)(g + ((long long)(b0 + row) * I + i) * jd_count))[q];
            }
            for (int e = threadIdx.x; e < rows * K; e += blockDim.x) {
                const int row = e / K;
                u_s[e] = u[((long long)(b0 + row) * I + i) * K + (e - row * K)];
            }
            __syncthreads();
            if ((int)threadIdx.x < rows) {  // grad_u of row b0 + threadIdx.x
                const V* g_row = (const V*)(g_s + threadIdx.x * pitch);
                T acc[GRAD_KMAX];
#pragma unroll
                for (int k = 0; k < GRAD_KMAX; ++k) acc[k] = T(0);
                for (int q = 0; q < groups; ++q) {
                    const V x = g_row[q];
#pragma unroll
                    for (int k = 0; k < GRAD_KMAX; ++k)
                        if (k < K) acc[k] += dot(x, ((const V*)(w_s + k * jd_count))[q]);
                }
                T* out = grad_u + ((long long)(b0 + threadIdx.x) * I + i) * K;
#pragma unroll
                for (int k = 0; k < GRAD_KMAX; ++k)
                    if (k < K) out[k] = acc[k];
            } else if (column >= 0 && column < groups) {  // grad_W[i]'s column group, rows in order
                for (int row = 0; row < rows; ++row) {
                    const V x = ((const V*)(g_s + row * pitch))[column];
#pragma unroll
                    for (int k = 0; k < GRAD_KMAX; ++k)
                        if (k < K) add_scaled(gw[k], x, u_s[row * K + k]);
                }
            }
        }
        if (column >= 0 && column < groups) {
            T* out = grad_w + ((long long)i * jd_count + column * width) * K;
#pragma unroll
            for (int c = 0; c < width; ++c)
#pragma unroll
                for (int k = 0; k < GRAD_KMAX; ++k)
                    if (k < K) out[c * K + k] = part(gw[k], c);
        }
    }
}

template <typename T>
__device__ void capsule_grad_registers_impl(const T* __restrict__ g, const T* __restrict__ u, const T* __restrict__ W,
                                            T* __restrict__ grad_u, T* __restrict__ grad_w, int B, int I, int J, int D,
                                            int K, int tile_rows, int pitch, int vec)
{
    typedef Vec<T> Vt;
    if (vec)
        grad_registers<T, typename Vt::type, Vt::width>(g, u, W, grad_u, grad_w, B, I, J, D, K, tile_rows, pitch);
    else
        grad_registers<T, T, 1>(g, u, W, grad_u, grad_w, B, I, J, D, K, tile_rows, pitch);
}

// W[i] (JD rows of K) -> shared (K rows of JD).
template <typename T>
__device__ void load_transposed(const T* __restrict__ w_i, T* __restrict__ w_s, int jd_count, int K)
{
    for (int e = threadIdx.x; e < jd_count * K; e += blockDim.x) w_s[(e % K) * jd_count + e / K] = w_i[e];
}

template <typename T>
__device__ void capsule_predict_impl(const T* __restrict__ u, const T* __restrict__ W, T* __restrict__ u_hat,
                                     int B, int I, int J, int D, int K, int vec)
{
    typedef typename Vec<T>::type V;
    constexpr int width = Vec<T>::width;
    T* w_s = (T*)dynamic_shared_memory();
    const int jd_count = J * D;
    for (int i = blockIdx.x; i < I; i += gridDim.x) {
        __syncthreads();  // the previous i's readers are done with w_s
        load_transposed(W + (long long)i * jd_count * K, w_s, jd_count, K);
        __syncthreads();
        if (vec) {
            const int quads = jd_count / width;
            for (int t = threadIdx.x; t < B * quads; t += blockDim.x) {
                const int b = t / quads, q = t - b * quads;
                const T* u_row = u + ((long long)b * I + i) * K;
                V acc = {};
                for (int k = 0; k < K; ++k) add_scaled(acc, ((const V*)(w_s + k * jd_count))[q], u_row[k]);
                ((V*)(u_hat + ((long long)b * I + i) * jd_count))[q] = acc;
            }
        } else {
            for (int t = threadIdx.x; t < B * jd_count; t += blockDim.x) {
                const int b = t / jd_count, jd = t - b * jd_count;
                const T* u_row = u + ((long long)b * I + i) * K;
                T acc = T(0);
                for (int k = 0; k < K; ++k) acc += w_s[k * jd_count + jd] * u_row[k];
                u_hat[((long long)b * I + i) * jd_count + jd] = acc;
            }
        }
    }
}

template <typename T>
__device__ void capsule_grad_impl(const T* __restrict__ g, const T* __restrict__ u, const T* __restrict__ W,
                                  T* __restrict__ grad_u, T* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    const int jd_count = J * D, jdk = jd_count * K;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    T* w_s = (T*)dynamic_shared_memory();  // (K, JD)
    T* gw_s = w_s + jdk;                   // (JD, K): this block's grad_W[i]
    T* g_s = gw_s + jdk;                   // (warps, JD): g rows of the current chunk
    T* u_s = g_s + warps * jd_count;       // (warps, K)
    for (int i = blockIdx.x; i < I; i += gridDim.x) {
        __syncthreads();
        load_transposed(W + (long long)i * jdk, w_s, jd_count, K);
        for (int e = threadIdx.x; e < jdk; e += blockDim.x) gw_s[e] = T(0);
        for (int b0 = 0; b0 < B; b0 += warps) {
            const int rows = min(warps, B - b0);
            __syncthreads();  // w_s and gw_s are set; the previous chunk's readers are done
            for (int e = threadIdx.x; e < rows * jd_count; e += blockDim.x) {
                const int r = e / jd_count;
                g_s[e] = g[((long long)(b0 + r) * I + i) * jd_count + (e - r * jd_count)];
            }
            for (int e = threadIdx.x; e < rows * K; e += blockDim.x) {
                const int r = e / K;
                u_s[e] = u[((long long)(b0 + r) * I + i) * K + (e - r * K)];
            }
            __syncthreads();
            if (warp < rows) {  // grad_u[b0 + warp, i, :]: every lane of the warp takes part
                const T* g_row = g_s + warp * jd_count;
                for (int k = 0; k < K; ++k) {
                    T part = T(0);
                    for (int jd = lane; jd < jd_count; jd += 32) part += w_s[k * jd_count + jd] * g_row[jd];
                    for (int offset = 16; offset > 0; offset /= 2) part += __shfl_xor_sync(0xffffffffu, part, offset);
                    if (lane == 0) grad_u[((long long)(b0 + warp) * I + i) * K + k] = part;
                }
            }
            for (int e = threadIdx.x; e < jdk; e += blockDim.x) {
                const int jd = e / K, k = e - jd * K;
                T acc = gw_s[e];
                for (int r = 0; r < rows; ++r) acc += g_s[r * jd_count + jd] * u_s[r * K + k];
                gw_s[e] = acc;
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < jdk; e += blockDim.x) grad_w[(long long)i * jdk + e] = gw_s[e];
    }
}

template <typename T>
__device__ void capsule_grad_u_impl(const T* __restrict__ g, const T* __restrict__ W, T* __restrict__ grad_u,
                                    int B, int I, int J, int D, int K)
{
    const long long jd_count = (long long)J * D;
    const long long total = (long long)B * I * K;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int k = (int)(idx % K);
        const long long bi = idx / K;
        const long long i = bi % I;
        const T* g_row = g + bi * jd_count;
        const T* w_col = W + i * jd_count * K + k;
        T acc = T(0);
        for (long long jd = 0; jd < jd_count; ++jd) acc += w_col[jd * K] * g_row[jd];
        grad_u[idx] = acc;
    }
}

template <typename T>
__device__ void capsule_grad_w_impl(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ grad_w,
                                    int B, int I, int J, int D, int K)
{
    const long long jd_count = (long long)J * D;
    const long long total = (long long)I * jd_count * K;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int k = (int)(idx % K);
        const long long jd = (idx / K) % jd_count;
        const long long i = idx / (K * jd_count);
        T acc = T(0);
        for (int b = 0; b < B; ++b) {
            const long long bi = (long long)b * I + i;
            acc += g[bi * jd_count + jd] * u[bi * K + k];
        }
        grad_w[idx] = acc;
    }
}

}  // namespace capsule_kernels

extern "C" __global__ void capsule_predict_shared_f32(const float* __restrict__ u, const float* __restrict__ W, float* __restrict__ u_hat, int B, int I, int J, int D, int K, int vec)
{
    capsule_kernels::capsule_predict_impl<float>(u, W, u_hat, B, I, J, D, K, vec);
}

extern "C" __global__ void capsule_predict_shared_f64(const double* __restrict__ u, const double* __restrict__ W, double* __restrict__ u_hat, int B, int I, int J, int D, int K, int vec)
{
    capsule_kernels::capsule_predict_impl<double>(u, W, u_hat, B, I, J, D, K, vec);
}

extern "C" __global__ void __launch_bounds__(1024) capsule_predict_f32(const float* __restrict__ u, const float* __restrict__ W, float* __restrict__ u_hat, int B, int I, int J, int D, int K, int chunks, int rows_per_chunk, int vec)
{
    capsule_kernels::capsule_predict_registers_impl<float>(u, W, u_hat, B, I, J, D, K, chunks, rows_per_chunk, vec);
}

extern "C" __global__ void __launch_bounds__(1024) capsule_predict_f64(const double* __restrict__ u, const double* __restrict__ W, double* __restrict__ u_hat, int B, int I, int J, int D, int K, int chunks, int rows_per_chunk, int vec)
{
    capsule_kernels::capsule_predict_registers_impl<double>(u, W, u_hat, B, I, J, D, K, chunks, rows_per_chunk, vec);
}

extern "C" __global__ void __launch_bounds__(1024) capsule_grad_f32(const float* __restrict__ g, const float* __restrict__ u, const float* __restrict__ W, float* __restrict__ grad_u, float* __restrict__ grad_w, int B, int I, int J, int D, int K, int tile_rows, int pitch, int vec)
{
    capsule_kernels::capsule_grad_registers_impl<float>(g, u, W, grad_u, grad_w, B, I, J, D, K, tile_rows, pitch, vec);
}

extern "C" __global__ void __launch_bounds__(1024) capsule_grad_f64(const double* __restrict__ g, const double* __restrict__ u, const double* __restrict__ W, double* __restrict__ grad_u, double* __restrict__ grad_w, int B, int I, int J, int D, int K, int tile_rows, int pitch, int vec)
{
    capsule_kernels::capsule_grad_registers_impl<double>(g, u, W, grad_u, grad_w, B, I, J, D, K, tile_rows, pitch, vec);
}

extern "C" __global__ void capsule_grad_shared_f32(const float* __restrict__ g, const float* __restrict__ u, const float* __restrict__ W, float* __restrict__ grad_u, float* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    capsule_kernels::capsule_grad_impl<float>(g, u, W, grad_u, grad_w, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_shared_f64(const double* __restrict__ g, const double* __restrict__ u, const double* __restrict__ W, double* __restrict__ grad_u, double* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    capsule_kernels::capsule_grad_impl<double>(g, u, W, grad_u, grad_w, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_u_f32(const float* __restrict__ g, const float* __restrict__ W, float* __restrict__ grad_u, int B, int I, int J, int D, int K)
{
    capsule_kernels::capsule_grad_u_impl<float>(g, W, grad_u, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_u_f64(const double* __restrict__ g, const double* __restrict__ W, double* __restrict__ grad_u, int B, int I, int J, int D, int K)
{
    capsule_kernels::capsule_grad_u_impl<double>(g, W, grad_u, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_w_f32(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    capsule_kernels::capsule_grad_w_impl<float>(g, u, grad_w, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_w_f64(const double* __restrict__ g, const double* __restrict__ u, double* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    capsule_kernels::capsule_grad_w_impl<double>(g, u, grad_w, B, I, J, D, K);
}
