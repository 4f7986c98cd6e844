// Elementwise math of the fused model ops (fused_ops.cc), free of Paddle includes. The functions are
// branch-free and inline, so a loop under `#pragma omp simd` that calls them vectorises (the CPU build
// passes -fopenmp-simd: the pragmas only, no OpenMP runtime).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FUSED_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FUSED_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace fused {

// exp(x) in float32 to about 1e-7 relative, in a form compilers vectorise (std::exp is a library call
// they do not): x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2, then exp(x) = 2^n exp(r), with
// exp(r) by its Taylor series through r^7 (truncation below 6e-9 relative). ln2 is split into a short
// high part, so that n * kLn2Hi is exact, and the remainder. Inputs below -87.33 (where 2^n would
// leave the normal range) give exactly 0, so exp(-inf) = 0; inputs above 88.37 give 2.5e38, never inf.
FUSED_HOST_DEVICE float Exp(float x) {
  constexpr float kLow = -87.33654f, kHigh = 88.37626f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  float xc = x < kLow ? kLow : x;
  xc = xc > kHigh ? kHigh : xc;
  float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float result = p * scale;  // computed before the select, which then vectorises as a blend
  return x < kLow ? 0.0f : result;
}

FUSED_HOST_DEVICE float Sigmoid(float x) { return 1.0f / (1.0f + Exp(-x)); }

// SwiGLU: out = silu(gate) * up with silu(g) = g * sigmoid(g).
FUSED_HOST_DEVICE float Swiglu(float gate, float up) { return gate * Sigmoid(gate) * up; }

// Its gradients: d/dgate = up * s * (1 + g (1 - s)), d/dup = g * s, with s = sigmoid(g).
FUSED_HOST_DEVICE void SwigluGrad(float gate, float up, float grad, float* grad_gate, float* grad_up) {
  float s = Sigmoid(gate);
  *grad_gate = grad * up * s * (1.0f + gate * (1.0f - s));
  *grad_up = grad * gate * s;
}

#if !defined(__CUDACC__)
// The largest of x[0, n) (-inf for none; NaNs passed over), vectorised in the caller's loop: GCC vectorises
// this comparison under an omp simd max reduction, where it keeps std::max scalar. The order of the
// comparisons does not change a maximum.
inline __attribute__((always_inline)) float RowMax(const float* x, int64_t n) {
  float top = -__builtin_inff();
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < n; ++j) top = x[j] > top ? x[j] : top;
  return top;
}
#endif

}  // namespace fused
