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

// ---- sampling: one block of kSampleThreads per row ----

// A row's passes are bound by the loads its block keeps in flight: 1,024 threads, 16 bytes a load. (Any
// power of two from 64 to 1,024 works: the CPU emulation runs fewer, each an OS thread.)
#ifndef ROLLOUT_SAMPLE_THREADS
#define ROLLOUT_SAMPLE_THREADS 1024
#endif
constexpr int kSampleThreads = ROLLOUT_SAMPLE_THREADS;
constexpr int kWarpSize = 32;
constexpr int kSampleWarps = kSampleThreads / kWarpSize;
constexpr int64_t kWalkedEntries = 8;  // the draw walks this few entries one by one
static_assert(kSampleWarps >= 2, "the draw splits a range into one piece per warp");

// visit(v, value) for this thread's entries of row[begin, end): 4-entry groups number lane, lane + lanes, ...
// from the first 16-byte aligned entry, loaded 16 bytes at a time; the few entries before and after go one by one.
template <typename Visit>
__device__ __forceinline__ void ForEachEntry(const float* row, int64_t begin, int64_t end, int lane, int lanes,
                                             Visit visit) {
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row + begin) / sizeof(float) % 4);
  const int64_t body = misaligned == 0 ? begin : (begin + 4 - misaligned < end ? begin + 4 - misaligned : end);
  for (int64_t v = begin + lane; v < body; v += lanes) visit(v, row[v]);
  const int64_t groups = (end - body) / 4;
  const float4* quads = reinterpret_cast<const float4*>(row + body);
  for (int64_t q = lane; q < groups; q += lanes) {
    const float4 x = quads[q];
    const int64_t v = body + 4 * q;
    visit(v, x.x);
    visit(v + 1, x.y);
    visit(v + 2, x.z);
    visit(v + 3, x.w);
  }
  for (int64_t v = body + 4 * groups + lane; v < end; v += lanes) visit(v, row[v]);
}

struct Plus {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// The warp's reduction by the commutative `op`, the same in every lane (each lane combines the same pairs,
// commuted).
template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T value, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// The block's reduction by `op`, the same in every thread: each warp's, then the warps' in order. `shared`:
// one per warp.
template <typename T, typename Op>
__device__ T BlockReduce(T value, T* shared, Op op) {
  value = WarpReduce(value, op);
  if (threadIdx.x % kWarpSize == 0) shared[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) total = op(total, shared[w]);
  __syncthreads();  // every thread has read `shared` before the next call writes it
  return total;
}

template <typename T>
__device__ __forceinline__ T WarpSum(T value) { return WarpReduce(value, Plus()); }

template <typename T>
__device__ T BlockSum(T value, T* shared) { return BlockReduce(value, shared, Plus()); }

// Whether `value` at `index` comes first in an argmax: larger, or equal at a smaller index (as
// std::max_element on the CPU).
__device__ __forceinline__ bool Precedes(float value, int64_t index, float other, int64_t other_index) {
  return value > other || (value == other && index < other_index);
}

// The block's largest value and the smallest index it has, in every thread. `shared_*`: one per warp.
__device__ void BlockArgMax(float value, int64_t index, float* shared_values, int64_t* shared_indices,
                            float* best_value, int64_t* best_index) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    const int64_t other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (Precedes(other, other_index, value, index)) value = other, index = other_index;
  }
  if (threadIdx.x % kWarpSize == 0) {
    shared_values[threadIdx.x / kWarpSize] = value;
    shared_indices[threadIdx.x / kWarpSize] = index;
  }
  __syncthreads();
  *best_value = shared_values[0], *best_index = shared_indices[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) {
    if (Precedes(shared_values[w], shared_indices[w], *best_value, *best_index)) {
      *best_value = shared_values[w], *best_index = shared_indices[w];
    }
  }
  __syncthreads();
}

// Non-negative floats order like their bit patterns, so thresholds can be searched bit by bit.
__device__ __forceinline__ uint32_t KeyOf(float p) { return __float_as_uint(p); }

__device__ __forceinline__ bool Kept(float p, uint32_t keep_key) { return KeyOf(p) >= keep_key && p > 0.0f; }

// The sum of `value` over this lane and the lanes above it in the warp.
template <typename T>
__device__ __forceinline__ T WarpSuffixSum(T value) {
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const T other = __shfl_down_sync(0xffffffffu, value, offset);
    if (lane + offset < kWarpSize) value += other;
  }
  return value;
}

// A threshold's search: the exponent of the probabilities (bits 30-23 of their keys; the sign bit is 0) bit by
// bit, then their significand (bits 22-0) in two rounds of histograms, of 12 bits then 11.
constexpr int kSignificandBits = 23;
constexpr int kFirstRoundBits = 12;
using Units = unsigned long long;

struct SearchScratch {  // in shared memory
  Units bins[1 << kFirstRoundBits];
  Units warp_units[kSampleWarps];
  int warp_picks[kSampleWarps];
  Units picked_above;
};

// A probability's part of a measure: 1 (counting) or itself (mass).
template <typename T, bool kMass>
__device__ __forceinline__ T Weight(float p) {
  return kMass ? static_cast<T>(p) : T(1);
}

// A probability's part of its histogram bin: 1 (counting), or its significand as an integer (mass). Within one
// exponent every probability is that integer times one power of two, so the bins' sums are exact, and the same
// whatever order the atomic additions come in.
template <bool kMass>
__device__ __forceinline__ Units UnitsOf(uint32_t key) {
  if (!kMass) return 1;
  return (key & 0x7FFFFFu) | ((key >> kSignificandBits) != 0 ? 0x800000u : 0u);
}

// `above`, a measure, plus `units` of the exponent field `exponent`: a count, or units * 2^(exponent - 150)
// (2^-149 for the field 0, subnormals).
template <typename T, bool kMass>
__device__ __forceinline__ T MeasureOf(T above, Units units, uint32_t exponent) {
  if constexpr (kMass) {
    return above + ldexp(static_cast<double>(units), static_cast<int>(exponent > 0 ? exponent : 1) - 150);
  } else {
    return above + static_cast<T>(units);
  }
}

// The largest bin d of scratch->bins[0, bins) whose measure, with `above` and `above_units` and the bins above
// d, reaches `target` and is not none (else, rounding only, 0), in every thread; scratch->picked_above is set
// to `above_units` plus the units of the bins above d. Each thread owns bins / blockDim.x adjacent bins.
template <typename T, bool kMass>
__device__ int PickBin(SearchScratch* scratch, int bins, T above, Units above_units, uint32_t exponent, T target) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int per = bins / static_cast<int>(blockDim.x), first = static_cast<int>(threadIdx.x) * per;
  Units own = 0;
  for (int i = first; i < first + per; ++i) own += scratch->bins[i];
  const Units through = WarpSuffixSum(own);  // this thread's bins and those of the lanes above it
  if (lane == 0) scratch->warp_units[warp] = through;
  __syncthreads();
  Units higher = above_units + (through - own);
  for (int w = warp + 1; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) higher += scratch->warp_units[w];
  int pick = -1;
  Units pick_above = 0;
  for (int i = first + per - 1; i >= first && pick < 0; --i) {
    const T measure = MeasureOf<T, kMass>(above, higher + scratch->bins[i], exponent);
    if (measure >= target && measure > 0) pick = i;
    pick_above = higher;  // with no pick, thread 0 ends holding bin 0's
    higher += scratch->bins[i];
  }
  const int best = BlockReduce(pick, scratch->warp_picks, Max());
  if (best >= 0 ? pick == best : threadIdx.x == 0) scratch->picked_above = pick_above;
  __syncthreads();
  return best >= 0 ? best : 0;
}

// The significand of the threshold whose exponent field `key` holds: the probabilities of that exponent (and
// >= floor_key) go into bins by their next 12 bits, the bin where the measure from the top reaches the target
// is picked, and its probabilities into bins by their last 11 bits. The measure of the higher exponents is a
// block sum (double for mass), that of the exponent's own probabilities exact units.
template <typename T, bool kMass>
__device__ uint32_t SearchSignificand(const float* probs, int64_t vocab, uint32_t floor_key, T target, uint32_t key,
                                      T* shared, SearchScratch* scratch) {
  const uint32_t exponent = key >> kSignificandBits, higher = (exponent + 1) << kSignificandBits;
  T above = 0;
  Units above_units = 0;
  int shift = kSignificandBits;
  for (int round = 0; round < 2; ++round) {
    const int bits = round == 0 ? kFirstRoundBits : kSignificandBits - kFirstRoundBits, prefix = shift;
    shift -= bits;
    for (int i = threadIdx.x; i < (1 << bits); i += blockDim.x) scratch->bins[i] = 0;
    __syncthreads();
    T measure_above = 0;
    ForEachEntry(probs, 0, vocab, threadIdx.x, blockDim.x, [&](int64_t, float p) {
      const uint32_t k = KeyOf(p);
      if (k < floor_key) return;
      if ((k >> prefix) == (key >> prefix)) {
        atomicAdd(&scratch->bins[(k >> shift) & ((1u << bits) - 1)], UnitsOf<kMass>(k));
      } else if (round == 0 && k >= higher) {
        measure_above += Weight<T, kMass>(p);
      }
    });
    if (round == 0) {
      above = BlockSum<T>(measure_above, shared);  // its barriers complete the bins too
    } else {
      __syncthreads();
    }
    key |= static_cast<uint32_t>(PickBin<T, kMass>(scratch, 1 << bits, above, above_units, exponent, target)) << shift;
    above_units = scratch->picked_above;
    __syncthreads();  // every thread has read the bins and picked_above before the next round writes them
  }
  return key;
}

// The largest key K whose probabilities, those with a key >= max(K, floor_key), reach `target` (and are not
// none) in count (kMass false: top-k's k-th largest, exactly) or in mass (top-p): the exponent bit by bit, a
// pass over the row each, then the significand in two passes (SearchSignificand).
template <typename T, bool kMass>
__device__ uint32_t SearchKey(const float* probs, int64_t vocab, uint32_t floor_key, T target, T* shared,
                              SearchScratch* scratch) {
  uint32_t key = 0;
  for (int bit = 30; bit >= kSignificandBits; --bit) {
    const uint32_t candidate = key | (1u << bit);
    const uint32_t bound = candidate > floor_key ? candidate : floor_key;
    T measure = 0;
    ForEachEntry(probs, 0, vocab, threadIdx.x, blockDim.x, [&](int64_t, float p) {
      if (KeyOf(p) >= bound) measure += Weight<T, kMass>(p);
    });
    measure = BlockSum<T>(measure, shared);
    if (measure >= target && measure > 0) key = candidate;
  }
  key = SearchSignificand<T, kMass>(probs, vocab, floor_key, target, key, shared, scratch);
  return key > floor_key ? key : floor_key;
}

// The draw's split of [begin, end) into one piece a warp, each a multiple of 4 entries long (so that the pieces
// keep the row's alignment): the length of a piece, and this thread's warp's piece [*first, *last), empty past
// the end.
__device__ __forceinline__ int64_t WarpPiece(int64_t begin, int64_t end, int64_t* first, int64_t* last) {
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  const int64_t piece = ((end - begin + warps - 1) / warps + 3) / 4 * 4;
  const int64_t start = begin + static_cast<int64_t>(threadIdx.x / kWarpSize) * piece;
  *first = start < end ? start : end;
  *last = start + piece < end ? start + piece : end;
  return piece;
}

// The kept token where the kept mass, walked in token order, passes uniform * (the kept mass): the range is
// split into one piece per warp, each warp sums its piece, and the piece where the running sum passes the
// target (else, rounding only, the last piece with mass) is split again, down to kWalkedEntries entries that
// thread 0 walks. Returns the token in thread 0. `shared`: one per warp. `first_masses`, where given, are the
// kept masses of the first split's pieces, one a warp, already summed.
__device__ int64_t DrawKept(const float* probs, int64_t vocab, uint32_t keep_key, double uniform,
                            const double* first_masses, double* shared) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  int64_t begin = 0, end = vocab;
  double cumulative = 0.0, target = -1.0;
  while (end - begin > kWalkedEntries) {
    int64_t first, last;
    const int64_t piece = WarpPiece(begin, end, &first, &last);
    double mass = 0.0;
    if (target < 0.0 && first_masses != nullptr) {
      mass = first_masses[warp];
    } else {
      ForEachEntry(probs, first, last, lane, kWarpSize, [&](int64_t, float p) {
        if (Kept(p, keep_key)) mass += p;
      });
      mass = WarpSum(mass);
    }
    if (lane == 0) shared[warp] = mass;
    __syncthreads();
    if (target < 0.0) {  // the first split: its pieces' mass is the kept mass
      double total = 0.0;
      for (int w = 0; w < warps; ++w) total += shared[w];
      target = uniform * total;
    }
    int picked = -1;
    double before = cumulative;
    for (int w = 0; w < warps && picked < 0; ++w) {
      if (before + shared[w] > target) picked = w;
      else before += shared[w];
    }
    if (picked < 0) {
      picked = 0;  // (no piece has mass only where nothing is kept: the walk then finds no token)
      for (int w = 0; w < warps; ++w) picked = shared[w] > 0.0 ? w : picked;
      before = cumulative;
      for (int w = 0; w < picked; ++w) before += shared[w];
    }
    __syncthreads();  // every thread has read `shared` before the next split writes it
    cumulative = before;
    begin = begin + picked * piece;
    end = begin + piece < end ? begin + piece : end;
  }
  int64_t token = -1, last_kept = -1;
  if (threadIdx.x == 0) {
    if (target < 0.0) {  // a row of kWalkedEntries or fewer: never split
      double total = 0.0;
      for (int64_t v = begin; v < end; ++v) total += Kept(probs[v], keep_key) ? probs[v] : 0.0f;
      target = uniform * total;
    }
    for (int64_t v = begin; v < end && token < 0; ++v) {
      if (!Kept(probs[v], keep_key)) continue;
      cumulative += probs[v];
      last_kept = v;
      if (cumulative > target) token = v;
    }
  }
  return token >= 0 ? token : last_kept;
}

// (The bound holds the kernel to the 64 registers a thread that a block of 1,024 may have: past them the
// launch fails.)
__global__ void __launch_bounds__(kSampleThreads)
    SampleKernel(const float* logits, float* probs, const float* temperature, const int64_t* top_k, const float* top_p,
                 const int64_t* step_idx, const int64_t* row_ids, uint64_t seed, int64_t* tokens, int64_t vocab) {
  __shared__ float shared_values[kSampleWarps];
  __shared__ int64_t shared_counts[kSampleWarps];
  __shared__ double shared_mass[kSampleWarps];
  __shared__ double piece_masses[kSampleWarps];  // of the exponentials, by the draw's first split
  __shared__ SearchScratch search;
  const int64_t b = blockIdx.x;
  const float* row = logits + b * vocab;
  float* row_probs = probs + b * vocab;

  const float infinity = __int_as_float(0x7f800000);
  float local_max = -infinity;
  int64_t local_index = vocab, local_nans = 0;
  ForEachEntry(row, 0, vocab, threadIdx.x, blockDim.x, [&](int64_t v, float x) {
    if (x != x) {
      ++local_nans;
    } else if (Precedes(x, v, local_max, local_index)) {
      local_max = x, local_index = v;
    }
  });
  float max_logit;
  int64_t best;
  BlockArgMax(local_max, local_index, shared_values, shared_counts, &max_logit, &best);
  // Nothing to sample from (a NaN or +inf logit, or every logit -inf): the token is kNoToken.
  if (BlockSum<int64_t>(local_nans, shared_counts) > 0 || max_logit == infinity || max_logit == -infinity) {
    if (threadIdx.x == 0) tokens[b] = kNoToken;
    return;
  }
  const float t = temperature[b];
  if (t <= 0.0f || top_k[b] == 1) {
    if (threadIdx.x == 0) tokens[b] = best;
    return;
  }

  // The exponentials, each warp those of its piece of the draw's first split: where nothing is cut (top_k 0,
  // top_p 1: RL's usual setting) their sums are that split's masses, and the draw need not read the row again.
  const float max_scaled = max_logit / t;
  int64_t first, last;
  WarpPiece(0, vocab, &first, &last);
  double exp_mass = 0.0;
  ForEachEntry(row, first, last, threadIdx.x % kWarpSize, kWarpSize, [&](int64_t v, float x) {
    const float p = expf(x / t - max_scaled);
    row_probs[v] = p;
    exp_mass += p;
  });
  exp_mass = WarpSum(exp_mass);
  if (threadIdx.x % kWarpSize == 0) piece_masses[threadIdx.x / kWarpSize] = exp_mass;
  __syncthreads();

  uint32_t keep_key = 0;
  if (top_k[b] > 0 && top_k[b] < vocab) {
    keep_key = SearchKey<int64_t, false>(row_probs, vocab, 0, top_k[b], shared_counts, &search);
  }
  if (top_p[b] < 1.0f) {
    double kept_mass = 0.0;
    ForEachEntry(row_probs, 0, vocab, threadIdx.x, blockDim.x, [&](int64_t, float p) {
      if (KeyOf(p) >= keep_key) kept_mass += p;
    });
    kept_mass = BlockSum<double>(kept_mass, shared_mass);
    const double target = static_cast<double>(top_p[b]) * kept_mass;
    keep_key = SearchKey<double, true>(row_probs, vocab, keep_key, target, shared_mass, &search);
  }
  const double uniform = uniform01(seed, static_cast<uint64_t>(row_ids[b]), static_cast<uint64_t>(step_idx[b]));
  const double* first_masses = keep_key == 0 ? piece_masses : nullptr;  // nothing cut: every p > 0 is kept
  const int64_t token = DrawKept(row_probs, vocab, keep_key, uniform, first_masses, shared_mass);
  if (threadIdx.x == 0) tokens[b] = token;
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
