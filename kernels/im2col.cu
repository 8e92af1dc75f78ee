// im2col and col2im for NCHW images with stride and zero padding (launcher: conv.py).
//
// The column matrix is (C*kh*kw, N*OH*OW): row (c, ky, kx); column (oy, ox, n) when batch_last
// is nonzero, else (n, oy, ox). Both kernels use a grid-stride loop, one output element per
// step. Index is int when every index fits 32 bits (the *_i32 kernels, which the launcher picks
// then: 64-bit division is several times slower on the GPU), else long long.
// im2col_rows is the (n, oy, ox) layout with one row of the column matrix per grid row (blockIdx.y
// < 65536) and four consecutive columns per thread: the row's (c, ky, kx) is decoded once, a
// column's (n, oy, ox) once per four, and the rest is counted, not divided; the launcher takes it
// when the sizes fit 32-bit indices and the rows the grid's y dimension.
// col2im gathers per input pixel (no atomics), so its sums are deterministic, and it visits only
// the kernel offsets that land on an output pixel: ky = ky0, ky0 + sh, ... with ky0 the first
// offset >= max(0, iy + ph - (OH-1)*sh) that is congruent to iy + ph modulo sh.

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

template <typename T>
__device__ void im2col_rows_impl(const T* __restrict__ x, T* __restrict__ col, int n, int c, int h, int w,
                                 int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow)
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
#pragma unroll
        for (int k = 0; k < per_thread; ++k) {
            if (first + k < ncols) {
                const int iy = oy * sh - ph + ky;
                const int ix = ox * sw - pw + kx;
                const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                out[first + k] = inside ? x[((ni * c + ch) * h + iy) * w + ix] : T(0);
            }
            if (++ox == ow) {
                ox = 0;
                if (++oy == oh) {
                    oy = 0;
                    ++ni;
                }
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

extern "C" __global__ void im2col_rows_f32(const float* __restrict__ x, float* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow)
{
    im2col_kernels::im2col_rows_impl<float>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow);
}

extern "C" __global__ void im2col_rows_f64(const double* __restrict__ x, double* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow)
{
    im2col_kernels::im2col_rows_impl<double>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow);
}
