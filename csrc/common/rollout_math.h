// Shared by the CPU ops and the CUDA kernels (no Paddle, no CUDA headers needed):
// the counter-based random numbers that make sampling reproducible on both devices.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ROLLOUT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ROLLOUT_HOST_DEVICE inline
#endif

namespace rollout {

// SplitMix64 finaliser: a bijective mix with good avalanche, cheap enough to call per row and step.
ROLLOUT_HOST_DEVICE uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform double in [0, 1) for (seed, row, step): the same stream on CPU and GPU, independent of
// the batch layout, so a row's sample depends only on its own history.
ROLLOUT_HOST_DEVICE double uniform01(uint64_t seed, uint64_t row, uint64_t step) {
  uint64_t bits = mix64(mix64(mix64(seed) ^ row) ^ step);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits
}

}  // namespace rollout
