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
//  - x for the int8 tensor-core paths (imma-tok, imma-step; see "int8 x" below): x ~ S (h + l / 254) with
//    h, l int8, S a token's scale (over all k, or over each step), one 128-byte row an (s, token, piece).
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
constexpr int kI8Row = 128;       // int8 x: bytes of one (step, token, piece) row

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
  WO_LOOP_HD int xi8_bytes() const { return steps * tokens() * 2 * kI8Row; }
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

// Float64 reference in output slots (out_index), and the bound sum |w x| per slot; x is d.x (bf16), or
// xt ([tokens][k], float64) where given.
inline void reference(const Shape& sh, const Data& d, int rounds, std::vector<double>& ref, std::vector<double>& mag,
                      const std::vector<double>* xt = nullptr) {
  ref.assign(sh.out_floats(), 0.0);
  mag.assign(sh.out_floats(), 0.0);
  for (int tile = 0; tile < sh.tiles(); ++tile)
    for (int t = 0; t < sh.mt; ++t)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const int ch = 16 * tile + lane / 4 + 8 * (i >> 1), tok = 8 * t + 2 * (lane % 4) + (i & 1);
          double acc = 0, m = 0;
          for (int k = 0; k < sh.k(); ++k) {
            const size_t xi = static_cast<size_t>(tok) * sh.k() + k;
            const double p = w_value(sh, d.w.data(), k / kStepK, ch, k % kStepK) *
                             (xt ? (*xt)[xi] : static_cast<double>(bf16_to_f32(d.x[xi])));
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

// ---- int8 x (the probe's imma paths): the weights' nibbles go to the tensor cores as unsigned bytes 16 u
// (u = q + 8: one lop3 a word for the high nibbles, w & 0xF0F0F0F0, a shift and a lop3 for the low ones) and x
// as two signed bytes h, l with x ~ S (h + l / 254), S = 4064 sc (sc = the float a token's scale is kept as;
// 4064 = 16 x 254), so that an mma.sync m16n8k32 u8 x s8 -> s32 chain sums 16 u (254 h + l) / 254 exactly and
// its product with sc is sum u x~; sum q x~ = that - 8 sum x~ (corr). A lane's 16 bytes of a row hold words
// j = 0..3; a chain of 4 k-steps takes, for k-step (hh, p) (hh = 0: low nibbles, 1: high; p = 0, 1), registers
// a0 / a1 = word 2 p of rows g / g + 8, a2 / a3 = word 2 p + 1 (bytes i = nibbles 2 i + hh), so byte i of B
// register b (b0 <- a0 / a1's k, b1 <- a2 / a3's) is real k 32 c + 4 p + 2 b + 8 hh + 16 (i & 1) + (i >> 1).
// Lane (g, c) of token tile t reads token 8 t + g's row of piece h and of piece l as two 16-byte loads each, hh
// = 0 and 1, at 64 (hh ^ (token & 1)) + 16 c: the swap keeps a quarter-warp's two tokens in disjoint banks.
inline int i8_real_k(int c, int hh, int p, int b, int i) {
  return 32 * c + 4 * p + 2 * b + 8 * hh + 16 * (i & 1) + (i >> 1);
}

// The unsigned bytes 16 u of a weight word's low (hh = 0) or high (hh = 1) nibbles (the kernel's and the emulation's).
WO_LOOP_HD inline uint32_t i8_nibbles(uint32_t w, int hh) { return hh ? (w & 0xF0F0F0F0u) : ((w << 4) & 0xF0F0F0F0u); }

// Byte offset of lane c's 16 bytes of chain hh in the row of (step s, token tok, piece) of an int8 image of T tokens;
// swap = tok & 1 (the self-test's fault leaves it out).
WO_LOOP_HD inline int x_i8_lane(int T, int s, int tok, int piece, int hh, int c, int swap) {
  return ((s * T + tok) * 2 + piece) * kI8Row + 64 * (hh ^ swap) + 16 * c;
}

// Byte offset of x piece `piece` (0: h, 1: l) of token tok at k (of the whole k) in the int8 image.
inline int x_i8_offset(const Shape& sh, int tok, int piece, int k) {
  const int s = k / kStepK, kk = k % kStepK, c = kk / 32, r = kk % 32;  // r = 4 p + 2 b + 8 hh + 16 (i & 1) + (i >> 1)
  const int hh = r >> 3 & 1, p = r >> 2 & 1, b = r >> 1 & 1, i = (r >> 4 & 1) | (r & 1) << 1;
  return x_i8_lane(sh.tokens(), s, tok, piece, hh, c, tok & 1) + 8 * p + 4 * b + i;
}

// The int8 image of d.x: per_step = false, one scale a token over all k (the image's sc has `tokens` floats);
// true, one a (step, token) (steps x tokens, step-major). xt: what the image stands for, float64 [tokens][k];
// corr: 8 sum_k xt a token.
struct XI8 {
  std::vector<uint8_t> img;
  std::vector<float> sc, corr;
  std::vector<double> xt;
};
inline XI8 make_xi8(const Shape& sh, const Data& d, bool per_step) {
  XI8 q;
  const int T = sh.tokens(), K = sh.k(), span = per_step ? kStepK : K;
  q.img.assign(sh.xi8_bytes(), 0);
  q.sc.assign(per_step ? sh.steps * T : T, 0.f);
  q.corr.assign(T, 0.f);
  q.xt.assign(static_cast<size_t>(T) * K, 0.0);
  for (int tok = 0; tok < T; ++tok) {
    double sum = 0;
    for (int k0 = 0; k0 < K; k0 += span) {
      double amax = 0;
      for (int k = k0; k < k0 + span; ++k)
        amax = std::fmax(amax, std::fabs(bf16_to_f32(d.x[static_cast<size_t>(tok) * K + k])));
      const float sc = static_cast<float>(amax / (127.0 * 4064.0));
      q.sc[per_step ? (k0 / kStepK) * T + tok : tok] = sc;
      const double S = 4064.0 * sc;
      for (int k = k0; k < k0 + span; ++k) {
        const double x = bf16_to_f32(d.x[static_cast<size_t>(tok) * K + k]);
        const double u = S > 0 ? x / S : 0.0;
        const double h = std::fmin(127.0, std::fmax(-127.0, std::nearbyint(u)));
        const double l = std::fmin(127.0, std::fmax(-127.0, std::nearbyint((u - h) * 254.0)));
        q.img[x_i8_offset(sh, tok, 0, k)] = static_cast<uint8_t>(static_cast<int8_t>(h));
        q.img[x_i8_offset(sh, tok, 1, k)] = static_cast<uint8_t>(static_cast<int8_t>(l));
        const double xt = S * (h + l / 254.0);
        q.xt[static_cast<size_t>(tok) * K + k] = xt;
        sum += xt;
      }
    }
    q.corr[tok] = static_cast<float>(8.0 * sum);
  }
  return q;
}

// Faults the int8 self-test plants: the token swap left out of the reads, the nibble chains swapped, the pieces
// swapped.
enum I8Fault { kI8None = 0, kI8NoSwap = 1, kI8Nibbles = 2, kI8Pieces = 3 };

// Emulated output of an int8 path (the kernel's loads and lop3s, the m16n8k32 fragments as PTX defines them for
// 8-bit types: a0 / a1 row g / g + 8, k 4 c + i; a2 / a3 k 16 + 4 c + i; b0 k 4 c + i, b1 16 + 4 c + i, token g),
// its int32 chains summed exactly, scaled as the kernel does (per step or at the end), less corr.
inline std::vector<double> emulate_i8(const Shape& sh, const Data& d, const XI8& q, bool per_step, int fault) {
  const int T = sh.tokens();
  std::vector<double> acc(sh.out_floats(), 0.0);
  std::vector<long long> ch[2];  // chains of piece h and l, in out slots
  ch[0].assign(sh.out_floats(), 0), ch[1].assign(sh.out_floats(), 0);
  auto word_of = [&](int s, int tile, int lane, int half, int j) {
    uint32_t w;
    std::memcpy(&w, d.w.data() + w_offset(sh, s, tile, lane, half) + 4 * j, 4);
    return w;
  };
  auto x_word = [&](int s, int tok, int piece, int c, int hh, int widx) {
    const int pc = fault == kI8Pieces ? 1 - piece : piece;
    const int swap = fault == kI8NoSwap ? 0 : (tok & 1);
    uint32_t w;
    std::memcpy(&w, q.img.data() + x_i8_lane(T, s, tok, pc, hh, c, swap) + 4 * widx, 4);
    return w;
  };
  auto byte = [](uint32_t w, int i) { return static_cast<int>((w >> (8 * i)) & 0xFF); };
  auto sbyte = [](uint32_t w, int i) { return static_cast<int>(static_cast<int8_t>((w >> (8 * i)) & 0xFF)); };
  for (int s = 0; s < sh.steps; ++s) {
    for (int tile = 0; tile < sh.tiles(); ++tile)
      for (int t = 0; t < sh.mt; ++t)
        for (int piece = 0; piece < 2; ++piece)
          for (int hh = 0; hh < 2; ++hh)
            for (int p = 0; p < 2; ++p) {
              int A[16][32], B[32][8];
              for (int lane = 0; lane < 32; ++lane) {
                const int g = lane / 4, c = lane % 4, nh = fault == kI8Nibbles ? 1 - hh : hh;
                auto un = [&](uint32_t w) { return i8_nibbles(w, nh); };
                const uint32_t a[4] = {un(word_of(s, tile, lane, 0, 2 * p)), un(word_of(s, tile, lane, 1, 2 * p)),
                                       un(word_of(s, tile, lane, 0, 2 * p + 1)),
                                       un(word_of(s, tile, lane, 1, 2 * p + 1))};
                for (int i = 0; i < 4; ++i) {
                  A[g][4 * c + i] = byte(a[0], i), A[g + 8][4 * c + i] = byte(a[1], i);
                  A[g][16 + 4 * c + i] = byte(a[2], i), A[g + 8][16 + 4 * c + i] = byte(a[3], i);
                }
                const int tok = 8 * t + g;
                const uint32_t b0 = x_word(s, tok, piece, c, hh, 2 * p), b1 = x_word(s, tok, piece, c, hh, 2 * p + 1);
                for (int i = 0; i < 4; ++i) B[4 * c + i][g] = sbyte(b0, i), B[16 + 4 * c + i][g] = sbyte(b1, i);
              }
              for (int lane = 0; lane < 32; ++lane)
                for (int i = 0; i < 4; ++i) {
                  const int row = lane / 4 + 8 * (i >> 1), n = 2 * (lane % 4) + (i & 1);
                  long long sum = 0;
                  for (int L = 0; L < 32; ++L) sum += static_cast<long long>(A[row][L]) * B[L][n];
                  ch[piece][out_index(sh, tile, t, lane, i)] += sum;
                }
            }
    if (per_step || s == sh.steps - 1)
      for (int tile = 0; tile < sh.tiles(); ++tile)
        for (int t = 0; t < sh.mt; ++t)
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 4; ++i) {
              const int o = out_index(sh, tile, t, lane, i), tok = 8 * t + 2 * (lane % 4) + (i & 1);
              const double sc = q.sc[per_step ? s * T + tok : tok];
              acc[o] += (254.0 * ch[0][o] + ch[1][o]) * sc;
              ch[0][o] = ch[1][o] = 0;
            }
  }
  for (int o = 0; o < sh.out_floats(); ++o) {
    const int lane = (o / 4) % 32, i = o % 4, t = (o / 128) % sh.mt;
    acc[o] -= q.corr[8 * t + 2 * (lane % 4) + (i & 1)];
  }
  return acc;
}

// Mismatches of an emulated int8 path against the float64 reference of what its image stands for (beyond 1e-6 of
// the bound: corr is a float).
inline int selftest_i8(const Shape& sh, bool per_step, int fault, unsigned seed = 1) {
  const Data d = make_data(sh, seed);
  const XI8 q = make_xi8(sh, d, per_step);
  std::vector<double> ref, mag;
  reference(sh, d, 1, ref, mag, &q.xt);
  const std::vector<double> got = emulate_i8(sh, d, q, per_step, fault);
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (std::fabs(got[i] - ref[i]) > 1e-6 * (mag[i] + 1)) ++bad;
  return bad;
}

}  // namespace wo_loop
