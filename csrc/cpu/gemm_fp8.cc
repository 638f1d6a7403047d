// Block-scaled FP8 GEMM on the CPU: the reference for the CUDA kernels.
// Layouts and the accumulation order are documented in include/dsx/gemm_fp8.h.
//
// Work split: the output is cut into tiles of kTileM rows x kTileN columns (kTileN divides
// 128, so a tile never straddles a weight-scale block); OpenMP runs tiles in parallel.
// For each 128-wide K block a tile decodes its A and B slices to fp32 (exact), forms the
// per-block dot products with 16 interleaved lanes, and adds them, scaled, to fp32
// accumulators. The result is rounded once to bf16.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "dsx.h"
#include "numeric.h"

namespace {

using dsx_num::f32_to_bf16_rne;

constexpr int64_t kBlock = 128;  // scale block along K (and along N for the weights)
constexpr int64_t kTileM = 16;
constexpr int64_t kTileN = 64;
constexpr int kLanes = 16;



// Sum of x[i]*y[i], i < len (len <= 128): lane j sums i = j, j+16, ... in order, the 16
// lanes are combined pairwise (j with j+8, then +4, +2, +1). No FMA (-ffp-contract=off).
inline float block_dot(const float* x, const float* y, int64_t len) {
  float lane[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] += x[i + j] * y[i + j];
  }
  for (int j = 0; i + j < len; ++j) lane[j] += x[i + j] * y[i + j];
  for (int w = kLanes / 2; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  }
  return lane[0];
}

// One output tile: rows [m0, m0+tm), columns [n0, n0+tn), all K blocks.
void gemm_tile(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
               uint16_t* out, int64_t n, int64_t k, int64_t m0, int64_t tm, int64_t n0,
               int64_t tn) {
  const int64_t kb_count = (k + kBlock - 1) / kBlock;
  const int64_t nb = n0 / kBlock;
  float af[kTileM][kBlock];
  float bf[kTileN][kBlock];
  float acc[kTileM][kTileN] = {};
  const float* e4m3 = dsx_num::e4m3_table();
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    const int64_t k0 = kb * kBlock;
    const int64_t len = (k - k0 < kBlock) ? k - k0 : kBlock;
    for (int64_t i = 0; i < tm; ++i) {
      const uint8_t* row = a + (m0 + i) * k + k0;
      for (int64_t t = 0; t < len; ++t) af[i][t] = e4m3[row[t]];
    }
    for (int64_t j = 0; j < tn; ++j) {
      const uint8_t* row = b + (n0 + j) * k + k0;
      for (int64_t t = 0; t < len; ++t) bf[j][t] = e4m3[row[t]];
    }
    const float s_b = sb[nb * kb_count + kb];
    for (int64_t i = 0; i < tm; ++i) {
      const float s = sa[(m0 + i) * kb_count + kb] * s_b;
      for (int64_t j = 0; j < tn; ++j) acc[i][j] += block_dot(af[i], bf[j], len) * s;
    }
  }
  for (int64_t i = 0; i < tm; ++i) {
    uint16_t* orow = out + (m0 + i) * n + n0;
    for (int64_t j = 0; j < tn; ++j) orow[j] = f32_to_bf16_rne(acc[i][j]);
  }
}

void gemm_nt(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
             uint16_t* out, int64_t m, int64_t n, int64_t k) {
  const int64_t tiles_m = (m + kTileM - 1) / kTileM;
  const int64_t tiles_n = (n + kTileN - 1) / kTileN;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles_m * tiles_n; ++t) {
    const int64_t m0 = (t / tiles_n) * kTileM, n0 = (t % tiles_n) * kTileN;
    const int64_t tm = (m - m0 < kTileM) ? m - m0 : kTileM;
    const int64_t tn = (n - n0 < kTileN) ? n - n0 : kTileN;
    gemm_tile(a, sa, b, sb, out, n, k, m0, tm, n0, tn);
  }
}

}  // namespace

extern "C" int dsx_gemm_fp8_nt_cpu(const uint8_t* a, const float* sa, const uint8_t* b,
                                   const float* sb, uint16_t* out, int64_t m, int64_t n,
                                   int64_t k) {
  if (m < 0 || n <= 0 || k <= 0) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!a || !sa || !b || !sb || !out) return DSX_EINVAL;
  gemm_nt(a, sa, b, sb, out, m, n, k);
  return DSX_OK;
}

extern "C" int dsx_gemm_fp8_grouped_nt_contiguous_cpu(const uint8_t* a, const float* sa,
                                                      const uint8_t* b, const float* sb,
                                                      const int32_t* offsets,
                                                      int64_t num_experts, uint16_t* out,
                                                      int64_t m, int64_t n, int64_t k) {
  if (num_experts <= 0 || m < 0 || n <= 0 || k <= 0 || !offsets) return DSX_EINVAL;
  if (offsets[0] != 0 || offsets[num_experts] != m) return DSX_EINVAL;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (offsets[e + 1] < offsets[e]) return DSX_EINVAL;
  }
  if (m == 0) return DSX_OK;
  if (!a || !sa || !b || !sb || !out) return DSX_EINVAL;
  const int64_t kb_count = (k + kBlock - 1) / kBlock;
  const int64_t nb_count = (n + kBlock - 1) / kBlock;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    gemm_nt(a + r0 * k, sa + r0 * kb_count, b + e * n * k, sb + e * nb_count * kb_count,
            out + r0 * n, rows, n, k);
  }
  return DSX_OK;
}
