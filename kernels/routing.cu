// The two contractions of dynamic routing (launcher: routing.py).
//
//   weighted sum: s[b,j,d] = sum_i c[b,i,j] u_hat[b,i,j,d]     c (B,I,J), u_hat (B,I,J,D)
//   agreement:    a[b,i,j] = sum_d u_hat[b,i,j,d] v[b,j,d]     v (B,J,D)
//
// Weighted sum: a block of ROUTING_TX x ROUTING_TY threads per (32 outputs jd, example b); thread
// row ty sums inputs i = ty, ty+TY, ... so a warp reads 32 neighbouring u_hat values per step,
// then the TY partial sums are added in a fixed order (deterministic, no atomics).
// Agreement: one output per grid-stride step, a D-long dot product over a contiguous u_hat row.

#define ROUTING_TX 32
#define ROUTING_TY 8

template <typename T>
__device__ void routing_weighted_sum_impl(const T* __restrict__ c, const T* __restrict__ u_hat, T* __restrict__ s,
                                          int B, int I, int J, int D)
{
    __shared__ T partial[ROUTING_TY][ROUTING_TX];
    const int jd_count = J * D;
    const long long b = blockIdx.y;
    const int jd = blockIdx.x * ROUTING_TX + threadIdx.x;
    T acc = T(0);
    if (jd < jd_count) {
        const int j = jd / D;
        for (int i = threadIdx.y; i < I; i += ROUTING_TY) {
            const long long bi = b * I + i;
            acc += c[bi * J + j] * u_hat[bi * jd_count + jd];
        }
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && jd < jd_count) {
        T total = T(0);
        for (int t = 0; t < ROUTING_TY; ++t) total += partial[t][threadIdx.x];
        s[b * jd_count + jd] = total;
    }
}

template <typename T>
__device__ void routing_agreement_impl(const T* __restrict__ u_hat, const T* __restrict__ v, T* __restrict__ a,
                                       int B, int I, int J, int D)
{
    const long long total = (long long)B * I * J;
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const long long j = idx % J;
        const long long b = idx / ((long long)I * J);
        const T* u_row = u_hat + idx * D;
        const T* v_row = v + (b * J + j) * D;
        T acc = T(0);
        for (int d = 0; d < D; ++d) acc += u_row[d] * v_row[d];
        a[idx] = acc;
    }
}

extern "C" __global__ void routing_weighted_sum_f32(const float* __restrict__ c, const float* __restrict__ u_hat, float* __restrict__ s, int B, int I, int J, int D)
{
    routing_weighted_sum_impl<float>(c, u_hat, s, B, I, J, D);
}

extern "C" __global__ void routing_weighted_sum_f64(const double* __restrict__ c, const double* __restrict__ u_hat, double* __restrict__ s, int B, int I, int J, int D)
{
    routing_weighted_sum_impl<double>(c, u_hat, s, B, I, J, D);
}

extern "C" __global__ void routing_agreement_f32(const float* __restrict__ u_hat, const float* __restrict__ v, float* __restrict__ a, int B, int I, int J, int D)
{
    routing_agreement_impl<float>(u_hat, v, a, B, I, J, D);
}

extern "C" __global__ void routing_agreement_f64(const double* __restrict__ u_hat, const double* __restrict__ v, double* __restrict__ a, int B, int I, int J, int D)
{
    routing_agreement_impl<double>(u_hat, v, a, B, I, J, D);
}
