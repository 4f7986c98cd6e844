// Fused core attention (package `paddlenlp_ops`): softmax(scale * q k^T + mask) v with its gradient, float32
// on CPU, in the layout of paddlenlp's Qwen2/Llama `scaled_dot_product_attention`: q [B, S, Hq, D], k and v
// [B, Sk, Hk, D] with Hk dividing Hq (grouped-query attention: query head h reads key/value head
// h / (Hq / Hk), as paddlenlp's repeat_kv lays the heads out, without repeating them in memory), mask [B, 1, S,
// Sk] additive (0 where attended, the dtype's lowest value where not: paddlenlp's causal + padding mask),
// out [B, S, Hq * D]. The probabilities [B, Hq, S, Sk] are kept for the backward, as Paddle's unfused ops keep
// them. llm/alignment/ppo/models/fused_kernels.py puts the op into the attention layers.
//
// Where the mask holds the lowest float the score is that value whatever q.k is (adding a score of sane size
// to it rounds back to it), so its dot product is skipped; a row whose keys are all masked gets uniform
// probabilities, as with Paddle's ops. Keys of probability 0 add nothing forward or backward and are skipped.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "common/cpu_clones.h"
#include "common/fused_math.h"
#include "common/op_checks.h"
#include "paddle/extension.h"

namespace {

// Sizes of one call; the strides follow from the layouts above.
struct AttentionShape {
  int64_t batch, queries, keys, q_heads, kv_heads, dim;
  int64_t group() const { return q_heads / kv_heads; }
  int64_t QueryOffset(int64_t b, int64_t i, int64_t h) const { return ((b * queries + i) * q_heads + h) * dim; }
  int64_t KeyOffset(int64_t b, int64_t j, int64_t g) const { return ((b * keys + j) * kv_heads + g) * dim; }
  int64_t ProbRow(int64_t b, int64_t h, int64_t i) const { return ((b * q_heads + h) * queries + i) * keys; }
  int64_t MaskRow(int64_t b, int64_t i) const { return (b * queries + i) * keys; }
};

inline float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// y += a * x
inline void Axpy(float a, const float* x, int64_t n, float* y) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

FUSED_CPU_CLONES void AttentionForward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                       const float* mask, float scale, float* out, float* probs) {
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.queries; ++i) {
      const float* mask_row = mask + s.MaskRow(b, i);
      for (int64_t h = 0; h < s.q_heads; ++h) {
        const int64_t g = h / s.group();
        const float* qi = q + s.QueryOffset(b, i, h);
        float* p = probs + s.ProbRow(b, h, i);
        float row_max = -INFINITY;
        for (int64_t j = 0; j < s.keys; ++j) {
          p[j] = mask_row[j] == -FLT_MAX ? -FLT_MAX : scale * Dot(qi, k + s.KeyOffset(b, j, g), s.dim) + mask_row[j];
          row_max = std::max(row_max, p[j]);
        }
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < s.keys; ++j) {
          p[j] = fused::Exp(p[j] - row_max);
          total += p[j];
        }
        const float inv_total = 1.0f / total;
        float* oi = out + s.QueryOffset(b, i, h);
        std::fill(oi, oi + s.dim, 0.0f);
        for (int64_t j = 0; j < s.keys; ++j) {
          p[j] *= inv_total;
          if (p[j] != 0.0f) Axpy(p[j], v + s.KeyOffset(b, j, g), s.dim, oi);
        }
      }
    }
  }
}

// With P the probabilities and dO the output's gradient: dP = dO v^T, dS = P (dP - rowsum(P dP)),
// dq = scale dS k, dk = scale dS^T q, dv = P^T dO (key/value heads summed over their query heads).
FUSED_CPU_CLONES void AttentionBackward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                        const float* probs, const float* grad_out, float scale, float* grad_q,
                                        float* grad_k, float* grad_v) {
  std::fill(grad_k, grad_k + s.batch * s.keys * s.kv_heads * s.dim, 0.0f);
  std::fill(grad_v, grad_v + s.batch * s.keys * s.kv_heads * s.dim, 0.0f);
  std::vector<float> grad_p(s.keys);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.queries; ++i) {
      for (int64_t h = 0; h < s.q_heads; ++h) {
        const int64_t g = h / s.group();
        const float* qi = q + s.QueryOffset(b, i, h);
        const float* goi = grad_out + s.QueryOffset(b, i, h);
        const float* p = probs + s.ProbRow(b, h, i);
        float weighted = 0.0f;  // rowsum(P dP)
        for (int64_t j = 0; j < s.keys; ++j) {
          grad_p[j] = p[j] != 0.0f ? Dot(goi, v + s.KeyOffset(b, j, g), s.dim) : 0.0f;
          weighted += p[j] * grad_p[j];
        }
        float* gqi = grad_q + s.QueryOffset(b, i, h);
        std::fill(gqi, gqi + s.dim, 0.0f);
        for (int64_t j = 0; j < s.keys; ++j) {
          if (p[j] == 0.0f) continue;
          const float grad_score = scale * p[j] * (grad_p[j] - weighted);
          const int64_t kj = s.KeyOffset(b, j, g);
          Axpy(grad_score, k + kj, s.dim, gqi);
          Axpy(grad_score, qi, s.dim, grad_k + kj);
          Axpy(p[j], goi, s.dim, grad_v + kj);
        }
      }
    }
  }
}

AttentionShape CheckAttentionInputs(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v) {
  for (const auto* t : {&q, &k, &v}) fused::CheckFloat32CPU(*t, "q, k and v");
  PD_CHECK(q.shape().size() == 4 && k.shape().size() == 4 && v.shape() == k.shape(),
           "q must be [batch, seq, heads, head_dim], k and v [batch, kv_seq, kv_heads, head_dim]");
  const AttentionShape s{q.shape()[0], q.shape()[1], k.shape()[1], q.shape()[2], k.shape()[2], q.shape()[3]};
  PD_CHECK(k.shape()[0] == s.batch && k.shape()[3] == s.dim, "q and k must agree in batch and head_dim");
  PD_CHECK(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, "kv heads (", s.kv_heads, ") must divide q heads (",
           s.q_heads, ")");
  return s;
}

std::vector<paddle::Tensor> Attention(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                      const paddle::Tensor& mask, float scale) {
  const AttentionShape s = CheckAttentionInputs(q, k, v);
  fused::CheckFloat32CPU(mask, "mask");
  PD_CHECK(mask.numel() == s.batch * s.queries * s.keys, "mask must be [batch, 1, seq, kv_seq]");
  auto out = paddle::empty({s.batch, s.queries, s.q_heads * s.dim}, q.dtype(), q.place());
  auto probs = paddle::empty({s.batch, s.q_heads, s.queries, s.keys}, q.dtype(), q.place());
  AttentionForward(s, q.data<float>(), k.data<float>(), v.data<float>(), mask.data<float>(), scale,
                   out.data<float>(), probs.data<float>());
  return {out, probs};
}

std::vector<paddle::Tensor> AttentionGrad(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                          const paddle::Tensor& probs, const paddle::Tensor& grad_out, float scale) {
  const AttentionShape s = CheckAttentionInputs(q, k, v);
  auto grad_q = paddle::empty(q.shape(), q.dtype(), q.place());
  auto grad_k = paddle::empty(k.shape(), k.dtype(), k.place());
  auto grad_v = paddle::empty(v.shape(), v.dtype(), v.place());
  AttentionBackward(s, q.data<float>(), k.data<float>(), v.data<float>(), probs.data<float>(),
                    grad_out.data<float>(), scale, grad_q.data<float>(), grad_k.data<float>(), grad_v.data<float>());
  return {grad_q, grad_k, grad_v};
}

using Shape = std::vector<int64_t>;

std::vector<Shape> AttentionShapes(const Shape& q, const Shape& k, const Shape&, const Shape&) {
  return {{q[0], q[1], q[2] * q[3]}, {q[0], q[2], q[1], k[1]}};
}

std::vector<paddle::DataType> AttentionDtypes(const paddle::DataType& q, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&) {
  return {q, q};
}

}  // namespace

PD_BUILD_OP(fused_attention)
    .Inputs({"q", "k", "v", "mask"})
    .Outputs({"out", "probs"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(Attention))
    .SetInferShapeFn(PD_INFER_SHAPE(AttentionShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttentionDtypes));

PD_BUILD_GRAD_OP(fused_attention)
    .Inputs({"q", "k", "v", "probs", paddle::Grad("out")})
    .Outputs({paddle::Grad("q"), paddle::Grad("k"), paddle::Grad("v")})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(AttentionGrad));
