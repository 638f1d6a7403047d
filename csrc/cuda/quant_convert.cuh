// Element and 32-element-unit operations of the GPU conversion kernels
// (quant_convert.cu), usable on the host and the device so that a host build
// (DSX_QUANT_CUDA_HOST_EMULATION, tests/test_quant_cuda_compile.py) checks them
// against the CPU kernels without a GPU.
//
// Bit-exactness: every float operation is one IEEE float32 operation with round
// to nearest even, written as an intrinsic (__fmul_rn, __fdiv_rn, ...) on the
// device so that nvcc can neither contract it into an FMA nor approximate it;
// encodings are integer arithmetic on the bits, ported from
// csrc/cpu/quant_fp8.cc and csrc/cpu/quant_weight_only.cc.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define DSXQ_HD __host__ __device__ __forceinline__
#else
#define DSXQ_HD inline
#endif

namespace dsxq {

// ---- IEEE float32 operations, round to nearest even, no contraction -------------------

DSXQ_HD float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

DSXQ_HD uint32_t f2u(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

DSXQ_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DSXQ_HD float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

DSXQ_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DSXQ_HD int f2i_rz(float v) {  // |v| < 2^31 only
#ifdef __CUDA_ARCH__
  return __float2int_rz(v);
#else
  return static_cast<int>(v);
#endif
}

DSXQ_HD float i2f_rn(int i) {
#ifdef __CUDA_ARCH__
  return __int2float_rn(i);
#else
  return static_cast<float>(i);
#endif
}

DSXQ_HD bool is_nan_bits(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- FP8 e4m3fn (docs/format-fp8-block.md) ---------------------------------------------

// Code -> float32 bits: the CPU decode table's entries (NaN codes -> 0x7FC00000 | sign).
DSXQ_HD uint32_t decode_e4m3_bits(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
  uint32_t bits;
  if (e == 15u && m == 7u) {
    bits = 0x7FC00000u;
  } else if (e == 0u) {
    bits = f2u(mul_rn(i2f_rn(static_cast<int>(m)), 1.0f / 512.0f));  // m * 2^-9, exact
  } else {
    bits = ((e + 120u) << 23) | (m << 20);
  }
  return bits | sign;
}

// decode(code) * s as the CPU kernel computes it (quant_fp8.cc's dequant_product), NaN bits
// included: a NaN scale wins (quieted), then a NaN code's, and an invalid product (0 x inf)
// is x86's default NaN 0xFFC00000. The GPU's own multiply would return 0x7FFFFFFF in all
// these cases.
DSXQ_HD uint32_t dequant_bits(uint32_t code, float s) {
  const uint32_t d = decode_e4m3_bits(code), su = f2u(s);
  const uint32_t p = f2u(mul_rn(u2f(d), s));
  if (is_nan_bits(su)) return su | 0x00400000u;
  if (is_nan_bits(d)) return d;
  return is_nan_bits(p) ? 0xFFC00000u : p;
}

// float32 bits -> bf16 bits, RNE; NaN -> 0x7FC0 | sign (quant_fp8.cc's encode_bf16).
DSXQ_HD uint32_t encode_bf16(uint32_t bits) {
  const uint32_t r = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = ((bits >> 16) & 0x8000u) | 0x7FC0u;
  return is_nan_bits(bits) ? nan : (r & 0xFFFFu);
}

// float32 bits -> e4m3fn code: RNE on the exact value, |x| > 464 and inf -> +-448,
// NaN -> 0x7F | sign (quant_fp8.cc's encode_e4m3, line for line).
DSXQ_HD uint32_t encode_e4m3(uint32_t bits) {
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7FFFFFFFu;
  const uint32_t rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  const uint32_t normal = rounded - (120u << 3);
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x7FFFFFu) | (e != 0 ? 0x800000u : 0u);
  int32_t sh = 141 - static_cast<int32_t>(e != 0 ? e : 1u);
  sh = sh < 21 ? 21 : (sh > 31 ? 31 : sh);
  const uint32_t shift = static_cast<uint32_t>(sh);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t sub = (mant + (half - 1u) + ((mant >> shift) & 1u)) >> shift;
  uint32_t code = a >= 0x3C800000u ? normal : sub;
  code = a > 0x43E80000u ? 0x7Eu : code;
  code = a > 0x7F800000u ? 0x7Fu : code;
  return (code | sign) & 0xFFu;
}

// ---- weight-only INT8 / INT4 (docs/format-weight-only.md) ------------------------------

DSXQ_HD float bf16_to_f32(uint32_t b) { return u2f(b << 16); }

// quant_weight_only.cc's f32_to_bf16 (used for the scales, which are finite).
DSXQ_HD uint32_t f32_to_bf16_wo(float f) {
  const uint32_t u = f2u(f);
  if ((u & 0x7FFFFFFFu) == 0) return u >> 16;
  if ((u & 0x7F800000u) == 0x7F800000u) return (u & 0x007FFFFFu) ? 0x7FFFu : (u >> 16);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// q = clip(round_half_away(v)) with Paddle's CPU outcomes for NaN / +-Inf (int8: 127
// for NaN, +-127 for +-Inf; int4: -7), as quant_weight_only.cc's quantize_one.
template <int BITS>
DSXQ_HD int quantize_one(float v) {
  constexpr int lim = BITS == 8 ? 127 : 7;
  const bool ok = (f2u(v) & 0x7FFFFFFFu) < 0x4F000000u;  // |v| < 2^31, false for NaN
  const float vc = ok ? v : 0.0f;
  const int t = f2i_rz(vc);
  const float frac = sub_rn(vc, i2f_rn(t));
  int r = t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);
  r = r < lim ? r : lim;
  r = r > -lim ? r : -lim;
  const int special = BITS == 8 ? (v < 0.0f ? -127 : 127) : -7;
  return ok ? r : special;
}

// Output slot p (0..127/BITS-1) of a 64-element tile segment takes tile element
// src_slot(p); the permutation never leaves blocks of 128/BITS elements, so a
// 32-element unit maps onto its own 32 slots (int4: one block; int8: two of 16).
template <int BITS>
DSXQ_HD constexpr int src_slot(int p) {
  constexpr int e = 32 / BITS, g = 128 / BITS;
  const int d = p % e;
  const int pre = (p / e) * e + (d < e / 2 ? 2 * d : 2 * (d - e / 2) + 1);  // undo in-word order
  const int t = pre % g;
  return (pre / g) * g + 8 * ((t % e) / 2) + t % 2 + 2 * (t / e);  // row permutation f(t)
}

// Byte offset, in the chunk-local qweight, of the 32-element unit starting at column c0
// (c0 % 32 == 0) of chunk row rr (the chunk starts at a multiple of 8 channels):
// element P = (rr/I)*K*I + (c0/64)*64*I + (rr%I)*64 + c0%64, I = 2 (int8) | 4 (int4).
template <int BITS>
DSXQ_HD int64_t unit_out_byte(int64_t rr, int64_t k, int64_t c0) {
  constexpr int I = BITS == 8 ? 2 : 4;
  const int64_t elem = (rr / I) * k * I + (c0 / 64) * 64 * I + (rr % I) * 64 + (c0 % 64);
  return BITS == 8 ? elem : elem / 2;
}

// 32 bf16 values (bits) with scale s -> the unit's output words (int4: 4 words = 16
// bytes, int8: 8 words = 32 bytes), bias and nibble packing included.
template <int BITS>
DSXQ_HD void quant_pack_unit(const uint32_t* x, float s, uint32_t* words) {
  int q[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) q[i] = quantize_one<BITS>(div_rn(bf16_to_f32(x[i]), s));
  if (BITS == 4) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int n = 0; n < 8; ++n)  // nibble n of word w is output slot 8w + n
        word |= static_cast<uint32_t>((q[src_slot<4>(8 * w + n)] + 8) & 0xF) << (4 * n);
      words[w] = word;
    }
  } else {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {  // byte b of word w is output slot 4w + b
        const int p = 4 * w + b;
        word |= static_cast<uint32_t>((q[(p / 16) * 16 + src_slot<8>(p % 16)] + 128) & 0xFF) << (8 * b);
      }
      words[w] = word;
    }
  }
}

// ---- vector memory access ------------------------------------------------------------

DSXQ_HD void load16(const void* p, uint32_t* w) {
#ifdef __CUDA_ARCH__
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  memcpy(w, p, 16);
#endif
}

DSXQ_HD void store16(void* p, const uint32_t* w) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  memcpy(p, w, 16);
#endif
}

// ---- dequant ---------------------------------------------------------------------------

// FP8 dequant of the 16 elements at column c0 of one row (fewer at a ragged end, scalar):
// vec (k % 16 == 0) moves them with one 16-byte load and 16-byte stores.
template <bool BF16>
DSXQ_HD void dequant16(const uint8_t* wrow, const float* sr, int64_t k, int bk, int64_t c0, void* orow,
                       bool vec) {
  if (vec) {  // k % 16 == 0: 16 codes in, 32 (bf16) or 64 (f32) bytes out
    uint32_t b[4], o[16];
    load16(wrow + c0, b);
    const bool one = bk % 16 == 0;
    const float s0 = sr[static_cast<int>(c0) / bk];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float sc = one ? s0 : sr[(static_cast<int>(c0) + i) / bk];
      const uint32_t p = dequant_bits((b[i / 4] >> (8 * (i % 4))) & 0xFFu, sc);
      if (BF16) {
        const uint32_t h = encode_bf16(p);
        o[i / 2] = (i % 2) ? (o[i / 2] | (h << 16)) : h;
      } else {
        o[i] = p;
      }
    }
    char* dst = static_cast<char*>(orow) + c0 * (BF16 ? 2 : 4);
#pragma unroll
    for (int j = 0; j < (BF16 ? 2 : 4); ++j) store16(dst + 16 * j, o + 4 * j);
  } else {
    for (int64_t c = c0; c < c0 + 16 && c < k; ++c) {
      const uint32_t p = dequant_bits(wrow[c], sr[static_cast<int>(c) / bk]);
      if (BF16) static_cast<uint16_t*>(orow)[c] = static_cast<uint16_t>(encode_bf16(p));
      else static_cast<uint32_t*>(orow)[c] = p;
    }
  }
}

// Per-byte unsigned maximum of two words (__vmaxu4 on the device).
DSXQ_HD uint32_t vmaxu4(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __vmaxu4(a, b);
#else
  uint32_t r = 0;
  for (int j = 0; j < 32; j += 8) {
    const uint32_t x = (a >> j) & 0xFFu, y = (b >> j) & 0xFFu;
    r |= (x > y ? x : y) << j;
  }
  return r;
#endif
}

// Largest (byte & 0x7F) over the 4 bytes of each of `n` words: the largest |code| of e4m3
// codes. The same per-byte folds run on the host (emulation) and the device.
DSXQ_HD uint32_t max_code7f(const uint32_t* w, int n) {
  uint32_t m = 0;
  for (int i = 0; i < n; ++i) m = vmaxu4(m, w[i] & 0x7F7F7F7Fu);
  m = vmaxu4(m, m >> 16);  // byte 0 = max(b0, b2), byte 1 = max(b1, b3)
  m = vmaxu4(m, m >> 8);   // byte 0 = max of all four
  return m & 0xFFu;
}

// ---- weight-only sources: 32 consecutive elements of one row -> bf16 bits ---------------
// load32: the unit's 32 values as bf16 bits; amax32: max of (bits & 0x7FFF) over the unit
// (>= 0x7F80 when the unit holds NaN or Inf), what the per-channel absmax pass needs.

// amax32 through load32: the largest bf16 magnitude bits of the unit's 32 values.
template <class Rows>
DSXQ_HD uint32_t amax32_loaded(const Rows& src, int64_t rr, const float* sr, int64_t c0) {
  uint32_t x[32], m = 0;
  src.load32(rr, sr, c0, x);
  for (int i = 0; i < 32; ++i) m = m > (x[i] & 0x7FFFu) ? m : (x[i] & 0x7FFFu);
  return m;
}

// FP8 rows with block scales: bf16(decode * scale), the CPU path's dequant_native(bf16).
struct Fp8Rows {
  const uint8_t* w;
  const float* s;  // scale rows of the chunk (first = row r0 / bn)
  int64_t k, r0;
  int bn, bk, nbk;
  DSXQ_HD const float* srow(int64_t rr) const { return s + ((r0 + rr) / bn - r0 / bn) * nbk; }
  DSXQ_HD uint32_t first(int64_t rr, const float* sr) const { return encode_bf16(dequant_bits(w[rr * k], sr[0])); }
  // With one scale for the unit, |bf16(decode(c) * s)| grows with |c| (RNE is monotone and
  // symmetric), so the unit's largest magnitude is that of its largest |code|; NaN codes
  // (0x7F), a NaN or infinite scale and overflow all still give >= 0x7F80.
  DSXQ_HD uint32_t amax32(int64_t rr, const float* sr, int64_t c0) const {
    if (bk % 32 != 0) return amax32_loaded(*this, rr, sr, c0);
    uint32_t b[8];
    load16(w + rr * k + c0, b);
    load16(w + rr * k + c0 + 16, b + 4);
    return encode_bf16(dequant_bits(max_code7f(b, 8), sr[static_cast<int>(c0) / bk])) & 0x7FFFu;
  }
  DSXQ_HD void load32(int64_t rr, const float* sr, int64_t c0, uint32_t* x) const {
    uint32_t b[8];
    load16(w + rr * k + c0, b);
    load16(w + rr * k + c0 + 16, b + 4);
    if (bk % 32 == 0) {  // c0 % 32 == 0: the unit lies in one block
      const float sc = sr[static_cast<int>(c0) / bk];
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] = encode_bf16(dequant_bits((b[i / 4] >> (8 * (i % 4))) & 0xFFu, sc));
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float sc = sr[(static_cast<int>(c0) + i) / bk];
        x[i] = encode_bf16(dequant_bits((b[i / 4] >> (8 * (i % 4))) & 0xFFu, sc));
      }
    }
  }
};

struct Bf16Rows {
  const uint16_t* w;
  int64_t k;
  DSXQ_HD uint32_t amax32(int64_t rr, const float* sr, int64_t c0) const { return amax32_loaded(*this, rr, sr, c0); }
  DSXQ_HD const float* srow(int64_t) const { return nullptr; }
  DSXQ_HD uint32_t first(int64_t rr, const float*) const { return w[rr * k]; }
  DSXQ_HD void load32(int64_t rr, const float*, int64_t c0, uint32_t* x) const {
    uint32_t b[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) load16(w + rr * k + c0 + 8 * j, b + 4 * j);
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = (b[i / 2] >> (16 * (i % 2))) & 0xFFFFu;
  }
};

// float32 rows, rounded to bf16 (RNE) as weight_only.quantize_rows_native does
// (ml_dtypes' cast: equal for finite values; NaN / Inf are refused either way).
struct F32Rows {
  const float* w;
  int64_t k;
  DSXQ_HD uint32_t amax32(int64_t rr, const float* sr, int64_t c0) const { return amax32_loaded(*this, rr, sr, c0); }
  DSXQ_HD const float* srow(int64_t) const { return nullptr; }
  DSXQ_HD uint32_t first(int64_t rr, const float*) const { return encode_bf16(f2u(w[rr * k])); }
  DSXQ_HD void load32(int64_t rr, const float*, int64_t c0, uint32_t* x) const {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t b[4];
      load16(w + rr * k + c0 + 4 * j, b);
#pragma unroll
      for (int i = 0; i < 4; ++i) x[4 * j + i] = encode_bf16(b[i]);
    }
  }
};

// ---- block-FP8 quantizer sources: float32 bits of element(s) (rr, c) -------------------

struct F32Elems {
  const float* w;
  int64_t k;
  DSXQ_HD uint32_t at(int64_t rr, int64_t c) const { return f2u(w[rr * k + c]); }
};

struct Bf16Elems {
  const uint16_t* w;
  int64_t k;
  DSXQ_HD uint32_t at(int64_t rr, int64_t c) const { return static_cast<uint32_t>(w[rr * k + c]) << 16; }
};

// FP8 with its own (source) blocks: the float32 product of dequant (its NaN bits do not
// matter: the quantizer refuses any NaN / Inf).
struct Fp8Elems {
  const uint8_t* w;
  const float* s;
  int64_t k, r0;
  int bn, bk, nbk;
  DSXQ_HD uint32_t at(int64_t rr, int64_t c) const {
    const float* sr = s + ((r0 + rr) / bn - r0 / bn) * nbk;
    return dequant_bits(w[rr * k + c], sr[c / bk]);
  }
};

}  // namespace dsxq
