// A no-gradient forward of a whole paddlenlp Qwen2/Llama decoder in one op call (package `paddlenlp_ops`),
// float32 on CPU, for the passes that need no autograd: the rollout's decode loop and the reference/old
// log-probs. Eager Paddle spends most of those passes dispatching hundreds of small ops; here the matrix
// products, attention's included, go to MKL's sgemm (Paddle's own libmklml_intel, so MKL's threads and its
// AVX2 setting apply) and the rest (RMSNorm, rotary, softmax, SwiGLU) runs in plain vectorised loops on one
// thread.
// llm/paddle_alignment/models/native_forward.py lists the model's own weight tensors and calls it (no copies:
// q, k and v, and gate and up, are separate products writing their columns of one output); csrc/README.md
// documents it.
//
// native_decoder_forward(input_ids [B, S], position_ids [B, S], key_valid [B, T], cache [L, 2, B, KV, T, D],
//                        cos [.., D], sin [.., D], weights)
//   -> logits [B, logits_end - logits_start, V] of positions [logits_start, logits_end) of this call; with
//      apply_lm_head false, their final-normed hidden states [B, logits_end - logits_start, H] instead.
// The S new tokens sit at cache positions [start, start + S); their keys and values are written there, and
// each attends to the cache positions up to its own (causal) whose key_valid is non-zero (padding masked).
// A query with no visible key (a left-padding position) gets a zero attention output; nothing else reads
// it, since its key is masked for every query. Heads h = kv * (heads / kv_heads) + g share kv head kv, as
// paddlenlp's repeat_kv arranges them, without materialising the repeated heads.
// weights, per layer: input_norm [H], q [H, heads D], k [H, kv_heads D], v [H, kv_heads D], (q_bias, k_bias,
// v_bias of those widths when has_qkv_bias), o [heads D, H], post_norm [H], gate [H, I], up [H, I], down [I, H]
// (a fused gate_up [H, 2 I], gate columns first, passes as gate with an empty up); then embedding [V, H],
// final_norm [H], lm_head ([H, V], or [V, H] with transpose_lm_head: tied).
//
// native_packed_products(weights) -> packed [P], float32: the weights of a decode step's large products in a packed
// form (common/session_products.h: panels on AVX-512 CPUs, else MKL's), for a session's steps to read (passed after
// the weights); see AttachPacked.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/cpu_clones.h"
#include "common/fused_math.h"
#include "common/mkl_gemm.h"
#include "common/session_products.h"
#include "common/op_checks.h"
#include "common/score_runs.h"
#include "common/rms_norm.h"
#include "paddle/extension.h"

namespace {

// ---- elementwise work ------------------------------------------------------------------------------

// In place, paddlenlp's rotate_half convention: x * cos + [-x2, x1] * sin (x1, x2 the halves of a head).
FUSED_CPU_CLONES void RotateHead(float* x, const float* c, const float* s, int64_t dim) {
  const int64_t half = dim / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i + half] + x1 * s[i + half];
  }
}

// gate_up rows [gate (I) | up (I)] -> silu(gate) * up rows [I].
FUSED_CPU_CLONES void SwigluRows(const float* gate_up, int64_t rows, int64_t inner, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * inner;
    const float* up = gate + inner;
    float* o = out + r * inner;
#pragma omp simd
    for (int64_t j = 0; j < inner; ++j) o[j] = fused::Swiglu(gate[j], up[j]);
  }
}

// softmax(scores) over the keys that are visible, in place; keys not visible get 0, and so do all when none is.
FUSED_CPU_CLONES void SoftmaxVisible(float* scores, const unsigned char* visible, int64_t keys) {
  float top = -INFINITY;
#pragma omp simd reduction(max : top)  // (a comparison, which GCC vectorises, as in fused::RowMax)
  for (int64_t j = 0; j < keys; ++j) top = visible[j] && scores[j] > top ? scores[j] : top;
  if (top == -INFINITY) {
    std::fill(scores, scores + keys, 0.0f);
    return;
  }
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < keys; ++j) {
    const float e = fused::Exp(scores[j] - top);
    scores[j] = visible[j] ? e : 0.0f;
    total += scores[j];
  }
  const float inverse = 1.0f / total;
#pragma omp simd
  for (int64_t j = 0; j < keys; ++j) scores[j] *= inverse;
}

// ---- the decoder -----------------------------------------------------------------------------------

struct Dims {
  int64_t batch, seq, hidden, heads, kv_heads, head_dim, inner, vocab, layers, cache_len;
  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
  int64_t tokens() const { return batch * seq; }
};

// A product's b in a decode session's packed form (session_products), or none (null data).
struct PackedB {
  const float* data = nullptr;
  session_products::Form form = session_products::Form::kMkl;
};

struct Layer {
  const float *input_norm, *q, *k, *v, *q_bias, *k_bias, *v_bias, *o, *post_norm, *gate, *up, *down;
  int64_t gate_up_ld;  // floats between rows of gate and of up: I, or 2 I in a fused gate_up
  // Their packed forms (native_packed_products) where a decode session made them, else none.
  PackedB packed_q, packed_o, packed_gate, packed_up, packed_down;
};

// Whether a product of m rows reads its b's packed form: where the session made one (`packed`) and the product has
// few rows (more gain nothing from it).
bool ReadsPacked(const PackedB& packed, int64_t m) { return packed.data != nullptr && m <= mkl::kSlicedMaxRows; }

// c = a [m, k] @ b + beta * c (b [k, n], rows `ldb` floats apart): from b's packed form where it ReadsPacked, else
// added to `plain`, which runs it with the others it holds.
void Product(mkl::ColumnProducts& plain, const PackedB& packed, const float* a, const float* b, int64_t ldb, float* c,
             int64_t ldc, int64_t m, int64_t n, int64_t k, float beta) {
  if (ReadsPacked(packed, m)) {
    session_products::MatMul(packed.form, a, packed.data, c, ldc, m, n, k, beta);
  } else {
    plain.Add(a, b, ldb, c, ldc, n, k, beta);
  }
}

// c [m, n] = a [m, k] @ b [k, n] + beta * c, contiguous, from b's packed form where there is one (Product).
void MatMul(const PackedB& packed, const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, float beta) {
  mkl::ColumnProducts product(m);
  Product(product, packed, a, b, n, c, n, m, n, k, beta);
  product.Run();
}

struct Cache {
  float* data;
  const Dims& d;
  // Keys (which = 0) or values (1) of layer l, batch row b, kv head h: [cache_len, head_dim].
  float* at(int64_t l, int which, int64_t b, int64_t h) const {
    return data + ((((l * 2 + which) * d.batch + b) * d.kv_heads + h) * d.cache_len) * d.head_dim;
  }
};

// q/k/v of the new tokens from the normed hidden states; k rotated and written with v into the cache, q
// rotated in place in `qkv`.
void ProjectQkv(const Layer& w, const Dims& d, const Cache& cache, int64_t l, int64_t start, const float* normed,
                const int64_t* positions, const float* cos, const float* sin, float* qkv) {
  const int64_t width = d.qkv_width(), n = d.tokens(), dim = d.head_dim;
  const int64_t q = d.q_width(), kv = d.kv_width();
  const bool bias = w.q_bias != nullptr;
  if (bias) {
    for (int64_t r = 0; r < n; ++r) {
      float* row = qkv + r * width;
      std::copy(w.q_bias, w.q_bias + q, row);
      std::copy(w.k_bias, w.k_bias + kv, row + q);
      std::copy(w.v_bias, w.v_bias + kv, row + q + kv);
    }
  }
  const float beta = bias ? 1.0f : 0.0f;
  mkl::ColumnProducts projections(n);
  Product(projections, w.packed_q, normed, w.q, q, qkv, width, n, q, d.hidden, beta);
  projections.Add(normed, w.k, kv, qkv + q, width, kv, d.hidden, beta);
  projections.Add(normed, w.v, kv, qkv + q + kv, width, kv, d.hidden, beta);
  projections.Run();
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t s = 0; s < d.seq; ++s) {
      float* row = qkv + (b * d.seq + s) * width;
      const int64_t p = positions[b * d.seq + s];
      const float *c = cos + p * dim, *sn = sin + p * dim;
      for (int64_t h = 0; h < d.heads; ++h) RotateHead(row + h * dim, c, sn, dim);
      for (int64_t h = 0; h < d.kv_heads; ++h) {
        float* key = row + d.q_width() + h * dim;
        RotateHead(key, c, sn, dim);
        std::copy(key, key + dim, cache.at(l, 0, b, h) + (start + s) * dim);
        const float* value = row + d.q_width() + d.kv_width() + h * dim;
        std::copy(value, value + dim, cache.at(l, 1, b, h) + (start + s) * dim);
      }
    }
  }
}

// One pair of attention products: `rows` queries of one batch row (row r at q + r * ldq) against its first
// `keys` cache positions; row r sees the visible keys up to position first_position + r * row_step (causal).
struct AttentionBlock {
  const float* q;
  int64_t ldq, rows, keys, first_position, row_step;
  const float *key, *value;
  const unsigned char* visible;
  float* out;
  int64_t ldo;
  int64_t floats() const { return rows * keys; }
};

using attention::kQueryRows;

// The blocks of the new tokens: one token (decode) groups the heads that share a kv head into one block's
// rows; several (prefill) give each head blocks of kQueryRows consecutive tokens.
std::vector<AttentionBlock> AttentionBlocks(const Dims& d, const Cache& cache, int64_t l, int64_t start,
                                            const float* qkv, const unsigned char* visible, float* out) {
  const int64_t dim = d.head_dim, groups = d.heads / d.kv_heads, width = d.qkv_width();
  std::vector<AttentionBlock> blocks;
  if (d.seq == 1) {
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t kv = 0; kv < d.kv_heads; ++kv) {
        blocks.push_back({qkv + b * width + kv * groups * dim, dim, groups, start + 1, start, 0,
                          cache.at(l, 0, b, kv), cache.at(l, 1, b, kv), visible + b * d.cache_len,
                          out + b * d.q_width() + kv * groups * dim, dim});
      }
    }
    return blocks;
  }
  for (int64_t s = 0; s < d.seq; s += kQueryRows) {  // outermost, so that blocks of one shape are adjacent
    const int64_t rows = std::min(kQueryRows, d.seq - s);
    for (int64_t b = 0; b < d.batch; ++b) {
      for (int64_t h = 0; h < d.heads; ++h) {
        blocks.push_back({qkv + (b * d.seq + s) * width + h * dim, width, rows, start + s + rows, start + s, 1,
                          cache.at(l, 0, b, h / groups), cache.at(l, 1, b, h / groups), visible + b * d.cache_len,
                          out + (b * d.seq + s) * d.q_width() + h * dim, d.q_width()});
      }
    }
  }
  return blocks;
}

// The blocks of a run: scores = q k^T / sqrt(D) in one batched call, softmax over each row's visible causal
// keys, out = scores v in a second.
void RunAttentionBlocks(const std::vector<AttentionBlock>& run, int64_t dim, float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  mkl::GemmBatch products;
  std::vector<float*> block_scores;
  int64_t offset = 0;
  for (const AttentionBlock& block : run) {
    block_scores.push_back(scores + offset);
    offset += block.floats();
    products.Add(false, true, block.rows, block.keys, dim, scale, block.q, block.ldq, block.key, dim, 0.0f,
                 block_scores.back(), block.keys);
  }
  products.Run();
  for (size_t i = 0; i < run.size(); ++i) {
    const AttentionBlock& block = run[i];
    float* block_rows = block_scores[i];
    for (int64_t r = 0; r < block.rows; ++r) {
      float* row = block_rows + r * block.keys;
      const int64_t seen = std::min(block.keys, block.first_position + r * block.row_step + 1);
      SoftmaxVisible(row, block.visible, seen);
      std::fill(row + seen, row + block.keys, 0.0f);
    }
    products.Add(false, false, block.rows, dim, block.keys, 1.0f, block_rows, block.keys, block.value, dim, 0.0f,
                 block.out, block.ldo);
  }
  products.Run();
}

// out [tokens, heads * D]: each new token's heads attending to the visible cache positions up to its own,
// the blocks in runs (attention::ScoreRuns).
void Attend(const Dims& d, const Cache& cache, int64_t l, int64_t start, const float* qkv,
            const unsigned char* visible, float* out, std::vector<float>& scores) {
  for (const auto& run : attention::ScoreRuns(AttentionBlocks(d, cache, l, start, qkv, visible, out))) {
    int64_t floats = 0;
    for (const AttentionBlock& block : run) floats += block.floats();
    scores.resize(std::max<size_t>(scores.size(), floats));
    RunAttentionBlocks(run, d.head_dim, scores.data());
  }
}

// ---- the op ----------------------------------------------------------------------------------------

void CheckFloat32CPU(const paddle::Tensor& t, const char* name) {
  fused::CheckFloat32CPU(t, name);
  PD_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void CheckInt64CPU(const paddle::Tensor& t, const char* name) {
  PD_CHECK(t.is_cpu() && t.dtype() == paddle::DataType::INT64 && t.is_contiguous(), name,
           " must be a contiguous int64 CPU tensor");
}

const float* Weight(const paddle::Tensor& t, std::vector<int64_t> shape, const char* name) {
  CheckFloat32CPU(t, name);
  PD_CHECK(t.shape() == shape, name, " has the wrong shape");
  return t.data<float>();
}

// The LM head: [H, V], or the tied embedding [V, H] with transpose_lm_head.
const float* LmHead(const paddle::Tensor& t, const Dims& d, bool transpose_lm_head) {
  return Weight(t, transpose_lm_head ? std::vector<int64_t>{d.vocab, d.hidden} : std::vector<int64_t>{d.hidden, d.vocab},
                "lm_head");
}

std::vector<Layer> CheckLayers(const std::vector<paddle::Tensor>& weights, const Dims& d, bool has_qkv_bias) {
  std::vector<Layer> layers;
  for (int64_t l = 0, i = 0; l < d.layers; ++l) {
    Layer w;
    w.input_norm = Weight(weights[i++], {d.hidden}, "input_norm");
    w.q = Weight(weights[i++], {d.hidden, d.q_width()}, "q");
    w.k = Weight(weights[i++], {d.hidden, d.kv_width()}, "k");
    w.v = Weight(weights[i++], {d.hidden, d.kv_width()}, "v");
    w.q_bias = has_qkv_bias ? Weight(weights[i++], {d.q_width()}, "q_bias") : nullptr;
    w.k_bias = has_qkv_bias ? Weight(weights[i++], {d.kv_width()}, "k_bias") : nullptr;
    w.v_bias = has_qkv_bias ? Weight(weights[i++], {d.kv_width()}, "v_bias") : nullptr;
    w.o = Weight(weights[i++], {d.q_width(), d.hidden}, "o");
    w.post_norm = Weight(weights[i++], {d.hidden}, "post_norm");
    const paddle::Tensor &gate = weights[i++], &up = weights[i++];
    if (up.numel() == 0) {  // a fused gate_up
      w.gate = Weight(gate, {d.hidden, 2 * d.inner}, "gate_up");
      w.up = w.gate + d.inner;
      w.gate_up_ld = 2 * d.inner;
    } else {
      w.gate = Weight(gate, {d.hidden, d.inner}, "gate");
      w.up = Weight(up, {d.hidden, d.inner}, "up");
      w.gate_up_ld = d.inner;
    }
    w.down = Weight(weights[i++], {d.inner, d.hidden}, "down");
    layers.push_back(w);
  }
  return layers;
}

// ---- packed products for decode sessions -------------------------------------------------------------

// A decode session's products of the layers' q, o, gate, up and down and of the LM head can read their b in a packed
// form (session_products), made once per session by native_packed_products into one buffer (k and v, [H, 128]
// at Qwen2.5-0.5B's shape, gain little and would take 20 times their size in MKL's form). The buffer's first line
// records the form; the products follow.
constexpr int64_t kPackedHeader = 16;

// Floats a packed b [k, n] takes in the buffer: whole 64-byte lines, so that each starts as aligned as the buffer.
int64_t PackedSpan(session_products::Form form, int64_t n, int64_t k) {
  return (session_products::Floats(form, n, k) + 15) / 16 * 16;
}

int64_t PackedBufferFloats(const Dims& d, session_products::Form form) {
  const int64_t layer = PackedSpan(form, d.q_width(), d.hidden) + PackedSpan(form, d.hidden, d.q_width()) +
                        2 * PackedSpan(form, d.inner, d.hidden) + PackedSpan(form, d.hidden, d.inner);
  return kPackedHeader + d.layers * layer + PackedSpan(form, d.vocab, d.hidden);
}

// The form a packed buffer records (PackedProducts), checked.
session_products::Form PackedForm(const paddle::Tensor& buffer) {
  PD_CHECK(buffer.is_cpu() && buffer.dtype() == paddle::DataType::FLOAT32 && buffer.numel() >= kPackedHeader,
           "packed products must be a float32 CPU buffer made by native_packed_products");
  const float tag = buffer.data<float>()[0];
  PD_CHECK(tag == static_cast<float>(session_products::Form::kMkl) ||
               tag == static_cast<float>(session_products::Form::kPanels),
           "packed products do not start with the form native_packed_products records");
  return static_cast<session_products::Form>(static_cast<int>(tag));
}

// Points `layers` at their packed products in `buffer` [PackedBufferFloats(d, form)], in the order
// native_packed_products writes them (it lays them out with this function); returns the LM head's.
PackedB AttachPacked(const float* buffer, session_products::Form form, const Dims& d, std::vector<Layer>& layers) {
  buffer += kPackedHeader;
  auto next = [&](int64_t n, int64_t k) {
    const PackedB packed{buffer, form};
    buffer += PackedSpan(form, n, k);
    return packed;
  };
  for (Layer& w : layers) {
    w.packed_q = next(d.q_width(), d.hidden);
    w.packed_o = next(d.hidden, d.q_width());
    w.packed_gate = next(d.inner, d.hidden);
    w.packed_up = next(d.inner, d.hidden);
    w.packed_down = next(d.hidden, d.inner);
  }
  return PackedB{buffer, form};
}

// The model's tensors come first in the forward's weights; a session's packed buffer after them is 1-D, where the
// last model tensor, the LM head, is 2-D.
int64_t ModelWeightCount(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t count = static_cast<int64_t>(shapes.size());
  while (count > 0 && shapes[count - 1].size() == 1) --count;
  return count;
}

// The dimensions the products need, read from the shapes of the model's weights (heads of width 1: only q's and k's
// widths matter).
Dims ProductDims(const std::vector<std::vector<int64_t>>& shapes, bool has_qkv_bias) {
  const int64_t per_layer = has_qkv_bias ? 12 : 9, count = static_cast<int64_t>(shapes.size());
  PD_CHECK(count > 3 && (count - 3) % per_layer == 0, "weights must hold ", per_layer, " tensors per layer and 3 more");
  const auto &q = shapes[1], &k = shapes[2], &down = shapes[per_layer - 1], &embedding = shapes[count - 3];
  PD_CHECK(q.size() == 2 && k.size() == 2 && down.size() == 2 && embedding.size() == 2,
           "q, k, down and the embedding must be 2-D");
  return Dims{0, 0, embedding[1], q[1], k[1], 1, down[0], embedding[0], (count - 3) / per_layer, 0};
}

// native_packed_products(weights) -> [PackedBufferFloats]: the packed b of each product a decode step runs on the
// model's `weights` (the forward's), laid out by AttachPacked.
std::vector<paddle::Tensor> PackedProducts(const std::vector<paddle::Tensor>& weights, bool has_qkv_bias,
                                           bool transpose_lm_head) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& w : weights) shapes.push_back(w.shape());
  const Dims d = ProductDims(shapes, has_qkv_bias);
  std::vector<Layer> layers = CheckLayers(weights, d, has_qkv_bias);
  const float* lm_head = LmHead(weights.back(), d, transpose_lm_head);
  const session_products::Form form = session_products::Chosen();
  auto buffer = paddle::empty({PackedBufferFloats(d, form)}, paddle::DataType::FLOAT32, weights.back().place());
  std::fill_n(buffer.data<float>(), kPackedHeader, static_cast<float>(form));
  const PackedB packed_head = AttachPacked(buffer.data<float>(), form, d, layers);
  auto pack = [form](const float* b, int64_t ldb, int64_t n, int64_t k, bool transpose_b, const PackedB& packed) {
    session_products::Pack(form, b, ldb, n, k, transpose_b, const_cast<float*>(packed.data));
  };
  for (const Layer& w : layers) {
    pack(w.q, d.q_width(), d.q_width(), d.hidden, false, w.packed_q);
    pack(w.o, d.hidden, d.hidden, d.q_width(), false, w.packed_o);
    pack(w.gate, w.gate_up_ld, d.inner, d.hidden, false, w.packed_gate);
    pack(w.up, w.gate_up_ld, d.inner, d.hidden, false, w.packed_up);
    pack(w.down, d.hidden, d.hidden, d.inner, false, w.packed_down);
  }
  pack(lm_head, transpose_lm_head ? d.hidden : d.vocab, d.vocab, d.hidden, transpose_lm_head, packed_head);
  return {buffer};
}

std::vector<std::vector<int64_t>> PackedProductsShape(const std::vector<std::vector<int64_t>>& weights, bool has_qkv_bias,
                                                      bool) {
  return {{PackedBufferFloats(ProductDims(weights, has_qkv_bias), session_products::Chosen())}};
}

std::vector<paddle::DataType> PackedProductsDtype(const std::vector<paddle::DataType>&) { return {paddle::DataType::FLOAT32}; }

std::vector<paddle::Tensor> DecoderForward(const paddle::Tensor& input_ids, const paddle::Tensor& position_ids,
                                           const paddle::Tensor& key_valid, const paddle::Tensor& cache_tensor,
                                           const paddle::Tensor& cos, const paddle::Tensor& sin,
                                           const std::vector<paddle::Tensor>& weights, int start, float epsilon,
                                           bool has_qkv_bias, bool transpose_lm_head, int logits_start,
                                           int logits_end, bool apply_lm_head) {
  CheckInt64CPU(input_ids, "input_ids");
  CheckInt64CPU(position_ids, "position_ids");
  CheckInt64CPU(key_valid, "key_valid");
  CheckFloat32CPU(cache_tensor, "cache");
  CheckFloat32CPU(cos, "cos");
  CheckFloat32CPU(sin, "sin");
  const auto& cs = cache_tensor.shape();
  PD_CHECK(input_ids.shape().size() == 2 && position_ids.shape() == input_ids.shape(),
           "input_ids and position_ids must be [batch, seq]");
  PD_CHECK(cs.size() == 6 && cs[1] == 2 && cs[2] == input_ids.shape()[0], "cache must be [layers, 2, batch, kv_heads, len, head_dim]");
  const int64_t per_layer = has_qkv_bias ? 12 : 9, count = cs[0] * per_layer + 3;
  const int64_t given = static_cast<int64_t>(weights.size());
  PD_CHECK(given == count || given == count + 1, "weights must hold ", per_layer,
           " tensors per layer and 3 more, then optionally a session's packed products");
  const std::vector<paddle::Tensor> model_weights(weights.begin(), weights.begin() + count);
  const auto& embedding = weights[count - 3];
  PD_CHECK(embedding.shape().size() == 2, "embedding must be [vocab, hidden]");
  const auto& q0 = weights[1];
  const auto& down0 = weights[per_layer - 1];
  PD_CHECK(down0.shape().size() == 2, "down must be [inner, hidden]");
  Dims d{input_ids.shape()[0], input_ids.shape()[1], embedding.shape()[1], 0, cs[3], cs[5],
         down0.shape()[0], embedding.shape()[0], cs[0], cs[4]};
  PD_CHECK(q0.shape().size() == 2 && q0.shape()[1] % d.head_dim == 0, "q must be [hidden, heads head_dim]");
  d.heads = q0.shape()[1] / d.head_dim;
  PD_CHECK(d.heads > 0 && d.heads % d.kv_heads == 0, "heads must be a multiple of kv_heads");
  PD_CHECK(d.head_dim % 2 == 0, "head_dim must be even");
  PD_CHECK(start >= 0 && start + d.seq <= d.cache_len, "tokens at [", start, ", ", start + d.seq,
           ") do not fit the cache of ", d.cache_len);
  PD_CHECK(key_valid.shape() == std::vector<int64_t>({d.batch, d.cache_len}), "key_valid must be [batch, cache len]");
  PD_CHECK(0 <= logits_start && logits_start <= logits_end && logits_end <= d.seq, "logits positions out of range");
  PD_CHECK(cos.shape() == sin.shape() && cos.shape().back() == d.head_dim, "cos and sin must be [.., head_dim] tables");
  const int64_t table_rows = cos.numel() / d.head_dim;
  std::vector<Layer> layers = CheckLayers(model_weights, d, has_qkv_bias);
  const float* embed = Weight(embedding, {d.vocab, d.hidden}, "embedding");
  const float* final_norm = Weight(weights[count - 2], {d.hidden}, "final_norm");
  const float* lm_head = LmHead(weights[count - 1], d, transpose_lm_head);
  PackedB packed_head;
  if (given > count) {
    const session_products::Form form = PackedForm(weights[count]);
    packed_head = AttachPacked(Weight(weights[count], {PackedBufferFloats(d, form)}, "packed products"), form, d, layers);
  }

  const int64_t n = d.tokens();
  const int64_t* ids = input_ids.data<int64_t>();
  const int64_t* positions = position_ids.data<int64_t>();
  for (int64_t t = 0; t < n; ++t) {
    PD_CHECK(ids[t] >= 0 && ids[t] < d.vocab, "token id ", ids[t], " is outside the vocabulary of ", d.vocab);
    PD_CHECK(positions[t] >= 0 && positions[t] < table_rows, "position ", positions[t],
             " is outside the cos/sin table of ", table_rows, " rows");
  }
  std::vector<float> hidden(n * d.hidden), normed(n * d.hidden), qkv(n * d.qkv_width()), attn(n * d.q_width());
  std::vector<float> gate_up(n * 2 * d.inner), act(n * d.inner);
  std::vector<float> scores;
  std::vector<unsigned char> visible(d.batch * d.cache_len);
  const int64_t* valid = key_valid.data<int64_t>();
  for (int64_t i = 0; i < d.batch * d.cache_len; ++i) visible[i] = valid[i] != 0;
  for (int64_t t = 0; t < n; ++t) std::copy(embed + ids[t] * d.hidden, embed + (ids[t] + 1) * d.hidden, &hidden[t * d.hidden]);
  const Cache cache{const_cast<float*>(cache_tensor.data<float>()), d};
  for (int64_t l = 0; l < d.layers; ++l) {
    const Layer& w = layers[l];
    fused::RmsNormRows(hidden.data(), nullptr, w.input_norm, epsilon, n, d.hidden, normed.data(), nullptr,
                       nullptr);
    ProjectQkv(w, d, cache, l, start, normed.data(), positions, cos.data<float>(), sin.data<float>(), qkv.data());
    Attend(d, cache, l, start, qkv.data(), visible.data(), attn.data(), scores);
    MatMul(w.packed_o, attn.data(), w.o, hidden.data(), n, d.hidden, d.q_width(), 1.0f);  // the residual add: beta 1
    fused::RmsNormRows(hidden.data(), nullptr, w.post_norm, epsilon, n, d.hidden, normed.data(), nullptr,
                       nullptr);
    mkl::ColumnProducts gate_and_up(n);
    Product(gate_and_up, w.packed_gate, normed.data(), w.gate, w.gate_up_ld, gate_up.data(), 2 * d.inner, n, d.inner,
            d.hidden, 0.0f);
    Product(gate_and_up, w.packed_up, normed.data(), w.up, w.gate_up_ld, gate_up.data() + d.inner, 2 * d.inner, n,
            d.inner, d.hidden, 0.0f);
    gate_and_up.Run();
    SwigluRows(gate_up.data(), n, d.inner, act.data());
    MatMul(w.packed_down, act.data(), w.down, hidden.data(), n, d.hidden, d.inner, 1.0f);
  }
  // The final norm and the LM head, only on the positions whose logits are asked for.
  const int64_t kept = logits_end - logits_start, rows = d.batch * kept;
  for (int64_t b = 0; b < d.batch; ++b) {
    fused::RmsNormRows(&hidden[(b * d.seq + logits_start) * d.hidden], nullptr, final_norm, epsilon, kept,
                       d.hidden, &normed[b * kept * d.hidden], nullptr, nullptr);
  }
  if (!apply_lm_head) {  // the caller projects them itself, a chunk of positions at a time
    auto normed_out = paddle::empty({d.batch, kept, d.hidden}, paddle::DataType::FLOAT32, input_ids.place());
    std::copy(normed.begin(), normed.begin() + rows * d.hidden, normed_out.data<float>());
    return {normed_out};
  }
  auto logits = paddle::empty({d.batch, kept, d.vocab}, paddle::DataType::FLOAT32, input_ids.place());
  if (ReadsPacked(packed_head, rows)) {
    session_products::MatMul(packed_head.form, normed.data(), packed_head.data, logits.data<float>(), d.vocab, rows,
                             d.vocab, d.hidden, 0.0f);
  } else if (rows > 0) {
    mkl::MatMul(normed.data(), lm_head, logits.data<float>(), rows, d.vocab, d.hidden, 0.0f, transpose_lm_head);
  }
  return {logits};
}

std::vector<std::vector<int64_t>> DecoderForwardShape(const std::vector<int64_t>& input_ids,
                                                      const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                      const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                      const std::vector<int64_t>&,
                                                      const std::vector<std::vector<int64_t>>& weights, int,
                                                      float, bool, bool transpose_lm_head, int logits_start,
                                                      int logits_end, bool apply_lm_head) {
  const int64_t count = ModelWeightCount(weights);
  const auto& head = weights[count - 1];
  const int64_t hidden = weights[count - 2][0];  // the final norm's [H]
  const int64_t width = !apply_lm_head ? hidden : transpose_lm_head ? head[0] : head[1];
  return {{input_ids[0], logits_end - logits_start, width}};
}

std::vector<paddle::DataType> DecoderForwardDtype(const paddle::DataType&, const paddle::DataType&,
                                                  const paddle::DataType&, const paddle::DataType& cache,
                                                  const paddle::DataType&, const paddle::DataType&,
                                                  const std::vector<paddle::DataType>&) {
  return {cache};
}

}  // namespace

PD_BUILD_OP(native_packed_products)
    .Inputs({paddle::Vec("weights")})
    .Outputs({paddle::Vec("packed")})
    .Attrs({"has_qkv_bias: bool", "transpose_lm_head: bool"})
    .SetKernelFn(PD_KERNEL(PackedProducts))
    .SetInferShapeFn(PD_INFER_SHAPE(PackedProductsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PackedProductsDtype));

PD_BUILD_OP(native_decoder_forward)
    .Inputs({"input_ids", "position_ids", "key_valid", "cache", "cos", "sin", paddle::Vec("weights")})
    .Outputs({"logits"})
    .Attrs({"start: int", "epsilon: float", "has_qkv_bias: bool", "transpose_lm_head: bool", "logits_start: int",
            "logits_end: int", "apply_lm_head: bool"})
    .SetKernelFn(PD_KERNEL(DecoderForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DecoderForwardShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecoderForwardDtype));
