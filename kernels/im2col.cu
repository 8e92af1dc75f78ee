// im2col and col2im for NCHW images with stride and zero padding (launcher: conv.py).
//
// The column matrix is (C*kh*kw, N*OH*OW): row (c, ky, kx); column (oy, ox, n) when batch_last
// is nonzero, else (n, oy, ox). Both kernels use a grid-stride loop, one output element per
// step. Index is int when every index fits 32 bits (the *_i32 kernels, which the launcher picks
// then: 64-bit division is several times slower on the GPU), else long long.
// im2col_rows is the (n, oy, ox) layout with one row of the column matrix per grid row (blockIdx.y
// < 65536) and four consecutive columns per thread: the row's (c, ky, kx) is decoded once, a
// column's (n, oy, ox) once per four, and the rest is counted, not divided; the launcher takes it
// when the sizes fit 32-bit indices and the rows the grid's y dimension. With vec (N*OH*OW a
// multiple of 4, col 16-byte aligned) a thread writes its four columns with one float4 store (two
// double2): a warp's store is 512 contiguous bytes instead of four strided ones.
// im2col_planes (below) serves the (n, oy, ox) layout first where an image plane fits shared memory.
// col2im gathers per input pixel (no atomics), so its sums are deterministic, and it visits only
// the kernel offsets that land on an output pixel: ky = ky0, ky0 + sh, ... with ky0 the first
// offset >= max(0, iy + ph - (OH-1)*sh) that is congruent to iy + ph modulo sh.

#ifndef EMULATED_DYNAMIC_SHARED_MEMORY
// The launch's dynamic shared memory (the CPU emulation supplies its own).
__device__ __forceinline__ void* dynamic_shared_memory()
{
    extern __shared__ __align__(16) unsigned char dynamic_shared_bytes[];
    return dynamic_shared_bytes;
}
#endif

namespace im2col_kernels {

template <typename T, typename Index>
__device__ void im2col_impl(const T* __restrict__ x, T* __restrict__ col, int n, int c, int h, int w,
                            int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    const Index ncols = (Index)n * oh * ow;
    const Index total = (Index)c * kh * kw * ncols;
    const Index step = (Index)blockDim.x * gridDim.x;
    for (Index idx = (Index)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const Index row = idx / ncols;
        const Index column = idx - row * ncols;
        const int kx = (int)(row % kw);
        const int ky = (int)((row / kw) % kh);
        const int ch = (int)(row / ((Index)kw * kh));
        int ni, oy, ox;
        if (batch_last) {
            ni = (int)(column % n);
            ox = (int)((column / n) % ow);
            oy = (int)(column / ((Index)n * ow));
        } else {
            ox = (int)(column % ow);
            oy = (int)((column / ow) % oh);
            ni = (int)(column / ((Index)ow * oh));
        }
        const int iy = oy * sh - ph + ky;
        const int ix = ox * sw - pw + kx;
        const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
        col[idx] = inside ? x[(((Index)ni * c + ch) * h + iy) * w + ix] : T(0);
    }
}

// Four values to p[0..3] in one float4 store or two double2 stores (p 16-byte aligned).
__device__ __forceinline__ void store_four(float* p, const float* v) { *(float4*)p = make_float4(v[0], v[1], v[2], v[3]); }
__device__ __forceinline__ void store_four(double* p, const double* v)
{
    ((double2*)p)[0] = make_double2(v[0], v[1]);
    ((double2*)p)[1] = make_double2(v[2], v[3]);
}

template <typename T>
__device__ void im2col_rows_impl(const T* __restrict__ x, T* __restrict__ col, int n, int c, int h, int w,
                                 int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int vec)
{
    constexpr int per_thread = 4;
    const int row = blockIdx.y;
    const int kx = row % kw;
    const int ky = (row / kw) % kh;
    const int ch = row / (kw * kh);
    const int ncols = n * oh * ow;
    const int step = gridDim.x * blockDim.x * per_thread;
    T* __restrict__ out = col + (long long)row * ncols;
    for (int first = (blockIdx.x * blockDim.x + threadIdx.x) * per_thread; first < ncols; first += step) {
        int ox = first % ow;
        const int rest = first / ow;
        int oy = rest % oh;
        int ni = rest / oh;
        T values[per_thread];
#pragma unroll
        for (int k = 0; k < per_thread; ++k) {
            const int iy = oy * sh - ph + ky;
            const int ix = ox * sw - pw + kx;
            const bool inside = first + k < ncols && iy >= 0 && iy < h && ix >= 0 && ix < w;
            values[k] = inside ? x[((ni * c + ch) * h + iy) * w + ix] : T(0);
            if (++ox == ow) {
                ox = 0;
                if (++oy == oh) {
                    oy = 0;
                    ++ni;
                }
            }
        }
        if (vec && first + per_thread <= ncols) {  // the row starts on a 16-byte boundary (ncols % 4 == 0)
            store_four(out + first, values);
        } else {
#pragma unroll
            for (int k = 0; k < per_thread; ++k)
                if (first + k < ncols) out[first + k] = values[k];
        }
    }
}

// im2col_planes: the (n, oy, ox) layout from image planes staged in shared memory. Block task
// (channel ch, group of ``images`` images): the block copies the group's H*W planes of channel ch
// into shared memory (contiguous, coalesced reads: x is read once in all), then writes the
// kh*kw rows (ch, ky, kx) of the group's columns. Thread (row group, quad) decodes its four
// consecutive columns (image, oy, ox) once and walks its rows (ky, kx) by counting, reading the
// four values from shared memory and writing them with one float4 (two double2) store where vec
// (every group's columns start 16-byte aligned), else four scalar stores.
template <typename T>
__device__ void im2col_planes_impl(const T* __restrict__ x, T* __restrict__ col, int n, int c, int h, int w,
                                   int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int images,
                                   int row_groups, int vec)
{
    T* planes = (T*)dynamic_shared_memory();  // (images, h, w)
    const int plane = h * w, ohow = oh * ow, ncols = n * ohow, krows = kh * kw;
    const int groups = (n + images - 1) / images;
    const int quads = (images * ohow + 3) / 4;
    const int row_group = threadIdx.x / quads, quad = threadIdx.x - row_group * quads;
    const int rows_per_group = (krows + row_groups - 1) / row_groups;
    for (int task = blockIdx.x; task < c * groups; task += gridDim.x) {
        const int ch = task / groups, n0 = (task - ch * groups) * images;
        const int here = min(images, n - n0), span = here * ohow;  // images and columns of this group
        __syncthreads();  // the previous task's readers are done with the planes
        for (int e = threadIdx.x; e < here * plane; e += blockDim.x) {
            const int image = e / plane;
            planes[e] = x[((long long)(n0 + image) * c + ch) * plane + (e - image * plane)];
        }
        __syncthreads();
        const int first = quad * 4;
        if (row_group >= row_groups || first >= span) continue;
        const int image0 = first / ohow, rest = first - image0 * ohow, oy0 = rest / ow, ox0 = rest - oy0 * ow;
        const int r_begin = row_group * rows_per_group, r_end = min(krows, r_begin + rows_per_group);
        int ky = r_begin / kw, kx = r_begin - ky * kw;
        T* out = col + ((long long)ch * krows + r_begin) * ncols + (long long)n0 * ohow + first;
        for (int r = r_begin; r < r_end; ++r, out += ncols) {
            T values[4];
            int image = image0, oy = oy0, ox = ox0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int iy = oy * sh - ph + ky;
                const int ix = ox * sw - pw + kx;
                const bool inside = first + k < span && iy >= 0 && iy < h && ix >= 0 && ix < w;
                values[k] = inside ? planes[(image * h + iy) * w + ix] : T(0);
                if (++ox == ow) {
                    ox = 0;
                    if (++oy == oh) {
                        oy = 0;
                        ++image;
                    }
                }
            }
            if (vec && first + 4 <= span) {
                store_four(out, values);
            } else {
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    if (first + k < span) out[k] = values[k];
            }
            if (++kx == kw) {
                kx = 0;
                ++ky;
            }
        }
    }
}

// The first kernel offset (>= 0) that maps padded coordinate t onto an output position, given
// that output positions run 0 .. out-1 with stride s.
__device__ __forceinline__ int first_offset(int t, int s, int out)
{
    const int lowest = max(0, t - (out - 1) * s);
    return lowest + (t - lowest) % s;
}

template <typename T, typename Index>
__device__ void col2im_impl(const T* __restrict__ col, T* __restrict__ x, int n, int c, int h, int w,
                            int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    const Index ncols = (Index)n * oh * ow;
    const Index total = (Index)n * c * h * w;
    const Index step = (Index)blockDim.x * gridDim.x;
    for (Index idx = (Index)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int ix = (int)(idx % w);
        const int iy = (int)((idx / w) % h);
        const int ch = (int)((idx / ((Index)w * h)) % c);
        const int ni = (int)(idx / ((Index)w * h * c));
        const int ty = iy + ph, tx = ix + pw;
        const int ky_last = min(kh - 1, ty), kx_last = min(kw - 1, tx);
        const int kx_first = first_offset(tx, sw, ow);
        T sum = T(0);
        for (int ky = first_offset(ty, sh, oh); ky <= ky_last; ky += sh) {
            const int oy = (ty - ky) / sh;
            for (int kx = kx_first; kx <= kx_last; kx += sw) {
                const int ox = (tx - kx) / sw;
                const Index row = ((Index)ch * kh + ky) * kw + kx;
                const Index column = batch_last ? ((Index)oy * ow + ox) * n + ni : ((Index)ni * oh + oy) * ow + ox;
                sum += col[row * ncols + column];
            }
        }
        x[idx] = sum;
    }
}

}  // namespace im2col_kernels

extern "C" __global__ void im2col_f32(const float* __restrict__ x, float* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::im2col_impl<float, long long>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void im2col_f64(const double* __restrict__ x, double* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::im2col_impl<double, long long>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void im2col_i32_f32(const float* __restrict__ x, float* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::im2col_impl<float, int>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void im2col_i32_f64(const double* __restrict__ x, double* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::im2col_impl<double, int>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void col2im_f32(const float* __restrict__ col, float* __restrict__ x, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::col2im_impl<float, long long>(col, x, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void col2im_f64(const double* __restrict__ col, double* __restrict__ x, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::col2im_impl<double, long long>(col, x, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void col2im_i32_f32(const float* __restrict__ col, float* __restrict__ x, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::col2im_impl<float, int>(col, x, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void col2im_i32_f64(const double* __restrict__ col, double* __restrict__ x, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_kernels::col2im_impl<double, int>(col, x, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void im2col_rows_f32(const float* __restrict__ x, float* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int vec)
{
    im2col_kernels::im2col_rows_impl<float>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, vec);
}

extern "C" __global__ void im2col_rows_f64(const double* __restrict__ x, double* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int vec)
{
    im2col_kernels::im2col_rows_impl<double>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, vec);
}

extern "C" __global__ void im2col_planes_f32(const float* __restrict__ x, float* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int images, int row_groups, int vec)
{
    im2col_kernels::im2col_planes_impl<float>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, images, row_groups, vec);
}

extern "C" __global__ void im2col_planes_f64(const double* __restrict__ x, double* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int images, int row_groups, int vec)
{
    im2col_kernels::im2col_planes_impl<double>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, images, row_groups, vec);
}
