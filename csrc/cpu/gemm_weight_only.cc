// Weight-only GEMM on the CPU (bf16 x Paddle INT8/INT4): the reference for the CUDA kernel.
// Layouts and the accumulation order: include/dsx/gemm_weight_only.h.
//
// Reading Paddle's bytes: this file uses the closed form of docs/format-weight-only.md,
// section 4, in the forward direction (element (n, k) -> byte / nibble), derived here on
// its own rather than shared with the quantizer (csrc/cpu/quant_weight_only.cc builds the
// inverse table), so a layout slip in either one is caught by the tests.
//
// Work split: OpenMP over tiles of kTileN = 16 output channels (a multiple of the tile
// interleave 2 / 4); inside a tile, K is walked in blocks of kBlockK: the tile's weights
// for the block are dequantized once to fp32 and reused for every row of x. Each output
// (m, n) is computed by one thread in a fixed order, so results do not depend on the
// thread count or the schedule.
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "dsx.h"
#include "numeric.h"

namespace {

using dsx_num::bf16_to_f32;
using dsx_num::f32_to_bf16_rne;

constexpr int64_t kTileN = 16;
constexpr int64_t kTileK = 64;    // Paddle's tile along K
constexpr int64_t kBlockK = 512;  // K elements dequantized at once per channel tile
constexpr int kLanes = 8;

// slot[b][kk]: position, inside its channel's 64-element segment of K tile kt, of the
// element with k = 64 * kt + kk (b = 0: int8, b = 1: int4). Closed form (doc section 4):
//   t = f^-1(kk mod G), k' = G * floor(kk / G) + t, F = E * floor(k' / E) + order^-1(k' mod E)
// with f(t) = 8 * floor((t mod E) / 2) + (t mod 2) + 2 * floor(t / E), E = 32 / bits,
// G = 128 / bits, order(d) = 2d (d < E/2) else 2(d - E/2) + 1.
struct SlotTable {
  uint8_t slot[2][kTileK];
  SlotTable() {
    for (int b = 0; b < 2; ++b) {
      const int bits = b ? 4 : 8, e = 32 / bits, g = 128 / bits;
      int finv[32], oinv[8];
      for (int t = 0; t < g; ++t) finv[8 * ((t % e) / 2) + t % 2 + 2 * (t / e)] = t;
      for (int d = 0; d < e; ++d) oinv[d < e / 2 ? 2 * d : 2 * (d - e / 2) + 1] = d;
      for (int kk = 0; kk < kTileK; ++kk) {
        const int kp = g * (kk / g) + finv[kk % g];
        slot[b][kk] = static_cast<uint8_t>(e * (kp / e) + oinv[kp % e]);
      }
    }
  }
};
const SlotTable kSlots;

#ifdef __AVX2__
// The same table as byte shuffles. int8: the permutation stays inside blocks of 16 (G),
// so one pshufb per 16 bytes puts a block in k order. int4: a 16-byte block holds 32 K
// values; its low nibbles carry k in [0, 8) and [16, 24), its high nibbles k in [8, 16)
// and [24, 32) (same byte as k - 8), so one mask picks both halves. `ok` is false if the
// table lacks that structure (then the scalar path runs; the tests compare both).
struct ShuffleMasks {
  alignas(16) uint8_t m8[16], m4[16];
  bool ok = true;
  ShuffleMasks() {
    const uint8_t* s8 = kSlots.slot[0];
    const uint8_t* s4 = kSlots.slot[1];
    for (int j = 0; j < 16; ++j) {
      m8[j] = s8[j];
      for (int b = 1; b < 4; ++b) ok = ok && s8[16 * b + j] == s8[j] + 16 * b;
      const int kk = j < 8 ? j : j + 8;  // k of the low nibble this lane takes
      m4[j] = static_cast<uint8_t>(s4[kk] / 2);
      ok = ok && s4[kk] % 2 == 0 && s4[kk + 8] == s4[kk] + 1 && s4[kk + 32] == s4[kk] + 32;
    }
  }
};
const ShuffleMasks kMasks;

// dst[0..16) = float(q[0..16)) * s, q signed bytes.
inline void store16(float* dst, __m128i q, __m256 s) {
  const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
  _mm256_storeu_ps(dst, _mm256_mul_ps(lo, s));
  _mm256_storeu_ps(dst + 8, _mm256_mul_ps(hi, s));
}

// One channel's 64-element segment (int8: 64 bytes, int4: 32 bytes) -> 64 floats in k order.
inline void dequant_segment_avx2(const uint8_t* b, int bits, float s, float* dst) {
  const __m256 sv = _mm256_set1_ps(s);
  if (bits == 8) {
    const __m128i m = _mm_load_si128(reinterpret_cast<const __m128i*>(kMasks.m8));
    for (int i = 0; i < 4; ++i) {
      const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i)), m);
      store16(dst + 16 * i, _mm_xor_si128(v, _mm_set1_epi8(static_cast<char>(0x80))), sv);  // u - 128
    }
    return;
  }
  const __m128i m = _mm_load_si128(reinterpret_cast<const __m128i*>(kMasks.m4));
  const __m128i nib = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int i = 0; i < 2; ++i) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * i));
    const __m128i lo = _mm_shuffle_epi8(_mm_and_si128(v, nib), m);
    const __m128i hi = _mm_shuffle_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), nib), m);
    store16(dst + 32 * i, _mm_sub_epi8(_mm_unpacklo_epi64(lo, hi), eight), sv);
    store16(dst + 32 * i + 16, _mm_sub_epi8(_mm_unpackhi_epi64(lo, hi), eight), sv);
  }
}
#endif

struct Problem {
  const float* x;        // fp32 copy of x, [M, K]
  const uint8_t* q;      // Paddle's bytes
  const uint16_t* scale; // bf16 [N] or [ceil(K/g), N]
  uint16_t* out;
  int64_t m, n, k;
  int bits, group;
  bool simd;  // use the AVX2 unpack (false: the scalar one; both give the same floats)
};

// One channel's 64-element segment (int8: 64 bytes, int4: 32 bytes) -> 64 floats in k order.
inline void dequant_segment_scalar(const uint8_t* b, int bits, float s, float* dst) {
  const uint8_t* slot = kSlots.slot[bits == 4];
  for (int kk = 0; kk < kTileK; ++kk) {
    const int e = slot[kk];
    // int4: even element = low nibble
    const int q = bits == 8 ? static_cast<int>(b[e]) - 128 : ((b[e >> 1] >> (4 * (e & 1))) & 0xF) - 8;
    dst[kk] = static_cast<float>(q) * s;
  }
}

// Whether the AVX2 unpack is usable: its masks have the expected structure and it gives
// the scalar unpack's floats on every byte value (checked once).
bool simd_ok() {
#ifdef __AVX2__
  static const bool ok = [] {
    if (!kMasks.ok) return false;
    uint8_t b[64];
    float x[64], y[64];
    for (int rep = 0; rep < 4; ++rep) {
      for (int i = 0; i < 64; ++i) b[i] = static_cast<uint8_t>((64 * rep + i) * 167);  // all 256 values, scattered
      for (int bits = 4; bits <= 8; bits += 4) {
        dequant_segment_scalar(b, bits, 0.5f, x);
        dequant_segment_avx2(b, bits, 0.5f, y);
        if (std::memcmp(x, y, sizeof x) != 0) return false;
      }
    }
    return true;
  }();
  return ok;
#else
  return false;
#endif
}

// Dequantize channels [n0, n0 + kTileN) x K range [k0, k0 + len) into w[kTileN][kBlockK].
void dequant_tile(const Problem& p, int64_t n0, int64_t k0, int64_t len, float* w) {
  const int il = p.bits == 8 ? 2 : 4;  // channels per column-major tile (interleave)
  for (int64_t i = 0; i < kTileN; ++i) {
    const int64_t n = n0 + i;
    // element index of (n, k) = (n / il) * il * K + kt * 64 * il + (n % il) * 64 + slot
    const int64_t chan_base = (n / il) * il * p.k + (n % il) * kTileK;
    for (int64_t kt = k0 / kTileK; kt < (k0 + len) / kTileK; ++kt) {
      const int64_t seg = chan_base + kt * kTileK * il;  // even, so int4 starts on a byte
      const float s = bf16_to_f32(p.group < 0 ? p.scale[n] : p.scale[(kt * kTileK / p.group) * p.n + n]);
      float* dst = w + i * kBlockK + (kt * kTileK - k0);
      const uint8_t* b = p.q + seg * p.bits / 8;
#ifdef __AVX2__
      if (p.simd) {
        dequant_segment_avx2(b, p.bits, s, dst);
        continue;
      }
#endif
      dequant_segment_scalar(b, p.bits, s, dst);
    }
  }
}

// acc[r][c][lane] += sum over this block: RM rows of x x RC channels, 8 lanes each.
template <int RM, int RC>
inline void micro(const float* const* xr, const float* const* wr, int64_t len, float* const* acc) {
#ifdef __AVX2__
  __m256 a[RM][RC];
  for (int r = 0; r < RM; ++r)
    for (int c = 0; c < RC; ++c) a[r][c] = _mm256_loadu_ps(acc[r * RC + c]);
  for (int64_t i = 0; i < len; i += kLanes) {
    __m256 xv[RM];
    for (int r = 0; r < RM; ++r) xv[r] = _mm256_loadu_ps(xr[r] + i);
    for (int c = 0; c < RC; ++c) {
      const __m256 wv = _mm256_loadu_ps(wr[c] + i);
      for (int r = 0; r < RM; ++r) a[r][c] = _mm256_add_ps(a[r][c], _mm256_mul_ps(xv[r], wv));
    }
  }
  for (int r = 0; r < RM; ++r)
    for (int c = 0; c < RC; ++c) _mm256_storeu_ps(acc[r * RC + c], a[r][c]);
#else
  for (int r = 0; r < RM; ++r)
    for (int c = 0; c < RC; ++c) {
      float* l = acc[r * RC + c];
      for (int64_t i = 0; i < len; i += kLanes)
        for (int j = 0; j < kLanes; ++j) l[j] += xr[r][i + j] * wr[c][i + j];
    }
#endif
}

// One channel tile: all rows of x, all of K. acc: [M][kTileN][kLanes] scratch.
void gemm_tile(const Problem& p, int64_t n0, float* w, float* acc) {
  std::memset(acc, 0, sizeof(float) * p.m * kTileN * kLanes);
  for (int64_t k0 = 0; k0 < p.k; k0 += kBlockK) {
    const int64_t len = p.k - k0 < kBlockK ? p.k - k0 : kBlockK;  // a multiple of 64
    dequant_tile(p, n0, k0, len, w);
    for (int64_t m = 0; m < p.m; m += 2) {
      const int rm = p.m - m >= 2 ? 2 : 1;
      for (int64_t c = 0; c < kTileN; c += 4) {
        const float* xr[2] = {p.x + m * p.k + k0, p.x + (m + rm - 1) * p.k + k0};
        const float* wr[4];
        float* ar[8];
        for (int j = 0; j < 4; ++j) {
          wr[j] = w + (c + j) * kBlockK;
          for (int r = 0; r < rm; ++r) ar[r * 4 + j] = acc + ((m + r) * kTileN + c + j) * kLanes;
        }
        if (rm == 2) {
          micro<2, 4>(xr, wr, len, ar);
        } else {
          micro<1, 4>(xr, wr, len, ar);
        }
      }
    }
  }
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t c = 0; c < kTileN; ++c) {
      const float* l = acc + (m * kTileN + c) * kLanes;
      const float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
      p.out[m * p.n + n0 + c] = f32_to_bf16_rne(sum);
    }
  }
}

bool valid_args(int64_t m, int64_t n, int64_t k, int bits, int group, int arch) {
  if (bits != 4 && bits != 8) return false;
  if (group != -1 && group != 64 && group != 128) return false;
  if (arch != 75 && arch != 80 && arch != 86 && arch != 89 && arch != 90 && arch != 100) return false;
  return m >= 0 && n > 0 && k > 0 && n % 64 == 0 && k % 64 == 0;
}

}  // namespace

extern "C" int dsx_wo_gemm_bf16_nt_cpu(const uint16_t* x, const int8_t* qweight,
                                       const uint16_t* scale, uint16_t* out, int64_t m,
                                       int64_t n, int64_t k, int bits, int group_size, int arch,
                                       int num_threads) {
  if (!valid_args(m, n, k, bits, group_size, arch) || num_threads < 0) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!x || !qweight || !scale || !out) return DSX_EINVAL;
  float* x32 = static_cast<float*>(std::malloc(sizeof(float) * m * k));
  if (!x32) return DSX_ENOMEM;
  const int nt = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t i = 0; i < m * k; ++i) x32[i] = bf16_to_f32(x[i]);

  const Problem p{x32, reinterpret_cast<const uint8_t*>(qweight), scale, out, m, n, k, bits, group_size,
                  simd_ok() && dsx_num::simd_on()};
  const int64_t tiles = n / kTileN;
  int failed = 0;
#pragma omp parallel num_threads(nt)
  {
    float* w = static_cast<float*>(std::malloc(sizeof(float) * kTileN * kBlockK));
    float* acc = static_cast<float*>(std::malloc(sizeof(float) * m * kTileN * kLanes));
    if (!w || !acc) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp barrier
    int stop;
#pragma omp atomic read
    stop = failed;
    if (!stop) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < tiles; ++t) gemm_tile(p, t * kTileN, w, acc);
    }
    std::free(w);
    std::free(acc);
  }
  std::free(x32);
  return failed ? DSX_ENOMEM : DSX_OK;
}
