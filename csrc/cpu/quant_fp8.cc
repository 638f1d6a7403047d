// Block-FP8 (e4m3fn + float32 scale_inv) quantize / dequantize and bf16 rounding.
// Spec: docs/format-fp8-block.md; reference: ds_export/formats/fp8_block.py.
// Bit-exact with the numpy reference: float32 IEEE division/multiplication only
// (built with -ffp-contract=off, no fast-math), encoding in integer arithmetic.
#include <algorithm>
#include <cstring>

#include "dsx.h"
#include "numeric.h"

namespace {

using dsx_num::f2u;
using dsx_num::u2f;

constexpr uint32_t kF32AbsInf = 0x7F800000u;
constexpr uint32_t kF32Bits464 = 0x43E80000u;     // 464.0f: midpoint of 448 and (absent) 480
constexpr uint32_t kF32BitsMinNormE4M3 = 0x3C800000u;  // 2^-6
constexpr float kFp8Max = 448.0f;

// float32 bits -> e4m3fn code. Round to nearest, ties to even, on the exact
// value; |x| > 464 (and inf) saturate to 448; NaN -> 0x7F|sign.
inline uint8_t encode_e4m3(uint32_t bits) {
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  // Normal e4m3 range (|x| >= 2^-6): keep 3 of 23 mantissa bits with RNE; a
  // carry into the exponent is correct by construction. Rebias 127 -> 7.
  const uint32_t rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  const uint32_t normal = rounded - (120u << 3);
  // Subnormal e4m3 range: code = RNE(|x| * 2^9) as an integer in 0..8 (8 is the
  // smallest normal, code 0x08, so the carry is again correct).
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
  // |x| * 2^9 = mant * 2^(e-141). Clamp the shift to [21, 31]: 21 is the
  // smallest that occurs in this range (the result is unused above it) and a
  // shift >= 25 gives 0 anyway; the clamp keeps every shift well defined.
  int32_t sh = 141 - static_cast<int32_t>(e != 0 ? e : 1u);
  sh = sh < 21 ? 21 : (sh > 31 ? 31 : sh);
  const uint32_t shift = static_cast<uint32_t>(sh);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t sub = (mant + (half - 1u) + ((mant >> shift) & 1u)) >> shift;  // RNE
  uint32_t code = a >= kF32BitsMinNormE4M3 ? normal : sub;
  code = a > kF32Bits464 ? 0x7Eu : code;
  code = a > kF32AbsInf ? 0x7Fu : code;
  return static_cast<uint8_t>(code | sign);
}

// float32 bits -> bfloat16 bits, RNE; NaN -> canonical quiet NaN with its sign.
inline uint16_t encode_bf16(uint32_t bits) {
  const uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = ((bits >> 16) & 0x8000u) | 0x7FC0u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > kF32AbsInf ? nan : r);
}

bool bad_dims(int64_t n, int64_t k, int64_t bn, int64_t bk) {
  return n < 0 || k < 0 || bn <= 0 || bk <= 0;
}

bool bad_range(int64_t n, int64_t bn, int64_t r0, int64_t r1, bool aligned) {
  if (r0 < 0 || r1 < r0 || r1 > n) return true;
  return aligned && (r0 % bn != 0 || (r1 % bn != 0 && r1 != n));
}

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Work is split into panels: one block row x up to kMaxPanel column blocks
// (about 1024 columns), so each thread walks contiguous row segments and a
// panel's data stays in L2 between the amax pass and the encode pass.
constexpr int64_t kPanelCols = 1024;
constexpr int64_t kMaxPanel = 16;

inline int64_t panel_blocks(int64_t bk, int64_t nbk) {
  return std::max<int64_t>(1, std::min({kPanelCols / bk, kMaxPanel, nbk}));
}

template <typename In>
inline float load_f32(In v) {
  if constexpr (sizeof(In) == 2) return u2f(static_cast<uint32_t>(v) << 16);  // bf16 bits
  else return v;
}

template <typename In>
inline uint32_t abs_bits(In v) {
  if constexpr (sizeof(In) == 2) return (static_cast<uint32_t>(v) & 0x7FFFu) << 16;
  else return f2u(v) & 0x7FFFFFFFu;
}

// Quantizes rows [r0, r1) x column blocks [j0, j1) of `w` (row stride k) into
// `out` (chunk rows, first row = row_base) and scale[j] for j in [j0, j1).
// Returns false on non-finite input.
template <typename In>
bool quant_panel(const In* w, int64_t k, int64_t bk, int64_t r0, int64_t r1, int64_t j0,
                 int64_t j1, int64_t row_base, uint8_t* out, float* scale) {
  // amax as the max of |x|'s bit patterns: same order as floats for |x|, and
  // inf/NaN (>= 0x7F800000) come out on top, so one pass also checks finiteness.
  uint32_t amax[kMaxPanel] = {0};
  for (int64_t r = r0; r < r1; ++r) {
    const In* row = w + r * k;
    for (int64_t j = j0; j < j1; ++j) {
      uint32_t m = 0;
      for (int64_t c = j * bk, c1 = std::min(c + bk, k); c < c1; ++c) m = std::max(m, abs_bits(row[c]));
      amax[j - j0] = std::max(amax[j - j0], m);
    }
  }
  for (int64_t j = j0; j < j1; ++j) {
    if (amax[j - j0] >= kF32AbsInf) return false;
    const float s = u2f(amax[j - j0]) / kFp8Max;
    scale[j] = s == 0.0f ? 1.0f : s;  // all-zero block (or amax/448 underflows): codes are +-0
  }
  for (int64_t r = r0; r < r1; ++r) {
    const In* row = w + r * k;
    uint8_t* orow = out + (r - row_base) * k;
    for (int64_t j = j0; j < j1; ++j) {
      const float s = scale[j];
      for (int64_t c = j * bk, c1 = std::min(c + bk, k); c < c1; ++c)
        orow[c] = encode_e4m3(f2u(load_f32(row[c]) / s));
    }
  }
  return true;
}

template <typename In>
int block_quant(const In* w, int64_t n, int64_t k, int64_t bn, int64_t bk, int64_t r0, int64_t r1,
                uint8_t* out, float* scale_out) {
  if (bad_dims(n, k, bn, bk) || bad_range(n, bn, r0, r1, true)) return DSX_EINVAL;
  if (r1 == r0 || k == 0) return DSX_OK;
  if (!w || !out || !scale_out) return DSX_EINVAL;
  const int64_t nbk = cdiv(k, bk), rb0 = r0 / bn, nrb = cdiv(r1, bn) - rb0;
  const int64_t pb = panel_blocks(bk, nbk), npan = cdiv(nbk, pb);
  int bad = 0;
#pragma omp parallel for collapse(2) schedule(static) reduction(| : bad)
  for (int64_t i = 0; i < nrb; ++i) {
    for (int64_t p = 0; p < npan; ++p) {
      const int64_t tr0 = (rb0 + i) * bn, tr1 = std::min(tr0 + bn, r1);
      const int64_t j0 = p * pb, j1 = std::min(j0 + pb, nbk);
      if (!quant_panel(w, k, bk, tr0, tr1, j0, j1, r0, out, scale_out + i * nbk)) bad |= 1;
    }
  }
  return bad ? DSX_EINVAL : DSX_OK;
}

// decode(code) * scale with its NaN bits spelled out: x86 picks between two NaN operands by their order
// in the instruction, which is the compiler's choice (gcc put the scale first on one machine and the code
// on another, with -march=native), so the rule is written here instead: a NaN scale wins (quieted), then
// a NaN code's (already quiet), and an invalid product (0 x inf) is x86's default NaN 0xFFC00000.
// quant_convert.cuh's dequant_bits, the GPU conversion's twin, is the same rule.
inline float dequant_product(float d, float s) {
  const uint32_t su = f2u(s), du = f2u(d);
  const float p = d * s;
  if ((su & 0x7FFFFFFFu) > kF32AbsInf) return u2f(su | 0x00400000u);
  if ((du & 0x7FFFFFFFu) > kF32AbsInf) return d;
  return (f2u(p) & 0x7FFFFFFFu) > kF32AbsInf ? u2f(0xFFC00000u) : p;
}

// Dequantizes rows [r0, r1) x column blocks [j0, j1) through one 256-entry
// table per block holding decode(code) * scale: the very float32 product (and
// its bf16 rounding), computed once per block instead of once per element.
template <typename Out>
void dequant_panel(const uint8_t* w, int64_t k, int64_t bk, int64_t r0, int64_t r1, int64_t j0,
                   int64_t j1, int64_t row_base, const float* scale, Out* out) {
  const float* dec = dsx_num::e4m3_table();
  Out lut[kMaxPanel][256];
  for (int64_t j = j0; j < j1; ++j) {
    for (int c = 0; c < 256; ++c) {
      const float prod = dequant_product(dec[c], scale[j]);
      if constexpr (sizeof(Out) == 2) lut[j - j0][c] = encode_bf16(f2u(prod));
      else lut[j - j0][c] = prod;
    }
  }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * k;
    Out* orow = out + (r - row_base) * k;
    for (int64_t j = j0; j < j1; ++j) {
      const Out* t = lut[j - j0];
      for (int64_t c = j * bk, c1 = std::min(c + bk, k); c < c1; ++c) orow[c] = t[row[c]];
    }
  }
}

template <typename Out>
void block_dequant(const uint8_t* w, const float* s, int64_t k, int64_t bn, int64_t bk, int64_t r0,
                   int64_t r1, Out* out) {
  const int64_t nbk = cdiv(k, bk), rb0 = r0 / bn, nrb = cdiv(r1, bn) - rb0;
  const int64_t pb = panel_blocks(bk, nbk), npan = cdiv(nbk, pb);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < nrb; ++i) {
    for (int64_t p = 0; p < npan; ++p) {
      const int64_t rb = rb0 + i;
      const int64_t tr0 = std::max(rb * bn, r0), tr1 = std::min((rb + 1) * bn, r1);
      const int64_t j0 = p * pb, j1 = std::min(j0 + pb, nbk);
      dequant_panel(w, k, bk, tr0, tr1, j0, j1, r0, s + rb * nbk, out);
    }
  }
}

}  // namespace

extern "C" {

int dsx_f32_to_fp8_e4m3_sat(const float* x, int64_t count, uint8_t* out) {
  if (count < 0 || (count > 0 && (!x || !out))) return DSX_EINVAL;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = encode_e4m3(f2u(x[i]));
  return DSX_OK;
}

int dsx_fp8_e4m3_to_f32(const uint8_t* x, int64_t count, float* out) {
  if (count < 0 || (count > 0 && (!x || !out))) return DSX_EINVAL;
  const float* dec = dsx_num::e4m3_table();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = dec[x[i]];
  return DSX_OK;
}

int dsx_fp8_e4m3_count_nan(const uint8_t* x, int64_t count, int64_t* n_nan, int64_t* first) {
  if (count < 0 || (count > 0 && !x) || !n_nan || !first) return DSX_EINVAL;
  // (in runs of at most 2^16 codes with a 32-bit sum, which the compiler keeps in vector lanes: one pass at
  // memory speed; the first NaN's index is looked for only where there is one)
  int64_t n = 0;
  for (int64_t i0 = 0; i0 < count; i0 += 1 << 16) {
    const int64_t i1 = count - i0 < (1 << 16) ? count : i0 + (1 << 16);
    uint32_t c = 0;
    for (int64_t i = i0; i < i1; ++i) c += (x[i] & 0x7Fu) == 0x7Fu;
    n += c;
  }
  *n_nan = n;
  *first = -1;
  for (int64_t i = 0; n > 0 && i < count; ++i)
    if ((x[i] & 0x7Fu) == 0x7Fu) {
      *first = i;
      break;
    }
  return DSX_OK;
}

int dsx_f32_to_bf16(const float* x, int64_t count, uint16_t* out) {
  if (count < 0 || (count > 0 && (!x || !out))) return DSX_EINVAL;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = encode_bf16(f2u(x[i]));
  return DSX_OK;
}

int dsx_fp8_block_dequant_rowmajor(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k,
                                   int64_t block_n, int64_t block_k, int64_t row_begin,
                                   int64_t row_end, int out_dtype, void* out) {
  if (bad_dims(n, k, block_n, block_k) || bad_range(n, block_n, row_begin, row_end, false))
    return DSX_EINVAL;
  if (out_dtype != DSX_FP8_OUT_F32 && out_dtype != DSX_FP8_OUT_BF16) return DSX_EINVAL;
  if (row_end == row_begin || k == 0) return DSX_OK;
  if (!w || !scale_inv || !out) return DSX_EINVAL;
  if (out_dtype == DSX_FP8_OUT_F32)
    block_dequant(w, scale_inv, k, block_n, block_k, row_begin, row_end, static_cast<float*>(out));
  else
    block_dequant(w, scale_inv, k, block_n, block_k, row_begin, row_end,
                  static_cast<uint16_t*>(out));
  return DSX_OK;
}

int dsx_fp8_block_quant_f32_rowmajor(const float* w, int64_t n, int64_t k, int64_t block_n,
                                     int64_t block_k, int64_t row_begin, int64_t row_end,
                                     uint8_t* out, float* scale_inv_out) {
  return block_quant(w, n, k, block_n, block_k, row_begin, row_end, out, scale_inv_out);
}

int dsx_fp8_block_quant_bf16_rowmajor(const uint16_t* w, int64_t n, int64_t k, int64_t block_n,
                                      int64_t block_k, int64_t row_begin, int64_t row_end,
                                      uint8_t* out, float* scale_inv_out) {
  return block_quant(w, n, k, block_n, block_k, row_begin, row_end, out, scale_inv_out);
}

int dsx_fp8_act_quant_f32_rowmajor(const float* x, int64_t m, int64_t k, int64_t group,
                                   int64_t row_begin, int64_t row_end, uint8_t* out,
                                   float* scale_out) {
  return block_quant(x, m, k, int64_t{1}, group, row_begin, row_end, out, scale_out);
}

int dsx_fp8_act_quant_bf16_rowmajor(const uint16_t* x, int64_t m, int64_t k, int64_t group,
                                    int64_t row_begin, int64_t row_end, uint8_t* out,
                                    float* scale_out) {
  return block_quant(x, m, k, int64_t{1}, group, row_begin, row_end, out, scale_out);
}

}  // extern "C"
