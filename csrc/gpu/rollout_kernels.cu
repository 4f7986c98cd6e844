// Launchers of the CUDA rollout kernels (rollout_kernels.cuh). Paddle-free: `nvcc -c` compiles it alone.

#include <cuda_runtime.h>

#include "rollout_kernels.cuh"
#include "rollout_launchers.h"

// kernel<<<blocks, threads, 0, stream>>>, spelled so that the CPU emulation (emulation/cuda_runtime.h, which
// defines its own) runs the same launches.
#ifndef ROLLOUT_LAUNCH
#define ROLLOUT_LAUNCH(kernel, blocks, threads, stream) kernel<<<blocks, threads, 0, stream>>>
#endif

namespace rollout {

namespace {
cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }
int BlocksFor(int64_t items) { return static_cast<int>((items + kThreads - 1) / kThreads); }

// nullptr, or CUDA's words for why the launch just made failed (too many resources, a bad configuration).
const char* LaunchError() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}
}  // namespace

const char* LaunchTokenPenalty(float* logits, int32_t* counts, const int64_t* history, const int64_t* step_idx,
                               const float* repetition, const float* frequency, const float* presence,
                               const int64_t* min_len, const int64_t* eos_ids, int64_t num_eos,
                               const int64_t* banned_ids, int64_t num_banned, int64_t rows, int64_t vocab,
                               int64_t history_len, void* stream) {
  if (rows == 0) return nullptr;
  ROLLOUT_LAUNCH(TokenPenaltyKernel, rows, kThreads, AsStream(stream))(
      logits, counts, history, step_idx, repetition, frequency, presence, min_len, eos_ids, num_eos, banned_ids,
      num_banned, vocab, history_len);
  return LaunchError();
}

const char* LaunchSample(const float* logits, float* probs, const float* temperature, const int64_t* top_k,
                         const float* top_p, const int64_t* step_idx, const int64_t* row_ids, uint64_t seed,
                         int64_t* tokens, int64_t rows, int64_t vocab, void* stream) {
  if (rows == 0) return nullptr;
  ROLLOUT_LAUNCH(SampleKernel, rows, kSampleThreads, AsStream(stream))(logits, probs, temperature, top_k, top_p,
                                                                       step_idx, row_ids, seed, tokens, vocab);
  return LaunchError();
}

const char* LaunchSaveStep(int64_t* history, int64_t* step_idx, const int64_t* tokens, const bool* stop_flags,
                           int64_t rows, int64_t history_len, void* stream) {
  if (rows == 0) return nullptr;
  ROLLOUT_LAUNCH(SaveStepKernel, BlocksFor(rows), kThreads, AsStream(stream))(history, step_idx, tokens, stop_flags,
                                                                              rows, history_len);
  return LaunchError();
}

const char* LaunchUpdateStop(int64_t* tokens, bool* stop_flags, const int64_t* step_idx, const int64_t* eos_ids,
                             int64_t num_eos, int64_t max_dec_len, int64_t pad_id, bool* any_running, int64_t rows,
                             void* stream) {
  ROLLOUT_LAUNCH(UpdateStopKernel, 1, 1024, AsStream(stream))(tokens, stop_flags, step_idx, eos_ids, num_eos,
                                                              max_dec_len, pad_id, any_running, rows);
  return LaunchError();
}

}  // namespace rollout
