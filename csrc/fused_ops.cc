// Fused model ops (package `paddlenlp_ops`, beside the rollout ops): RMSNorm (optionally of x + residual),
// SwiGLU, rotary position embedding and the token log-prob/entropy of a softmax, each a forward op and a
// grad op (PD_BUILD_GRAD_OP), float32 on CPU. llm/alignment/ppo/models/fused_kernels.py puts them into
// paddlenlp's Qwen2/Llama layers; csrc/README.md documents them. CUDA kernels are not written yet.
//
// The row loops are plain C++ under `#pragma omp simd` (built with -fopenmp-simd: no OpenMP runtime),
// each also compiled for AVX2 + FMA where GCC can (common/cpu_clones.h).

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_clones.h"
#include "common/fused_math.h"
#include "common/mkl_threads.h"
#include "common/op_checks.h"
#include "common/rms_norm.h"
#include "paddle/extension.h"

namespace fused {

// See common/rms_norm.h.
FUSED_CPU_CLONES void RmsNormRows(const float* input, const float* residual, const float* weight, float eps,
                                  int64_t rows, int64_t hidden, float* out, float* sum_out, float* inv_rms) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = input + r * hidden;
    if (residual != nullptr) {
      const float* res = residual + r * hidden;
      float* sum = sum_out + r * hidden;
#pragma omp simd
      for (int64_t j = 0; j < hidden; ++j) sum[j] = x[j] + res[j];
      x = sum;
    }
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t j = 0; j < hidden; ++j) squares += x[j] * x[j];
    const float inv = 1.0f / std::sqrt(squares / static_cast<float>(hidden) + eps);
    if (inv_rms != nullptr) inv_rms[r] = inv;
    float* y = out + r * hidden;
#pragma omp simd
    for (int64_t j = 0; j < hidden; ++j) y[j] = x[j] * inv * weight[j];
  }
}

}  // namespace fused

namespace {

using fused::CheckFloat32CPU;
using fused::RmsNormRows;

int64_t LastDim(const paddle::Tensor& t, const char* name) {
  PD_CHECK(!t.shape().empty() && t.shape().back() > 0, name, " must have a non-empty last dimension");
  return t.shape().back();
}

std::vector<int64_t> LeadingShape(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end() - 1);
}

// ---- fused_rms_norm / fused_add_rms_norm ---------------------------------------------------------

// y = x * inv * w with inv = (mean(x^2) + eps)^-1/2:
//   dx = inv * g * w - x * inv^3 * mean(g * w * x)  (+ grad_sum, the gradient reaching x directly),
//   dw = sum over rows of g * x * inv, accumulated in double (`acc`, `hidden` of them) so that the sum over
//   thousands of rows does not depend on their order to float32's rounding.
FUSED_CPU_CLONES void RmsNormGradRows(const float* input, const float* weight, const float* inv_rms,
                                      const float* grad_out, const float* grad_sum, int64_t rows, int64_t hidden,
                                      float* grad_x, double* acc, float* grad_weight) {
  for (int64_t j = 0; j < hidden; ++j) acc[j] = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = input + r * hidden;
    const float* g = grad_out + r * hidden;
    float* dx = grad_x + r * hidden;
    const float inv = inv_rms[r];
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < hidden; ++j) dot += g[j] * weight[j] * x[j];
    const float c = dot * inv * inv * inv / static_cast<float>(hidden);
    if (grad_sum != nullptr) {
      const float* gs = grad_sum + r * hidden;
#pragma omp simd
      for (int64_t j = 0; j < hidden; ++j) dx[j] = inv * g[j] * weight[j] - c * x[j] + gs[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < hidden; ++j) dx[j] = inv * g[j] * weight[j] - c * x[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < hidden; ++j) acc[j] += static_cast<double>(g[j] * x[j] * inv);
  }
  for (int64_t j = 0; j < hidden; ++j) grad_weight[j] = static_cast<float>(acc[j]);
}

void CheckNormInputs(const paddle::Tensor& x, const paddle::Tensor& weight, int64_t* rows, int64_t* hidden) {
  CheckFloat32CPU(x, "x");
  CheckFloat32CPU(weight, "weight");
  *hidden = LastDim(x, "x");
  PD_CHECK(weight.numel() == *hidden, "weight must have ", *hidden, " elements (x's last dimension)");
  *rows = x.numel() / *hidden;
}

std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x, const paddle::Tensor& weight, float epsilon) {
  int64_t rows, hidden;
  CheckNormInputs(x, weight, &rows, &hidden);
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  auto inv_rms = paddle::empty(LeadingShape(x.shape()), x.dtype(), x.place());
  RmsNormRows(x.data<float>(), nullptr, weight.data<float>(), epsilon, rows, hidden, out.data<float>(), nullptr,
              inv_rms.data<float>());
  return {out, inv_rms};
}

std::vector<paddle::Tensor> RmsNormGrad(const paddle::Tensor& x, const paddle::Tensor& weight,
                                        const paddle::Tensor& inv_rms, const paddle::Tensor& grad_out) {
  int64_t rows, hidden;
  CheckNormInputs(x, weight, &rows, &hidden);
  auto grad_x = paddle::empty(x.shape(), x.dtype(), x.place());
  auto grad_weight = paddle::empty(weight.shape(), weight.dtype(), weight.place());
  std::vector<double> acc(hidden);
  RmsNormGradRows(x.data<float>(), weight.data<float>(), inv_rms.data<float>(), grad_out.data<float>(), nullptr,
                  rows, hidden, grad_x.data<float>(), acc.data(), grad_weight.data<float>());
  return {grad_x, grad_weight};
}

std::vector<paddle::Tensor> AddRmsNorm(const paddle::Tensor& x, const paddle::Tensor& residual,
                                       const paddle::Tensor& weight, float epsilon) {
  int64_t rows, hidden;
  CheckNormInputs(x, weight, &rows, &hidden);
  CheckFloat32CPU(residual, "residual");
  PD_CHECK(residual.shape() == x.shape(), "residual must have x's shape");
  auto out = paddle::empty(x.shape(), x.dtype(), x.place());
  auto sum = paddle::empty(x.shape(), x.dtype(), x.place());
  auto inv_rms = paddle::empty(LeadingShape(x.shape()), x.dtype(), x.place());
  RmsNormRows(x.data<float>(), residual.data<float>(), weight.data<float>(), epsilon, rows, hidden,
              out.data<float>(), sum.data<float>(), inv_rms.data<float>());
  return {out, sum, inv_rms};
}

// The sum's own gradient (it is the next residual) is added to the norm's; x and residual get the same.
std::vector<paddle::Tensor> AddRmsNormGrad(const paddle::Tensor& sum, const paddle::Tensor& weight,
                                           const paddle::Tensor& inv_rms, const paddle::Tensor& grad_out,
                                           const paddle::Tensor& grad_sum) {
  int64_t rows, hidden;
  CheckNormInputs(sum, weight, &rows, &hidden);
  auto grad_x = paddle::empty(sum.shape(), sum.dtype(), sum.place());
  auto grad_weight = paddle::empty(weight.shape(), weight.dtype(), weight.place());
  const float* gs = grad_sum.initialized() ? grad_sum.data<float>() : nullptr;
  if (grad_out.initialized()) {
    std::vector<double> acc(hidden);
    RmsNormGradRows(sum.data<float>(), weight.data<float>(), inv_rms.data<float>(), grad_out.data<float>(), gs,
                    rows, hidden, grad_x.data<float>(), acc.data(), grad_weight.data<float>());
  } else {
    float* dx = grad_x.data<float>();
    for (int64_t i = 0; i < sum.numel(); ++i) dx[i] = gs != nullptr ? gs[i] : 0.0f;
    float* dw = grad_weight.data<float>();
    for (int64_t j = 0; j < hidden; ++j) dw[j] = 0.0f;
  }
  return {grad_x, grad_x.copy_to(grad_x.place(), false), grad_weight};
}

// ---- fused_swiglu --------------------------------------------------------------------------------

FUSED_CPU_CLONES void SwigluLoop(const float* gate, const float* up, int64_t n, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = fused::Swiglu(gate[i], up[i]);
}

FUSED_CPU_CLONES void SwigluGradLoop(const float* gate, const float* up, const float* grad, int64_t n,
                                     float* grad_gate, float* grad_up) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) fused::SwigluGrad(gate[i], up[i], grad[i], grad_gate + i, grad_up + i);
}

void CheckSwigluInputs(const paddle::Tensor& gate, const paddle::Tensor& up) {
  CheckFloat32CPU(gate, "gate");
  CheckFloat32CPU(up, "up");
  PD_CHECK(gate.shape() == up.shape(), "gate and up must have the same shape");
}

std::vector<paddle::Tensor> Swiglu(const paddle::Tensor& gate, const paddle::Tensor& up) {
  CheckSwigluInputs(gate, up);
  auto out = paddle::empty(gate.shape(), gate.dtype(), gate.place());
  SwigluLoop(gate.data<float>(), up.data<float>(), gate.numel(), out.data<float>());
  return {out};
}

std::vector<paddle::Tensor> SwigluGrad(const paddle::Tensor& gate, const paddle::Tensor& up,
                                       const paddle::Tensor& grad_out) {
  CheckSwigluInputs(gate, up);
  auto grad_gate = paddle::empty(gate.shape(), gate.dtype(), gate.place());
  auto grad_up = paddle::empty(up.shape(), up.dtype(), up.place());
  SwigluGradLoop(gate.data<float>(), up.data<float>(), grad_out.data<float>(), gate.numel(),
                 grad_gate.data<float>(), grad_up.data<float>());
  return {grad_gate, grad_up};
}

// ---- fused_rotary --------------------------------------------------------------------------------

// paddlenlp's Qwen2/Llama rotary embedding, out = x * cos + rotate_half(x) * sin with
// rotate_half(x) = [-x2, x1] (x1, x2 the two halves of the head dimension), cos and sin taken at each
// token's position. Its gradient is the transpose: dx = g * cos + [g2 * sin2, -g1 * sin1].
FUSED_CPU_CLONES void RotaryRows(const float* x, const float* cos, const float* sin, const int64_t* positions,
                                 int64_t tokens, int64_t heads, int64_t dim, bool transpose, float* out) {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + positions[t] * dim;
    const float* s = sin + positions[t] * dim;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xi = x + (t * heads + h) * dim;
      float* yo = out + (t * heads + h) * dim;
      if (!transpose) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          yo[i] = xi[i] * c[i] - xi[i + half] * s[i];
          yo[i + half] = xi[i + half] * c[i + half] + xi[i] * s[i + half];
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          yo[i] = xi[i] * c[i] + xi[i + half] * s[i + half];
          yo[i + half] = xi[i + half] * c[i + half] - xi[i] * s[i];
        }
      }
    }
  }
}

// q [B, S, Hq, D], k [B, S, Hk, D], cos and sin: L x D values (any leading shape, e.g. [1, L, 1, D]),
// position_ids [B, S] int64 in [0, L).
void CheckRotaryInputs(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& cos,
                       const paddle::Tensor& sin, const paddle::Tensor& position_ids) {
  for (const auto* t : {&q, &k, &cos, &sin}) CheckFloat32CPU(*t, "q, k, cos and sin");
  PD_CHECK(q.shape().size() == 4 && k.shape().size() == 4, "q and k must be [batch, seq, heads, head_dim]");
  PD_CHECK(q.shape()[0] == k.shape()[0] && q.shape()[1] == k.shape()[1] && q.shape()[3] == k.shape()[3],
           "q and k must agree in batch, seq and head_dim");
  const int64_t dim = q.shape()[3];
  PD_CHECK(dim % 2 == 0, "head_dim must be even");
  PD_CHECK(cos.numel() == sin.numel() && cos.numel() % dim == 0 && cos.shape().back() == dim,
           "cos and sin must be [..., head_dim] tables of the same size");
  PD_CHECK(position_ids.is_cpu() && position_ids.dtype() == paddle::DataType::INT64, "position_ids must be CPU int64");
  PD_CHECK(position_ids.numel() == q.shape()[0] * q.shape()[1], "position_ids must be [batch, seq]");
  const int64_t table = cos.numel() / dim;
  const int64_t* pos = position_ids.data<int64_t>();
  for (int64_t t = 0; t < position_ids.numel(); ++t) {
    PD_CHECK(pos[t] >= 0 && pos[t] < table, "position id ", pos[t], " is outside the cos/sin table of ", table, " rows");
  }
}

std::vector<paddle::Tensor> RotaryApply(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& cos,
                                        const paddle::Tensor& sin, const paddle::Tensor& position_ids,
                                        bool transpose) {
  CheckRotaryInputs(q, k, cos, sin, position_ids);
  const int64_t tokens = q.shape()[0] * q.shape()[1], dim = q.shape()[3];
  std::vector<paddle::Tensor> outs;
  for (const auto* x : {&q, &k}) {
    auto out = paddle::empty(x->shape(), x->dtype(), x->place());
    RotaryRows(x->data<float>(), cos.data<float>(), sin.data<float>(), position_ids.data<int64_t>(), tokens,
               x->shape()[2], dim, transpose, out.data<float>());
    outs.push_back(out);
  }
  return outs;
}

std::vector<paddle::Tensor> Rotary(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& cos,
                                   const paddle::Tensor& sin, const paddle::Tensor& position_ids) {
  return RotaryApply(q, k, cos, sin, position_ids, false);
}

std::vector<paddle::Tensor> RotaryGrad(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& cos,
                                       const paddle::Tensor& sin, const paddle::Tensor& position_ids,
                                       const paddle::Tensor& grad_q, const paddle::Tensor& grad_k) {
  // A gradient that never arrives (q_out or k_out unused downstream) is zero, and so is its input's.
  const auto& gq = grad_q.initialized() ? grad_q : paddle::full(q.shape(), 0.0, q.dtype(), q.place());
  const auto& gk = grad_k.initialized() ? grad_k : paddle::full(k.shape(), 0.0, k.dtype(), k.place());
  return RotaryApply(gq, gk, cos, sin, position_ids, true);
}

// ---- fused_token_logprobs ------------------------------------------------------------------------

constexpr int64_t kIgnoreIndex = -100;  // F.cross_entropy's default ignore_index: log-prob 0, no gradient

// Per row of logits [N, V], with z = logits / temperature, m = max z, s = sum exp(z - m):
//   lse = m + log s, logprob = z[label] - lse,
//   entropy = -sum p log p = log s - sum exp(z - m) (z - m) / s.
FUSED_CPU_CLONES void TokenLogprobRows(const float* logits, const int64_t* labels, float temperature, int64_t rows,
                                       int64_t vocab, float* logprobs, float* entropy, float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    const float m = fused::RowMax(x, vocab) / temperature;  // = max z: division by temperature > 0 keeps order
    float s = 0.0f, t = 0.0f;
#pragma omp simd reduction(+ : s, t)
    for (int64_t j = 0; j < vocab; ++j) {
      const float d = x[j] / temperature - m;
      const float e = fused::Exp(d);
      const float ed = e * d;
      s += e;
      t += e > 0.0f ? ed : 0.0f;  // 0 for -inf logits rather than 0 * -inf
    }
    const float log_s = std::log(s);
    lse[r] = m + log_s;
    entropy[r] = log_s - t / s;
    const int64_t label = labels[r];
    logprobs[r] = label == kIgnoreIndex ? 0.0f : x[label] / temperature - lse[r];
  }
}

// d logprob / dz = onehot(label) - p, d entropy / dz = -p (log p + entropy); d/dlogits = d/dz / temperature.
FUSED_CPU_CLONES void TokenLogprobGradRows(const float* logits, const int64_t* labels, const float* lse,
                                           const float* entropy, const float* grad_logprobs,
                                           const float* grad_entropy, float temperature, int64_t rows,
                                           int64_t vocab, float* grad_logits) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    float* dx = grad_logits + r * vocab;
    const int64_t label = labels[r];
    const float gl = (grad_logprobs != nullptr && label != kIgnoreIndex) ? grad_logprobs[r] : 0.0f;
    const float ge = grad_entropy != nullptr ? grad_entropy[r] : 0.0f;
    const float row_lse = lse[r], h = entropy[r];
#pragma omp simd
    for (int64_t j = 0; j < vocab; ++j) {
      const float log_p = x[j] / temperature - row_lse;
      const float p = fused::Exp(log_p);
      const float dz = -p * (gl + ge * (log_p + h)) / temperature;
      dx[j] = p > 0.0f ? dz : 0.0f;
    }
    if (label != kIgnoreIndex) dx[label] += gl / temperature;
  }
}

void CheckLogprobInputs(const paddle::Tensor& logits, const paddle::Tensor& labels, float temperature,
                        int64_t* rows, int64_t* vocab) {
  CheckFloat32CPU(logits, "logits");
  *vocab = LastDim(logits, "logits");
  *rows = logits.numel() / *vocab;
  PD_CHECK(labels.is_cpu() && labels.dtype() == paddle::DataType::INT64, "labels must be CPU int64");
  PD_CHECK(labels.numel() == *rows, "labels must have one entry per row of logits ([..., V] -> [...])");
  PD_CHECK(temperature > 0.0f, "temperature must be positive");
}

std::vector<paddle::Tensor> TokenLogprobs(const paddle::Tensor& logits, const paddle::Tensor& labels,
                                          float temperature) {
  int64_t rows, vocab;
  CheckLogprobInputs(logits, labels, temperature, &rows, &vocab);
  const int64_t* ids = labels.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    PD_CHECK(ids[r] == kIgnoreIndex || (ids[r] >= 0 && ids[r] < vocab), "label ", ids[r], " is outside [0, ", vocab,
             ") and is not the ignore index -100");
  }
  const auto shape = LeadingShape(logits.shape());
  auto logprobs = paddle::empty(shape, logits.dtype(), logits.place());
  auto entropy = paddle::empty(shape, logits.dtype(), logits.place());
  auto lse = paddle::empty(shape, logits.dtype(), logits.place());
  const float* x = logits.data<float>();
  float *logprob = logprobs.data<float>(), *row_entropy = entropy.data<float>(), *row_lse = lse.data<float>();
  mkl_threads::ParallelFor(rows, mkl_threads::RowsPerShare(vocab), [&](int64_t begin, int64_t end) {
    TokenLogprobRows(x + begin * vocab, ids + begin, temperature, end - begin, vocab, logprob + begin,
                     row_entropy + begin, row_lse + begin);
  });
  return {logprobs, entropy, lse};
}

std::vector<paddle::Tensor> TokenLogprobsGrad(const paddle::Tensor& logits, const paddle::Tensor& labels,
                                              const paddle::Tensor& entropy, const paddle::Tensor& lse,
                                              const paddle::Tensor& grad_logprobs, const paddle::Tensor& grad_entropy,
                                              float temperature) {
  int64_t rows, vocab;
  CheckLogprobInputs(logits, labels, temperature, &rows, &vocab);
  auto grad_logits = paddle::empty(logits.shape(), logits.dtype(), logits.place());
  const float *x = logits.data<float>(), *row_lse = lse.data<float>(), *row_entropy = entropy.data<float>();
  const float* gl = grad_logprobs.initialized() ? grad_logprobs.data<float>() : nullptr;
  const float* ge = grad_entropy.initialized() ? grad_entropy.data<float>() : nullptr;
  const int64_t* ids = labels.data<int64_t>();
  float* dx = grad_logits.data<float>();
  mkl_threads::ParallelFor(rows, mkl_threads::RowsPerShare(vocab), [&](int64_t begin, int64_t end) {
    TokenLogprobGradRows(x + begin * vocab, ids + begin, row_lse + begin, row_entropy + begin,
                         gl == nullptr ? nullptr : gl + begin, ge == nullptr ? nullptr : ge + begin, temperature,
                         end - begin, vocab, dx + begin * vocab);
  });
  return {grad_logits};
}

// ---- shape and dtype inference (static graph) ----------------------------------------------------

using Shape = std::vector<int64_t>;

std::vector<Shape> NormShape(const Shape& x, const Shape&) { return {x, LeadingShape(x)}; }
std::vector<Shape> AddNormShape(const Shape& x, const Shape&, const Shape&) { return {x, x, LeadingShape(x)}; }
std::vector<Shape> SameAsFirst(const Shape& x, const Shape&) { return {x}; }
std::vector<Shape> RotaryShape(const Shape& q, const Shape& k, const Shape&, const Shape&, const Shape&) {
  return {q, k};
}
std::vector<Shape> LogprobShape(const Shape& logits, const Shape&) {
  return {LeadingShape(logits), LeadingShape(logits), LeadingShape(logits)};
}
std::vector<paddle::DataType> Float2(const paddle::DataType& x, const paddle::DataType&) { return {x, x}; }
std::vector<paddle::DataType> Float3(const paddle::DataType& x, const paddle::DataType&, const paddle::DataType&) {
  return {x, x, x};
}
std::vector<paddle::DataType> Float1(const paddle::DataType& x, const paddle::DataType&) { return {x}; }
std::vector<paddle::DataType> RotaryDtype(const paddle::DataType& q, const paddle::DataType& k,
                                          const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) {
  return {q, k};
}
std::vector<paddle::DataType> LogprobDtype(const paddle::DataType& logits, const paddle::DataType&) {
  return {logits, logits, logits};
}

}  // namespace

PD_BUILD_OP(fused_rms_norm)
    .Inputs({"x", "weight"})
    .Outputs({"out", "inv_rms"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(RmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(NormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Float2));

PD_BUILD_GRAD_OP(fused_rms_norm)
    .Inputs({"x", "weight", "inv_rms", paddle::Grad("out")})
    .Outputs({paddle::Grad("x"), paddle::Grad("weight")})
    .SetKernelFn(PD_KERNEL(RmsNormGrad));

PD_BUILD_OP(fused_add_rms_norm)
    .Inputs({"x", "residual", "weight"})
    .Outputs({"out", "sum", "inv_rms"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(AddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(AddNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Float3));

PD_BUILD_GRAD_OP(fused_add_rms_norm)
    .Inputs({"sum", "weight", "inv_rms", paddle::Grad("out"), paddle::Grad("sum")})
    .Outputs({paddle::Grad("x"), paddle::Grad("residual"), paddle::Grad("weight")})
    .SetKernelFn(PD_KERNEL(AddRmsNormGrad));

PD_BUILD_OP(fused_swiglu)
    .Inputs({"gate", "up"})
    .Outputs({"out"})
    .SetKernelFn(PD_KERNEL(Swiglu))
    .SetInferShapeFn(PD_INFER_SHAPE(SameAsFirst))
    .SetInferDtypeFn(PD_INFER_DTYPE(Float1));

PD_BUILD_GRAD_OP(fused_swiglu)
    .Inputs({"gate", "up", paddle::Grad("out")})
    .Outputs({paddle::Grad("gate"), paddle::Grad("up")})
    .SetKernelFn(PD_KERNEL(SwigluGrad));

PD_BUILD_OP(fused_rotary)
    .Inputs({"q", "k", "cos", "sin", "position_ids"})
    .Outputs({"q_out", "k_out"})
    .SetKernelFn(PD_KERNEL(Rotary))
    .SetInferShapeFn(PD_INFER_SHAPE(RotaryShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RotaryDtype));

PD_BUILD_GRAD_OP(fused_rotary)
    .Inputs({"q", "k", "cos", "sin", "position_ids", paddle::Grad("q_out"), paddle::Grad("k_out")})
    .Outputs({paddle::Grad("q"), paddle::Grad("k")})
    .SetKernelFn(PD_KERNEL(RotaryGrad));

PD_BUILD_OP(fused_token_logprobs)
    .Inputs({"logits", "labels"})
    .Outputs({"logprobs", "entropy", "lse"})
    .Attrs({"temperature: float"})
    .SetKernelFn(PD_KERNEL(TokenLogprobs))
    .SetInferShapeFn(PD_INFER_SHAPE(LogprobShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LogprobDtype));

PD_BUILD_GRAD_OP(fused_token_logprobs)
    .Inputs({"logits", "labels", "entropy", "lse", paddle::Grad("logprobs"), paddle::Grad("entropy")})
    .Outputs({paddle::Grad("logits")})
    .Attrs({"temperature: float"})
    .SetKernelFn(PD_KERNEL(TokenLogprobsGrad));
