// Block-scaled FP8 GEMM on the CPU: the reference for the CUDA kernels.
// Layouts and the accumulation order are documented in include/dsx/gemm_fp8.h.
//
// Work split: the output is cut into tiles of kTileM rows x kTileN columns (kTileN divides
// 128, so a tile never straddles a weight-scale block); OpenMP runs tiles in parallel.
// For each 128-wide K block a tile decodes its A and B slices to fp32 (exact), forms the
// per-block dot products with 16 interleaved lanes, and adds them, scaled, to fp32
// accumulators. The result is rounded once to bf16.
//
// Two paths give the same bits (tests/test_kernels_cpu.py compares both with a float32 numpy
// emulation of the order): the scalar one (a table lookup per code, one dot product at a time,
// its 16 lanes in a loop), and with AVX2 (dsx_cpu_simd on, the default) one that decodes eight
// codes at a time with integer ops, prefetches each row's next block, and forms 2 x 4 dot products
// together, each dot's 16 lanes as two 8-wide registers: the same products added to the same lanes
// in the same order, combined by the same tree. The scalar path was bound by the decode and the
// loads of its 80 rows a block at small M and by the add latency of one dot's two lane chains at
// large M; the AVX2 one is 2-5x faster (forty-sixth session, `bench/cpu_kernels.py`).
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#ifdef __AVX2__
#include <immintrin.h>
#endif

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

// One output tile: rows [m0, m0+tm), columns [n0, n0+tn), all K blocks (the scalar path).
void gemm_tile_scalar(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, uint16_t* out, int64_t n,
                      int64_t k, int64_t m0, int64_t tm, int64_t n0, int64_t tn) {
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

#ifdef __AVX2__
// Eight e4m3 codes -> their floats, bit for bit e4m3_to_f32's: normal codes by moving the exponent and
// mantissa bits into place (bias 7 -> 127), subnormal ones as m * 2^-9 (an exact product of normal
// floats, so no denormal flag can change it), 0x7F / 0xFF the quiet NaN; then the sign.
inline __m256 e4m3x8(const uint8_t* p) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(1.0f / 512.0f));
  __m256i bits = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub), _mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7FC00000), _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

// One row's K block (len <= 128 codes) -> dst[0, 128): decoded, zeros past len. A zero lane adds +0
// to a lane sum, which leaves it as it was: the lanes start at +0 and a sum of them is never -0.
inline void decode_block(const uint8_t* src, int64_t len, const float* table, float* dst, bool more) {
  if (more) {  // (the row's next block: a tile reads its 80 rows a block at a time, more streams than the
               // hardware prefetchers follow)
    _mm_prefetch(reinterpret_cast<const char*>(src + kBlock), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(src + kBlock + 64), _MM_HINT_T0);
  }
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) _mm256_storeu_ps(dst + t, e4m3x8(src + t));
  for (; t < len; ++t) dst[t] = table[src[t]];
  for (; t < kBlock; ++t) dst[t] = 0.0f;
}

// The lane tree of block_dot: lane j + lane j+8, then +4, +2, +1 (lo holds lanes 0..7, hi 8..15).
inline float lane_tree(__m256 lo, __m256 hi) {
  const __m256 v = _mm256_add_ps(lo, hi);
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// block_dot of RM rows of A with RC rows of B over a full (zero-padded) block: dot[r * RC + c].
template <int RM, int RC>
inline void block_dots(const float* const* x, const float* const* y, float* dot) {
  __m256 lo[RM][RC], hi[RM][RC];
  for (int r = 0; r < RM; ++r)
    for (int c = 0; c < RC; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
#pragma GCC unroll 1
  for (int i = 0; i < kBlock; i += kLanes) {
    __m256 xl[RM], xh[RM];
    for (int r = 0; r < RM; ++r) xl[r] = _mm256_loadu_ps(x[r] + i), xh[r] = _mm256_loadu_ps(x[r] + i + 8);
    for (int c = 0; c < RC; ++c) {
      const __m256 yl = _mm256_loadu_ps(y[c] + i), yh = _mm256_loadu_ps(y[c] + i + 8);
      for (int r = 0; r < RM; ++r) {
        lo[r][c] = _mm256_add_ps(lo[r][c], _mm256_mul_ps(xl[r], yl));
        hi[r][c] = _mm256_add_ps(hi[r][c], _mm256_mul_ps(xh[r], yh));
      }
    }
  }
  for (int r = 0; r < RM; ++r)
    for (int c = 0; c < RC; ++c) dot[r * RC + c] = lane_tree(lo[r][c], hi[r][c]);
}

constexpr int kCols = 4;  // B rows a dot block takes at once, with 2 of A: 16 accumulators

void dots(int rm, int rc, const float* const* x, const float* const* y, float* dot) {
  switch (rm * 8 + rc) {
#define DSX_DOTS(R, C) \
  case R * 8 + C:      \
    return block_dots<R, C>(x, y, dot);
    DSX_DOTS(2, 1) DSX_DOTS(2, 2) DSX_DOTS(2, 3) DSX_DOTS(2, 4)
    DSX_DOTS(1, 1) DSX_DOTS(1, 2) DSX_DOTS(1, 3) DSX_DOTS(1, 4)
#undef DSX_DOTS
  }
}

// The tile of gemm_tile_scalar, on AVX2 (the same bits).
void gemm_tile_avx2(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, uint16_t* out, int64_t n,
                    int64_t k, int64_t m0, int64_t tm, int64_t n0, int64_t tn) {
  const int64_t kb_count = (k + kBlock - 1) / kBlock;
  const int64_t nb = n0 / kBlock;
  alignas(32) float af[kTileM][kBlock];
  alignas(32) float bf[kTileN][kBlock];
  float acc[kTileM][kTileN] = {};
  const float* e4m3 = dsx_num::e4m3_table();
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    const int64_t k0 = kb * kBlock;
    const int64_t len = (k - k0 < kBlock) ? k - k0 : kBlock;
    const bool more = kb + 1 < kb_count;
    for (int64_t i = 0; i < tm; ++i) decode_block(a + (m0 + i) * k + k0, len, e4m3, af[i], more);
    for (int64_t j = 0; j < tn; ++j) decode_block(b + (n0 + j) * k + k0, len, e4m3, bf[j], more);
    const float s_b = sb[nb * kb_count + kb];
    float s[kTileM];
    for (int64_t i = 0; i < tm; ++i) s[i] = sa[(m0 + i) * kb_count + kb] * s_b;
    for (int64_t j = 0; j < tn; j += kCols) {  // (B's rows outer: A's, 8 KB, stay in L1 as they are read again)
      const int rc = tn - j >= kCols ? kCols : static_cast<int>(tn - j);
      const float* y[kCols];
      for (int c = 0; c < kCols; ++c) y[c] = bf[j + (c < rc ? c : rc - 1)];
      for (int64_t i = 0; i < tm; i += 2) {
        const int rm = tm - i >= 2 ? 2 : 1;
        const float* x[2] = {af[i], af[i + rm - 1]};
        float dot[2 * kCols];
        dots(rm, rc, x, y, dot);
        for (int r = 0; r < rm; ++r)
          for (int c = 0; c < rc; ++c) acc[i + r][j + c] += dot[r * rc + c] * s[i + r];
      }
    }
  }
  for (int64_t i = 0; i < tm; ++i) {
    uint16_t* orow = out + (m0 + i) * n + n0;
    for (int64_t j = 0; j < tn; ++j) orow[j] = f32_to_bf16_rne(acc[i][j]);
  }
}

// Whether the AVX2 decode gives the table's bits on all 256 codes (checked once; else the scalar path).
bool decode_ok() {
  static const bool ok = [] {
    alignas(32) uint8_t codes[256];
    alignas(32) float got[256];
    for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
    for (int c = 0; c < 256; c += 8) _mm256_storeu_ps(got + c, e4m3x8(codes + c));
    return std::memcmp(got, dsx_num::e4m3_table(), sizeof got) == 0;
  }();
  return ok;
}
#endif

void gemm_tile(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, uint16_t* out, int64_t n,
               int64_t k, int64_t m0, int64_t tm, int64_t n0, int64_t tn, bool simd) {
#ifdef __AVX2__
  if (simd) return gemm_tile_avx2(a, sa, b, sb, out, n, k, m0, tm, n0, tn);
#else
  (void)simd;
#endif
  gemm_tile_scalar(a, sa, b, sb, out, n, k, m0, tm, n0, tn);
}

void gemm_nt(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
             uint16_t* out, int64_t m, int64_t n, int64_t k) {
  const int64_t tiles_m = (m + kTileM - 1) / kTileM;
  const int64_t tiles_n = (n + kTileN - 1) / kTileN;
#ifdef __AVX2__
  const bool simd = dsx_num::simd_on() && decode_ok();
#else
  const bool simd = false;
#endif
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles_m * tiles_n; ++t) {
    const int64_t m0 = (t / tiles_n) * kTileM, n0 = (t % tiles_n) * kTileN;
    const int64_t tm = (m - m0 < kTileM) ? m - m0 : kTileM;
    const int64_t tn = (n - n0 < kTileN) ? n - n0 : kTileN;
    gemm_tile(a, sa, b, sb, out, n, k, m0, tm, n0, tn, simd);
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
