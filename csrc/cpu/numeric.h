// Bit-level number conversions shared by the CPU kernels (internal header, not part of the C ABI):
// float32 <-> bits, bfloat16 <-> float32, float8_e4m3fn -> float32. Integer arithmetic only, so the
// results do not depend on the compiler's floating-point flags.
//
// Rounding to bfloat16 has two conventions in this library, on purpose:
//  - f32_to_bf16_rne (here): round to nearest even, a NaN stays a quiet NaN with its sign and top
//    payload bits; what the GPU's __float2bfloat16_rn does, so the CPU kernels are the GPU's reference;
//  - Paddle's CPU cast (NaN -> 0x7FFF) in quant_weight_only.cc and the canonical NaN of quant_fp8.cc,
//    where bytes must equal Paddle's or the numpy reference's.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../include/dsx/env_switch.h"

namespace dsx_num {

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }

inline uint16_t f32_to_bf16_rne(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// float8_e4m3fn code -> float32, exact: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m * 2^-9); 0x7F / 0xFF are the only NaNs (there is no infinity).
inline float e4m3_to_f32(uint32_t c) {
  const uint32_t sign = (c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 7u;
  uint32_t bits;
  if (e == 15 && m == 7) {
    bits = 0x7FC00000u;
  } else if (e == 0) {
    bits = f2u(static_cast<float>(m) * (1.0f / 512.0f));
  } else {
    bits = ((e + 120u) << 23) | (m << 20);  // (1 + m/8) * 2^(e-7)
  }
  return u2f(bits | sign);
}

// The 256 decoded e4m3 values, built once (thread-safe) and shared by every translation unit.
inline const float* e4m3_table() {
  struct Table {
    float v[256];
    Table() {
      for (uint32_t c = 0; c < 256; ++c) v[c] = e4m3_to_f32(c);
    }
  };
  static const Table table;
  return table.v;
}

// Whether the CPU kernels take their SIMD paths (on) or their scalar ones: the same numbers either way (the block
// FP8 GEMM's AVX2 lanes and the weight-only GEMM's AVX2 unpack; tests compare the two bit for bit). Read from
// DSX_CPU_SIMD (0: scalar) at the first kernel call; dsx_cpu_simd switches it after.
inline dsx::EnvSwitch& simd_switch() {
  static dsx::EnvSwitch s("DSX_CPU_SIMD");
  return s;
}

inline bool simd_on() { return simd_switch().on(); }

}  // namespace dsx_num
