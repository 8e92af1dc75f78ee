// im2col and col2im for NCHW images with stride and zero padding (launcher: conv.py).
//
// The column matrix is (C*kh*kw, N*OH*OW): row (c, ky, kx); column (oy, ox, n) when batch_last
// is nonzero, else (n, oy, ox). Both kernels use a grid-stride loop, one output element per
// step. col2im gathers per input pixel (no atomics), so its sums are deterministic.

template <typename T>
__device__ void im2col_impl(const T* __restrict__ x, T* __restrict__ col, int n, int c, int h, int w,
                            int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    const long long ncols = (long long)n * oh * ow;
    const long long total = (long long)c * kh * kw * ncols;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const long long row = idx / ncols;
        const long long column = idx - row * ncols;
        const int kx = (int)(row % kw);
        const int ky = (int)((row / kw) % kh);
        const int ch = (int)(row / ((long long)kw * kh));
        int ni, oy, ox;
        if (batch_last) {
            ni = (int)(column % n);
            ox = (int)((column / n) % ow);
            oy = (int)(column / ((long long)n * ow));
        } else {
            ox = (int)(column % ow);
            oy = (int)((column / ow) % oh);
            ni = (int)(column / ((long long)ow * oh));
        }
        const int iy = oy * sh - ph + ky;
        const int ix = ox * sw - pw + kx;
        const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
        col[idx] = inside ? x[(((long long)ni * c + ch) * h + iy) * w + ix] : T(0);
    }
}

template <typename T>
__device__ void col2im_impl(const T* __restrict__ col, T* __restrict__ x, int n, int c, int h, int w,
                            int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    const long long ncols = (long long)n * oh * ow;
    const long long total = (long long)n * c * h * w;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int ix = (int)(idx % w);
        const int iy = (int)((idx / w) % h);
        const int ch = (int)((idx / ((long long)w * h)) % c);
        const int ni = (int)(idx / ((long long)w * h * c));
        T sum = T(0);
        for (int ky = 0; ky < kh; ++ky) {
            const int ty = iy + ph - ky;
            if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
            const int oy = ty / sh;
            for (int kx = 0; kx < kw; ++kx) {
                const int tx = ix + pw - kx;
                if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
                const int ox = tx / sw;
                const long long row = ((long long)ch * kh + ky) * kw + kx;
                const long long column = batch_last ? ((long long)oy * ow + ox) * n + ni
                                                    : ((long long)ni * oh + oy) * ow + ox;
                sum += col[row * ncols + column];
            }
        }
        x[idx] = sum;
    }
}

extern "C" __global__ void im2col_f32(const float* __restrict__ x, float* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_impl<float>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void im2col_f64(const double* __restrict__ x, double* __restrict__ col, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    im2col_impl<double>(x, col, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void col2im_f32(const float* __restrict__ col, float* __restrict__ x, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    col2im_impl<float>(col, x, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}

extern "C" __global__ void col2im_f64(const double* __restrict__ col, double* __restrict__ x, int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph, int pw, int oh, int ow, int batch_last)
{
    col2im_impl<double>(col, x, n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, batch_last);
}
