// The products of a decode session's steps (a few rows of a against the same large b at every step) on a copy of b
// made once per session in one of two forms, chosen when it is made and recorded at its start:
//  - panels, on CPUs with AVX-512: b cut into panels of 16 columns, each panel's k rows of 16 floats contiguous.
//    Each step streams every panel once per 16 rows of a, two panels at a time against up to 16 rows (32 register
//    accumulators, the rows' values broadcast from a transposed copy of a), prefetching 4 KiB ahead, near the
//    memory bandwidth where MKL's packed form is not (csrc/README.md gives the figures);
//  - MKL's packed form (cblas_sgemm_pack / cblas_sgemm_compute) elsewhere, or with
//    PADDLE_ALIGNMENT_PANEL_PRODUCTS=off.
// Used by decoder_ops.cc (native_packed_products and the decode steps that read its buffer).
#pragma once

#include <array>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SESSION_PANELS 1
#endif

#include "common/mkl_gemm.h"
#include "common/mkl_threads.h"

namespace session_products {

enum class Form { kMkl = 1, kPanels = 2 };

constexpr int64_t kLanes = 16;     // columns of b in a panel: one AVX-512 register of floats
constexpr int64_t kRowBlock = 16;  // rows of a against a pair of panels at a time
constexpr int64_t kPrefetch = 64;  // rows of a panel (64 bytes each) the kernel prefetches ahead

inline bool CpuHasPanels() {
#ifdef SESSION_PANELS
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// The form a session packed now takes.
inline Form Chosen() {
  const char* setting = std::getenv("PADDLE_ALIGNMENT_PANEL_PRODUCTS");
  const bool off = setting != nullptr && std::string(setting) == "off";
  return CpuHasPanels() && !off ? Form::kPanels : Form::kMkl;
}

inline int64_t PanelCount(int64_t n) { return (n + kLanes - 1) / kLanes; }

// Floats the packed form of a b [k, n] takes.
inline int64_t Floats(Form form, int64_t n, int64_t k) {
  return form == Form::kPanels ? PanelCount(n) * kLanes * k : mkl::PackedFloats(n, k);
}

// panels[p][i][lane] = b[i][p * 16 + lane] (b [k, n], rows `ldb` floats apart), or b[p * 16 + lane][i] with
// transpose_b (b [n, k]); 0 past column n. Each pass reads whole lines of b: kBlock panels' columns of each row of
// b [k, n] (a 1 KiB run), or a 16 x 16 tile of b [n, k].
inline void PackPanels(const float* b, int64_t ldb, int64_t n, int64_t k, bool transpose_b, float* panels) {
  constexpr int64_t kBlock = 16;  // panels packed together from b [k, n]
  const int64_t count = PanelCount(n);
  mkl_threads::ParallelFor((count + kBlock - 1) / kBlock, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p0 = begin * kBlock; p0 < std::min(count, end * kBlock); p0 += kBlock) {
      const int64_t panels_here = std::min(kBlock, count - p0);
      for (int64_t p = p0; p < p0 + panels_here; ++p) {
        if (n - p * kLanes < kLanes) std::fill_n(panels + p * k * kLanes, k * kLanes, 0.0f);
      }
      if (!transpose_b) {
        for (int64_t i = 0; i < k; ++i) {
          for (int64_t p = p0; p < p0 + panels_here; ++p) {
            const int64_t first = p * kLanes;
            std::copy_n(b + i * ldb + first, std::min(kLanes, n - first), panels + (p * k + i) * kLanes);
          }
        }
        continue;
      }
      for (int64_t p = p0; p < p0 + panels_here; ++p) {
        const int64_t first = p * kLanes, columns = std::min(kLanes, n - first);
        float* panel = panels + p * k * kLanes;
        for (int64_t i0 = 0; i0 < k; i0 += kLanes) {
          const int64_t rows = std::min(kLanes, k - i0);
          for (int64_t lane = 0; lane < columns; ++lane) {
            const float* source = b + (first + lane) * ldb + i0;
            for (int64_t i = 0; i < rows; ++i) panel[(i0 + i) * kLanes + lane] = source[i];
          }
        }
      }
    }
  });
}

inline void Pack(Form form, const float* b, int64_t ldb, int64_t n, int64_t k, bool transpose_b, float* packed) {
  if (form == Form::kPanels) {
    PackPanels(b, ldb, n, k, transpose_b, packed);
  } else {
    mkl::PackB(b, ldb, n, k, transpose_b, packed);
  }
}

#ifdef SESSION_PANELS
// c[r][j * 16 + lane] = sum_i at[i * lda + r] panel_j[i][lane] (+ beta c) for Rows rows and Panels adjacent panels,
// `columns` of their 16 * Panels columns real.
template <int Rows, int Panels>
__attribute__((target("avx512f"))) void PanelBlock(const float* at, int64_t lda, const float* panels, int64_t k,
                                                  float* c, int64_t ldc, int64_t columns, float beta) {
  __m512 acc[Panels][Rows];
  for (int j = 0; j < Panels; ++j)
    for (int r = 0; r < Rows; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    __m512 w[Panels];
    for (int j = 0; j < Panels; ++j) {
      const float* row = panels + (j * k + i) * kLanes;
      _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetch * kLanes), _MM_HINT_T0);
      w[j] = _mm512_loadu_ps(row);
    }
    for (int r = 0; r < Rows; ++r) {
      const __m512 x = _mm512_set1_ps(at[i * lda + r]);
      for (int j = 0; j < Panels; ++j) acc[j][r] = _mm512_fmadd_ps(w[j], x, acc[j][r]);
    }
  }
  for (int j = 0; j < Panels; ++j) {
    const int64_t real = std::max<int64_t>(0, std::min<int64_t>(kLanes, columns - j * kLanes));
    const __mmask16 mask = static_cast<__mmask16>((1u << real) - 1u);
    for (int r = 0; r < Rows; ++r) {
      float* out = c + r * ldc + j * kLanes;
      __m512 value = acc[j][r];
      if (beta != 0.0f) value = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, out), value);
      _mm512_mask_storeu_ps(out, mask, value);
    }
  }
}

using BlockFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, float);

template <int Panels, size_t... Rows>
constexpr std::array<BlockFn, sizeof...(Rows)> BlockTable(std::index_sequence<Rows...>) {
  return {&PanelBlock<static_cast<int>(Rows) + 1, Panels>...};
}

// c [m, n] (rows `ldc` floats apart) = a [m, k] @ b + beta * c, b in panels (PackPanels), on MKL's threads: each
// takes a contiguous share of the pairs of panels.
inline void PanelMatMul(const float* a, const float* panels, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
                        float beta) {
  static const auto pairs_of = BlockTable<2>(std::make_index_sequence<kRowBlock>());
  static const auto singles = BlockTable<1>(std::make_index_sequence<kRowBlock>());
  std::vector<float> at(k * m);  // a transposed: a row block's values of one i share a line
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) at[i * m + r] = a[r * k + i];
  const int64_t count = PanelCount(n);
  mkl_threads::ParallelFor((count + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t first = 2 * pair, columns = n - first * kLanes;
      const auto& table = count - first >= 2 ? pairs_of : singles;
      for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
        table[std::min(kRowBlock, m - r0) - 1](at.data() + r0, m, panels + first * kLanes * k, k,
                                               c + r0 * ldc + first * kLanes, ldc, columns, beta);
      }
    }
  });
}
#endif

// c [m, n] (rows `ldc` floats apart) = a [m, k] @ b + beta * c, b in its packed form `form` (Pack).
inline void MatMul(Form form, const float* a, const float* packed, float* c, int64_t ldc, int64_t m, int64_t n,
                   int64_t k, float beta) {
#ifdef SESSION_PANELS
  if (form == Form::kPanels) return PanelMatMul(a, packed, c, ldc, m, n, k, beta);
#endif
  mkl::PackedMatMul(a, packed, c, ldc, m, n, k, beta);
}

}  // namespace session_products
