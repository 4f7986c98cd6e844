// The CUDA the rollout kernels use, emulated on the CPU, so that ../rollout_kernels.cu runs where no GPU is:
// check_kernels.py --emulate compiles that file with g++ and this folder first on the include path, so
// this header stands in for CUDA's. Every CUDA thread of a block is an OS thread, __syncthreads() a
// std::barrier of the block's threads, and a warp shuffle an exchange between two barriers of the warp's
// threads: a kernel runs as it is written, barriers included, and under ThreadSanitizer (--sanitize thread)
// a missing barrier shows as the race it lets through. A launch's threads run its blocks one after the
// other, so `__shared__` arrays are plain statics. Only what the kernels use is here; y and z of the indices
// are never set (the kernels use x alone).
//
// Why not a library: hipCPU and cuda4cpu do this job, but neither is on PyPI or in Debian, the only
// package sources this project's machines reach.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__ inline
#define __host__
#define __forceinline__
#define __launch_bounds__(threads)
#define __shared__ static

using cudaStream_t = void*;

// A launch's outcome, as CUDA reports it: the last error, cleared when read.
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9 };
inline thread_local cudaError_t last_launch_error = cudaSuccess;

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = last_launch_error;
  last_launch_error = cudaSuccess;
  return error;
}

inline const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "invalid configuration argument";
}

struct alignas(16) float4 {
  float x, y, z, w;
};

namespace cuda_emulation {

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;  // a block's, on every GPU CUDA supports

// What a thread of a running block shares with the others: its barrier, __syncthreads_or's vote, and its
// warp's barrier and the values its warp's lanes exchange in a shuffle.
struct Block {
  explicit Block(int threads) : barrier(threads), exchange(threads) {
    for (int first = 0; first < threads; first += kWarpSize) {
      warps.push_back(std::make_unique<std::barrier<>>(std::min(kWarpSize, threads - first)));
    }
  }
  std::barrier<> barrier;
  std::atomic<int> vote{0};
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> exchange;
};

inline thread_local Block* current_block = nullptr;

}  // namespace cuda_emulation

inline thread_local cuda_emulation::Dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { cuda_emulation::current_block->barrier.arrive_and_wait(); }

// Non-zero when `predicate` is non-zero on any thread of the block; a barrier too. The vote is cleared
// behind a third barrier, after every thread has read it and before any can vote again.
inline int __syncthreads_or(int predicate) {
  cuda_emulation::Block& block = *cuda_emulation::current_block;
  if (predicate) block.vote.store(1);
  block.barrier.arrive_and_wait();
  const int any = block.vote.load();
  block.barrier.arrive_and_wait();
  if (threadIdx.x == 0) block.vote.store(0);
  block.barrier.arrive_and_wait();
  return any;
}

namespace cuda_emulation {

// A warp shuffle: every lane of the warp writes `value`, meets the others at the warp's barrier, reads the
// value of its warp's lane `source` (its own where there is no such lane), and meets them again before any
// lane writes anew.
template <typename T>
T Shuffle(T value, unsigned int source) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
  Block& block = *current_block;
  std::barrier<>& warp = *block.warps[threadIdx.x / kWarpSize];
  std::memcpy(&block.exchange[threadIdx.x], &value, sizeof value);
  warp.arrive_and_wait();
  if (source < static_cast<unsigned int>(kWarpSize)) {
    std::memcpy(&value, &block.exchange[threadIdx.x - threadIdx.x % kWarpSize + source], sizeof value);
  }
  warp.arrive_and_wait();
  return value;
}

}  // namespace cuda_emulation

// (The mask is every lane, as the kernels pass it.)
template <typename T>
T __shfl_xor_sync(unsigned int /*mask*/, T value, int lane_mask) {
  return cuda_emulation::Shuffle(value, threadIdx.x % cuda_emulation::kWarpSize ^ static_cast<unsigned int>(lane_mask));
}

template <typename T>
T __shfl_down_sync(unsigned int /*mask*/, T value, unsigned int delta) {
  return cuda_emulation::Shuffle(value, threadIdx.x % cuda_emulation::kWarpSize + delta);
}

inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}

inline int atomicAdd(int32_t* address, int32_t value) {
  return std::atomic_ref<int32_t>(*address).fetch_add(value);
}

inline float __int_as_float(int bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline unsigned int __float_as_uint(float value) {
  unsigned int bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

namespace cuda_emulation {

// kernel<<<blocks, threads>>>(args...) on the CPU: `threads` OS threads run the blocks one after the other,
// all of them one block before any the next. A thread that leaves the kernel drops out of its block's
// barrier, as a GPU's exited threads stop counting at __syncthreads(). A configuration a GPU refuses (more
// than 1,024 threads a block, no block) runs nothing and leaves the error for cudaGetLastError().
template <typename... Params>
auto Launch(void (*kernel)(Params...), int64_t blocks, int threads) {
  return [=](auto... args) {
    if (threads < 1 || threads > kMaxThreads || blocks < 1) {  // as a GPU refuses it: nothing runs
      last_launch_error = cudaErrorInvalidConfiguration;
      return;
    }
    std::vector<std::unique_ptr<Block>> grid;
    for (int64_t b = 0; b < blocks; ++b) grid.push_back(std::make_unique<Block>(threads));
    std::barrier<> block_done(threads);
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        threadIdx.x = t, blockDim.x = threads, gridDim.x = static_cast<unsigned int>(blocks);
        for (int64_t b = 0; b < blocks; ++b) {
          current_block = grid[b].get();
          blockIdx.x = static_cast<unsigned int>(b);
          kernel(args...);
          current_block->barrier.arrive_and_drop();
          current_block->warps[t / kWarpSize]->arrive_and_drop();
          block_done.arrive_and_wait();
        }
      });
    }
    for (std::thread& worker : workers) worker.join();
  };
}

}  // namespace cuda_emulation

#define ROLLOUT_LAUNCH(kernel, blocks, threads, stream) cuda_emulation::Launch(kernel, blocks, threads)
