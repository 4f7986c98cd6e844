// Paddle custom ops of the rollout decode loop (package `paddlenlp_ops`). Each op has a CPU kernel
// here; with ROLLOUT_OPS_WITH_CUDA (setup_cuda.py) GPU tensors go to the launchers of gpu/, which
// hold the CUDA code free of Paddle includes. csrc/README.md documents every op.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/cpu_clones.h"
#include "common/fused_math.h"
#include "common/mkl_threads.h"
#include "common/rollout_math.h"
#include "paddle/extension.h"

#ifdef ROLLOUT_OPS_WITH_CUDA
#include "gpu/rollout_launchers.h"
#endif

namespace {

constexpr float kMaskedLogit = -std::numeric_limits<float>::infinity();
// The token of a row with nothing to sample from: a NaN or +inf among its logits, or all of them -inf.
constexpr int64_t kNoToken = -1;

void CheckRowVector(const paddle::Tensor& t, int64_t rows, const char* name) {
  PD_CHECK(t.shape().size() == 1 && t.shape()[0] == rows, name, " must have shape [", rows, "]");
}

#ifdef ROLLOUT_OPS_WITH_CUDA
void* StreamOf(const paddle::Tensor& t) { return static_cast<void*>(t.stream()); }

// A launcher's answer (gpu/rollout_launchers.h): a kernel that did not launch wrote nothing, so the op stops.
void CheckLaunch(const char* error, const char* op) {
  PD_CHECK(error == nullptr, op, ": its CUDA kernel did not launch: ", error == nullptr ? "" : error);
}
#endif

// ---- rollout_token_penalty ---------------------------------------------------------------------

void TokenPenaltyCPU(float* logits, const int64_t* history, const int64_t* step_idx, const float* repetition,
                     const float* frequency, const float* presence, const int64_t* min_len, const int64_t* eos_ids,
                     int64_t num_eos, const int64_t* banned_ids, int64_t num_banned, int64_t rows, int64_t vocab,
                     int64_t history_len) {
  for (int64_t b = 0; b < rows; ++b) {
    float* row = logits + b * vocab;
    const bool penalised = repetition[b] != 1.0f || frequency[b] != 0.0f || presence[b] != 0.0f;
    std::unordered_map<int64_t, int64_t> counts;
    int64_t generated = penalised ? std::min(step_idx[b], history_len) : 0;
    for (int64_t t = 0; t < generated; ++t) {
      int64_t token = history[b * history_len + t];
      if (token >= 0 && token < vocab) ++counts[token];
    }
    for (const auto& [token, count] : counts) {
      float value = row[token];
      value = value > 0 ? value / repetition[b] : value * repetition[b];
      row[token] = value - static_cast<float>(count) * frequency[b] - presence[b];
    }
    if (step_idx[b] < min_len[b]) {
      for (int64_t e = 0; e < num_eos; ++e) {
        if (eos_ids[e] >= 0 && eos_ids[e] < vocab) row[eos_ids[e]] = kMaskedLogit;
      }
    }
    for (int64_t k = 0; k < num_banned; ++k) {
      if (banned_ids[k] >= 0 && banned_ids[k] < vocab) row[banned_ids[k]] = kMaskedLogit;
    }
  }
}

void TokenPenalty(const paddle::Tensor& logits, const paddle::Tensor& history, const paddle::Tensor& step_idx,
                  const paddle::Tensor& repetition_penalty, const paddle::Tensor& frequency_penalty,
                  const paddle::Tensor& presence_penalty, const paddle::Tensor& min_len,
                  const paddle::Tensor& eos_ids, const paddle::Tensor& banned_ids) {
  PD_CHECK(logits.shape().size() == 2, "logits must be [batch, vocab]");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  PD_CHECK(history.shape().size() == 2 && history.shape()[0] == rows, "history must be [batch, max_dec_len]");
  for (const auto* t : {&step_idx, &repetition_penalty, &frequency_penalty, &presence_penalty, &min_len}) {
    CheckRowVector(*t, rows, "per-row penalty inputs");
  }
  const int64_t history_len = history.shape()[1];
  auto* out = const_cast<float*>(logits.data<float>());
#ifdef ROLLOUT_OPS_WITH_CUDA
  if (logits.is_gpu()) {
    auto counts = paddle::empty({rows, vocab}, paddle::DataType::INT32, logits.place());
    CheckLaunch(rollout::LaunchTokenPenalty(out, counts.data<int32_t>(), history.data<int64_t>(),
                                            step_idx.data<int64_t>(), repetition_penalty.data<float>(),
                                            frequency_penalty.data<float>(), presence_penalty.data<float>(),
                                            min_len.data<int64_t>(), eos_ids.data<int64_t>(), eos_ids.numel(),
                                            banned_ids.data<int64_t>(), banned_ids.numel(), rows, vocab, history_len,
                                            StreamOf(logits)),
                "rollout_token_penalty");
    return;
  }
#endif
  TokenPenaltyCPU(out, history.data<int64_t>(), step_idx.data<int64_t>(), repetition_penalty.data<float>(),
                  frequency_penalty.data<float>(), presence_penalty.data<float>(), min_len.data<int64_t>(),
                  eos_ids.data<int64_t>(), eos_ids.numel(), banned_ids.data<int64_t>(), banned_ids.numel(), rows,
                  vocab, history_len);
}

// ---- rollout_sample ----------------------------------------------------------------------------

// probs[v] = exp(logits[v] * inverse_temperature - max_scaled): the unnormalised sampling distribution,
// vectorised (std::exp is a library call per element; this is most of the op's time at 152k entries).
FUSED_CPU_CLONES void ScaledExp(const float* logits, int64_t vocab, float inverse_temperature, float max_scaled,
                                float* probs) {
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) probs[v] = fused::Exp(logits[v] * inverse_temperature - max_scaled);
}

// The sum of the probabilities >= threshold, in double, vectorised.
FUSED_CPU_CLONES double MassAtLeast(const float* probs, int64_t count, float threshold) {
  double mass = 0.0;
#pragma omp simd reduction(+ : mass)
  for (int64_t v = 0; v < count; ++v) mass += probs[v] >= threshold ? probs[v] : 0.0f;
  return mass;
}

// The draw walks the kept mass in token order a block at a time: block sums first, then one block's
// tokens, instead of one dependent double addition per token of the vocabulary.
constexpr int64_t kMassBlock = 1024;

// MassAtLeast of each block of kMassBlock tokens into `blocks`; returns their sum, the kept mass.
double BlockMasses(const float* probs, int64_t vocab, float threshold, std::vector<double>* blocks) {
  blocks->resize((vocab + kMassBlock - 1) / kMassBlock);
  double total = 0.0;
  for (size_t b = 0; b < blocks->size(); ++b) {
    const int64_t start = static_cast<int64_t>(b) * kMassBlock;
    (*blocks)[b] = MassAtLeast(probs + start, std::min(kMassBlock, vocab - start), threshold);
    total += (*blocks)[b];
  }
  return total;
}

// The row's largest logit, NaN set aside, and whether any logit is NaN: one vectorised pass.
FUSED_CPU_CLONES float MaxLogit(const float* logits, int64_t vocab, bool* has_nan) {
  float top = -std::numeric_limits<float>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : top) reduction(| : nan)
  for (int64_t v = 0; v < vocab; ++v) {
    top = logits[v] > top ? logits[v] : top;
    nan |= logits[v] != logits[v];
  }
  *has_nan = nan != 0;
  return top;
}

// The k-th largest of `probs` (0 < k <= vocab), in linear time: a selection, not a sort.
float KthLargest(const std::vector<float>& probs, int64_t k, std::vector<float>* scratch) {
  scratch->assign(probs.begin(), probs.end());
  std::nth_element(scratch->begin(), scratch->begin() + (k - 1), scratch->end(), std::greater<float>());
  return (*scratch)[k - 1];
}

// The smallest probability top-p keeps among those >= `floor`: walking the probabilities in descending
// order, the one at which their sum first reaches `target`. Nothing is sorted whole: non-negative floats
// order like their bit patterns, so a radix selection narrows the candidates to the bucket of key bits
// where the descending sum crosses the target (12 bits a round, the mass above the bucket carried), and
// only that bucket, a few values even for a flat distribution, is sorted and walked. Linear time.
constexpr int kRadixBits = 12;
constexpr int64_t kSortedBucket = 2048;  // a bucket this small is sorted rather than split further

float TopPThreshold(const std::vector<float>& probs, float floor, double target, std::vector<float>* scratch) {
  scratch->clear();
  for (float p : probs) {
    if (p >= floor && p > 0.0f) scratch->push_back(p);
  }
  auto key = [](float p) { uint32_t bits; std::memcpy(&bits, &p, sizeof(bits)); return bits; };
  double above = 0.0;  // the mass of the values above every remaining candidate
  std::vector<double> mass(1 << kRadixBits);
  for (int shift = 32 - kRadixBits; shift > -kRadixBits && scratch->size() > kSortedBucket; shift -= kRadixBits) {
    const int low = std::max(shift, 0);
    const uint32_t digits = (1u << (std::min(shift + kRadixBits, 32) - low)) - 1;
    std::fill(mass.begin(), mass.end(), 0.0);
    for (float p : *scratch) mass[(key(p) >> low) & digits] += p;
    int64_t bucket = digits;
    while (bucket > 0 && (mass[bucket] == 0.0 || above + mass[bucket] < target)) above += mass[bucket--];
    scratch->erase(std::remove_if(scratch->begin(), scratch->end(),
                                  [&](float p) { return ((key(p) >> low) & digits) != static_cast<uint32_t>(bucket); }),
                   scratch->end());
    if (low == 0) break;  // one key left: its values are all equal
  }
  std::sort(scratch->begin(), scratch->end(), std::greater<float>());
  double cumulative = above;
  for (float p : *scratch) {
    cumulative += p;
    if (cumulative >= target) return std::max(floor, p);
  }
  return floor;
}

// The smallest probability kept by top-k then top-p, over unnormalised probabilities `probs`. Every token
// whose probability is >= the threshold stays (ties at the boundary all stay). With top_k 0 and top_p 1
// (the RL default) nothing is ordered at all.
float KeepThreshold(const std::vector<float>& probs, int64_t top_k, float top_p, std::vector<float>* scratch) {
  const int64_t vocab = static_cast<int64_t>(probs.size());
  const float threshold = top_k > 0 && top_k < vocab ? KthLargest(probs, top_k, scratch) : 0.0f;
  if (top_p >= 1.0f) return threshold;
  const double top_k_mass = MassAtLeast(probs.data(), vocab, threshold);
  return TopPThreshold(probs, threshold, static_cast<double>(top_p) * top_k_mass, scratch);
}

int64_t SampleRowCPU(const float* logits, int64_t vocab, float temperature, int64_t top_k, float top_p,
                     double uniform, std::vector<float>* probs, std::vector<float>* scratch,
                     std::vector<double>* blocks) {
  bool has_nan;
  const float largest = MaxLogit(logits, vocab, &has_nan);
  if (has_nan || !std::isfinite(largest)) return kNoToken;
  const int64_t best = std::find(logits, logits + vocab, largest) - logits;  // the first of equal maxima
  if (temperature <= 0.0f || top_k == 1) return best;
  probs->resize(vocab);
  ScaledExp(logits, vocab, 1.0f / temperature, largest / temperature, probs->data());
  const float threshold = KeepThreshold(*probs, top_k, top_p, scratch);
  // Inverse CDF in token order over the kept tokens: the block where the kept mass passes the target,
  // then its tokens one by one (and the next blocks', should rounding leave the target past its end).
  const float* p = probs->data();
  const double target = uniform * BlockMasses(p, vocab, threshold, blocks);
  double cumulative = 0.0;
  size_t block = 0;
  while (block + 1 < blocks->size() && cumulative + (*blocks)[block] <= target) cumulative += (*blocks)[block++];
  int64_t last_kept = best;
  for (int64_t v = static_cast<int64_t>(block) * kMassBlock; v < vocab; ++v) {
    if (p[v] < threshold || p[v] <= 0.0f) continue;
    cumulative += p[v];
    last_kept = v;
    if (cumulative > target) return v;
  }
  return last_kept;  // rounding left the target past the end
}

std::vector<paddle::Tensor> Sample(const paddle::Tensor& logits, const paddle::Tensor& temperature,
                                   const paddle::Tensor& top_k, const paddle::Tensor& top_p,
                                   const paddle::Tensor& step_idx, const paddle::Tensor& row_ids, int64_t seed) {
  PD_CHECK(logits.shape().size() == 2, "logits must be [batch, vocab]");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1];
  for (const auto* t : {&temperature, &top_k, &top_p, &step_idx, &row_ids}) CheckRowVector(*t, rows, "sampling inputs");
  auto tokens = paddle::empty({rows}, paddle::DataType::INT64, logits.place());
#ifdef ROLLOUT_OPS_WITH_CUDA
  if (logits.is_gpu()) {
    auto workspace = paddle::empty({rows, vocab}, paddle::DataType::FLOAT32, logits.place());
    CheckLaunch(rollout::LaunchSample(logits.data<float>(), workspace.data<float>(), temperature.data<float>(),
                                      top_k.data<int64_t>(), top_p.data<float>(), step_idx.data<int64_t>(),
                                      row_ids.data<int64_t>(), static_cast<uint64_t>(seed), tokens.data<int64_t>(),
                                      rows, vocab, StreamOf(logits)),
                "rollout_sample");
    return {tokens};
  }
#endif
  const float* data = logits.data<float>();
  int64_t* out = tokens.data<int64_t>();
  mkl_threads::ParallelFor(rows, mkl_threads::RowsPerShare(vocab), [&](int64_t begin, int64_t end) {
    std::vector<float> probs, scratch;
    std::vector<double> blocks;
    for (int64_t b = begin; b < end; ++b) {
      double u = rollout::uniform01(static_cast<uint64_t>(seed), static_cast<uint64_t>(row_ids.data<int64_t>()[b]),
                                    static_cast<uint64_t>(step_idx.data<int64_t>()[b]));
      out[b] = SampleRowCPU(data + b * vocab, vocab, temperature.data<float>()[b], top_k.data<int64_t>()[b],
                            top_p.data<float>()[b], u, &probs, &scratch, &blocks);
    }
  });
  return {tokens};
}

// ---- rollout_save_step -------------------------------------------------------------------------

void SaveStep(const paddle::Tensor& history, const paddle::Tensor& step_idx, const paddle::Tensor& tokens,
              const paddle::Tensor& stop_flags) {
  PD_CHECK(history.shape().size() == 2, "history must be [batch, max_dec_len]");
  const int64_t rows = history.shape()[0], history_len = history.shape()[1];
  for (const auto* t : {&step_idx, &tokens, &stop_flags}) CheckRowVector(*t, rows, "save_step inputs");
  auto* hist = const_cast<int64_t*>(history.data<int64_t>());
  auto* steps = const_cast<int64_t*>(step_idx.data<int64_t>());
#ifdef ROLLOUT_OPS_WITH_CUDA
  if (history.is_gpu()) {
    CheckLaunch(rollout::LaunchSaveStep(hist, steps, tokens.data<int64_t>(), stop_flags.data<bool>(), rows,
                                        history_len, StreamOf(history)),
                "rollout_save_step");
    return;
  }
#endif
  for (int64_t b = 0; b < rows; ++b) {
    if (stop_flags.data<bool>()[b] || steps[b] >= history_len) continue;
    hist[b * history_len + steps[b]] = tokens.data<int64_t>()[b];
    ++steps[b];
  }
}

// ---- rollout_update_stop -----------------------------------------------------------------------

std::vector<paddle::Tensor> UpdateStop(const paddle::Tensor& tokens, const paddle::Tensor& stop_flags,
                                       const paddle::Tensor& step_idx, const paddle::Tensor& eos_ids,
                                       int64_t max_dec_len, int64_t pad_id) {
  PD_CHECK(tokens.shape().size() == 1, "tokens must be [batch]");
  const int64_t rows = tokens.shape()[0];
  CheckRowVector(stop_flags, rows, "stop_flags");
  CheckRowVector(step_idx, rows, "step_idx");
  auto* toks = const_cast<int64_t*>(tokens.data<int64_t>());
  auto* flags = const_cast<bool*>(stop_flags.data<bool>());
#ifdef ROLLOUT_OPS_WITH_CUDA
  if (tokens.is_gpu()) {
    auto any_running = paddle::empty({1}, paddle::DataType::BOOL, tokens.place());
    CheckLaunch(rollout::LaunchUpdateStop(toks, flags, step_idx.data<int64_t>(), eos_ids.data<int64_t>(),
                                          eos_ids.numel(), max_dec_len, pad_id, any_running.data<bool>(), rows,
                                          StreamOf(tokens)),
                "rollout_update_stop");
    // The loop's one host synchronisation per step: whether any row still runs.
    return {any_running.copy_to(paddle::CPUPlace(), true)};
  }
#endif
  auto not_need_stop = paddle::empty({1}, paddle::DataType::BOOL, paddle::CPUPlace());
  bool running = false;
  for (int64_t b = 0; b < rows; ++b) {
    if (flags[b]) {
      toks[b] = pad_id;
      continue;
    }
    bool is_eos = std::find(eos_ids.data<int64_t>(), eos_ids.data<int64_t>() + eos_ids.numel(), toks[b]) !=
                  eos_ids.data<int64_t>() + eos_ids.numel();
    if (is_eos || step_idx.data<int64_t>()[b] >= max_dec_len) flags[b] = true;
    running = running || !flags[b];
  }
  not_need_stop.data<bool>()[0] = running;
  return {not_need_stop};
}

}  // namespace

PD_BUILD_OP(rollout_token_penalty)
    .Inputs({"logits", "history", "step_idx", "repetition_penalty", "frequency_penalty", "presence_penalty",
             "min_len", "eos_ids", "banned_ids"})
    .Outputs({"logits_out"})
    .SetInplaceMap({{"logits", "logits_out"}})
    .SetKernelFn(PD_KERNEL(TokenPenalty));

PD_BUILD_OP(rollout_sample)
    .Inputs({"logits", "temperature", "top_k", "top_p", "step_idx", "row_ids"})
    .Outputs({"tokens"})
    .Attrs({"seed: int64_t"})
    .SetKernelFn(PD_KERNEL(Sample));

PD_BUILD_OP(rollout_save_step)
    .Inputs({"history", "step_idx", "tokens", "stop_flags"})
    .Outputs({"history_out", "step_idx_out"})
    .SetInplaceMap({{"history", "history_out"}, {"step_idx", "step_idx_out"}})
    .SetKernelFn(PD_KERNEL(SaveStep));

PD_BUILD_OP(rollout_update_stop)
    .Inputs({"tokens", "stop_flags", "step_idx", "eos_ids"})
    .Outputs({"tokens_out", "stop_flags_out", "not_need_stop"})
    .SetInplaceMap({{"tokens", "tokens_out"}, {"stop_flags", "stop_flags_out"}})
    .Attrs({"max_dec_len: int64_t", "pad_id: int64_t"})
    .SetKernelFn(PD_KERNEL(UpdateStop));
