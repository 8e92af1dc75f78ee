// The contractions of dynamic routing, and the whole routing forward in one launch (launcher: routing.py).
//
//   weighted sum: s[b,j,d] = sum_i c[b,i,j] u_hat[b,i,j,d]     c (B,I,J), u_hat (B,I,J,D)
//   agreement:    a[b,i,j] = sum_d u_hat[b,i,j,d] v[b,j,d]     v (B,J,D)
//   outer products: g[b,i,j,d] = sum_t p[t,b,i,j] q[t,b,j,d]     the u_hat gradient of both, summed
//   routing forward (no gradient): all iterations of softmax over J, weighted sum, squash and
//   agreement, for evaluation and no_grad; the engine derives every gradient from the ops above.
//   Two forms: one block per example and every iteration in one launch (routing_forward_*), or
//   S blocks per example and one launch per iteration (routing_forward_sliced_*, see there).
//
// Weighted sum, two launches so the whole GPU works on it: pass 1 gives each block a tile
// (example b, chunk of I) and writes the tile's sums to partial[b, chunk, :]; pass 2 adds the
// chunks in increasing order. Inside a tile, thread (r, q) sums rows i = r, r + R, ... of column
// group q (VEC columns with vec loads, else one), then row 0 adds the R partial sums in order.
// No atomics but the sliced forward's ticket counter, which only picks the block that adds the
// slices (in a fixed order): no result depends on scheduling.
// Agreement: tiles of rows of one example b, v[b] in shared memory. With vec (D a multiple of VEC
// and D/VEC a power of two up to 32), the warps walk the tile's vectors as one flat run, lane by
// lane, and the D/VEC lanes of each (i, j) add up with __shfl_xor_sync; otherwise one warp per
// (b, i) reduces each j over its D in turn.

#ifndef EMULATED_DYNAMIC_SHARED_MEMORY
// The launch's dynamic shared memory (the CPU emulation supplies its own).
__device__ __forceinline__ void* dynamic_shared_memory()
{
    extern __shared__ __align__(16) unsigned char dynamic_shared_bytes[];
    return dynamic_shared_bytes;
}
#endif

#define AGREEMENT_ROWS_PER_WARP 4
// The fused forward's block size (routing.py: FORWARD_THREADS). __launch_bounds__ holds the
// compiler to the 64 registers per thread that 1024 threads may use, so no NVRTC version can
// build a kernel that then fails to launch for lack of registers; the sliced kernel asks for two
// such blocks per SM, so 32 registers: 8 of its 256-thread blocks fit an SM (nvcc 13, sm_90: no
// spills in float32, a few bytes in float64).
#define ROUTING_FORWARD_THREADS 1024

namespace routing_kernels {

template <typename T> struct RoutingVec;
template <> struct RoutingVec<float> { typedef float4 type; static constexpr int width = 4; };
template <> struct RoutingVec<double> { typedef double2 type; static constexpr int width = 2; };

__device__ __forceinline__ void add_scaled(float4& acc, const float4& x, float c)
{
    acc.x += c * x.x; acc.y += c * x.y; acc.z += c * x.z; acc.w += c * x.w;
}
__device__ __forceinline__ void add_scaled(double2& acc, const double2& x, double c)
{
    acc.x += c * x.x; acc.y += c * x.y;
}
__device__ __forceinline__ void add_to(float4& acc, const float4& x) { acc.x += x.x; acc.y += x.y; acc.z += x.z; acc.w += x.w; }
__device__ __forceinline__ void add_to(double2& acc, const double2& x) { acc.x += x.x; acc.y += x.y; }
__device__ __forceinline__ void add_scaled(float& acc, const float& x, float c) { acc += c * x; }
__device__ __forceinline__ void add_scaled(double& acc, const double& x, double c) { acc += c * x; }
__device__ __forceinline__ void add_to(float& acc, const float& x) { acc += x; }
__device__ __forceinline__ void add_to(double& acc, const double& x) { acc += x; }
__device__ __forceinline__ float dot(const float4& a, const float4& b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ __forceinline__ double dot(const double2& a, const double2& b) { return a.x * b.x + a.y * b.y; }
__device__ __forceinline__ float dot(const float& a, const float& b) { return a * b; }
__device__ __forceinline__ double dot(const double& a, const double& b) { return a * b; }

// Pass 1 of the weighted sum, for column groups of type V (a vector, or T itself when width = 1).
template <typename T, typename V, int width>
__device__ void weighted_sum_tiles(const T* __restrict__ c, const T* __restrict__ u_hat, T* __restrict__ partial,
                                   int B, int I, int J, int D, int chunks, int rows_per_chunk)
{
    V* sums = (V*)dynamic_shared_memory();  // (R, groups)
    const int jd_count = J * D, groups = jd_count / width;
    const int R = max(1, (int)blockDim.x / groups), r = threadIdx.x / groups;
    const int q_step = min(groups, (int)blockDim.x);
    for (int tile = blockIdx.x; tile < B * chunks; tile += gridDim.x) {
        const int b = tile / chunks, chunk = tile - b * chunks;
        const int i_begin = chunk * rows_per_chunk, i_end = min(I, i_begin + rows_per_chunk);
        __syncthreads();  // the previous tile's row 0 has read sums
        if (r < R) {
            for (int q = threadIdx.x % groups; q < groups; q += q_step) {
                V acc = {};
                for (int i = i_begin + r; i < i_end; i += R) {
                    const long long bi = (long long)b * I + i;
                    add_scaled(acc, ((const V*)(u_hat + bi * jd_count))[q], c[bi * J + q * width / D]);
                }
                if (R == 1)
                    ((V*)(partial + ((long long)b * chunks + chunk) * jd_count))[q] = acc;
                else
                    sums[r * groups + q] = acc;
            }
        }
        if (R > 1) {
            __syncthreads();
            if (r == 0) {
                const int q = threadIdx.x;
                V total = sums[q];
                for (int row = 1; row < R; ++row) add_to(total, sums[row * groups + q]);
                ((V*)(partial + ((long long)b * chunks + chunk) * jd_count))[q] = total;
            }
        }
    }
}

template <typename T>
__device__ void weighted_sum_partial_impl(const T* __restrict__ c, const T* __restrict__ u_hat, T* __restrict__ partial,
                                          int B, int I, int J, int D, int chunks, int rows_per_chunk, int vec)
{
    typedef RoutingVec<T> Rv;
    if (vec)
        weighted_sum_tiles<T, typename Rv::type, Rv::width>(c, u_hat, partial, B, I, J, D, chunks, rows_per_chunk);
    else
        weighted_sum_tiles<T, T, 1>(c, u_hat, partial, B, I, J, D, chunks, rows_per_chunk);
}

template <typename T>
__device__ void weighted_sum_finish_impl(const T* __restrict__ partial, T* __restrict__ s, int B, int jd_count, int chunks)
{
    const long long total = (long long)B * jd_count;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const long long b = idx / jd_count, jd = idx - b * jd_count;
        T acc = T(0);
        for (int chunk = 0; chunk < chunks; ++chunk) acc += partial[(b * chunks + chunk) * jd_count + jd];
        s[idx] = acc;
    }
}

template <typename T>
__device__ void routing_agreement_impl(const T* __restrict__ u_hat, const T* __restrict__ v, T* __restrict__ a,
                                       int B, int I, int J, int D, int vec, int vec_rows_per_tile)
{
    typedef typename RoutingVec<T>::type V;
    constexpr int width = RoutingVec<T>::width;
    T* v_s = (T*)dynamic_shared_memory();  // v[b]: (J, D)
    const int jd_count = J * D;
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int rows_per_tile = vec ? vec_rows_per_tile : warps * AGREEMENT_ROWS_PER_WARP;
    const int tiles_per_b = (I + rows_per_tile - 1) / rows_per_tile;
    for (int tile = blockIdx.x; tile < B * tiles_per_b; tile += gridDim.x) {
        const int b = tile / tiles_per_b;
        const int i_begin = (tile - b * tiles_per_b) * rows_per_tile, i_end = min(I, i_begin + rows_per_tile);
        __syncthreads();  // the previous tile is done with v_s
        for (int e = threadIdx.x; e < jd_count; e += blockDim.x) v_s[e] = v[(long long)b * jd_count + e];
        __syncthreads();
        if (vec) {
            // The tile's rows as one flat run of vectors: segment s (G = D/VEC vectors, one (i, j)) is
            // a[b, i, j] at a's flat index s. Warp w takes vectors w*32 + lane, + 32*warps, ...: every
            // load is 512 contiguous bytes and no lane idles but in the tile's last step; the G lanes
            // of a segment (G divides 32, and segments start at multiples of G) add with shuffles.
            const int G = D / width, groups = jd_count / width;
            const long long first = ((long long)b * I + i_begin) * groups;
            const int count = (i_end - i_begin) * groups;
            const V* src = (const V*)u_hat + first;
            T* out = a + first / G;
            const int q_step = warps * 32 % groups;
            int q = (warp * 32 + lane) % groups;  // the column group of v[b] under vector e
            for (int base = warp * 32; base < count; base += warps * 32) {  // the same steps for the whole warp
                const int e = base + lane;
                T part = e < count ? dot(src[e], ((const V*)v_s)[q]) : T(0);
                for (int offset = G / 2; offset > 0; offset /= 2) part += __shfl_xor_sync(0xffffffffu, part, offset);
                if (e < count && lane % G == 0) out[e / G] = part;
                q += q_step;
                if (q >= groups) q -= groups;
            }
        } else {
            const int i_first = i_begin + warp * AGREEMENT_ROWS_PER_WARP;
            for (int i = i_first; i < min(i_end, i_first + AGREEMENT_ROWS_PER_WARP); ++i) {
                const T* row = u_hat + ((long long)b * I + i) * jd_count;
                T* out = a + ((long long)b * I + i) * J;
                for (int j = 0; j < J; ++j) {
                    T part = T(0);
                    for (int d = lane; d < D; d += 32) part += row[j * D + d] * v_s[j * D + d];
                    for (int offset = 16; offset > 0; offset /= 2) part += __shfl_xor_sync(0xffffffffu, part, offset);
                    if (lane == 0) out[j] = part;
                }
            }
        }
    }
}

// All routing iterations for one example per block (a grid-stride loop over b). Shared memory:
// s and v (J*D each) and R*J*D partial sums; the logits and couplings of example b live in the
// (B, I, J) outputs, which only this block touches. Matches the engine's ops: softmax over J with
// the row maximum subtracted, squash(s) = |s|^2/(1+|s|^2) * s/sqrt(|s|^2+eps).
template <typename T>
__device__ void routing_forward_impl(const T* __restrict__ u_hat, T* __restrict__ v_out, T* __restrict__ c_out,
                                     T* __restrict__ logits, int B, int I, int J, int D, int iterations, T eps)
{
    const int jd_count = J * D;
    const int R = max(1, (int)blockDim.x / jd_count), r = threadIdx.x / jd_count;
    const int jd_step = min(jd_count, (int)blockDim.x);
    T* v_s = (T*)dynamic_shared_memory();  // (J, D)
    T* sums = v_s + jd_count;              // (R, J, D)
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        const T* u_b = u_hat + (long long)b * I * jd_count;
        T* c_b = c_out + (long long)b * I * J;
        T* l_b = logits + (long long)b * I * J;
        __syncthreads();  // the previous example is done with shared memory
        for (int e = threadIdx.x; e < I * J; e += blockDim.x) l_b[e] = T(0);
        for (int it = 0; it < iterations; ++it) {
            __syncthreads();
            for (int i = threadIdx.x; i < I; i += blockDim.x) {  // c = softmax over J
                T top = l_b[i * J];
                for (int j = 1; j < J; ++j) top = max(top, l_b[i * J + j]);
                T total = T(0);
                for (int j = 0; j < J; ++j) total += exp(l_b[i * J + j] - top);
                for (int j = 0; j < J; ++j) c_b[i * J + j] = exp(l_b[i * J + j] - top) / total;
            }
            __syncthreads();
            if (r < R) {  // s = sum_i c u_hat, rows split over R thread rows
                for (int jd = threadIdx.x % jd_count; jd < jd_count; jd += jd_step) {
                    T acc = T(0);
                    for (int i = r; i < I; i += R) acc += c_b[i * J + jd / D] * u_b[(long long)i * jd_count + jd];
                    sums[r * jd_count + jd] = acc;
                }
            }
            __syncthreads();
            for (int j = threadIdx.x; j < J; j += blockDim.x) {  // add the rows in order, then squash
                T norm2 = T(0);
                for (int d = 0; d < D; ++d) {
                    T s = sums[j * D + d];
                    for (int row = 1; row < R; ++row) s += sums[row * jd_count + j * D + d];
                    v_s[j * D + d] = s;
                    norm2 += s * s;
                }
                const T scale = norm2 / (T(1) + norm2) / sqrt(norm2 + eps);
                for (int d = 0; d < D; ++d) v_s[j * D + d] *= scale;
            }
            __syncthreads();
            if (it + 1 < iterations) {  // b += u_hat . v
                for (int e = threadIdx.x; e < I * J; e += blockDim.x) {
                    const int i = e / J, j = e - i * J;
                    const T* row = u_b + (long long)i * jd_count + j * D;
                    T acc = T(0);
                    for (int d = 0; d < D; ++d) acc += row[d] * v_s[j * D + d];
                    l_b[e] += acc;
                }
            }
        }
        for (int e = threadIdx.x; e < jd_count; e += blockDim.x) v_out[(long long)b * jd_count + e] = v_s[e];
    }
}

// The routing forward with several blocks per example, one launch per iteration (routing.py:
// routing_forward, which also documents how S is chosen). Block task (b, slice) owns rows
// [slice * rows_per_slice, ...) of example b, min(I, ...) at the end. Launch k (iteration k) does,
// for its rows, tile by tile (tile_rows rows staged in shared memory, each u_hat value read from
// global memory once per iteration, with float4/double2 loads when vec):
//   (A) load the tile; with ``agree`` (k > 0) each thread also forms the dot product of its
//       column group with v[b] of iteration k-1 (v_prev);
//   (B) logits = (read_logits ? logits : 0) + (agree ? the D/VEC dot products of (i,j) added in
//       order : 0), written back to logits (the same element, by the same thread) if write_logits;
//   (C) c = softmax over J (to c_out if write_c: the last launch only);
//   (D) thread (r, q) adds c * u_hat of rows r, r + R, ... of the tile to its running sum.
// Then the block adds its R thread rows in order into partial[b, slice, :] and takes a ticket from
// counters[b]; the block that draws the last ticket (S - 1), whichever it is, sets counters[b]
// back to 0, adds the S partial sums in slice order 0, 1, ..., S - 1 and squashes them into
// v_next[b]. Every sum has a fixed order, so the result is bitwise the same whatever order the
// blocks run or arrive in; the counter only decides which block does the last step. No block ever
// waits for another, and the same launch replayed (a CUDA graph, a timing loop) computes the same.
template <typename T, typename V, int width>
__device__ void forward_sliced(const T* __restrict__ u_hat, const T* __restrict__ v_prev, T* __restrict__ v_next,
                               T* __restrict__ logits, T* __restrict__ c_out, T* __restrict__ partial,
                               unsigned int* __restrict__ counters, int B, int I, int J, int D, int S,
                               int rows_per_slice, int tile_rows, int agree, int read_logits, int write_logits,
                               int write_c, T eps)
{
    __shared__ int last_block;  // this block drew its example's last ticket
    const int jd_count = J * D, groups = jd_count / width, G = D / width;  // G column groups per capsule j
    const int R = max(1, (int)blockDim.x / groups), r = threadIdx.x / groups;
    const int q_step = min(groups, (int)blockDim.x);
    T* tile = (T*)dynamic_shared_memory();  // (tile_rows, J*D): the staged rows of u_hat
    T* sums = tile + tile_rows * jd_count;  // (R, J*D): each thread row's running sums
    T* v_s = sums + R * jd_count;           // (J*D): v of the previous iteration
    T* dots = v_s + jd_count;               // (tile_rows, groups): u_hat . v per column group
    T* coef = dots + tile_rows * groups;    // (tile_rows, J): the logits, then the couplings
    for (int task = blockIdx.x; task < B * S; task += gridDim.x) {
        const int b = task / S, slice = task - b * S;
        const int i_begin = slice * rows_per_slice, i_end = min(I, i_begin + rows_per_slice);
        __syncthreads();  // the previous task is done with shared memory
        if (agree)
            for (int e = threadIdx.x; e < jd_count; e += blockDim.x) v_s[e] = v_prev[(long long)b * jd_count + e];
        for (int t0 = i_begin; t0 < i_end; t0 += tile_rows) {
            const int rows = min(tile_rows, i_end - t0);
            const T* u_tile = u_hat + ((long long)b * I + t0) * jd_count;
            __syncthreads();  // v_s is set; the previous tile's readers are done with tile, dots and coef
            if (r < R) {  // (A)
                for (int q = threadIdx.x % groups; q < groups; q += q_step) {
                    V vq = {};
                    if (agree) vq = ((const V*)v_s)[q];
                    for (int i = r; i < rows; i += R) {
                        const V x = ((const V*)(u_tile + (long long)i * jd_count))[q];
                        ((V*)tile)[i * groups + q] = x;
                        if (agree) dots[i * groups + q] = dot(x, vq);
                    }
                }
            }
            __syncthreads();
            for (int e = threadIdx.x; e < rows * J; e += blockDim.x) {  // (B)
                const int i = e / J, j = e - i * J;
                const long long at = ((long long)b * I + t0) * J + e;
                T value = read_logits ? logits[at] : T(0);
                if (agree) {
                    T a = T(0);
                    for (int g = 0; g < G; ++g) a += dots[i * groups + j * G + g];
                    value += a;
                }
                coef[e] = value;
                if (write_logits) logits[at] = value;
            }
            __syncthreads();
            for (int i = threadIdx.x; i < rows; i += blockDim.x) {  // (C)
                T* row = coef + i * J;
                T top = row[0];
                for (int j = 1; j < J; ++j) top = max(top, row[j]);
                T total = T(0);
                for (int j = 0; j < J; ++j) {
                    row[j] = exp(row[j] - top);
                    total += row[j];
                }
                for (int j = 0; j < J; ++j) {
                    row[j] = row[j] / total;
                    if (write_c) c_out[((long long)b * I + t0 + i) * J + j] = row[j];
                }
            }
            __syncthreads();
            if (r < R) {  // (D): the first tile starts every thread row's sums, rows or not
                for (int q = threadIdx.x % groups; q < groups; q += q_step) {
                    const int j = q * width / D;
                    V acc = {};
                    if (t0 != i_begin) acc = ((const V*)sums)[r * groups + q];
                    for (int i = r; i < rows; i += R) add_scaled(acc, ((const V*)tile)[i * groups + q], coef[i * J + j]);
                    ((V*)sums)[r * groups + q] = acc;
                }
            }
        }
        __syncthreads();
        T* own = partial + ((long long)b * S + slice) * jd_count;
        for (int q = threadIdx.x; q < groups; q += blockDim.x) {  // thread rows added in order r
            V total = ((const V*)sums)[q];
            for (int row = 1; row < R; ++row) add_to(total, ((const V*)sums)[row * groups + q]);
            ((V*)own)[q] = total;
        }
        __threadfence();  // this block's partial sums reach the device before its ticket
        __syncthreads();
        if (threadIdx.x == 0) last_block = atomicAdd(counters + b, 1u) == (unsigned int)(S - 1);
        __syncthreads();
        if (last_block) {  // the same for every thread of the block
            __threadfence();
            // every block of example b has drawn its ticket: the counter starts again from 0, so a
            // replay of this very launch (a CUDA graph, a timing loop) draws tickets as the first did
            if (threadIdx.x == 0) counters[b] = 0u;
            T* s_s = tile;  // (J*D): s[b], the tile is free
            const T* column = partial + (long long)b * S * jd_count;
            for (int e = threadIdx.x; e < jd_count; e += blockDim.x) {
                T s = __ldcg(column + e);  // L2, not this SM's L1: other blocks wrote the partial sums
                for (int k = 1; k < S; ++k) s += __ldcg(column + (long long)k * jd_count + e);
                s_s[e] = s;
            }
            __syncthreads();
            for (int j = threadIdx.x; j < J; j += blockDim.x) {  // squash
                T norm2 = T(0);
                for (int d = 0; d < D; ++d) norm2 += s_s[j * D + d] * s_s[j * D + d];
                const T scale = norm2 / (T(1) + norm2) / sqrt(norm2 + eps);
                for (int d = 0; d < D; ++d) v_next[(long long)b * jd_count + j * D + d] = s_s[j * D + d] * scale;
            }
        }
    }
}

template <typename T>
__device__ void routing_forward_sliced_impl(const T* __restrict__ u_hat, const T* __restrict__ v_prev,
                                            T* __restrict__ v_next, T* __restrict__ logits, T* __restrict__ c_out,
                                            T* __restrict__ partial, unsigned int* __restrict__ counters, int B, int I,
                                            int J, int D, int S, int rows_per_slice, int tile_rows, int agree,
                                            int read_logits, int write_logits, int write_c, int vec, T eps)
{
    typedef RoutingVec<T> Rv;
    if (vec)
        forward_sliced<T, typename Rv::type, Rv::width>(u_hat, v_prev, v_next, logits, c_out, partial, counters, B, I,
                                                        J, D, S, rows_per_slice, tile_rows, agree, read_logits,
                                                        write_logits, write_c, eps);
    else
        forward_sliced<T, T, 1>(u_hat, v_prev, v_next, logits, c_out, partial, counters, B, I, J, D, S,
                                rows_per_slice, tile_rows, agree, read_logits, write_logits, write_c, eps);
}

// The u_hat gradient of the routing contractions in one pass: out[b,i,j,d] = sum_t p[t,b,i,j] q[t,b,j,d]
// over the T terms (the weighted sums' c * dL/ds and the agreements' dL/da * v), added in order t.
// One thread per output value in a grid-stride loop: the (B, I, J, D) result is written once.
// Index is int where B*I*J*D fits (32-bit division is several times cheaper), else long long.
template <typename T, typename Index>
__device__ void outer_products_impl(const T* __restrict__ p, const T* __restrict__ q, T* __restrict__ out, int terms,
                                    int B, int I, int J, int D)
{
    const Index ij_count = (Index)I * J, bij_count = B * ij_count, bjd_count = (Index)B * J * D;
    const Index total = bij_count * D;
    for (Index e = blockIdx.x * (Index)blockDim.x + threadIdx.x; e < total; e += (Index)gridDim.x * blockDim.x) {
        const Index bij = e / D;
        const int d = (int)(e - bij * D);
        const Index b = bij / ij_count;
        const int j = (int)(bij % J);
        const Index q_at = (b * J + j) * D + d;
        T acc = T(0);
        for (int t = 0; t < terms; ++t) acc += p[t * bij_count + bij] * q[t * bjd_count + q_at];
        out[e] = acc;
    }
}

template <typename T>
__device__ void outer_products(const T* __restrict__ p, const T* __restrict__ q, T* __restrict__ out, int terms,
                               int B, int I, int J, int D, int wide)
{
    if (wide)
        outer_products_impl<T, long long>(p, q, out, terms, B, I, J, D);
    else
        outer_products_impl<T, int>(p, q, out, terms, B, I, J, D);
}

}  // namespace routing_kernels

extern "C" __global__ void routing_weighted_sum_partial_f32(const float* __restrict__ c, const float* __restrict__ u_hat, float* __restrict__ partial, int B, int I, int J, int D, int chunks, int rows_per_chunk, int vec)
{
    routing_kernels::weighted_sum_partial_impl<float>(c, u_hat, partial, B, I, J, D, chunks, rows_per_chunk, vec);
}

extern "C" __global__ void routing_weighted_sum_partial_f64(const double* __restrict__ c, const double* __restrict__ u_hat, double* __restrict__ partial, int B, int I, int J, int D, int chunks, int rows_per_chunk, int vec)
{
    routing_kernels::weighted_sum_partial_impl<double>(c, u_hat, partial, B, I, J, D, chunks, rows_per_chunk, vec);
}

extern "C" __global__ void routing_weighted_sum_finish_f32(const float* __restrict__ partial, float* __restrict__ s, int B, int jd_count, int chunks)
{
    routing_kernels::weighted_sum_finish_impl<float>(partial, s, B, jd_count, chunks);
}

extern "C" __global__ void routing_weighted_sum_finish_f64(const double* __restrict__ partial, double* __restrict__ s, int B, int jd_count, int chunks)
{
    routing_kernels::weighted_sum_finish_impl<double>(partial, s, B, jd_count, chunks);
}

extern "C" __global__ void routing_agreement_f32(const float* __restrict__ u_hat, const float* __restrict__ v, float* __restrict__ a, int B, int I, int J, int D, int vec, int vec_rows_per_tile)
{
    routing_kernels::routing_agreement_impl<float>(u_hat, v, a, B, I, J, D, vec, vec_rows_per_tile);
}

extern "C" __global__ void routing_agreement_f64(const double* __restrict__ u_hat, const double* __restrict__ v, double* __restrict__ a, int B, int I, int J, int D, int vec, int vec_rows_per_tile)
{
    routing_kernels::routing_agreement_impl<double>(u_hat, v, a, B, I, J, D, vec, vec_rows_per_tile);
}

extern "C" __global__ void __launch_bounds__(ROUTING_FORWARD_THREADS) routing_forward_f32(const float* __restrict__ u_hat, float* __restrict__ v, float* __restrict__ c, float* __restrict__ logits, int B, int I, int J, int D, int iterations, float eps)
{
    routing_kernels::routing_forward_impl<float>(u_hat, v, c, logits, B, I, J, D, iterations, eps);
}

extern "C" __global__ void __launch_bounds__(ROUTING_FORWARD_THREADS) routing_forward_f64(const double* __restrict__ u_hat, double* __restrict__ v, double* __restrict__ c, double* __restrict__ logits, int B, int I, int J, int D, int iterations, double eps)
{
    routing_kernels::routing_forward_impl<double>(u_hat, v, c, logits, B, I, J, D, iterations, eps);
}

extern "C" __global__ void __launch_bounds__(ROUTING_FORWARD_THREADS, 2) routing_forward_sliced_f32(const float* __restrict__ u_hat, const float* __restrict__ v_prev, float* __restrict__ v_next, float* __restrict__ logits, float* __restrict__ c, float* __restrict__ partial, unsigned int* __restrict__ counters, int B, int I, int J, int D, int S, int rows_per_slice, int tile_rows, int agree, int read_logits, int write_logits, int write_c, int vec, float eps)
{
    routing_kernels::routing_forward_sliced_impl<float>(u_hat, v_prev, v_next, logits, c, partial, counters, B, I, J, D, S, rows_per_slice, tile_rows, agree, read_logits, write_logits, write_c, vec, eps);
}

extern "C" __global__ void __launch_bounds__(ROUTING_FORWARD_THREADS, 2) routing_forward_sliced_f64(const double* __restrict__ u_hat, const double* __restrict__ v_prev, double* __restrict__ v_next, double* __restrict__ logits, double* __restrict__ c, double* __restrict__ partial, unsigned int* __restrict__ counters, int B, int I, int J, int D, int S, int rows_per_slice, int tile_rows, int agree, int read_logits, int write_logits, int write_c, int vec, double eps)
{
    routing_kernels::routing_forward_sliced_impl<double>(u_hat, v_prev, v_next, logits, c, partial, counters, B, I, J, D, S, rows_per_slice, tile_rows, agree, read_logits, write_logits, write_c, vec, eps);
}

extern "C" __global__ void routing_outer_products_f32(const float* __restrict__ p, const float* __restrict__ q, float* __restrict__ out, int terms, int B, int I, int J, int D, int wide)
{
    routing_kernels::outer_products<float>(p, q, out, terms, B, I, J, D, wide);
}

extern "C" __global__ void routing_outer_products_f64(const double* __restrict__ p, const double* __restrict__ q, double* __restrict__ out, int terms, int B, int I, int J, int D, int wide)
{
    routing_kernels::outer_products<double>(p, q, out, terms, B, I, J, D, wide);
}
