// Host entry points of the CUDA rollout kernels. Plain C++ (no Paddle, no CUDA types) so the Paddle
// bindings can call them; `stream` is a cudaStream_t passed as void*. Each returns nullptr, or CUDA's words
// for why its kernel did not launch (a launch that fails writes nothing: the caller must not go on).
#pragma once

#include <cstdint>

namespace rollout {

const char* LaunchTokenPenalty(float* logits, int32_t* counts, const int64_t* history, const int64_t* step_idx,
                               const float* repetition, const float* frequency, const float* presence,
                               const int64_t* min_len, const int64_t* eos_ids, int64_t num_eos,
                               const int64_t* banned_ids, int64_t num_banned, int64_t rows, int64_t vocab,
                               int64_t history_len, void* stream);

const char* LaunchSample(const float* logits, float* probs, const float* temperature, const int64_t* top_k,
                         const float* top_p, const int64_t* step_idx, const int64_t* row_ids, uint64_t seed,
                         int64_t* tokens, int64_t rows, int64_t vocab, void* stream);

const char* LaunchSaveStep(int64_t* history, int64_t* step_idx, const int64_t* tokens, const bool* stop_flags,
                           int64_t rows, int64_t history_len, void* stream);

const char* LaunchUpdateStop(int64_t* tokens, bool* stop_flags, const int64_t* step_idx, const int64_t* eos_ids,
                             int64_t num_eos, int64_t max_dec_len, int64_t pad_id, bool* any_running, int64_t rows,
                             void* stream);

}  // namespace rollout
