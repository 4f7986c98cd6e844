// Fused optimizer ops (package `paddlenlp_ops`): one op for the AdamW update of every float32 CPU parameter,
// and the two halves of a global-norm gradient clip, each over a list of tensors. Paddle's CPU `adamw_`
// runs once per parameter at about 5 ns per float; here one call covers the whole list at under 1 ns.
// llm/alignment/ppo/fused_optimizer.py puts them into Paddle's AdamW and ClipGradByGlobalNorm;
// csrc/README.md documents them. CPU only, float32.

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_clones.h"
#include "common/op_checks.h"
#include "paddle/extension.h"

namespace {

using fused::CheckFloat32CPU;

void CheckSameSizes(const std::vector<paddle::Tensor>& a, const std::vector<paddle::Tensor>& b, const char* name) {
  PD_CHECK(a.size() == b.size(), name, ": ", b.size(), " tensors for ", a.size(), " parameters");
  for (size_t i = 0; i < a.size(); ++i) {
    CheckFloat32CPU(b[i], name);
    PD_CHECK(a[i].numel() == b[i].numel(), name, "[", i, "] has ", b[i].numel(), " elements, its parameter ",
             a[i].numel());
  }
}

// ---- fused_adamw ---------------------------------------------------------------------------------

// Paddle's AdamW step for one tensor (phi's adamw kernel, beta powers b1p, b2p before the step):
//   p <- p - lr * coeff * p;  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
//   p <- p - lr_t * m / (sqrt(v) + eps_t),  lr_t = lr sqrt(1 - b2p) / (1 - b1p),  eps_t = eps sqrt(1 - b2p).
FUSED_CPU_CLONES void AdamWSpan(float* param, const float* grad, float* moment1, float* moment2, int64_t n,
                                float beta1, float beta2, float decay, float lr_t, float eps_t) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = beta1 * moment1[i] + (1.0f - beta1) * g;
    const float v = beta2 * moment2[i] + (1.0f - beta2) * g * g;
    moment1[i] = m;
    moment2[i] = v;
    const float p = param[i] - decay * param[i];
    param[i] = p - lr_t * (m / (std::sqrt(v) + eps_t));
  }
}

// Every tensor i: one AdamW step with learning rate learning_rates[i] and decay coefficient coeffs[i] (0 for
// no decay); its beta powers advance by beta1 and beta2.
void FusedAdamW(std::vector<paddle::Tensor>& params, const std::vector<paddle::Tensor>& grads,
                std::vector<paddle::Tensor>& moment1, std::vector<paddle::Tensor>& moment2,
                std::vector<paddle::Tensor>& beta1_pows, std::vector<paddle::Tensor>& beta2_pows,
                const std::vector<float>& learning_rates, const std::vector<float>& coeffs, float beta1, float beta2,
                float epsilon) {
  for (const auto& p : params) CheckFloat32CPU(p, "params");
  CheckSameSizes(params, grads, "grads");
  CheckSameSizes(params, moment1, "moment1");
  CheckSameSizes(params, moment2, "moment2");
  PD_CHECK(beta1_pows.size() == params.size() && beta2_pows.size() == params.size(),
           "fused_adamw needs one beta1_pow and one beta2_pow per parameter");
  PD_CHECK(learning_rates.size() == params.size() && coeffs.size() == params.size(),
           "fused_adamw needs one learning rate and one decay coefficient per parameter");
  for (size_t i = 0; i < params.size(); ++i) {
    CheckFloat32CPU(beta1_pows[i], "beta1_pows");
    CheckFloat32CPU(beta2_pows[i], "beta2_pows");
    PD_CHECK(beta1_pows[i].numel() == 1 && beta2_pows[i].numel() == 1, "a beta power must hold one value");
    float* b1p = beta1_pows[i].data<float>();
    float* b2p = beta2_pows[i].data<float>();
    const float lr = learning_rates[i];
    const float lr_t = lr * (std::sqrt(1.0f - *b2p) / (1.0f - *b1p));
    const float eps_t = epsilon * std::sqrt(1.0f - *b2p);
    AdamWSpan(params[i].data<float>(), grads[i].data<float>(), moment1[i].data<float>(), moment2[i].data<float>(),
              params[i].numel(), beta1, beta2, lr * coeffs[i], lr_t, eps_t);
    *b1p *= beta1;
    *b2p *= beta2;
  }
}

// ---- fused_square_sum / fused_scale --------------------------------------------------------------

// Sum of x^2 over a span: float lanes within blocks of 1024, blocks added in double, so the result for a
// million floats does not depend on float32 rounding of a long running sum.
FUSED_CPU_CLONES double SquareSumSpan(const float* x, int64_t n) {
  constexpr int64_t kBlock = 1024;
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    float block = 0.0f;
#pragma omp simd reduction(+ : block)
    for (int64_t i = start; i < end; ++i) block += x[i] * x[i];
    total += block;
  }
  return total;
}

// The sum of the squares of every element of every tensor, as a [1] float64 tensor.
std::vector<paddle::Tensor> FusedSquareSum(const std::vector<paddle::Tensor>& xs) {
  double total = 0.0;
  for (const auto& x : xs) {
    CheckFloat32CPU(x, "fused_square_sum input");
    total += SquareSumSpan(x.data<float>(), x.numel());
  }
  auto out = paddle::empty({1}, paddle::DataType::FLOAT64, paddle::CPUPlace());
  out.data<double>()[0] = total;
  return {out};
}

std::vector<std::vector<int64_t>> SquareSumShape(const std::vector<std::vector<int64_t>>&) { return {{1}}; }

std::vector<paddle::DataType> SquareSumDtype(const std::vector<paddle::DataType>&) {
  return {paddle::DataType::FLOAT64};
}

FUSED_CPU_CLONES void ScaleSpan(float* x, int64_t n, float factor) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

// Every element of every tensor multiplied by `factor`, in place.
void FusedScale(std::vector<paddle::Tensor>& xs, float factor) {
  for (auto& x : xs) {
    CheckFloat32CPU(x, "fused_scale input");
    ScaleSpan(x.data<float>(), x.numel(), factor);
  }
}

}  // namespace

PD_BUILD_OP(fused_adamw)
    .Inputs({paddle::Vec("params"), paddle::Vec("grads"), paddle::Vec("moment1"), paddle::Vec("moment2"),
             paddle::Vec("beta1_pows"), paddle::Vec("beta2_pows")})
    .Outputs({paddle::Vec("params_out"), paddle::Vec("moment1_out"), paddle::Vec("moment2_out"),
              paddle::Vec("beta1_pows_out"), paddle::Vec("beta2_pows_out")})
    .SetInplaceMap({{paddle::Vec("params"), paddle::Vec("params_out")},
                    {paddle::Vec("moment1"), paddle::Vec("moment1_out")},
                    {paddle::Vec("moment2"), paddle::Vec("moment2_out")},
                    {paddle::Vec("beta1_pows"), paddle::Vec("beta1_pows_out")},
                    {paddle::Vec("beta2_pows"), paddle::Vec("beta2_pows_out")}})
    .Attrs({"learning_rates: std::vector<float>", "coeffs: std::vector<float>", "beta1: float", "beta2: float",
            "epsilon: float"})
    .SetKernelFn(PD_KERNEL(FusedAdamW));

PD_BUILD_OP(fused_square_sum)
    .Inputs({paddle::Vec("xs")})
    .Outputs({"out"})
    .SetKernelFn(PD_KERNEL(FusedSquareSum))
    .SetInferShapeFn(PD_INFER_SHAPE(SquareSumShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SquareSumDtype));

PD_BUILD_OP(fused_scale)
    .Inputs({paddle::Vec("xs")})
    .Outputs({paddle::Vec("xs_out")})
    .SetInplaceMap({{paddle::Vec("xs"), paddle::Vec("xs_out")}})
    .Attrs({"factor: float"})
    .SetKernelFn(PD_KERNEL(FusedScale));
