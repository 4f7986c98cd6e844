// Fused core attention (package `paddlenlp_ops`): softmax(scale * q k^T + mask) v with its gradient, float32
// on CPU, in the layout of paddlenlp's Qwen2/Llama `scaled_dot_product_attention`: q [B, S, Hq, D], k and v
// [B, Sk, Hk, D] with Hk dividing Hq (grouped-query attention: query head h reads key/value head
// h / (Hq / Hk), as paddlenlp's repeat_kv lays the heads out, without repeating them in memory), mask [B, 1, S,
// Sk] additive (0 where attended, the dtype's lowest value where not: paddlenlp's causal + padding mask),
// out [B, S, Hq * D]. llm/paddle_alignment/models/fused_kernels.py puts the op into the attention layers.
//
// The probabilities are not kept for the backward: the forward keeps each query row's largest score and the
// inverse of its sum of exponentials ([B, Hq, S, 2]), from which the backward makes the probabilities again
// (as flash attention does), so what a layer keeps grows with S, not S^2. The products run in MKL's batched
// sgemm on its threads, a block of up to 128 queries of one head at a time, each against the keys up to the
// last one its rows may see (a causal mask's later keys are never multiplied).
//
// Where the mask holds the lowest float the score is that value whatever q.k is (adding a score of sane size
// to it rounds back to it); a row whose keys are all masked gets uniform probabilities over every key, as
// with Paddle's ops.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "common/cpu_clones.h"
#include "common/fused_math.h"
#include "common/mkl_gemm.h"
#include "common/op_checks.h"
#include "common/score_runs.h"
#include "paddle/extension.h"

namespace {

// Sizes of one call; the strides follow from the layouts above.
struct AttentionShape {
  int64_t batch, queries, keys, q_heads, kv_heads, dim;
  int64_t group() const { return q_heads / kv_heads; }
  int64_t q_stride() const { return q_heads * dim; }    // between one head's consecutive queries
  int64_t kv_stride() const { return kv_heads * dim; }  // between one kv head's consecutive keys
  int64_t QueryOffset(int64_t b, int64_t i, int64_t h) const { return ((b * queries + i) * q_heads + h) * dim; }
  int64_t KeyOffset(int64_t b, int64_t j, int64_t g) const { return ((b * keys + j) * kv_heads + g) * dim; }
  int64_t StatsRow(int64_t b, int64_t h, int64_t i) const { return ((b * q_heads + h) * queries + i) * 2; }
  int64_t MaskRow(int64_t b, int64_t i) const { return (b * queries + i) * keys; }
};

using attention::kQueryRows;

// Queries [first, first + rows) of batch row b and query head h, against keys [0, keys).
struct Block {
  int64_t b, h, first, rows, keys;
  int64_t floats() const { return rows * keys; }
};

// 1 + the last key that a query of [first, first + rows) of batch row b may see; every key when one of them
// sees none (its probabilities are uniform over all keys).
int64_t KeysSeen(const AttentionShape& s, const float* mask, int64_t b, int64_t first, int64_t rows) {
  int64_t keys = 0;
  for (int64_t i = first; i < first + rows; ++i) {
    const float* row = mask + s.MaskRow(b, i);
    int64_t seen = s.keys;
    while (seen > 0 && row[seen - 1] == -FLT_MAX) --seen;
    if (seen == 0) return s.keys;
    keys = std::max(keys, seen);
  }
  return keys;
}

// The blocks of the queries [first, first + kQueryRows), every batch row and head, in runs (attention::ScoreRuns).
std::vector<std::vector<Block>> BlockRuns(const AttentionShape& s, const float* mask, int64_t first) {
  const int64_t rows = std::min(kQueryRows, s.queries - first);
  std::vector<Block> blocks;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t keys = KeysSeen(s, mask, b, first, rows);
    for (int64_t h = 0; h < s.q_heads; ++h) blocks.push_back({b, h, first, rows, keys});
  }
  return attention::ScoreRuns(blocks);
}

// scores [rows, keys] = scale q k^T of each block of `run`, at offsets[i] of `buffer`.
void AddScores(const AttentionShape& s, const std::vector<Block>& run, const float* q, const float* k, float scale,
               float* buffer, const std::vector<int64_t>& offsets, mkl::GemmBatch& products) {
  for (size_t i = 0; i < run.size(); ++i) {
    const Block& x = run[i];
    products.Add(false, true, x.rows, x.keys, s.dim, scale, q + s.QueryOffset(x.b, x.first, x.h), s.q_stride(),
                 k + s.KeyOffset(x.b, 0, x.h / s.group()), s.kv_stride(), 0.0f, buffer + offsets[i], x.keys);
  }
}

std::vector<int64_t> Offsets(const std::vector<Block>& run) {
  std::vector<int64_t> offsets;
  int64_t next = 0;
  for (const Block& block : run) offsets.push_back(next), next += block.floats();
  return offsets;
}

// The masked scores of a row: the mask's lowest value where it holds it (whatever the score), else score + mask.
FUSED_CPU_CLONES void MaskScores(float* row, const float* mask_row, int64_t keys) {
#pragma omp simd
  for (int64_t j = 0; j < keys; ++j) row[j] = mask_row[j] == -FLT_MAX ? -FLT_MAX : row[j] + mask_row[j];
}

// exp(row - top) * inverse in place: the probabilities from the row's statistics.
FUSED_CPU_CLONES void Probabilities(float* row, int64_t keys, float top, float inverse) {
#pragma omp simd
  for (int64_t j = 0; j < keys; ++j) row[j] = fused::Exp(row[j] - top) * inverse;
}

// A masked score row -> its probabilities in place; returns (top, 1 / sum of exponentials).
FUSED_CPU_CLONES void Softmax(float* row, int64_t keys, float* stats) {
  const float top = fused::RowMax(row, keys);
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < keys; ++j) {
    row[j] = fused::Exp(row[j] - top);
    total += row[j];
  }
  stats[0] = top, stats[1] = 1.0f / total;
#pragma omp simd
  for (int64_t j = 0; j < keys; ++j) row[j] *= stats[1];
}

// grad_p <- scale * P (dP - rowsum(P dP)) in place: the scores' gradient.
FUSED_CPU_CLONES void ScoreGradient(const float* p, float* grad_p, int64_t keys, float scale) {
  float weighted = 0.0f;
#pragma omp simd reduction(+ : weighted)
  for (int64_t j = 0; j < keys; ++j) weighted += p[j] * grad_p[j];
#pragma omp simd
  for (int64_t j = 0; j < keys; ++j) grad_p[j] = scale * p[j] * (grad_p[j] - weighted);
}

void AttentionForward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* mask,
                      float scale, float* out, float* stats) {
  std::vector<float> scores;
  mkl::GemmBatch products;
  for (int64_t first = 0; first < s.queries; first += kQueryRows) {
    for (const std::vector<Block>& run : BlockRuns(s, mask, first)) {
      const std::vector<int64_t> offsets = Offsets(run);
      scores.resize(std::max<size_t>(scores.size(), offsets.back() + run.back().floats()));
      AddScores(s, run, q, k, scale, scores.data(), offsets, products);
      products.Run();
      for (size_t i = 0; i < run.size(); ++i) {
        const Block& x = run[i];
        for (int64_t r = 0; r < x.rows; ++r) {
          float* row = scores.data() + offsets[i] + r * x.keys;
          MaskScores(row, mask + s.MaskRow(x.b, x.first + r), x.keys);
          Softmax(row, x.keys, stats + s.StatsRow(x.b, x.h, x.first + r));
        }
        products.Add(false, false, x.rows, s.dim, x.keys, 1.0f, scores.data() + offsets[i], x.keys,
                     v + s.KeyOffset(x.b, 0, x.h / s.group()), s.kv_stride(), 0.0f,
                     out + s.QueryOffset(x.b, x.first, x.h), s.q_stride());
      }
      products.Run();
    }
  }
}

// With P the probabilities (made again from the forward's statistics) and dO the output's gradient:
// dP = dO v^T, dS = scale P (dP - rowsum(P dP)), dq = dS k, dk = dS^T q, dv = P^T dO. The key/value
// gradients of each query head gather in a buffer of their own ([B, Hq, Sk, D]: products of one batched
// call must not write the same memory), summed over the heads of each kv head at the end.
void AttentionBackward(const AttentionShape& s, const float* q, const float* k, const float* v, const float* mask,
                       const float* stats, const float* grad_out, float scale, float* grad_q, float* grad_k,
                       float* grad_v) {
  const int64_t head_floats = s.keys * s.dim;
  std::vector<float> head_grad_k(s.batch * s.q_heads * head_floats, 0.0f), head_grad_v(head_grad_k.size(), 0.0f);
  std::vector<float> probs, grad_scores;
  mkl::GemmBatch products;
  for (int64_t first = 0; first < s.queries; first += kQueryRows) {
    for (const std::vector<Block>& run : BlockRuns(s, mask, first)) {
      const std::vector<int64_t> offsets = Offsets(run);
      const size_t floats = offsets.back() + run.back().floats();
      probs.resize(std::max(probs.size(), floats)), grad_scores.resize(std::max(grad_scores.size(), floats));
      AddScores(s, run, q, k, scale, probs.data(), offsets, products);
      for (size_t i = 0; i < run.size(); ++i) {
        const Block& x = run[i];
        products.Add(false, true, x.rows, x.keys, s.dim, 1.0f, grad_out + s.QueryOffset(x.b, x.first, x.h),
                     s.q_stride(), v + s.KeyOffset(x.b, 0, x.h / s.group()), s.kv_stride(), 0.0f,
                     grad_scores.data() + offsets[i], x.keys);
      }
      products.Run();
      for (size_t i = 0; i < run.size(); ++i) {
        const Block& x = run[i];
        const int64_t g = x.h / s.group();
        float* p = probs.data() + offsets[i];
        float* ds = grad_scores.data() + offsets[i];
        for (int64_t r = 0; r < x.rows; ++r) {
          const float* row_stats = stats + s.StatsRow(x.b, x.h, x.first + r);
          MaskScores(p + r * x.keys, mask + s.MaskRow(x.b, x.first + r), x.keys);
          Probabilities(p + r * x.keys, x.keys, row_stats[0], row_stats[1]);
          ScoreGradient(p + r * x.keys, ds + r * x.keys, x.keys, scale);
        }
        float* head_k = head_grad_k.data() + (x.b * s.q_heads + x.h) * head_floats;
        float* head_v = head_grad_v.data() + (x.b * s.q_heads + x.h) * head_floats;
        products.Add(false, false, x.rows, s.dim, x.keys, 1.0f, ds, x.keys, k + s.KeyOffset(x.b, 0, g), s.kv_stride(),
                     0.0f, grad_q + s.QueryOffset(x.b, x.first, x.h), s.q_stride());
        products.Add(true, false, x.keys, s.dim, x.rows, 1.0f, ds, x.keys, q + s.QueryOffset(x.b, x.first, x.h),
                     s.q_stride(), 1.0f, head_k, s.dim);
        products.Add(true, false, x.keys, s.dim, x.rows, 1.0f, p, x.keys, grad_out + s.QueryOffset(x.b, x.first, x.h),
                     s.q_stride(), 1.0f, head_v, s.dim);
      }
      products.Run();
    }
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t j = 0; j < s.keys; ++j) {
      for (int64_t g = 0; g < s.kv_heads; ++g) {
        float* gk = grad_k + s.KeyOffset(b, j, g);
        float* gv = grad_v + s.KeyOffset(b, j, g);
        std::fill(gk, gk + s.dim, 0.0f), std::fill(gv, gv + s.dim, 0.0f);
        for (int64_t h = g * s.group(); h < (g + 1) * s.group(); ++h) {
          const int64_t at = (b * s.q_heads + h) * head_floats + j * s.dim;
          for (int64_t d = 0; d < s.dim; ++d) gk[d] += head_grad_k[at + d], gv[d] += head_grad_v[at + d];
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
  auto stats = paddle::empty({s.batch, s.q_heads, s.queries, 2}, q.dtype(), q.place());
  AttentionForward(s, q.data<float>(), k.data<float>(), v.data<float>(), mask.data<float>(), scale,
                   out.data<float>(), stats.data<float>());
  return {out, stats};
}

std::vector<paddle::Tensor> AttentionGrad(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                          const paddle::Tensor& mask, const paddle::Tensor& stats,
                                          const paddle::Tensor& grad_out, float scale) {
  const AttentionShape s = CheckAttentionInputs(q, k, v);
  auto grad_q = paddle::empty(q.shape(), q.dtype(), q.place());
  auto grad_k = paddle::empty(k.shape(), k.dtype(), k.place());
  auto grad_v = paddle::empty(v.shape(), v.dtype(), v.place());
  AttentionBackward(s, q.data<float>(), k.data<float>(), v.data<float>(), mask.data<float>(), stats.data<float>(),
                    grad_out.data<float>(), scale, grad_q.data<float>(), grad_k.data<float>(), grad_v.data<float>());
  return {grad_q, grad_k, grad_v};
}

using Shape = std::vector<int64_t>;

std::vector<Shape> AttentionShapes(const Shape& q, const Shape&, const Shape&, const Shape&) {
  return {{q[0], q[1], q[2] * q[3]}, {q[0], q[2], q[1], 2}};
}

std::vector<paddle::DataType> AttentionDtypes(const paddle::DataType& q, const paddle::DataType&,
                                              const paddle::DataType&, const paddle::DataType&) {
  return {q, q};
}

}  // namespace

PD_BUILD_OP(fused_attention)
    .Inputs({"q", "k", "v", "mask"})
    .Outputs({"out", "softmax_stats"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(Attention))
    .SetInferShapeFn(PD_INFER_SHAPE(AttentionShapes))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttentionDtypes));

PD_BUILD_GRAD_OP(fused_attention)
    .Inputs({"q", "k", "v", "mask", "softmax_stats", paddle::Grad("out")})
    .Outputs({paddle::Grad("q"), paddle::Grad("k"), paddle::Grad("v")})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(AttentionGrad));
