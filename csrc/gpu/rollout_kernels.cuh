// CUDA kernels of the rollout ops, free of Paddle includes so they compile and can be checked with
// nvcc or CuPy alone. Semantics match the CPU kernels in ../rollout_ops.cc (see ../README.md).
#pragma once

#include <cstdint>

#include "../common/rollout_math.h"

namespace rollout {

constexpr int kThreads = 256;
constexpr int64_t kNoToken = -1;  // the token of a row with nothing to sample from (as the CPU op)

// ---- token penalties: one block per row ----

__global__ void TokenPenaltyKernel(float* logits, int32_t* counts, const int64_t* history, const int64_t* step_idx,
                                   const float* repetition, const float* frequency, const float* presence,
                                   const int64_t* min_len, const int64_t* eos_ids, int64_t num_eos,
                                   const int64_t* banned_ids, int64_t num_banned, int64_t vocab,
                                   int64_t history_len) {
  const int64_t b = blockIdx.x;
  float* row = logits + b * vocab;
  int32_t* row_counts = counts + b * vocab;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) row_counts[v] = 0;
  __syncthreads();
  const int64_t generated = step_idx[b] < history_len ? step_idx[b] : history_len;
  for (int64_t t = threadIdx.x; t < generated; t += blockDim.x) {
    const int64_t token = history[b * history_len + t];
    if (token >= 0 && token < vocab) atomicAdd(&row_counts[token], 1);
  }
  __syncthreads();
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    const int32_t count = row_counts[v];
    if (count == 0) continue;
    float value = row[v];
    value = value > 0 ? value / repetition[b] : value * repetition[b];
    row[v] = value - static_cast<float>(count) * frequency[b] - presence[b];
  }
  __syncthreads();
  const float masked = -__int_as_float(0x7f800000);  // -inf
  if (step_idx[b] < min_len[b]) {
    for (int64_t e = threadIdx.x; e < num_eos; e += blockDim.x) {
      if (eos_ids[e] >= 0 && eos_ids[e] < vocab) row[eos_ids[e]] = masked;
    }
  }
  for (int64_t k = threadIdx.x; k < num_banned; k += blockDim.x) {
    if (banned_ids[k] >= 0 && banned_ids[k] < vocab) row[banned_ids[k]] = masked;
  }
}

// ---- block reductions ----

template <typename T>
__device__ T BlockSum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  T total = shared[0];
  __syncthreads();
  return total;
}

// Largest value, smallest index among equals (as std::max_element on the CPU).
__device__ void BlockArgMax(float value, int64_t index, float* shared_values, int64_t* shared_indices,
                            float* best_value, int64_t* best_index) {
  shared_values[threadIdx.x] = value;
  shared_indices[threadIdx.x] = index;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float other = shared_values[threadIdx.x + stride];
      const int64_t other_index = shared_indices[threadIdx.x + stride];
      if (other > shared_values[threadIdx.x] ||
          (other == shared_values[threadIdx.x] && other_index < shared_indices[threadIdx.x])) {
        shared_values[threadIdx.x] = other;
        shared_indices[threadIdx.x] = other_index;
      }
    }
    __syncthreads();
  }
  *best_value = shared_values[0];
  *best_index = shared_indices[0];
  __syncthreads();
}

// Non-negative floats order like their bit patterns, so thresholds can be searched bit by bit.
__device__ __forceinline__ uint32_t KeyOf(float p) { return __float_as_uint(p); }

// Largest key K with count(key >= K) >= k: the k-th largest probability, exactly.
__device__ uint32_t KthLargestKey(const float* probs, int64_t vocab, int64_t k, int64_t* shared) {
  uint32_t key = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = key | (1u << bit);
    int64_t count = 0;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) count += KeyOf(probs[v]) >= candidate;
    if (BlockSum<int64_t>(count, shared) >= k) key = candidate;
  }
  return key;
}

// Largest key K >= floor_key with mass(key >= K) >= target: the smallest kept probability of top-p.
__device__ uint32_t TopPKey(const float* probs, int64_t vocab, uint32_t floor_key, double target, double* shared) {
  uint32_t key = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = key | (1u << bit);
    const uint32_t bound = candidate > floor_key ? candidate : floor_key;
    double mass = 0.0;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      if (KeyOf(probs[v]) >= bound) mass += probs[v];
    }
    if (BlockSum<double>(mass, shared) >= target) key = candidate;
  }
  return key > floor_key ? key : floor_key;
}

// ---- sampling: one block of kThreads per row ----

__global__ void SampleKernel(const float* logits, float* probs, const float* temperature, const int64_t* top_k,
                             const float* top_p, const int64_t* step_idx, const int64_t* row_ids, uint64_t seed,
                             int64_t* tokens, int64_t vocab) {
  __shared__ float shared_values[kThreads];
  __shared__ int64_t shared_indices[kThreads];
  __shared__ double shared_mass[kThreads];
  const int64_t b = blockIdx.x;
  const float* row = logits + b * vocab;
  float* row_probs = probs + b * vocab;

  const float infinity = __int_as_float(0x7f800000);
  float local_max = -infinity;
  int64_t local_index = vocab, local_nans = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    if (row[v] != row[v]) {
      ++local_nans;
    } else if (row[v] > local_max) {
      local_max = row[v];
      local_index = v;
    }
  }
  float max_logit;
  int64_t best;
  BlockArgMax(local_max, local_index, shared_values, shared_indices, &max_logit, &best);
  // Nothing to sample from (a NaN or +inf logit, or every logit -inf): the token is kNoToken.
  if (BlockSum<int64_t>(local_nans, shared_indices) > 0 || max_logit == infinity || max_logit == -infinity) {
    if (threadIdx.x == 0) tokens[b] = kNoToken;
    return;
  }
  const float t = temperature[b];
  if (t <= 0.0f || top_k[b] == 1) {
    if (threadIdx.x == 0) tokens[b] = best;
    return;
  }

  const float max_scaled = max_logit / t;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) row_probs[v] = expf(row[v] / t - max_scaled);
  __syncthreads();

  uint32_t floor_key = 0;
  if (top_k[b] > 0 && top_k[b] < vocab) floor_key = KthLargestKey(row_probs, vocab, top_k[b], shared_indices);
  double kept_mass = 0.0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    if (KeyOf(row_probs[v]) >= floor_key) kept_mass += row_probs[v];
  }
  kept_mass = BlockSum<double>(kept_mass, shared_mass);
  uint32_t keep_key = floor_key;
  if (top_p[b] < 1.0f) {
    keep_key = TopPKey(row_probs, vocab, floor_key, static_cast<double>(top_p[b]) * kept_mass, shared_mass);
    kept_mass = 0.0;
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      if (KeyOf(row_probs[v]) >= keep_key) kept_mass += row_probs[v];
    }
    kept_mass = BlockSum<double>(kept_mass, shared_mass);
  }

  // Inverse CDF in token order: each thread owns a contiguous chunk; thread 0 walks the chunk sums.
  const int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = threadIdx.x * chunk;
  const int64_t end = begin + chunk < vocab ? begin + chunk : vocab;
  double chunk_mass = 0.0;
  for (int64_t v = begin; v < end; ++v) {
    if (KeyOf(row_probs[v]) >= keep_key && row_probs[v] > 0.0f) chunk_mass += row_probs[v];
  }
  shared_mass[threadIdx.x] = chunk_mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    const double target = uniform01(seed, static_cast<uint64_t>(row_ids[b]), static_cast<uint64_t>(step_idx[b])) * kept_mass;
    double cumulative = 0.0;
    int64_t picked = best, last_kept = best;
    bool found = false;
    for (int c = 0; c < blockDim.x && !found; ++c) {
      if (cumulative + shared_mass[c] <= target) {
        cumulative += shared_mass[c];
        continue;
      }
      const int64_t chunk_end = (c + 1) * chunk < vocab ? (c + 1) * chunk : vocab;
      for (int64_t v = c * chunk; v < chunk_end; ++v) {
        if (KeyOf(row_probs[v]) < keep_key || row_probs[v] <= 0.0f) continue;
        cumulative += row_probs[v];
        last_kept = v;
        if (cumulative > target) {
          picked = v;
          found = true;
          break;
        }
      }
    }
    if (!found) {  // rounding left the target past the end: take the last kept token
      for (int64_t v = vocab - 1; v >= 0; --v) {
        if (KeyOf(row_probs[v]) >= keep_key && row_probs[v] > 0.0f) {
          last_kept = v;
          break;
        }
      }
      picked = last_kept;
    }
    tokens[b] = picked;
  }
}

// ---- bookkeeping ----

__global__ void SaveStepKernel(int64_t* history, int64_t* step_idx, const int64_t* tokens, const bool* stop_flags,
                               int64_t rows, int64_t history_len) {
  for (int64_t b = blockIdx.x * blockDim.x + threadIdx.x; b < rows; b += gridDim.x * blockDim.x) {
    if (stop_flags[b] || step_idx[b] >= history_len) continue;
    history[b * history_len + step_idx[b]] = tokens[b];
    step_idx[b] += 1;
  }
}

// One block: rows stopped earlier emit pad; rows reaching EOS or max_dec_len stop; any_running = any row left.
__global__ void UpdateStopKernel(int64_t* tokens, bool* stop_flags, const int64_t* step_idx, const int64_t* eos_ids,
                                 int64_t num_eos, int64_t max_dec_len, int64_t pad_id, bool* any_running,
                                 int64_t rows) {
  int running = 0;
  for (int64_t b = threadIdx.x; b < rows; b += blockDim.x) {
    if (stop_flags[b]) {
      tokens[b] = pad_id;
      continue;
    }
    bool is_eos = false;
    for (int64_t e = 0; e < num_eos; ++e) is_eos = is_eos || tokens[b] == eos_ids[e];
    if (is_eos || step_idx[b] >= max_dec_len) stop_flags[b] = true;
    running = running || !stop_flags[b];
  }
  running = __syncthreads_or(running);
  if (threadIdx.x == 0) *any_running = running != 0;
}

}  // namespace rollout
