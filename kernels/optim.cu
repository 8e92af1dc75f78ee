// Optimizer updates, one launch per parameter (launcher: optim.py).
//
//   adam_step: Adam's update (PyTorch's, with bias correction; optional AMSGrad and L2 or
//   decoupled weight decay) of param, exp_avg and exp_avg_sq in place, one thread per element in
//   a grid-stride loop. The same arithmetic, in the same order, as the array formulation in
//   tinygrad_caps/optim/optimizer.py, which takes about a dozen launches per parameter.
//
//   adam_step_capturable: the same update with the learning rate and the step count read from
//   device memory (PyTorch's capturable=True), so that a CUDA graph replaying it advances the
//   bias corrections and follows learning-rate changes; the corrections are computed in double,
//   as the host computes them for adam_step. increment_counts_i32 adds one to step counters after
//   every parameter of the step has read its own.

namespace optim_kernels {

template <typename T>
__device__ void adam_step(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ exp_avg,
                          T* __restrict__ exp_avg_sq, T* __restrict__ max_exp_avg_sq, int n, int amsgrad,
                          int decoupled, T weight_decay, T decay_factor, T beta1, T one_minus_beta1, T beta2,
                          T one_minus_beta2, T bias_correction2_sqrt, T step_size, T eps)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        T p = param[e], g = grad[e];
        if (weight_decay != T(0)) {
            if (decoupled)
                p *= decay_factor;  // 1 - lr * weight_decay
            else
                g = g + weight_decay * p;
        }
        const T m = exp_avg[e] * beta1 + g * one_minus_beta1;
        T v = exp_avg_sq[e] * beta2 + g * one_minus_beta2 * g;
        exp_avg[e] = m;
        exp_avg_sq[e] = v;
        if (amsgrad) {
            v = max(max_exp_avg_sq[e], v);
            max_exp_avg_sq[e] = v;
        }
        const T denom = sqrt(v) / bias_correction2_sqrt + eps;
        param[e] = p - m / denom * step_size;
    }
}

template <typename T>
__device__ void adam_step_capturable(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ exp_avg,
                                     T* __restrict__ exp_avg_sq, T* __restrict__ max_exp_avg_sq, int n, int amsgrad,
                                     int decoupled, T weight_decay, T beta1, T one_minus_beta1, T beta2,
                                     T one_minus_beta2, T eps, double beta1_d, double beta2_d, double weight_decay_d,
                                     const double* __restrict__ lr, const int* __restrict__ step)
{
    const double t = double(*step + 1);  // this step's count: the counter is incremented after the update
    const double rate = *lr;
    const T decay_factor = T(1.0 - rate * weight_decay_d);
    const T bias_correction2_sqrt = T(sqrt(1.0 - pow(beta2_d, t)));
    const T step_size = T(rate / (1.0 - pow(beta1_d, t)));
    adam_step<T>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, amsgrad, decoupled, weight_decay, decay_factor,
                 beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, step_size, eps);
}

}  // namespace optim_kernels

extern "C" __global__ void increment_counts_i32(int* __restrict__ counts, int n)
{
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
        counts[e] += 1;
}

extern "C" __global__ void adam_step_capturable_f32(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, float* __restrict__ max_exp_avg_sq, int n, int amsgrad, int decoupled, float weight_decay, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2, float eps, double beta1_d, double beta2_d, double weight_decay_d, const double* __restrict__ lr, const int* __restrict__ step)
{
    optim_kernels::adam_step_capturable<float>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, amsgrad, decoupled, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, beta1_d, beta2_d, weight_decay_d, lr, step);
}

extern "C" __global__ void adam_step_capturable_f64(double* __restrict__ param, const double* __restrict__ grad, double* __restrict__ exp_avg, double* __restrict__ exp_avg_sq, double* __restrict__ max_exp_avg_sq, int n, int amsgrad, int decoupled, double weight_decay, double beta1, double one_minus_beta1, double beta2, double one_minus_beta2, double eps, double beta1_d, double beta2_d, double weight_decay_d, const double* __restrict__ lr, const int* __restrict__ step)
{
    optim_kernels::adam_step_capturable<double>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, amsgrad, decoupled, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, beta1_d, beta2_d, weight_decay_d, lr, step);
}

extern "C" __global__ void adam_step_f32(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, float* __restrict__ max_exp_avg_sq, int n, int amsgrad, int decoupled, float weight_decay, float decay_factor, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2, float bias_correction2_sqrt, float step_size, float eps)
{
    optim_kernels::adam_step<float>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, amsgrad, decoupled, weight_decay, decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, step_size, eps);
}

extern "C" __global__ void adam_step_f64(double* __restrict__ param, const double* __restrict__ grad, double* __restrict__ exp_avg, double* __restrict__ exp_avg_sq, double* __restrict__ max_exp_avg_sq, int n, int amsgrad, int decoupled, double weight_decay, double decay_factor, double beta1, double one_minus_beta1, double beta2, double one_minus_beta2, double bias_correction2_sqrt, double step_size, double eps)
{
    optim_kernels::adam_step<double>(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, amsgrad, decoupled, weight_decay, decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, step_size, eps);
}
