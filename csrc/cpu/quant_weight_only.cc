// Weight-only INT8 / INT4 quantizer in Paddle's `weight_quantize` CPU layout.
//
// Byte-identical with Paddle 3.3.1's CPU op and with the numpy reference in
// ds_export/formats/weight_only.py; the layout is specified in
// docs/format-weight-only.md. The reference follows Paddle's steps (row
// permutation, transpose, tile interleave, bias + in-word interleave) one by
// one; this file instead derives, for one 64-element K tile, a gather table
// (output slot -> source k) from the same formulas, and writes every output
// byte exactly once, one output channel (a contiguous HF row) at a time.
//
// Work unit: a block of DSX_WO_ROW_ALIGN (8) output channels. Blocks are
// independent (8 is a multiple of the tile interleave 2 / 4 and of the
// 32-bit word of arch 70), so OpenMP splits the block range statically.

#include <math.h>

#include <algorithm>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "dsx.h"
#include "numeric.h"

#include <algorithm>

namespace {

using dsx_num::bf16_to_f32;
using dsx_num::e4m3_to_f32;

constexpr int kTileK = 64;
constexpr int kBlock = DSX_WO_ROW_ALIGN;

// Paddle's float -> bfloat16 on CPU: round to nearest even; zeros keep their
// sign, infinities stay, NaN becomes 0x7FFF; subnormals round like normals.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(u >> 16);
  if ((u & 0x7F800000u) == 0x7F800000u) return (u & 0x007FFFFFu) ? 0x7FFF : static_cast<uint16_t>(u >> 16);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Largest |x| of a span, as bf16 bits (ordering of bits & 0x7FFF equals the
// ordering of |x| for finite values; >= 0x7F80 means Inf or NaN present).
inline uint16_t absmax_bits(const uint16_t* x, int64_t len) {
  uint16_t m = 0;
  for (int64_t i = 0; i < len; ++i) {
    const uint16_t a = x[i] & 0x7FFF;
    m = a > m ? a : m;
  }
  return m;
}

// q = clip(round_half_away(x / s)) with Paddle's outcomes when x / s is NaN
// or +-Inf (only possible when the scale is 0): int8 -> 127 for NaN, +-127 for
// +-Inf (std::min(127, NaN) keeps 127); int4 -> -7 (Paddle casts to int before
// clipping, and x86 turns NaN / Inf / |v| >= 2^31 into INT_MIN).
// Rounding without roundf: t = trunc(v) by float->int conversion, then one
// step away from zero when |v - t| >= 0.5 (v - t is exact).
template <int BITS>
inline int8_t quantize_one(float v) {
  constexpr int lim = BITS == 8 ? 127 : 7;
  const bool ok = fabsf(v) < 2147483648.0f;  // false for NaN too
  const float vc = ok ? v : 0.0f;
  const int t = static_cast<int>(vc);
  const float frac = vc - static_cast<float>(t);
  int r = t + (frac >= 0.5f) - (frac <= -0.5f);
  r = r < lim ? r : lim;
  r = r > -lim ? r : -lim;
  const int special = BITS == 8 ? (v < 0.0f ? -127 : 127) : -7;
  return static_cast<int8_t>(ok ? r : special);
}

#ifdef __AVX2__
// Eight lanes of quantize_one: same operations, same results.
template <int BITS>
inline __m256i quantize8(const uint16_t* x, __m256 s) {
  const __m256i lim = _mm256_set1_epi32(BITS == 8 ? 127 : 7);
  const __m256i nlim = _mm256_set1_epi32(BITS == 8 ? -127 : -7);
  const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))), 16);
  const __m256 v = _mm256_div_ps(_mm256_castsi256_ps(wide), s);
  const __m256 av = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  const __m256 ok = _mm256_cmp_ps(av, _mm256_set1_ps(2147483648.0f), _CMP_LT_OQ);
  const __m256 vc = _mm256_and_ps(v, ok);
  const __m256i t = _mm256_cvttps_epi32(vc);
  const __m256 frac = _mm256_sub_ps(vc, _mm256_cvtepi32_ps(t));
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
  const __m256i dn = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ));
  __m256i r = _mm256_add_epi32(_mm256_sub_epi32(t, up), dn);
  r = _mm256_max_epi32(_mm256_min_epi32(r, lim), nlim);
  __m256i special = _mm256_set1_epi32(-7);
  if (BITS == 8) {
    const __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
    special = _mm256_blendv_epi8(lim, nlim, _mm256_castps_si256(neg));
  }
  return _mm256_blendv_epi8(special, r, _mm256_castps_si256(ok));
}
#endif

template <int BITS>
void quantize_span(const uint16_t* x, int64_t len, float s, int8_t* q) {
  int64_t i = 0;
#ifdef __AVX2__
  const __m256 sv = _mm256_set1_ps(s);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 32 <= len; i += 32) {
    const __m256i a = quantize8<BITS>(x + i, sv), b = quantize8<BITS>(x + i + 8, sv);
    const __m256i c = quantize8<BITS>(x + i + 16, sv), d = quantize8<BITS>(x + i + 24, sv);
    // values fit in int8, so the saturating packs are exact; fix the lane order
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), _mm256_permutevar8x32_epi32(bytes, order));
  }
#endif
  for (; i < len; ++i) q[i] = quantize_one<BITS>(bf16_to_f32(x[i]) / s);
}

struct Spec {
  int bits, group_size, arch;
  int64_t n, k;
  int elts_per_word;   // E = 32 / bits
  int interleave;      // I = 2 (int8) or 4 (int4) channels per column tile
  uint8_t src[kTileK]; // arch >= 75: output slot p of a 64-slot segment <- tile element src[p]
  // src only moves elements inside blocks of 128/bits (16 int8 / 32 int4), so
  // a 64-tile is 4 (int8) or 2 (int4) repeats of one byte shuffle:
  uint8_t shuf8[16];      // int8: out[b] = in16[shuf8[b]]
  uint8_t shuf4[4][16];   // int4: low / high nibble of out byte b from the first (0x80 = none)
                          // or second 16 bytes: [lo_a, lo_b, hi_a, hi_b]
  // Chunk-local outputs (dsx_wo_quantize_bf16_rowmajor_nk_rows): the output buffer starts at
  // element out_off of the full layout, the scale buffer at channel scale_r0 with row stride scale_ld.
  int64_t out_off = 0, scale_r0 = 0, scale_ld = 0;
};

// In-word interleave: destination slot d holds pre-interleave element order(d)
// (int8: 0 2 1 3; int4: 0 2 4 6 1 3 5 7).
inline int word_order(int d, int e) { return d < e / 2 ? 2 * d : 2 * (d - e / 2) + 1; }

void build_spec(Spec* sp, int64_t n, int64_t k, int bits, int group_size, int arch) {
  sp->bits = bits;
  sp->group_size = group_size;
  sp->arch = arch;
  sp->n = n;
  sp->k = k;
  sp->out_off = 0;
  sp->scale_r0 = 0;
  sp->scale_ld = n;
  const int e = 32 / bits, g = 128 / bits;
  sp->elts_per_word = e;
  sp->interleave = bits == 8 ? 2 : 4;
  for (int p = 0; p < kTileK; ++p) {
    const int pre = (p / e) * e + word_order(p % e, e);  // undo the in-word interleave
    const int t = pre % g;                                 // row-permutation slot in its MMA group
    sp->src[p] = static_cast<uint8_t>((pre / g) * g + 8 * ((t % e) / 2) + t % 2 + 2 * (t / e));
  }
  for (int b = 0; b < 16; ++b) {
    sp->shuf8[b] = sp->src[b];
    for (int h = 0; h < 2; ++h) {
      const int from = sp->src[2 * b + h];  // < 32
      sp->shuf4[2 * h][b] = from < 16 ? static_cast<uint8_t>(from) : 0x80;
      sp->shuf4[2 * h + 1][b] = from >= 16 ? static_cast<uint8_t>(from - 16) : 0x80;
    }
  }
}

bool valid(int64_t n, int64_t k, int bits, int group_size, int arch) {
  if (bits != 4 && bits != 8) return false;
  if (group_size != -1 && group_size != 64 && group_size != 128) return false;
  if (n <= 0 || k <= 0) return false;
  if (arch == 70) return n % 16 == 0;
  if (arch != 75 && arch != 80 && arch != 86 && arch != 89 && arch != 90 && arch != 100) return false;
  return n % 64 == 0 && k % kTileK == 0;
}

// Quantize one HF row (output channel r) into q[0..k); writes its scales.
// Returns false if the row holds NaN / Inf.
template <int BITS>
bool quantize_row(const Spec& sp, const uint16_t* x, int64_t r, int8_t* q, uint16_t* scale) {
  const float bound = BITS == 8 ? 127.0f : 7.0f;
  if (sp.group_size == -1) {
    const uint16_t m = absmax_bits(x, sp.k);
    if (m >= 0x7F80) return false;
    // Paddle seeds the running max with the signed first element: -0.0 survives.
    const float amax = bf16_to_f32(m == 0 ? x[0] : m);
    const uint16_t sb = f32_to_bf16(amax / bound);
    scale[r - sp.scale_r0] = sb;
    quantize_span<BITS>(x, sp.k, bf16_to_f32(sb), q);
    return true;
  }
  for (int64_t k0 = 0, gi = 0; k0 < sp.k; k0 += sp.group_size, ++gi) {
    const int64_t len = sp.k - k0 < sp.group_size ? sp.k - k0 : sp.group_size;
    const uint16_t m = absmax_bits(x + k0, len);
    if (m >= 0x7F80) return false;
    const uint16_t sb = f32_to_bf16(bf16_to_f32(m) / bound);
    scale[gi * sp.scale_ld + r - sp.scale_r0] = sb;
    quantize_span<BITS>(x + k0, len, bf16_to_f32(sb), q + k0);
  }
  return true;
}

// arch >= 75: channel r's tile j is the 64-element segment starting at element
// (r / I) * K * I + j * 64 * I + (r % I) * 64 of the flat output.
void store_tiled(const Spec& sp, const int8_t* q, int64_t r, uint8_t* out) {
  const int64_t I = sp.interleave;
  const int64_t chan_base = (r / I) * sp.k * I + (r % I) * kTileK - sp.out_off;
#ifdef __AVX2__
  const __m128i m8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp.shuf8));
  const __m128i lo_a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp.shuf4[0]));
  const __m128i lo_b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp.shuf4[1]));
  const __m128i hi_a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp.shuf4[2]));
  const __m128i hi_b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp.shuf4[3]));
  const __m128i bias8 = _mm_set1_epi8(static_cast<char>(0x80)), bias4 = _mm_set1_epi8(8);
#endif
  for (int64_t j = 0; j < sp.k / kTileK; ++j) {
    const int8_t* tile = q + j * kTileK;
    const int64_t base = chan_base + j * kTileK * I;
#ifdef __AVX2__
    if (sp.bits == 8) {
      for (int c = 0; c < kTileK; c += 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + c));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + base + c), _mm_xor_si128(_mm_shuffle_epi8(v, m8), bias8));
      }
    } else {
      for (int c = 0; c < kTileK; c += 32) {  // 32 nibbles -> 16 bytes
        const __m128i a = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + c)), bias4);
        const __m128i b = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + c + 16)), bias4);
        const __m128i lo = _mm_or_si128(_mm_shuffle_epi8(a, lo_a), _mm_shuffle_epi8(b, lo_b));
        const __m128i hi = _mm_or_si128(_mm_shuffle_epi8(a, hi_a), _mm_shuffle_epi8(b, hi_b));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (base + c) / 2), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
      }
    }
#else
    if (sp.bits == 8) {
      uint8_t* o = out + base;
      for (int p = 0; p < kTileK; ++p) o[p] = static_cast<uint8_t>(tile[sp.src[p]] + 128);
    } else {
      uint8_t* o = out + base / 2;
      for (int p = 0; p < kTileK; p += 2) {
        const unsigned lo = (tile[sp.src[p]] + 8) & 0xF, hi = (tile[sp.src[p + 1]] + 8) & 0xF;
        o[p / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
#endif
  }
}

// arch 70: flat output is row-major [K, N] (element k*N + n); one block of 8
// channels is 8 consecutive elements of each K row (two int8 words / one int4 word).
void store_rowmajor_kn(const Spec& sp, const int8_t* qblk, int64_t r0, uint8_t* out) {
  const int e = sp.elts_per_word;
  int src[kBlock];
  for (int d = 0; d < kBlock; ++d) src[d] = (d / e) * e + word_order(d % e, e);
  for (int64_t kk = 0; kk < sp.k; ++kk) {
    if (sp.bits == 8) {
      uint8_t* o = out + kk * sp.n + r0;
      for (int d = 0; d < kBlock; ++d) o[d] = static_cast<uint8_t>(qblk[src[d] * sp.k + kk] + 128);
    } else {
      uint8_t* o = out + (kk * sp.n + r0) / 2;
      for (int d = 0; d < kBlock; d += 2) {
        const unsigned lo = (qblk[src[d] * sp.k + kk] + 8) & 0xF;
        const unsigned hi = (qblk[src[d + 1] * sp.k + kk] + 8) & 0xF;
        o[d / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

// Optional FP8 source: rows are e4m3 codes, decoded to the bf16 Paddle would be given
// (float32 decode(code) * block scale_inv, rounded to nearest even) just before quantizing.
struct Fp8Source {
  const uint8_t* rows = nullptr;  // row r_begin first, row-major [*, K]
  const float* scale_inv = nullptr;  // the full [ceil(N/bn), ceil(K/bk)] block scales
  int64_t bn = 0, bk = 0;
};

// Decodes row `r` into bf16 through per-column-block tables of decode(code) * scale,
// rebuilt only when the scale row changes (lut holds ceil(K/bk) x 256 entries).
inline void decode_fp8_row(const Fp8Source& src, const Spec& sp, int64_t r, int64_t r_begin, uint16_t* lut,
                           int64_t* lut_row, uint16_t* x) {
  const int64_t nbk = (sp.k + src.bk - 1) / src.bk, srow = r / src.bn;
  if (*lut_row != srow) {
    const float* s = src.scale_inv + srow * nbk;
    for (int64_t j = 0; j < nbk; ++j)
      for (uint32_t c = 0; c < 256; ++c) lut[j * 256 + c] = f32_to_bf16(e4m3_to_f32(c) * s[j]);
    *lut_row = srow;
  }
  const uint8_t* row = src.rows + (r - r_begin) * sp.k;
  for (int64_t j = 0; j < nbk; ++j) {
    const uint16_t* t = lut + j * 256;
    for (int64_t c = j * src.bk, c1 = std::min(c + src.bk, sp.k); c < c1; ++c) x[c] = t[row[c]];
  }
}

template <int BITS>
int quantize_blocks(const Spec& sp, const uint16_t* w_rows, int64_t r_begin, int64_t r_end,
                    uint8_t* out, uint16_t* scale, int num_threads, const Fp8Source& fp8 = Fp8Source()) {
  const int64_t nblk = (r_end - r_begin) / kBlock;
  int rc = DSX_OK;
  const int nt = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel num_threads(nt)
  {
    int8_t* qblk = static_cast<int8_t*>(malloc(static_cast<size_t>(kBlock * sp.k)));
    uint16_t* xrow = nullptr;
    uint16_t* lut = nullptr;
    int64_t lut_row = -1;
    if (fp8.rows) {
      xrow = static_cast<uint16_t*>(malloc(static_cast<size_t>(sp.k) * 2));
      lut = static_cast<uint16_t*>(malloc(static_cast<size_t>((sp.k + fp8.bk - 1) / fp8.bk) * 256 * 2));
    }
    int local = qblk && (!fp8.rows || (xrow && lut)) ? DSX_OK : DSX_ENOMEM;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblk; ++b) {
      if (local != DSX_OK) continue;
      const int64_t r0 = r_begin + b * kBlock;
      for (int i = 0; i < kBlock; ++i) {
        const uint16_t* x;
        if (fp8.rows) {
          decode_fp8_row(fp8, sp, r0 + i, r_begin, lut, &lut_row, xrow);
          x = xrow;
        } else {
          x = w_rows + (r0 - r_begin + i) * sp.k;
        }
        if (!quantize_row<BITS>(sp, x, r0 + i, qblk + i * sp.k, scale)) local = DSX_WO_ENONFINITE;
      }
      if (local != DSX_OK) continue;
      if (sp.arch == 70) {
        store_rowmajor_kn(sp, qblk, r0, out);
      } else {
        for (int i = 0; i < kBlock; ++i) store_tiled(sp, qblk + i * sp.k, r0 + i, out);
      }
    }
    free(qblk);
    free(xrow);
    free(lut);
    if (local != DSX_OK) {
#pragma omp critical(dsx_wo_rc)
      rc = rc == DSX_OK ? local : rc;
    }
  }
  return rc;
}

}  // namespace

extern "C" int dsx_wo_quantize_bf16_rowmajor_nk(const uint16_t* w_rows, int64_t n_out, int64_t k_in,
                                                int64_t row_begin, int64_t row_end, int bits,
                                                int group_size, int arch, int8_t* qweight,
                                                uint16_t* scale, int num_threads) {
  if (!w_rows || !qweight || !scale || !valid(n_out, k_in, bits, group_size, arch)) return DSX_EINVAL;
  if (row_begin < 0 || row_end > n_out || row_begin >= row_end || row_begin % kBlock || row_end % kBlock)
    return DSX_EINVAL;
  Spec sp;
  build_spec(&sp, n_out, k_in, bits, group_size, arch);
  uint8_t* out = reinterpret_cast<uint8_t*>(qweight);
  return bits == 8 ? quantize_blocks<8>(sp, w_rows, row_begin, row_end, out, scale, num_threads)
                   : quantize_blocks<4>(sp, w_rows, row_begin, row_end, out, scale, num_threads);
}

namespace {

// Chunk-local quantization of channels [row_begin, row_end) from bf16 rows or an FP8 source.
int quantize_rows_local(const uint16_t* w_rows, const Fp8Source& fp8, int64_t n_out, int64_t k_in,
                        int64_t row_begin, int64_t row_end, int bits, int group_size, int arch,
                        int8_t* qweight_rows, uint16_t* scale_rows, int num_threads) {
  if ((!w_rows && !fp8.rows) || !qweight_rows || !scale_rows || arch == 70 || !valid(n_out, k_in, bits, group_size, arch))
    return DSX_EINVAL;
  if (row_begin < 0 || row_end > n_out || row_begin >= row_end || row_begin % kBlock || row_end % kBlock)
    return DSX_EINVAL;
  Spec sp;
  build_spec(&sp, n_out, k_in, bits, group_size, arch);
  // Channels [row_begin, row_end) own elements [(row_begin / I) * K * I, (row_end / I) * K * I).
  sp.out_off = (row_begin / sp.interleave) * k_in * sp.interleave;
  sp.scale_r0 = row_begin;
  sp.scale_ld = row_end - row_begin;
  uint8_t* out = reinterpret_cast<uint8_t*>(qweight_rows);
  return bits == 8 ? quantize_blocks<8>(sp, w_rows, row_begin, row_end, out, scale_rows, num_threads, fp8)
                   : quantize_blocks<4>(sp, w_rows, row_begin, row_end, out, scale_rows, num_threads, fp8);
}

}  // namespace

extern "C" int dsx_wo_quantize_bf16_rowmajor_nk_rows(const uint16_t* w_rows, int64_t n_out, int64_t k_in,
                                                     int64_t row_begin, int64_t row_end, int bits,
                                                     int group_size, int arch, int8_t* qweight_rows,
                                                     uint16_t* scale_rows, int num_threads) {
  if (!w_rows) return DSX_EINVAL;
  return quantize_rows_local(w_rows, Fp8Source(), n_out, k_in, row_begin, row_end, bits, group_size, arch,
                             qweight_rows, scale_rows, num_threads);
}

extern "C" int dsx_wo_quantize_fp8_rowmajor_nk_rows(const uint8_t* w_fp8_rows, const float* scale_inv,
                                                    int64_t block_n, int64_t block_k, int64_t n_out,
                                                    int64_t k_in, int64_t row_begin, int64_t row_end,
                                                    int bits, int group_size, int arch, int8_t* qweight_rows,
                                                    uint16_t* scale_rows, int num_threads) {
  if (!w_fp8_rows || !scale_inv || block_n <= 0 || block_k <= 0) return DSX_EINVAL;
  Fp8Source src;
  src.rows = w_fp8_rows;
  src.scale_inv = scale_inv;
  src.bn = block_n;
  src.bk = block_k;
  return quantize_rows_local(nullptr, src, n_out, k_in, row_begin, row_end, bits, group_size, arch, qweight_rows,
                             scale_rows, num_threads);
}

namespace {

// Signed element (n, k) of the packed buffer, by the same gather tables.
inline int load_element(const Spec& sp, const uint8_t* in, int64_t r, int64_t kk, const uint8_t* dst) {
  int64_t pos;  // element index in the flat output
  if (sp.arch == 70) {
    const int e = sp.elts_per_word;
    const int64_t pre = kk * sp.n + r;
    pos = (pre / e) * e + dst[pre % e];
  } else {
    const int64_t I = sp.interleave;
    pos = (r / I) * sp.k * I + (kk / kTileK) * kTileK * I + (r % I) * kTileK + dst[kk % kTileK];
  }
  if (sp.bits == 8) return static_cast<int>(in[pos]) - 128;
  return static_cast<int>((in[pos / 2] >> (4 * (pos % 2))) & 0xF) - 8;
}

}  // namespace

extern "C" int dsx_wo_dequantize_rowmajor_nk(const int8_t* qweight, const uint16_t* scale,
                                             int64_t n_out, int64_t k_in, int bits, int group_size,
                                             int arch, float* w_out, int num_threads) {
  if (!qweight || !scale || !w_out || !valid(n_out, k_in, bits, group_size, arch)) return DSX_EINVAL;
  Spec sp;
  build_spec(&sp, n_out, k_in, bits, group_size, arch);
  // dst = inverse table: tile element kk sits in slot dst[kk] (arch 70: word slot).
  uint8_t dst[kTileK];
  if (arch == 70) {
    const int e = sp.elts_per_word;
    for (int d = 0; d < e; ++d) dst[word_order(d, e)] = static_cast<uint8_t>(d);
  } else {
    for (int p = 0; p < kTileK; ++p) dst[sp.src[p]] = static_cast<uint8_t>(p);
  }
  const uint8_t* in = reinterpret_cast<const uint8_t*>(qweight);
  const int nt = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < n_out; ++r) {
    for (int64_t kk = 0; kk < k_in; ++kk) {
      const uint16_t sb = group_size == -1 ? scale[r] : scale[(kk / group_size) * n_out + r];
      w_out[r * k_in + kk] = static_cast<float>(load_element(sp, in, r, kk, dst)) * bf16_to_f32(sb);
    }
  }
  return DSX_OK;
}
