// Row-wise activations, each one primitive op's forward or its own adjoint (launcher: activation.py).
//
//   squash:  y = |x|^2 / (1 + |x|^2) * x / sqrt(|x|^2 + eps)       over each row of N values
//   softmax: y = exp(x - max x) / sum exp(x - max x)              over each row of N values
//
// x is (rows, N), C-contiguous: the op's axis is the last one. One thread per row in a grid-stride
// loop; a row is read in order, so the result does not depend on the launch. The engine's
// CapsNet rows are short (N = 8 or 16 for squash, J = 10 for softmax): a warp per row would idle.
// Each kernel replaces the 5 to 12 array ops (and launches) of the same formula written with
// array primitives; the engine records it as one node either way.

namespace activation_kernels {

// |x|^2 of one row.
template <typename T>
__device__ __forceinline__ T squared_norm(const T* __restrict__ x, int n)
{
    T total = T(0);
    for (int k = 0; k < n; ++k) total += x[k] * x[k];
    return total;
}

template <typename T>
__device__ void squash_rows(const T* __restrict__ x, T* __restrict__ y, int rows, int n, T eps)
{
    for (long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x; row < rows;
         row += (long long)gridDim.x * blockDim.x) {
        const T* x_row = x + row * n;
        const T norm2 = squared_norm(x_row, n);
        const T scale = norm2 / (T(1) + norm2) / sqrt(norm2 + eps);  // the engine's order of operations
        for (int k = 0; k < n; ++k) y[row * n + k] = x_row[k] * scale;
    }
}

// dL/dx = g f + 2 x f'(|x|^2) (g . x), with f(q) = q / ((1 + q) sqrt(q + eps)) the scale and
// f'(q) = h (1 - q / (1 + q) - q / (2 (q + eps))), h = 1 / ((1 + q) sqrt(q + eps)): finite at x = 0.
template <typename T>
__device__ void squash_rows_grad(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ grad_x, int rows,
                                 int n, T eps)
{
    for (long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x; row < rows;
         row += (long long)gridDim.x * blockDim.x) {
        const T* x_row = x + row * n;
        const T* g_row = g + row * n;
        T norm2 = T(0), g_dot_x = T(0);
        for (int k = 0; k < n; ++k) {
            norm2 += x_row[k] * x_row[k];
            g_dot_x += g_row[k] * x_row[k];
        }
        const T h = T(1) / ((T(1) + norm2) * sqrt(norm2 + eps));
        const T scale = norm2 * h;
        const T slope = h * (T(1) - norm2 / (T(1) + norm2) - norm2 / (T(2) * (norm2 + eps)));
        const T along_x = T(2) * slope * g_dot_x;
        for (int k = 0; k < n; ++k) grad_x[row * n + k] = g_row[k] * scale + x_row[k] * along_x;
    }
}

template <typename T>
__device__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int rows, int n)
{
    for (long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x; row < rows;
         row += (long long)gridDim.x * blockDim.x) {
        const T* x_row = x + row * n;
        T top = x_row[0];
        for (int k = 1; k < n; ++k) top = max(top, x_row[k]);
        T total = T(0);
        for (int k = 0; k < n; ++k) total += exp(x_row[k] - top);
        for (int k = 0; k < n; ++k) y[row * n + k] = exp(x_row[k] - top) / total;
    }
}

// dL/dx = y (g - sum(g y)), from the saved output y.
template <typename T>
__device__ void softmax_rows_grad(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ grad_x, int rows,
                                  int n)
{
    for (long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x; row < rows;
         row += (long long)gridDim.x * blockDim.x) {
        const T* y_row = y + row * n;
        const T* g_row = g + row * n;
        T g_dot_y = T(0);
        for (int k = 0; k < n; ++k) g_dot_y += g_row[k] * y_row[k];
        for (int k = 0; k < n; ++k) grad_x[row * n + k] = y_row[k] * (g_row[k] - g_dot_y);
    }
}

}  // namespace activation_kernels

extern "C" __global__ void squash_rows_f32(const float* __restrict__ x, float* __restrict__ y, int rows, int n, float eps)
{
    activation_kernels::squash_rows<float>(x, y, rows, n, eps);
}

extern "C" __global__ void squash_rows_f64(const double* __restrict__ x, double* __restrict__ y, int rows, int n, double eps)
{
    activation_kernels::squash_rows<double>(x, y, rows, n, eps);
}

extern "C" __global__ void squash_rows_grad_f32(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ grad_x, int rows, int n, float eps)
{
    activation_kernels::squash_rows_grad<float>(x, g, grad_x, rows, n, eps);
}

extern "C" __global__ void squash_rows_grad_f64(const double* __restrict__ x, const double* __restrict__ g, double* __restrict__ grad_x, int rows, int n, double eps)
{
    activation_kernels::squash_rows_grad<double>(x, g, grad_x, rows, n, eps);
}

extern "C" __global__ void softmax_rows_f32(const float* __restrict__ x, float* __restrict__ y, int rows, int n)
{
    activation_kernels::softmax_rows<float>(x, y, rows, n);
}

extern "C" __global__ void softmax_rows_f64(const double* __restrict__ x, double* __restrict__ y, int rows, int n)
{
    activation_kernels::softmax_rows<double>(x, y, rows, n);
}

extern "C" __global__ void softmax_rows_grad_f32(const float* __restrict__ y, const float* __restrict__ g, float* __restrict__ grad_x, int rows, int n)
{
    activation_kernels::softmax_rows_grad<float>(y, g, grad_x, rows, n);
}

extern "C" __global__ void softmax_rows_grad_f64(const double* __restrict__ y, const double* __restrict__ g, double* __restrict__ grad_x, int rows, int n)
{
    activation_kernels::softmax_rows_grad<double>(y, g, grad_x, rows, n);
}
