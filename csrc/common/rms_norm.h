// paddlenlp's RMSNorm over rows, shared by the fused norm ops (fused_ops.cc, where it is defined) and the
// native decoder forward (decoder_ops.cc).
#pragma once

#include <cstdint>

namespace fused {

// out = x * rsqrt(mean(x^2) + eps) * weight per row of `hidden`; with `residual`, x = input + residual,
// written to `sum_out`. `inv_rms` (unless null) keeps rsqrt(mean(x^2) + eps) per row, for the backward.
void RmsNormRows(const float* input, const float* residual, const float* weight, float eps, int64_t rows,
                 int64_t hidden, float* out, float* sum_out, float* inv_rms);

}  // namespace fused
