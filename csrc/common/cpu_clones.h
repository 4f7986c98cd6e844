// FUSED_CPU_CLONES: with GCC on x86-64, a function so marked is also compiled for x86-64-v3 (AVX2 + FMA)
// and the loader picks that clone on CPUs that have it (target_clones); elsewhere the baseline clone runs.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(FUSED_OPS_NO_CLONES)
#define FUSED_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FUSED_CPU_CLONES
#endif
