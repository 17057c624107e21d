// Dense float32 kernels for the fused PPO update (learner/train/ppo_fused.h) and the fused GRU unroll
// (learner/model/recurrent_core.h): the few shapes a small MLP's or GRU's forward and backward pass need, register-blocked and vectorised for AVX-512, AVX2+FMA or baseline x86-64 (chosen
// once at run time from the CPU's features), plain portable vector code elsewhere. Single-threaded and
// allocation-free: for 64-wide layers and minibatches of hundreds of rows they are faster than a BLAS call
// (no packing, no threads to wake) and let the update keep off OpenBLAS's thread pool.
//
// Matrices are row-major with explicit strides (in elements). Results are float32 sums in an order of the
// kernel's choosing: they match another implementation to rounding, not bit for bit.
//
// Threading: every function is a pure function of its arguments (reentrant); the CPU-feature choice is made
// once, thread-safely, on first use.
#pragma once

#include <cstdint>

namespace farm::kernels {

// c[i, j] = bias[j] (or 0 when bias is null) + sum_k a[i * a_row + k * a_depth] * b[k * b_row + j]
// for i < rows, j < cols, k < depth. b's and c's rows are contiguous (j steps by 1); a is read with any
// strides, so a may be a transposed view (a_row = 1). c must not overlap a, b or bias.
void Gemm(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, int64_t a_depth, const float* b,
          int64_t b_row, float* c, int64_t c_row, const float* bias);

// c[i, j] = bias[j] (or 0) + sum_k a[i * a_row + k] * w[j * depth + k]: x W^T for a narrow W [cols, depth]
// (a layer with few outputs, such as a policy or value head), where Gemm would need W transposed.
void GemmRowDot(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row, const float* w, float* c,
                int64_t c_row, const float* bias);

// values[k] = tanh(values[k]), within 1.5 ulp of the exact value (ATen's Sleef tanh is within 1; ~5x faster
// here). NaN stays NaN, +-inf gives +-1.
void Tanh(float* values, int64_t count);

// g[k] *= 1 - y[k]^2: a gradient through tanh, given tanh's output y.
void MulTanhGrad(float* g, const float* y, int64_t count);

// out[j] = sum_i g[i * cols + j] for i < rows (the bias gradient of a layer).
void SumRows(const float* g, int64_t rows, int64_t cols, float* out);

// sum_k values[k]^2, accumulated in float lanes and added up in double (a gradient norm's square).
double SumSquares(const float* values, int64_t count);

// torch::optim::Adam's step for `count` parameters p with gradients g and moments m, v (float32, as its tensor
// ops): m = beta1 m + (1 - beta1) g, v = beta2 v + (1 - beta2) g^2,
// p -= step_size * m / (sqrt(v) / sqrt_bias_correction2 + eps).
struct AdamCoefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, step_size;
};
void AdamUpdate(float* p, float* m, float* v, const float* g, int64_t count, const AdamCoefficients& c);

// The instruction set the kernels run with: "avx512", "avx2" or "baseline".
const char* InstructionSet();

}  // namespace farm::kernels
