// Matrix products in the MKL that Paddle itself loads (libmklml_intel.so, found among the loaded libraries, or
// beside libphi): its threads (MKL_NUM_THREADS) and its code path (MKL_DEBUG_CPU_TYPE) apply, and no second
// BLAS is linked. Used by decoder_ops.cc and attention_ops.cc.
#pragma once

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "paddle/extension.h"

namespace mkl {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using SgemmFn = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc);
// MKL's group API: group g holds group_size[g] products sharing its shapes, strides and scalars; MKL runs
// the products of a call on its threads, so many small ones (one per row and head) use every core.
using SgemmBatchFn = void (*)(int layout, const int* trans_a, const int* trans_b, const int* m, const int* n,
                              const int* k, const float* alpha, const float** a, const int* lda, const float** b,
                              const int* ldb, const float* beta, float** c, const int* ldc, int group_count,
                              const int* group_size);

struct PaddleLibraries {
  std::string mklml;  // libmklml_intel.so when already loaded
  std::string libs;   // the folder of libphi (where the wheel keeps libmklml_intel.so)
  std::string iomp;   // libiomp5.so, the OpenMP runtime MKL threads with, when already loaded
};

inline int FindPaddleLibraries(dl_phdr_info* info, size_t, void* data) {
  auto* found = static_cast<PaddleLibraries*>(data);
  const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return 0;
  const std::string file = path.substr(slash + 1);
  if (file == "libmklml_intel.so") found->mklml = path;
  if (file == "libiomp5.so") found->iomp = path;
  if (file == "libphi.so" || file == "libphi_core.so") found->libs = path.substr(0, slash);
  return 0;
}

struct OpenedLibrary {
  void* handle;       // nullptr when it could not be opened
  std::string error;  // then, why
};

// Paddle's MKL, the same instance Paddle uses (dlopen of a loaded path returns it); not there on a Paddle build
// without MKL (built with WITH_MKL=OFF, as for ARM CPUs).
inline const OpenedLibrary& PaddleMkl() {
  static const OpenedLibrary mkl = [] {
    PaddleLibraries found;
    dl_iterate_phdr(FindPaddleLibraries, &found);
    const std::string path = !found.mklml.empty() ? found.mklml : found.libs + "/libmklml_intel.so";
    void* opened = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* error = opened == nullptr ? dlerror() : nullptr;
    return OpenedLibrary{opened, path + ": " + (error != nullptr ? error : "not opened")};
  }();
  return mkl;
}

// Whether this Paddle has an MKL: the loops of the ops that need no products (sampling, token log-probs) run on
// its threads where it does, and on the calling thread where it does not (mkl_threads.h).
inline bool Available() { return PaddleMkl().handle != nullptr; }

// A function of Paddle's MKL: the products of the decoder and attention ops need it.
inline void* Function(const char* name) {
  const OpenedLibrary& mkl = PaddleMkl();
  PD_CHECK(mkl.handle != nullptr, "the CPU ops need Paddle's MKL, ", mkl.error);
  void* fn = dlsym(mkl.handle, name);
  PD_CHECK(fn != nullptr, "no ", name, " in Paddle's MKL");
  return fn;
}

inline SgemmFn Sgemm() {
  static const auto sgemm = reinterpret_cast<SgemmFn>(Function("cblas_sgemm"));
  return sgemm;
}

inline SgemmBatchFn SgemmBatch() {
  static const auto sgemm_batch = reinterpret_cast<SgemmBatchFn>(Function("cblas_sgemm_batch"));
  return sgemm_batch;
}

// Products c = alpha op(a) op(b) + beta c, gathered, then run in one batched call (Run), which MKL spreads over
// its threads; consecutive products of one shape and scalars form one group of the call. Products of one call
// must not write the same c.
class GemmBatch {
 public:
  void Add(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    const int ta = trans_a ? kTrans : kNoTrans, tb = trans_b ? kTrans : kNoTrans;
    const bool same = !sizes_.empty() && trans_a_.back() == ta && trans_b_.back() == tb && m_.back() == m &&
                      n_.back() == n && k_.back() == k && alpha_.back() == alpha && lda_.back() == lda &&
                      ldb_.back() == ldb && beta_.back() == beta && ldc_.back() == ldc;
    if (same) {
      ++sizes_.back();
    } else {
      trans_a_.push_back(ta), trans_b_.push_back(tb), m_.push_back(m), n_.push_back(n), k_.push_back(k);
      alpha_.push_back(alpha), lda_.push_back(lda), ldb_.push_back(ldb), beta_.push_back(beta);
      ldc_.push_back(ldc), sizes_.push_back(1);
    }
    a_.push_back(a), b_.push_back(b), c_.push_back(c);
  }

  void Run() {
    if (!sizes_.empty()) {
      SgemmBatch()(kRowMajor, trans_a_.data(), trans_b_.data(), m_.data(), n_.data(), k_.data(), alpha_.data(),
                   a_.data(), lda_.data(), b_.data(), ldb_.data(), beta_.data(), c_.data(), ldc_.data(),
                   static_cast<int>(sizes_.size()), sizes_.data());
    }
    *this = GemmBatch();
  }

 private:
  std::vector<int> trans_a_, trans_b_, m_, n_, k_, lda_, ldb_, ldc_, sizes_;
  std::vector<float> alpha_, beta_;
  std::vector<const float*> a_, b_;
  std::vector<float*> c_;
};

inline int MaxThreads() {
  static const auto max_threads = reinterpret_cast<int (*)()>(Function("MKL_Get_Max_Threads"));
  return max_threads();  // the calling thread's setting (MKL_Set_Num_Threads_Local) when it has one
}

// Products of a few rows (the decode step's: one row per sequence) cut into column slices, one per MKL thread.
// MKL threads one such product poorly: cut into slices run as one batched call (each slice on one thread) it runs
// faster up to a few dozen rows, and no faster at hundreds (csrc/README.md gives the figures). A transposed b (the
// tied LM head) is left whole: MKL threads it well, better than sliced.
constexpr int64_t kSlicedMaxRows = 64;
constexpr int64_t kSliceAlign = 16;  // slice widths in floats: a 64-byte line

// Products of `m` rows each, c = a [m, k] @ b [k, n] + beta * c (rows of b `ldb` floats apart, of c `ldc` apart:
// the columns of a wider matrix, as q, k and v, or gate and up, fill theirs of one output). With few rows their
// column slices, one per MKL thread, run together as one batched call (Run); otherwise each product is one
// threaded call, made when it is added.
class ColumnProducts {
 public:
  explicit ColumnProducts(int64_t m) : m_(m), slices_(m <= kSlicedMaxRows ? MaxThreads() : 1) {}

  void Add(const float* a, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n, int64_t k, float beta) {
    if (slices_ <= 1) {
      Sgemm()(kRowMajor, kNoTrans, kNoTrans, m_, n, k, 1.0f, a, k, b, ldb, beta, c, ldc);
      return;
    }
    const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(slices_, n / kSliceAlign));
    const int64_t width = ((n + slices - 1) / slices + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
    for (int64_t start = 0; start < n; start += width) {
      batch_.Add(false, false, m_, std::min(width, n - start), k, 1.0f, a, k, b + start, ldb, beta, c + start, ldc);
    }
  }

  void Run() { batch_.Run(); }

 private:
  int64_t m_, slices_;
  GemmBatch batch_;
};

// MKL's packed form of a product's b (cblas_sgemm_pack): made once per decode session, then read by every step's
// product of few rows (cblas_sgemm_compute), which MKL runs much closer to its peak than the same product on the
// plain b, sliced or not (csrc/README.md gives the figures). A product of up to kSlicedMaxRows rows may use it,
// whatever row count it was packed for.
constexpr int kPackedMatrix = 151, kPackB = 162;

inline int64_t PackedFloats(int64_t n, int64_t k) {
  using SizeFn = size_t (*)(int identifier, int m, int n, int k);
  static const auto size = reinterpret_cast<SizeFn>(Function("cblas_sgemm_pack_get_size"));
  return (static_cast<int64_t>(size(kPackB, kSlicedMaxRows, n, k)) + 3) / 4;
}

// packed (PackedFloats(n, k) floats) = b [k, n] (rows `ldb` floats apart), or b [n, k] with transpose_b.
inline void PackB(const float* b, int64_t ldb, int64_t n, int64_t k, bool transpose_b, float* packed) {
  using PackFn = void (*)(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                          int ld, float* dest);
  static const auto pack = reinterpret_cast<PackFn>(Function("cblas_sgemm_pack"));
  pack(kRowMajor, kPackB, transpose_b ? kTrans : kNoTrans, kSlicedMaxRows, n, k, 1.0f, b, ldb, packed);
}

// c [m, n] (rows `ldc` floats apart) = a [m, k] @ the packed b + beta * c, on MKL's threads.
inline void PackedMatMul(const float* a, const float* packed, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
                         float beta) {
  using ComputeFn = void (*)(int layout, int trans_a, int trans_b, int m, int n, int k, const float* a, int lda,
                             const float* b, int ldb, float beta, float* c, int ldc);
  static const auto compute = reinterpret_cast<ComputeFn>(Function("cblas_sgemm_compute"));
  compute(kRowMajor, kNoTrans, kPackedMatrix, m, n, k, a, k, packed, n, beta, c, ldc);
}

// c [m, n] = a [m, k] @ b (b [k, n], or [n, k] with transpose_b) + beta * c, row-major, contiguous.
inline void MatMul(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, float beta,
                   bool transpose_b = false) {
  if (transpose_b) {
    Sgemm()(kRowMajor, kNoTrans, kTrans, m, n, k, 1.0f, a, k, b, k, beta, c, n);
  } else {
    ColumnProducts product(m);
    product.Add(a, b, n, c, n, n, k, beta);
    product.Run();
  }
}

}  // namespace mkl
