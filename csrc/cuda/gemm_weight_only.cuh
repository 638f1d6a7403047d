// Device helpers of the weight-only GEMM (gemm_weight_only.cu): the bulk-copy pipeline
// primitives, Paddle-layout unpacking into mma fragments, the bf16 tensor-core mma, and the
// warp steps per layout (step_q: int8 and int4, one or two steps at once; step_g64_tiles: int4 group 64).
//
// How Paddle's bytes meet the mma (m16n8k16, A = weights [16 channels x 16 k] row-major,
// B = activations [16 k x 8 tokens]; lane = 4 * g + c, g = groupID, c = thread in group):
// A's registers for a lane are {row g: k 2c,2c+1}, {row g+8: same}, {row g: k 2c+8,2c+9},
// {row g+8: same}; B's are {k 2c,2c+1} and {k 2c+8,2c+9} of token g. The dot product does
// not care which real k stands behind a logical k, as long as A and B agree, so each lane
// takes whole 32-bit words of Paddle's layout and its B values are read from the matching
// real k of x.
//
//  int8: a 32-bit word of a channel's 64-element segment holds, in bytes 0..3, the real
//        k = 16b + 2j + {0, 8, 1, 9} (b = word / 4, j = word % 4; doc section 3): bytes
//        {0, 2} are a k pair and bytes {1, 3} the pair 8 above. A lane takes words
//        4c..4c+3 (16 bytes) of rows g and g+8, i.e. the 8 k pairs p of real k = 16c + 2p
//        (x[16c .. 16c+16) of the step); mma k-step (i, h), i, h = 0, 1, takes pairs
//        4i + 2h (byte pair i of word 2h: logical {2c, 2c+1}) and 4i + 2h + 1 (byte pair i
//        of word 2h + 1: logical {2c+8, 2c+9}).
//  int4: a word holds 8 nibbles with real k = 2w + {0, 8, 16, 24, 1, 9, 17, 25} inside its
//        32-block (w = word % 4): nibbles {J, J+4} form the pair k = 2w + 8J + {0, 1}. A
//        lane takes one 16-byte half of a segment (one 32-block): lane c takes tile
//        2*step + c/2, half c%2, i.e. the 16 pairs p of real k = 32c + 2p of the 128-wide
//        step (p = 4J + w); mma k-step (i, h), i = 0..3, h = 0, 1, takes pairs 4i + 2h
//        (nibbles {i, i+4} of word 2h) and 4i + 2h + 1 (the same nibbles of word 2h + 1).
//  Either way the two B registers of k-step (i, h) are words 2h, 2h + 1 of the lane's x
//  piece i: one 16-byte load of x serves two mma.
//  (int4 group 64, step_g64_tiles, pairs its k differently: see there.)
//
// x in shared memory: a step's row of x is stored as 16-byte pieces (8 k each) in the order
// that makes every lane's loads consecutive: the piece of real k = 8 * (IPC * c + i) (lane c's
// i-th piece, IPC = 4 pieces a lane for int4, 2 for int8) sits at position 4 * i + c. Rows are
// 64 bytes apart modulo 128, so the two rows a quarter-warp reads fall in disjoint banks.
//
// Values: int8 byte u = q + 128, int4 nibble u = q + 8. Each is turned into bf16 q exactly
// with one lop3 (mask and magic exponent), a shift for most nibbles, and one bf16x2 fma:
// bf16 bits 0x4300 | v is 128 + v for v < 128.
// Tried and dropped (wo15, 2026-12-01; code in branch wt-wo15, commit 16476db): int4 pairs left at
// 128 + u = q + 136 (no fma), each mma chain started from -136 * (the fp32 sum of the x it covers,
// computed once per staged x in a fixed order) instead of 0, at up to 16 rows. Exact algebra, the
// same bits on every path, GPU tests passed; precision (numpy model of the tensor cores, truncating):
// the fp32 error grew from 0.04% to 2.7% of the tests' bound with one x of 500 among N(0, 1), >= 98%
// still correctly rounded. Speed (H200, interleaved A/B against this kernel, us, new / this):
// 36864 x 7168 M = 4 / 9 / 16 44.18 / 45.00, 54.94 / 55.51, 62.68 / 63.34 (1-2% faster), but
// 7168 x 18432 M = 1 / 16 27.01 / 26.56, 35.75 / 33.55, 4096 x 7168 M = 16 17.35 / 15.40, 2048 x 7168
// M = 16 13.20 / 11.57 (up to 14% slower): the sums, taken before a block's first step, delay every
// block of a one-round grid, and the chain starts (a shared load per token tile a step, live before
// the first mma) cost about what the 32 fma a step saved. So the fma is not where M = 16's ~15 us of
// arithmetic goes. (At 64 rows the chain starts cost registers, 163 -> 195: 213.1 against 198.0 us.)
// Thirtieth session, again without a prologue (x sums by mma, x as A against B = -136, added where a run ends; commit
// 4b4f834): 36864 x 7168 M = 9..16 3-4% faster, 7168 x 18432 4% and 24576 x 1536 27-34% slower (docs/benchmarks.md).
// Thirty-first session, kept where it pays: x-ring launches whose blocks loop over two tile groups or more, the x sums
// taken by the producer warp from the x ring (i4_pairj<false>, fold_step_sum_xr; gemm_weight_only_ws.cuh, FOLD).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sm90_ptx.cuh"  // (wgmma, for the WG consumers: step_q_wgmma)

namespace dsx_wo {

// ---------------------------------------------------------------- pipeline primitives

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the bulk-copy (async) proxy.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of bulk copies completing on the barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

// Wait until the barrier's phase with this parity has completed (its bytes have landed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// L2 policy for bytes read once (the weights): evict them first.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// Bulk copy (the copy engine, no registers) global -> this CTA's shared memory, completing
// `bytes` on the barrier. dst, src 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// Tensor copy (the copy engine) of one box at coordinates {c0 (bytes along the row), c1 (row)}
// of a 2D byte tensor map into this CTA's shared memory, completing on the barrier.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void prefetch_tmap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// Programmatic dependent launch: let the next kernel in the stream start launching now; wait
// until the previous kernel has finished and its writes are visible (no-ops when the launch
// did not ask for it).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// A cluster barrier in two halves: arrive (relaxed: it orders nothing, it only says "I am done
// reading my peers' shared memory") and, later, wait. Every thread of every block of the cluster
// executes both, warps converged, alternately.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

// Shared-memory reads are plain C++ loads, so the compiler orders them with the barriers
// and the asm volatile waits (which clobber memory).
__device__ __forceinline__ uint4 lds128(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 lds64(const void* p) { return *reinterpret_cast<const uint2*>(p); }

// 16 bytes global -> shared, asynchronously; src_bytes 0 writes zeros (reads nothing).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t a = smem_addr(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- unpacking

// (a & b) | c in one instruction (lop3 truth table 0xEA), (a & b) ^ c (0x6A).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t and_xor(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// d = a * 1 + c on bf16x2: exact here (small integers).
__device__ __forceinline__ uint32_t bf16x2_add(uint32_t a, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(c));
  return d;
}

// int8: bytes {0, 2} (pair 0) or {1, 3} (pair 1) of a word -> bf16x2 q = u - 128, low half
// from the lower byte. v = u & 127 gives 128 + v; subtract 256 (u < 128) or 128 (u >= 128).
template <int PAIR>
__device__ __forceinline__ uint32_t i8_pair(uint32_t w) {
  const uint32_t t = PAIR ? (w >> 8) : w;                  // bytes of the pair at bits 0..7 and 16..23
  const uint32_t val = and_or(t, 0x007F007Fu, 0x43004300u);   // 128 + (u & 127)
  const uint32_t neg = and_xor(t, 0x00800080u, 0xC380C380u);  // -256, or -128 if u >= 128
  return bf16x2_add(val, neg);
}

// int4: nibbles {j, j + 4} of a word -> bf16x2 q = u - 8 (low half from nibble j); int8 the same for a byte pair. The
// pair is an argument, a constant once the loops unroll.
// (The shifts are 48 of the 252 instructions of the 9..16-row step loop, 3 a word; taking them out, wrong values,
// makes 36864 x 7168 at 16 rows 9% faster, but each way of getting the nibbles down without them measured no better:
// mul.hi, byte permutes, fp16 magic arithmetic: docs/benchmarks.md, "Twenty-ninth session" in the weight-only section.)
template <bool SUB = true>
__device__ __forceinline__ uint32_t i4_pairj(uint32_t w, int j) {
#ifdef DSX_WO_DIAG_NOUNPACK  // diagnostic build (bench --ab-libs): the raw word to the mma, no unpack, wrong values
  return w;
#endif
#ifndef DSX_WO_DIAG_NOSHIFT
  const uint32_t val = and_or(j ? (w >> (4 * j)) : w, 0x000F000Fu, 0x43004300u);
#else  // diagnostic build (bench --alt-lib): the same but for the shifts, wrong values
  const uint32_t val = and_or(w, 0x000F000Fu << (4 * j), 0x43004300u);
#endif
#ifdef DSX_WO_DIAG_NOADD  // diagnostic build (bench --ab-libs): 128 + u to the mma, without the - 136, wrong values
  return val;
#endif
  if constexpr (!SUB) return val;  // (the fold: 128 + u = q + 136; the kernel subtracts 136 x the sum of x)
  return bf16x2_add(val, 0xC308C308u);
}
__device__ __forceinline__ uint32_t i8_pairj(uint32_t w, int pair) {
#ifdef DSX_WO_DIAG_NOUNPACK
  return w;
#endif
  return pair ? i8_pair<1>(w) : i8_pair<0>(w);
}

// d += A (16x16, row) * B (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#ifdef DSX_WO_DIAG_NOMMA  // diagnostic build (bench --ab-libs): the operands consumed on the CUDA cores, no mma
  d[0] += __uint_as_float((a[0] ^ a[1] ^ a[2] ^ a[3] ^ b0 ^ b1) & 1u);
  return;
#endif
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ uint16_t f32_to_bf16_rne(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// One step of weights for one lane: 16 bytes of rows g and g+8, and their scales
// (GMODE 1: s[0] = bf16 of row g | row g+8 << 16; GMODE 2: s[0], s[1] for the two 64-groups).
struct Stage {
  uint4 w[2];
  uint32_t s[2];
};

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// The A fragment of mma k-step (i, h) (issued in the order 2 i + h) of one 16-channel tile: the nibble (int4) or byte
// (int8) pairs i of words 2 h and 2 h + 1 of the lane's two rows (step_q, step_q_tiles_with, step_q_wgmma).
template <int BITS, bool SUB = true>
__device__ __forceinline__ void a_frag(uint32_t (&a)[4], const Stage& st, int i, int h) {
  auto pair = [](uint32_t w, int j) { return BITS == 8 ? i8_pairj(w, j) : i4_pairj<SUB>(w, j); };
  a[0] = pair(word(st.w[0], 2 * h), i), a[1] = pair(word(st.w[1], 2 * h), i);
  a[2] = pair(word(st.w[0], 2 * h + 1), i), a[3] = pair(word(st.w[1], 2 * h + 1), i);
}

__device__ __forceinline__ void add_scaled(float (&acc)[4], const float (&part)[4], uint32_t s) {
  const float s0 = bf16_bits_to_f32(static_cast<uint16_t>(s & 0xFFFF));
  const float s1 = bf16_bits_to_f32(static_cast<uint16_t>(s >> 16));
  acc[0] = fmaf(part[0], s0, acc[0]);
  acc[1] = fmaf(part[1], s0, acc[1]);
  acc[2] = fmaf(part[2], s1, acc[2]);
  acc[3] = fmaf(part[3], s1, acc[3]);
}

// A step's tensor-core partial (at most 8 chained mma, started from 0) joins the fp32
// accumulator on the CUDA cores: acc += part (per channel: scaled at the very end) or
// acc = fma(part, s, acc) (group scales). Short mma chains keep the tensor cores' own
// accumulation (which aligns and truncates internally) to 128 products.
template <int GMODE>
__device__ __forceinline__ void promote(float (&acc)[4], const float (&part)[4], uint32_t s) {
  if (GMODE == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += part[i];
  } else {
    add_scaled(acc, part, s);
  }
}

// int8 / int4 steps, NS (1 or 2) consecutive steps at once: the NS * MT mma chains are
// independent, so their instructions interleave (a warp alone keeps the tensor cores and the
// unpacking busy); each step's chain and its promotion are exactly those of a lone step
// (same bits). Mma k-step (i, h) takes the lane's k pairs 4i + 2h and 4i + 2h + 1 (real
// k = 2 * pair inside the lane's k range): both come from the same x piece i (one 16-byte
// load feeds two mma) and from words 2h, 2h + 1 of the lane's 16 bytes (int4: nibbles
// {i, i + 4}; int8: byte pair i).
// xs: the first step's x (the next one kStepK elements further); xo[t]: this lane's offset
// of tile t's x row in the buffer (row min(8t + g, M-1), plus 8c: the lane's first piece).
template <int BITS, int MT, int GMODE, int NS>
__device__ __forceinline__ void step_q(float (&acc)[MT][4], const Stage (&st)[NS], const uint16_t* xs,
                                       const int (&xo)[MT]) {
  // int8: 4 mma k-steps over 64 K (2 pieces of x a lane); int4 (per channel or group 128): 8 over
  // 128 K (lane c's pieces of x at positions c, 4 + c, 8 + c, 12 + c).
  constexpr int kPiecesPerLane = BITS == 8 ? 2 : 4, kStepElems = BITS == 8 ? 64 : 128;
  float part[NS][MT][4];
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int t = 0; t < MT; ++t) part[n][t][0] = part[n][t][1] = part[n][t][2] = part[n][t][3] = 0.f;
#pragma unroll
  for (int i = 0; i < kPiecesPerLane; ++i) {
    uint4 u[NS][MT];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int t = 0; t < MT; ++t) u[n][t] = dsx_wo::lds128(xs + kStepElems * n + xo[t] + 32 * i);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int n = 0; n < NS; ++n) {
        uint32_t a[4];
        a_frag<BITS>(a, st[n], i, h);
#pragma unroll
        for (int t = 0; t < MT; ++t)
          dsx_wo::mma_bf16(part[n][t], a, h ? u[n][t].z : u[n][t].x, h ? u[n][t].w : u[n][t].y);
      }
  }
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int t = 0; t < MT; ++t) promote<GMODE>(acc[t], part[n][t], st[n].s[0]);
}

// One step of CT channel tiles (16 channels each, st[ct] a tile's Stage) at once: each 16-byte
// x load feeds the mma of every tile (2 * CT * MT mma a load instead of 2 * MT), so a warp that
// owns CT tiles reads x from shared memory once per CT * 16 channels. Each tile's chain (the
// same mma in the same order, from 0) and its promotion are exactly step_q's for that tile alone
// with NS = 1: the same bits. xload(i, t): the lane's 16-byte x piece i of token tile t.
template <int BITS, int MT, int GMODE, int CT, class XLoad, bool SUB = true>
__device__ __forceinline__ void step_q_tiles_with(float (&acc)[CT][MT][4], const Stage (&st)[CT], XLoad xload) {
  constexpr int kPiecesPerLane = BITS == 8 ? 2 : 4;
  float part[CT][MT][4];
#pragma unroll
  for (int n = 0; n < CT; ++n)
#pragma unroll
    for (int t = 0; t < MT; ++t) part[n][t][0] = part[n][t][1] = part[n][t][2] = part[n][t][3] = 0.f;
#pragma unroll
  for (int i = 0; i < kPiecesPerLane; ++i) {
    uint4 u[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) u[t] = xload(i, t);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int n = 0; n < CT; ++n) {
        uint32_t a[4];
        a_frag<BITS, SUB>(a, st[n], i, h);
#pragma unroll
        for (int t = 0; t < MT; ++t)
          dsx_wo::mma_bf16(part[n][t], a, h ? u[t].z : u[t].x, h ? u[t].w : u[t].y);
      }
  }
#pragma unroll
  for (int n = 0; n < CT; ++n)
#pragma unroll
    for (int t = 0; t < MT; ++t) promote<GMODE>(acc[n][t], part[n][t], st[n].s[0]);
}

// x staged in the permuted layout (stage_x_steps): piece i of token tile t at xs + xo[t] + 32 i.
template <int BITS, int MT, int GMODE, int CT>
__device__ __forceinline__ void step_q_tiles(float (&acc)[CT][MT][4], const Stage (&st)[CT], const uint16_t* xs,
                                             const int (&xo)[MT]) {
  step_q_tiles_with<BITS, MT, GMODE, CT>(acc, st, [&](int i, int t) { return dsx_wo::lds128(xs + xo[t] + 32 * i); });
}

// x from the warp-specialized kernel's x ring (XR, int4, two token tiles; gemm_weight_only_ws.cuh, kXrStepBytes):
// the step's x at byte `off` of `smem` (512-byte aligned in shared memory), row r at 256 r, the lane's 64 bytes (real
// k 32 c ..) at 64 c, their 16-byte piece i swizzled to piece i ^ ((2 r + c / 2) & 3) by the copy engine; xo0 = 256 g
// + 64 c + 16 ((2 g + c / 2) & 3) (xr_lane_off), so piece i of row 8 t + g is at (off + xo0) ^ (16 i), + 2048 t (bits 4..5 of off,
// of 2048 t and of the shared base are zero). The same values as step_q_tiles': the same bits.
__device__ __forceinline__ int xr_lane_off(int g, int c) {
  return 256 * g + 64 * c + 16 * ((2 * g + (c >> 1)) & 3);
}
// (piece i of token tile t, o = off + xo0)
__device__ __forceinline__ uint4 xr_piece(const uint8_t* smem, uint32_t o, int i, int t) {
  return dsx_wo::lds128(smem + ((o ^ (16u * i)) + 2048u * t));
}
template <int BITS, int MT, int GMODE, int CT, bool SUB = true>
__device__ __forceinline__ void step_q_tiles_xr(float (&acc)[CT][MT][4], const Stage (&st)[CT], const uint8_t* smem,
                                                uint32_t off, int xo0) {
  static_assert(BITS == 4 && MT == 2, "the x ring: int4, two token tiles");
  const uint32_t o = off + static_cast<uint32_t>(xo0);
  auto xload = [&](int i, int t) { return xr_piece(smem, o, i, t); };
  step_q_tiles_with<BITS, MT, GMODE, CT, decltype(xload), SUB>(acc, st, xload);
}

// The fold's step sums (the producer warp of the warp-specialized kernel's FOLD instances): sum[t][e] += the sum of
// x row 8 t + 2 c + e over the x-ring step at byte `off` of `smem` (step_q_tiles_xr's layout; zeros past K and M), by
// one chain of 8 mma (A all ones, B the lane's x pieces in step_q's order), then one fp32 add (in step order across
// the calls: the same bits whatever warp or block shape runs them).
__device__ __forceinline__ void fold_step_sum_xr(float (&sum)[2][2], const uint8_t* smem, uint32_t off, int xo0) {
  const uint32_t o = off + static_cast<uint32_t>(xo0);
  const uint32_t ones[4] = {0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u};
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 u = xr_piece(smem, o, i, t);
#ifndef DSX_WO_DIAG_FOLDNOSUM  // (diagnostic build: the pieces loaded, no mma, wrong sums; with DSX_WO_FOLD_ALL)
      mma_bf16(d, ones, u.x, u.y);
      mma_bf16(d, ones, u.z, u.w);
#else
      d[0] += __uint_as_float(u.x & u.w & 1u);
#endif
    }
    sum[t][0] += d[0], sum[t][1] += d[1];
  }
}

// int4 step with group 64: a step spans two groups, but each mma must stay inside one. Lane c's
// words in "g64 order": word slots 0, 1 of every lane hold 32-block c & 1 of the step (the first
// 64-group) and slots 2, 3 block 2 + (c & 1) (the second), half c >> 1 of each block's words
// (slot w is word (w & 1) | (c >> 1) << 1 of block 2 (w >> 1) + (c & 1)), so that mma k-steps 0..3
// / 4..7 cover one 64-group each, with their own partial sums and scales (st.s[0], st.s[1]). The
// warp-specialized kernel reads them so from shared memory, two 8-byte loads a row (g64_stage);
// the plain kernel reads Paddle's 16 bytes a lane as for the other layouts and trades half its
// words with lane c ^ 2 (g64_words: its one-token-tile instances sit at their 64-register cap,
// where the 8-byte loads spilled). (Before the forty-second session both traded, which tied the
// step to one tile a warp.)
// (xo[t] here: row offset plus 8 (c & 1) + 4 (c >> 1): the lane's 8-byte x pieces, below.)
__device__ __forceinline__ void g64_words(Stage& st, int c) {
  const bool hi = (c >> 1) != 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint4 v = st.w[r];
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, hi ? v.x : v.z, 2);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, hi ? v.y : v.w, 2);
    st.w[r] = make_uint4(hi ? got0 : v.x, hi ? got1 : v.y, hi ? v.z : got0, hi ? v.w : got1);
  }
}

// A lane's two rows of one step in g64 order straight from shared memory: row r's slots 0, 1 at
// p + r * rgap and slots 2, 3 at 128 bytes further (the next 64 k of the channel-group row),
// p = the row's step + 32 (g & 3) + 16 (c & 1) + 8 (c >> 1).
__device__ __forceinline__ void g64_stage(Stage& st, const uint8_t* p, int rgap) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint2 lo = lds64(p + r * rgap), hi = lds64(p + r * rgap + 128);
    st.w[r] = make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
}

// The A fragment of group sg's k-step j (0..3: step_g64_tiles_with) from a lane's two rows in g64 order: nibble pair
// j of word slots 2 sg (the lower logical half) and 2 sg + 1 (the upper).
__device__ __forceinline__ void g64_frag(uint32_t (&r)[4], const Stage& st, int sg, int j) {
  r[0] = i4_pairj(word(st.w[0], 2 * sg), j), r[1] = i4_pairj(word(st.w[1], 2 * sg), j);
  r[2] = i4_pairj(word(st.w[0], 2 * sg + 1), j), r[3] = i4_pairj(word(st.w[1], 2 * sg + 1), j);
}

// One group-64 step of CT channel tiles (st[n] in g64 order) at once: each 8-byte x piece feeds
// the mma of every tile. Chain (n, t, sg) is the mma k-steps 4 sg + J, J = 0..3, in that order
// from 0, then fma'd into acc with the scale of group sg: per tile the chains of a lone tile, the
// same bits whatever CT. xload(sg, i, t): the lane's x piece i (8 bytes) of group sg, token tile t:
// real k 64 sg + 32 (c & 1) + 4 (c >> 1) + 8 i + {0, 1, 2, 3}. Nibble pair J (nibbles J, J + 4) of
// slot w holds real k 64 (w / 2) + 32 (c & 1) + 4 (c >> 1) + 2 (w & 1) + 8 J + {0, 1}, so k-step J of
// group sg takes pair J of slots 2 sg (its lower logical half) and 2 sg + 1 (its upper half, 2 above),
// and x piece J whole as its B pair: one 8-byte load an mma, no register moves. (Until the
// forty-fourth session the k-steps paired pairs 2h and 2h + 1 of one slot, and each mma's B pair
// came from two pieces: the compiler paired them by about 50 register moves a step; H200, 36864 x
// 7168 at 9..16 rows 5-9% faster without them: docs/benchmarks.md, "Forty-fourth session".)
template <int MT, int CT, class XLoad>
__device__ __forceinline__ void step_g64_tiles_with(float (&acc)[CT][MT][4], const Stage (&st)[CT], XLoad xload) {
  // The k-steps unpacked once for every token tile: both groups' at once, and both groups' x pieces loaded at
  // once, with one tile a warp and up to two token tiles (as before the forty-second session: the plain kernel's
  // one-token-tile instances sit at their 64-register cap, and a group at a time spilled there), else a group's at a
  // time (16 registers a tile; four token tiles spilled less so).
  constexpr int kAtOnce = CT == 1 && MT <= 2 ? 2 : 1;
#pragma unroll
  for (int sg0 = 0; sg0 < 2; sg0 += kAtOnce) {
    uint32_t a[CT][4 * kAtOnce][4];
#pragma unroll
    for (int n = 0; n < CT; ++n)
#pragma unroll
      for (int q = 0; q < kAtOnce; ++q)
#pragma unroll
        for (int j = 0; j < 4; ++j) g64_frag(a[n][4 * q + j], st[n], sg0 + q, j);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      uint2 xv[kAtOnce][4];
#pragma unroll
      for (int q = 0; q < kAtOnce; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[q][i] = xload(sg0 + q, i, t);
#pragma unroll
      for (int q = 0; q < kAtOnce; ++q) {
        float part[CT][4];
#pragma unroll
        for (int n = 0; n < CT; ++n) part[n][0] = part[n][1] = part[n][2] = part[n][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int n = 0; n < CT; ++n) dsx_wo::mma_bf16(part[n], a[n][4 * q + j], xv[q][j].x, xv[q][j].y);
#pragma unroll
        for (int n = 0; n < CT; ++n) add_scaled(acc[n][t], part[n], st[n].s[sg0 + q]);
      }
    }
  }
}

// x staged in the permuted layout (stage_x_steps): the lane's piece i of group sg, token tile t, at
// xs + xo[t] + 16 sg + 32 i (32-block 2 sg + (c & 1), half c >> 1).
template <int MT, int CT>
__device__ __forceinline__ void step_g64_tiles(float (&acc)[CT][MT][4], const Stage (&st)[CT], const uint16_t* xs,
                                               const int (&xo)[MT]) {
  step_g64_tiles_with<MT, CT>(acc, st,
                              [&](int sg, int i, int t) { return dsx_wo::lds64(xs + xo[t] + 16 * sg + 32 * i); });
}

// int4 group 64 from the x ring (XR; step_q_tiles_xr's layout): the lane's 8-byte piece i of group sg, token tile t, is
// half c >> 1 of piece i of segment 2 sg + (c & 1) of row 8 t + g, whose swizzle is (2 g + sg) & 3 (2048 t moves
// none of bits 4..5): at (off + xg0 + 144 sg) ^ (16 i), + 2048 t, xg0 = xr_g64_off(g, c) (group 1: 128 bytes on,
// swizzle + 1; no carry reaches bits 4..5, so the xor stays on the piece index).
__device__ __forceinline__ int xr_g64_off(int g, int c) {
  return 256 * g + 64 * (c & 1) + 8 * (c >> 1) + 16 * ((2 * g) & 3);
}
template <int MT, int CT>
__device__ __forceinline__ void step_g64_tiles_xr(float (&acc)[CT][MT][4], const Stage (&st)[CT], const uint8_t* smem,
                                                  uint32_t off, int xg0) {
  const uint32_t o = off + static_cast<uint32_t>(xg0);
  step_g64_tiles_with<MT, CT>(acc, st, [&](int sg, int i, int t) {
    return dsx_wo::lds64(smem + (((o + 144u * sg) ^ (16u * i)) + 2048u * t));
  });
}

// x steps [s0, s0 + steps) of rows [0, m) (row-major [m, k] bf16) into buf, row stride ld elements:
// each step's values as 16-byte pieces in the order the lanes' fragment loads read them (piece q of
// a step at ((q % ipc) * 4 + q / ipc) * 8, ipc = the pieces one lane reads); pieces at or past K
// read nothing and fill zeros (the int4 half step). Threads tid, tid + nthr, ... copy the pieces:
// SYNC = false: as one cp.async group, committed (for chunks staged ahead of their use);
// SYNC = true: through registers, KB loads in flight a thread, stored before returning (for x
// staged whole and waited for at once; the caller's barrier makes it visible: the warp-specialized
// kernel with one or two tiles a warp; the others keep cp.async, not measured). Fourteenth session:
// the register path was much faster where the kernel waits for x before its first step (H200, bench
// --ab, interleaved, one run, us, cp.async -> registers, the warp-specialized kernel: 36864 x 7168
// M = 1 / 8 / 16 43.96 / 45.31 / 59.26 -> 41.82 / 44.11 / 56.81; 4096 x 7168 10.38 / 12.06 / 15.11 ->
// 9.75 / 10.84 / 12.47; 2048 x 7168 7.62 / 9.42 / 11.03 -> 7.15 / 7.93 / 10.17; 7168 x 18432 25.10 /
// 28.09 / 32.58 -> 23.91 / 27.73 / 32.46), within 1.5 us of not staging x at all (a diagnostic
// build): the cp.async copies of all blocks (16-byte, zero-fill form) landed late. (Twenty-fourth session:
// x queued behind every block's first ring fills; the warp-specialized kernel's producer now waits for x
// before its second fill: kXGateFill in gemm_weight_only_ws.cuh.)
template <int BITS, bool SYNC = false, int KB = 8>
__device__ __forceinline__ void stage_x_steps(uint16_t* buf, int ld, const uint16_t* x, int m, int k, int s0,
                                              int steps, int tid, int nthr) {
  constexpr int kStepK = BITS == 8 ? 64 : 128, kPieces = kStepK / 8, kIpc = kPieces / 4;
  const int per_row = steps * kPieces, k0 = s0 * kStepK, total = m * per_row;
  if constexpr (SYNC) {
    for (int i0 = tid; i0 < total; i0 += KB * nthr) {  // (KB: fewer where the kernel sits at its register cap)
      uint4 v[KB];
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        const int i = i0 + b * nthr;
        if (i < total) {
          const int row = i / per_row, rem = i - row * per_row;
          const int kk = k0 + rem * 8;
          // (a coherent load, not __ldg: under PDL x may have been written by the grid just before)
          v[b] = kk < k ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * k + kk) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int b = 0; b < KB; ++b) {  // (the places computed again: fewer registers held across the loads)
        const int i = i0 + b * nthr;
        if (i < total) {
          const int row = i / per_row, rem = i - row * per_row;
          const int st = rem / kPieces, q = rem % kPieces;
          *reinterpret_cast<uint4*>(buf + row * ld + st * kStepK + ((q % kIpc) * 4 + q / kIpc) * 8) = v[b];
        }
      }
    }
  } else {
    for (int i = tid; i < total; i += nthr) {
      const int row = i / per_row, rem = i - row * per_row;
      const int st = rem / kPieces, q = rem % kPieces;
      const int kk = k0 + rem * 8;
      const bool in = kk < k;
      cp_async16(buf + row * ld + st * kStepK + ((q % kIpc) * 4 + q / kIpc) * 8,
                 in ? x + static_cast<int64_t>(row) * k + kk : x, in ? 16 : 0);
    }
    cp_async_commit();
  }
}

// x steps [s0, s0 + steps) of rows [0, m) into buf as the wgmma B operand of the warp-specialized kernel's wgmma
// consumers (WG; K-major, no swizzle; nt = ceil(m / 8) token groups of 8 rows): logical k in the order of step_q's mma k-steps, so
// that k-step s of the slice holds exactly the x values step_q's lanes load for theirs. Lane c's k pair p (real
// k = W c + 2 p, W = 32 for int4, 16 for int8) sits in mma k-step p / 2 at logical {2 c, 2 c + 1} (p even) or
// {2 c + 8, 2 c + 9} (p odd), so 8-element core column p of the step holds pairs p of the four lanes c: the 8-k
// piece q of a step (its pairs 4 (q % IPC) .. + 3, c = q / IPC) goes word by word to core columns 4 (q % IPC) + j,
// word c of row `row`. Core column `col` of the slice starts at col * nt * 128 bytes, row r of it at 16 r (the
// descriptor's lead nt * 128 bytes, its 8-row stride 128). Rows m .. 8 nt - 1 are not written, and a wgmma wider
// than 8 nt reads its groups past nt from the next core column (or the padding past the slice): their products land
// in output columns that are never stored. Pieces at or past K are zeros. Through registers, KB loads in flight a
// thread; the caller fences (generic -> async proxy) and syncs.
// G64 (int4 group 64, step_g64_wgmma; forty-third session): logical k in the order of step_g64_tiles_with's mma
// k-steps instead. There k-step 4 sg + J, lane c, takes real k 64 sg + 32 (c & 1) + 4 (c >> 1) + 8 J + {0, 1} at
// logical {2 c, 2 c + 1} and 2 further at {2 c + 8, 2 c + 9}: the 16-byte piece q of a step (real k 8 q .. 8 q + 7:
// sg = q >> 3, c & 1 = (q >> 2) & 1, J = q & 3) puts its word j (c >> 1 = j >> 1, the upper logical half j & 1) in
// core column 16 st + 8 sg + 2 J + (j & 1), word (c & 1) | (j >> 1) << 1.
template <int BITS, int KB = 8, bool G64 = false>
__device__ __forceinline__ void stage_x_wgmma(uint16_t* buf, const uint16_t* x, int m, int k, int s0, int steps, int tid,
                                              int nthr) {
  static_assert(!G64 || BITS == 4, "group 64 is int4 only");
  constexpr int kStepK = BITS == 8 ? 64 : 128, kPieces = kStepK / 8, kIpc = kPieces / 4;
  const int kCol = ((m + 7) >> 3) * 32;
  const int per_row = steps * kPieces, k0 = s0 * kStepK, total = m * per_row;
  uint32_t* w = reinterpret_cast<uint32_t*>(buf);
  for (int i0 = tid; i0 < total; i0 += KB * nthr) {
    uint4 v[KB];
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      const int i = i0 + b * nthr;
      if (i < total) {
        const int rem = i / m, row = i - rem * m;  // (rows fastest: a quarter-warp's stores hit distinct banks)
        const int kk = k0 + rem * 8;
        v[b] = kk < k ? *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * k + kk) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      const int i = i0 + b * nthr;
      if (i < total) {
        const int rem = i / m, row = i - rem * m;
        const int st = rem / kPieces, q = rem - st * kPieces;
        if constexpr (G64) {
          uint32_t* d = w + (st * kPieces + 8 * (q >> 3) + 2 * (q & 3)) * kCol + 4 * row + ((q >> 2) & 1);
          d[0] = v[b].x, d[kCol] = v[b].y, d[2] = v[b].z, d[kCol + 2] = v[b].w;
        } else {
          uint32_t* d = w + (st * kPieces + 4 * (q % kIpc)) * kCol + 4 * row + q / kIpc;
          d[0] = v[b].x, d[kCol] = v[b].y, d[2 * kCol] = v[b].z, d[3 * kCol] = v[b].w;
        }
      }
    }
  }
}

// One chain of wgmma k-steps ks0 .. ks0 + N - 1 into part, from 0 (the WG consumers): one k-step a commit group,
// frag(ks, r) unpacking each k-step's A set into a ring of two, each set kept live until its group is done; then
// waited for and fenced, so part may be read. xa: the step's x in stage_x_wgmma's layout (a shared address), nt its
// token groups.
template <int MT, int N, class Frag>
__device__ __forceinline__ void wgmma_chain(float (&part)[MT][4], uint32_t xa, uint32_t nt, int ks0, Frag frag) {
  uint32_t a[2][4];
#pragma unroll
  for (int s = 0; s < N; ++s) {
    const int ks = ks0 + s;
    uint32_t(&r)[4] = a[s & 1];
    frag(ks, r);
    dsx_cuda::sm90::wgmma_fence();
    dsx_cuda::sm90::wgmma_bf16_rs<MT>(part, r, dsx_cuda::sm90::interleave_desc(xa + ks * nt * 256, nt * 128, 128), s > 0);
    dsx_cuda::sm90::wgmma_commit();
    dsx_cuda::sm90::wgmma_wait<1>();
    if (s > 0)  // (the set of k-step ks - 1, done now, was live until here)
#pragma unroll
      for (int j = 0; j < 4; ++j) dsx_cuda::sm90::keep_reg(a[(s + 1) & 1][j]);
  }
  dsx_cuda::sm90::wgmma_wait<0>();
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dsx_cuda::sm90::fence_reg(part[t][e]);
}

// One step of one channel tile through wgmma (the WG consumers, four warps a warpgroup): the same k-steps in the same
// order as step_q's mma chain (wgmma_chain), then promoted on the CUDA cores as there: the same bits.
template <int BITS, int MT, int GMODE>
__device__ __forceinline__ void step_q_wgmma(float (&acc)[MT][4], float (&part)[MT][4], const Stage& st, uint32_t xa,
                                             uint32_t nt) {
  wgmma_chain<MT, BITS == 8 ? 4 : 8>(part, xa, nt, 0,
                                     [&](int ks, uint32_t(&r)[4]) { a_frag<BITS>(r, st, ks >> 1, ks & 1); });
#pragma unroll
  for (int t = 0; t < MT; ++t) promote<GMODE>(acc[t], part[t], st.s[0]);
}

// One int4 group-64 step of one channel tile through wgmma (the WG consumers; st in g64 order, g64_stage): per group sg
// the k-steps 4 sg .. 4 sg + 3 of step_g64_tiles_with in its order (wgmma_chain; the same A fragments, g64_frag; x in
// stage_x_wgmma's G64 layout), then fma'd into acc with the group's scale: the same bits as the mma chains.
template <int MT>
__device__ __forceinline__ void step_g64_wgmma(float (&acc)[MT][4], float (&part)[MT][4], const Stage& st, uint32_t xa,
                                               uint32_t nt) {
#pragma unroll
  for (int sg = 0; sg < 2; ++sg) {
    wgmma_chain<MT, 4>(part, xa, nt, 4 * sg, [&](int ks, uint32_t(&r)[4]) { g64_frag(r, st, sg, ks & 3); });
#pragma unroll
    for (int t = 0; t < MT; ++t) add_scaled(acc[t], part[t], st.s[sg]);
  }
}

// A warp's accumulator tile (MT x 8 rows x 16 channels: row 8 t + 2 c + (i & 1), channel g + 8 (i >> 1)
// of acc[t][i]) into the fp32 partial tile part [m][width] from column col0; with SCALE (per-channel
// weights: group scales were applied in the loop) times the bf16 scales of channels n0 + g, n0 + g + 8.
template <int MT, bool SCALE>
__device__ __forceinline__ void put_partial(float* part, int width, int col0, const float (&acc)[MT][4],
                                            const uint16_t* scale, int n0, int m, int g, int c) {
  float s_lo = 1.f, s_hi = 1.f;
  if (SCALE) {
    s_lo = bf16_bits_to_f32(__ldg(scale + n0 + g));
    s_hi = bf16_bits_to_f32(__ldg(scale + n0 + g + 8));
  }
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = 8 * t + 2 * c + (i & 1), ch = col0 + g + 8 * (i >> 1);
      if (tok < m) part[tok * width + ch] = SCALE ? acc[t][i] * (i < 2 ? s_lo : s_hi) : acc[t][i];
    }
}

}  // namespace dsx_wo
