// Loops of the CPU ops spread over MKL's threads: run through the OpenMP runtime that Paddle's MKL itself
// threads with (Intel's libiomp5, loaded with MKL), so that the loop and MKL's products share one team
// of threads. A second runtime (GCC's libgomp, which -fopenmp would link) would start its own threads, and those
// would compete for the cores with MKL's, which keep spinning a while after each product (KMP_BLOCKTIME).
// Used by rollout_ops.cc (sampling), fused_ops.cc (token log-probs) and session_products.h (panels): each share's
// work is independent of the others' and of the thread that does it, so the results do not depend on the thread
// count.
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/mkl_gemm.h"

namespace mkl_threads {

struct Runtime {
  void (*parallel)(void (*fn)(void*), void* data, unsigned threads, unsigned flags) = nullptr;  // GOMP_parallel
  int (*thread_num)() = nullptr;                                                                // omp_get_thread_num
  int (*team_size)() = nullptr;                                                                 // omp_get_num_threads
};

// The OpenMP runtime that Paddle's MKL (opened first, mkl::Function) was loaded with.
inline const Runtime& Loaded() {
  static const Runtime runtime = [] {
    mkl::MaxThreads();
    mkl::PaddleLibraries found;
    dl_iterate_phdr(mkl::FindPaddleLibraries, &found);
    const std::string& path = found.iomp;
    void* omp = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    PD_CHECK(omp != nullptr, "the CPU ops need the OpenMP runtime of Paddle's MKL (libiomp5.so), not loaded with it");
    Runtime r;
    r.parallel = reinterpret_cast<decltype(r.parallel)>(dlsym(omp, "GOMP_parallel"));
    r.thread_num = reinterpret_cast<decltype(r.thread_num)>(dlsym(omp, "omp_get_thread_num"));
    r.team_size = reinterpret_cast<decltype(r.team_size)>(dlsym(omp, "omp_get_num_threads"));
    PD_CHECK(r.parallel && r.thread_num && r.team_size, "no GOMP_parallel or omp_get_thread_num in ", path);
    return r;
  }();
  return runtime;
}

template <typename Body>
struct Task {
  Body* body;
  int64_t count;
  const Runtime* runtime;
};

template <typename Body>
void RunShare(void* data) {
  const auto* task = static_cast<Task<Body>*>(data);
  const int64_t threads = task->runtime->team_size(), thread = task->runtime->thread_num();
  const int64_t begin = task->count * thread / threads, end = task->count * (thread + 1) / threads;
  if (begin < end) (*task->body)(begin, end);
}

// Work smaller than this many values is not worth a second thread (waking it costs microseconds).
constexpr int64_t kMinShareValues = 1 << 15;

// The fewest rows of `width` values a thread's share may hold.
inline int64_t RowsPerShare(int64_t width) { return std::max<int64_t>(1, kMinShareValues / std::max<int64_t>(width, 1)); }

// body(begin, end) over contiguous shares of [0, count), one share per MKL thread (MKL_NUM_THREADS), at most one per
// `grain` items; on the calling thread alone where Paddle has no MKL. body must not throw: an exception cannot
// leave an OpenMP thread.
template <typename Body>
void ParallelFor(int64_t count, int64_t grain, Body body) {
  const int64_t threads =
      mkl::Available() ? std::min<int64_t>(mkl::MaxThreads(), count / std::max<int64_t>(grain, 1)) : 1;
  if (threads <= 1) {
    if (count > 0) body(0, count);
    return;
  }
  const Runtime& runtime = Loaded();
  Task<Body> task{&body, count, &runtime};
  runtime.parallel(&RunShare<Body>, &task, static_cast<unsigned>(threads), 0);
}

}  // namespace mkl_threads
