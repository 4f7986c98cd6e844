// How the attention of decoder_ops.cc and attention_ops.cc batches its products: queries in blocks of
// kQueryRows of one head (a causal block then multiplies few keys past its own), and blocks in runs whose
// score buffers together hold at most kRunFloats floats, so one batched call has enough products to keep MKL's
// threads busy without a [B, H, S, S] buffer.
#pragma once

#include <cstdint>
#include <vector>

namespace attention {

constexpr int64_t kQueryRows = 128;
constexpr int64_t kRunFloats = 1 << 22;  // 16 MB of scores

// `blocks` (each with floats(), its scores' size) in consecutive runs of at most kRunFloats each; a block larger
// than that runs alone.
template <class Block>
std::vector<std::vector<Block>> ScoreRuns(const std::vector<Block>& blocks) {
  std::vector<std::vector<Block>> runs;
  int64_t floats = 0;
  for (const Block& block : blocks) {
    if (runs.empty() || floats + block.floats() > kRunFloats) runs.emplace_back(), floats = 0;
    runs.back().push_back(block);
    floats += block.floats();
  }
  return runs;
}

}  // namespace attention
