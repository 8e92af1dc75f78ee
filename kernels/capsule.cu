// Capsule prediction (DigitCaps) and its two adjoints (launcher: capsule.py).
//
//   predict: u_hat[b,i,j,d] = sum_k W[i,j,d,k] u[b,i,k]      W (I,J,D,K), u (B,I,K)
//   grad_u:  grad_u[b,i,k]  = sum_{j,d} W[i,j,d,k] g[b,i,j,d]
//   grad_w:  grad_W[i,j,d,k] = sum_b g[b,i,j,d] u[b,i,k]      (a fixed-order loop over b: deterministic)
//
// One output element per grid-stride step. In predict, neighbouring threads read neighbouring
// K-long rows of W, so a warp reads one contiguous stretch; u[b,i,:] is shared through the cache.

template <typename T>
__device__ void capsule_predict_impl(const T* __restrict__ u, const T* __restrict__ W, T* __restrict__ u_hat,
                                     int B, int I, int J, int D, int K)
{
    const long long jd_count = (long long)J * D;
    const long long total = (long long)B * I * jd_count;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const long long jd = idx % jd_count;
        const long long bi = idx / jd_count;
        const long long i = bi % I;
        const T* w_row = W + (i * jd_count + jd) * K;
        const T* u_row = u + bi * K;
        T acc = T(0);
        for (int k = 0; k < K; ++k) acc += w_row[k] * u_row[k];
        u_hat[idx] = acc;
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

extern "C" __global__ void capsule_predict_f32(const float* __restrict__ u, const float* __restrict__ W, float* __restrict__ u_hat, int B, int I, int J, int D, int K)
{
    capsule_predict_impl<float>(u, W, u_hat, B, I, J, D, K);
}

extern "C" __global__ void capsule_predict_f64(const double* __restrict__ u, const double* __restrict__ W, double* __restrict__ u_hat, int B, int I, int J, int D, int K)
{
    capsule_predict_impl<double>(u, W, u_hat, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_u_f32(const float* __restrict__ g, const float* __restrict__ W, float* __restrict__ grad_u, int B, int I, int J, int D, int K)
{
    capsule_grad_u_impl<float>(g, W, grad_u, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_u_f64(const double* __restrict__ g, const double* __restrict__ W, double* __restrict__ grad_u, int B, int I, int J, int D, int K)
{
    capsule_grad_u_impl<double>(g, W, grad_u, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_w_f32(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    capsule_grad_w_impl<float>(g, u, grad_w, B, I, J, D, K);
}

extern "C" __global__ void capsule_grad_w_f64(const double* __restrict__ g, const double* __restrict__ u, double* __restrict__ grad_w, int B, int I, int J, int D, int K)
{
    capsule_grad_w_impl<double>(g, u, grad_w, B, I, J, D, K);
}
