// Operand layouts of bench/wo_loop_probe.cu (host C++, no CUDA: the probe's host side and
// tests/test_bench_wo_loop_layout.py's self-test both include it).
//
// The probe times the weight-only kernel's step loop (int4 per channel: unpack Paddle's nibbles in
// registers, mma) with its operands resident in shared memory, against the same loop feeding wgmma
// with A (the weights) from registers and B (x) from shared memory. Both consume one weight image
// and compute one function, so their outputs can be compared bit for bit and with a float64
// reference built here.
//
// Weights: step s (128 k), 16-channel tile T, lane l = 4 g + c holds 16 bytes of channel row g of the
// tile and 16 of row g + 8 (the kernel's Stage); word j, nibble n of lane c's bytes is real k
// 32 c + 2 j + 8 (n & 3) + (n >> 2) of the step (nibbles {J, J + 4} are the pair 2 j + 8 J + {0, 1}
// of the lane's 32-block: gemm_weight_only.cuh), value n - 8.
// mma k-step (i, h) (i = 0..3, h = 0, 1; issued in the order 2 i + h) takes from lane c the pairs of
// nibbles {i, i + 4} of words 2 h (logical k 2c, 2c + 1) and 2 h + 1 (logical 2c + 8, 2c + 9), so
// logical k L = 8 q + 2 c + e of that k-step is real k 32 c + 8 i + 4 h + 2 q + e.
//  - x for mma.sync (the kernel's stage_x_steps): the 8-k piece p of a step sits at element
//    (4 (p % 4) + p / 4) * 8 of the step's row, rows kXPad elements apart beyond the k.
//  - x for wgmma (B, K-major, no swizzle): core matrices of 8 tokens x 8 logical k (16 bytes a row,
//    128 bytes each), k-halves q kLbo bytes apart, 8-token groups t kSbo bytes apart, k-step
//    (s, 2 i + h) at byte (8 s + 2 i + h) * 256 * MT.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../csrc/cpu/numeric.h"  // (bf16 <-> float32 bits, the CPU kernels' own)

#ifdef __CUDACC__
#define WO_LOOP_HD __host__ __device__
#else
#define WO_LOOP_HD
#endif

namespace wo_loop {

constexpr int kStepK = 128;       // k of one int4 step
constexpr int kTileBytes = 1024;  // one 16-channel tile's step of weights
constexpr int kXPad = 32;         // the kernel's x row padding, elements (kXPadElems)
constexpr int kLbo = 128;         // wgmma B: bytes between the two 8-k halves of a k-step
constexpr int kSbo = 256;         // wgmma B: bytes between 8-token groups

struct Shape {
  int warps, ct, mt, steps;
  WO_LOOP_HD int tiles() const { return warps * ct; }
  WO_LOOP_HD int tokens() const { return 8 * mt; }
  WO_LOOP_HD int k() const { return steps * kStepK; }
  WO_LOOP_HD int w_bytes() const { return steps * tiles() * kTileBytes; }
  WO_LOOP_HD int x_ld() const { return k() + kXPad; }
  WO_LOOP_HD int x_mma_elems() const { return tokens() * x_ld(); }
  WO_LOOP_HD int x_wg_bytes() const { return steps * 8 * mt * 256; }
  WO_LOOP_HD int out_floats() const { return tiles() * mt * 32 * 4; }
};

// Byte offset of lane `lane`'s 16 bytes of row g (half 0) or g + 8 (half 1) in tile `tile`, step s.
inline int w_offset(const Shape& sh, int s, int tile, int lane, int half) {
  return (s * sh.tiles() + tile) * kTileBytes + 32 * lane + 16 * half;
}

// Real k (inside the step) of nibble `nib` of word j of lane c's 16 bytes.
inline int real_k(int c, int j, int nib) { return 32 * c + 2 * j + 8 * (nib & 3) + (nib >> 2); }

// Real k (inside the step) of logical k L (0..15) of k-step ks = 2 i + h.
inline int real_k_of_logical(int ks, int L) {
  const int i = ks >> 1, h = ks & 1, q = L >> 3, c = (L & 7) >> 1, e = L & 1;
  return 32 * c + 8 * i + 4 * h + 2 * q + e;
}

// The weight of channel `ch` (0 .. 16 tiles) at real k kk of step s.
inline int w_value(const Shape& sh, const uint8_t* w, int s, int ch, int kk) {
  const int tile = ch / 16, r = ch % 16, g = r % 8, half = r / 8;
  const int c = kk / 32, rr = kk % 32, e = rr & 1, j = (rr >> 1) & 3, J = rr >> 3;
  uint32_t word;
  std::memcpy(&word, w + w_offset(sh, s, tile, 4 * g + c, half) + 4 * j, 4);
  return static_cast<int>((word >> (4 * (J + 4 * e))) & 15u) - 8;
}

// Element index of x[tok][k] in the mma.sync layout.
inline int x_mma_index(const Shape& sh, int tok, int k) {
  const int s = k / kStepK, kk = k % kStepK, p = kk / 8;
  return tok * sh.x_ld() + s * kStepK + (4 * (p % 4) + p / 4) * 8 + kk % 8;
}

// Byte offset of x[tok][k] in the wgmma layout.
inline int x_wg_offset(const Shape& sh, int tok, int k) {
  const int s = k / kStepK, kk = k % kStepK;
  const int c = kk / 32, rem = kk % 32, i = rem / 8, h = (rem % 8) / 4, q = (rem % 4) / 2, e = rem % 2;
  const int ks = 2 * i + h, t = tok / 8, r = tok % 8;
  return (s * 8 + ks) * sh.mt * 256 + t * kSbo + q * kLbo + r * 16 + (2 * c + e) * 2;
}

// Output slot of accumulator element i of lane `lane`, token tile t, tile `tile`: channel
// 16 tile + g + 8 (i >> 1), token 8 t + 2 c + (i & 1) (the mma / wgmma accumulator fragment).
WO_LOOP_HD inline int out_index(const Shape& sh, int tile, int t, int lane, int i) { return ((tile * sh.mt + t) * 32 + lane) * 4 + i; }

using dsx_num::bf16_to_f32;

// Random weights and x (bf16 of N(0, 1)) and both x images.
struct Data {
  std::vector<uint8_t> w;
  std::vector<uint16_t> x;     // [tokens][k], natural order
  std::vector<uint16_t> xmma;  // mma.sync layout
  std::vector<uint8_t> xwg;    // wgmma layout
};
inline Data make_data(const Shape& sh, unsigned seed) {
  Data d;
  std::mt19937 rng(seed);
  d.w.resize(sh.w_bytes());
  for (auto& b : d.w) b = static_cast<uint8_t>(rng() & 0xFF);
  std::normal_distribution<float> nd(0.f, 1.f);
  d.x.resize(static_cast<size_t>(sh.tokens()) * sh.k());
  for (auto& v : d.x) v = dsx_num::f32_to_bf16_rne(nd(rng));
  d.xmma.assign(sh.x_mma_elems(), 0);
  d.xwg.assign(sh.x_wg_bytes(), 0);
  for (int tok = 0; tok < sh.tokens(); ++tok)
    for (int k = 0; k < sh.k(); ++k) {
      const uint16_t v = d.x[static_cast<size_t>(tok) * sh.k() + k];
      d.xmma[x_mma_index(sh, tok, k)] = v;
      std::memcpy(d.xwg.data() + x_wg_offset(sh, tok, k), &v, 2);
    }
  return d;
}

// Float64 reference in output slots (out_index), and the bound sum |w x| per slot.
inline void reference(const Shape& sh, const Data& d, int rounds, std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(sh.out_floats(), 0.0);
  mag.assign(sh.out_floats(), 0.0);
  for (int tile = 0; tile < sh.tiles(); ++tile)
    for (int t = 0; t < sh.mt; ++t)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const int ch = 16 * tile + lane / 4 + 8 * (i >> 1), tok = 8 * t + 2 * (lane % 4) + (i & 1);
          double acc = 0, m = 0;
          for (int k = 0; k < sh.k(); ++k) {
            const double p = w_value(sh, d.w.data(), k / kStepK, ch, k % kStepK) *
                             static_cast<double>(bf16_to_f32(d.x[static_cast<size_t>(tok) * sh.k() + k]));
            acc += p, m += std::fabs(p);
          }
          ref[out_index(sh, tile, t, lane, i)] = acc * rounds;
          mag[out_index(sh, tile, t, lane, i)] = m * rounds;
        }
}

// ---- host emulation of the two loops' operand gathering (what each lane's registers and each
// descriptor address would feed the tensor cores), for the self-test: it checks the index
// arithmetic above, not the hardware's fragment layouts (the GPU run checks those).

// The value of lane `lane`'s A register `reg` (0..3), half e, k-step ks, tile `tile`, step s,
// gathered as the kernel does: word 2 h + (reg >> 1) of row half reg & 1, nibble i + 4 e.
inline int a_value(const Shape& sh, const uint8_t* w, int s, int tile, int lane, int ks, int reg, int e) {
  const int i = ks >> 1, h = ks & 1;
  uint32_t word;
  std::memcpy(&word, w + w_offset(sh, s, tile, lane, reg & 1) + 4 * (2 * h + (reg >> 1)), 4);
  return static_cast<int>((word >> (4 * (i + 4 * e))) & 15u) - 8;
}

// Faults the self-test plants (each must be caught).
enum Fault { kNone = 0, kSwapLboSbo = 1, kMmaLayoutForWg = 2, kNibbleOrder = 3 };

// Emulated output of the mma.sync path (wg = false: x from xmma as step_q_tiles reads it) or the
// wgmma path (wg = true: x from xwg through the descriptor's addressing), into out slots.
inline std::vector<double> emulate(const Shape& sh, const Data& d, bool wg, int fault) {
  std::vector<double> out(sh.out_floats(), 0.0);
  const int lbo = fault == kSwapLboSbo ? kSbo : kLbo, sbo = fault == kSwapLboSbo ? kLbo : kSbo;
  for (int s = 0; s < sh.steps; ++s)
    for (int tile = 0; tile < sh.tiles(); ++tile)
      for (int ks = 0; ks < 8; ++ks) {
        double A[16][16], B[16][32];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4;
          for (int reg = 0; reg < 4; ++reg)
            for (int e = 0; e < 2; ++e) {  // a0: row g, L 2c + e; a1: row g + 8; a2, a3: L + 8
              const int ee = fault == kNibbleOrder ? 1 - e : e;
              A[g + 8 * (reg & 1)][8 * (reg >> 1) + 2 * c + e] = a_value(sh, d.w.data(), s, tile, lane, ks, reg, ee);
            }
        }
        for (int L = 0; L < 16; ++L)
          for (int n = 0; n < sh.tokens(); ++n) {
            uint16_t v;
            if (!wg) {  // lane (g = n % 8, c) reads piece i of its row: words 2 h (L < 8) or 2 h + 1
              const int c = (L & 7) >> 1, e = L & 1, q = L >> 3, i = ks >> 1, h = ks & 1;
              const int row = n, el = s * kStepK + (4 * i + c) * 8 + 4 * h + 2 * q + e;
              v = d.xmma[row * sh.x_ld() + el];
            } else if (fault == kMmaLayoutForWg) {  // the mma layout's bytes read through the descriptor
              const int off = (s * 8 + ks) * sh.mt * 256 + (n / 8) * sbo + (L / 8) * lbo + (n % 8) * 16 + (L % 8) * 2;
              v = d.xmma[(off / 2) % sh.x_mma_elems()];
            } else {
              const int off = (s * 8 + ks) * sh.mt * 256 + (n / 8) * sbo + (L / 8) * lbo + (n % 8) * 16 + (L % 8) * 2;
              std::memcpy(&v, d.xwg.data() + off, 2);
            }
            B[L][n] = bf16_to_f32(v);
          }
        for (int t = 0; t < sh.mt; ++t)
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 4; ++i) {
              const int row = lane / 4 + 8 * (i >> 1), n = 8 * t + 2 * (lane % 4) + (i & 1);
              double sum = 0;
              for (int L = 0; L < 16; ++L) sum += A[row][L] * B[L][n];
              out[out_index(sh, tile, t, lane, i)] += sum;
            }
      }
  return out;
}

// Mismatches (beyond 1e-9 of the bound) of one emulated path against the reference.
inline int selftest(const Shape& sh, bool wg, int fault, unsigned seed = 1) {
  const Data d = make_data(sh, seed);
  std::vector<double> ref, mag;
  reference(sh, d, 1, ref, mag);
  const std::vector<double> got = emulate(sh, d, wg, fault);
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (std::fabs(got[i] - ref[i]) > 1e-9 * (mag[i] + 1)) ++bad;
  return bad;
}

}  // namespace wo_loop
