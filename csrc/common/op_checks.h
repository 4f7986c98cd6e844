// Input checks shared by the fused CPU ops (fused_ops.cc, attention_ops.cc).
#pragma once

#include "paddle/extension.h"

namespace fused {

inline void CheckFloat32CPU(const paddle::Tensor& t, const char* name) {
  PD_CHECK(t.is_cpu(), name, " must be a CPU tensor (the fused ops have no GPU kernels yet)");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, name, " must be float32");
}

}  // namespace fused
