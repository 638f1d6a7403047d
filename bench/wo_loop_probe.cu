// Step-loop probe for the weight-only kernel (diagnostic, not part of the library): how many 16-channel
// tile-steps (16 channels x 128 k of int4 per channel) can an SM unpack and multiply per us, with the
// operands already in shared memory (no HBM, no ring, no reduction)? Two loops over one weight image:
//   mma    the warp-specialized kernel's own step (dsx_wo::step_q_tiles: Stage loads, lop3/fma unpack,
//          x by ldmatrix-free 16-byte loads, mma.sync m16n8k16 chains, promotion per step);
//   wgmma  the same unpack into the same registers, fed to wgmma m64n(8 MT)k16 with A from registers
//          (four consumer warps make one warpgroup, each its own 16 rows) and B = x from shared memory
//          through a descriptor (no x loads by the warps; one instruction for both token tiles);
//          "wgmma2" keeps the previous step's chain in flight while the next starts (two partial sets),
//          "wgmma8" unpacks a step's 8 k-steps first and issues them under one fence, commit and wait.
// For each (tiles a warp CT, token tiles MT) it first checks one block (rounds = 1): mma against a
// float64 reference, wgmma against mma bit for bit (same bits = a drop-in for the kernel's loop) and
// against the reference; then times a full grid (graph_median_us) and prints tile-steps a us per SM and
// what that rate means for 36864 x 7168 (2304 tiles x 56 steps over 132 SMs): the loop's floor there.
// Instruction counts (nvcc 13.0 SASS of this file, the round loop of 2 steps x 2 tiles a warp at MT = 2): mma
// 482 (unpack 352 = 128 LOP3 + 128 HFMA2 + 96 SHF, 64 HMMA, 24 LDS, 32 FADD), wgmma 490 (the same unpack, 32
// HGMMA, 33 WARPGROUP fences / waits, 17 uniform adds, 8 LDS, 32 FADD), wgmma8 461 (4 WARPGROUP); at MT = 1
// 427, 469 and 445. So wgmma issues about as many instructions; what it can change is the latency of the
// mma chains (asynchronous, one instruction for both token tiles), which is what the timing measures.
// Thirty-second session: also four and eight token tiles (17..32 and 33..64 rows; wgmma n32 / n64), where mma.sync's
// loop is what costs and wgmma takes 30-48% off it (docs/benchmarks.md, "The step-loop probe at more token tiles").
// Sixty-third session: the int8 paths imma-tok and imma-step (up to four token tiles): no bf16 unpack at all; x split
// into two int8 pieces by its producer, so the output is exact for that x, which is within S / 508 of the bf16 x
// (S a token's |x| max / 127 over all k, or over each step); checked against float64 of that x, and its distance
// from the bf16 x's output printed. Instructions (SASS, whole kernel, CT 2 MT 2): mma 616, imma-step 336, imma-tok 368.
// Run on an H100: 1.3-2x mma's rate at one token tile, up to 1.46x at two; the output 1e-5 of sum |w x| from the bf16
// x's; not built into the kernel (docs/benchmarks.md, "the step loop through int8 tensor cores").
// Operand layouts and the host reference: bench/wo_loop_layout.h (its index arithmetic is checked on
// the CPU by tests/test_bench_wo_loop_layout.py).
//
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda -Xptxas -v bench/wo_loop_probe.cu -o loop_probe
// Run:   ./loop_probe [rounds]   (one line a variant; exit 1 if a check fails)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "gemm_weight_only.cuh"
#include "probe_common.cuh"
#include "sm90_ptx.cuh"
#include "wo_loop_layout.h"

namespace {

constexpr int kWarps = 8;  // consumer warps a block (two warpgroups)
constexpr int kSteps = 2;  // steps of weights resident in shared memory (the loop cycles over them)

struct LP {
  const uint8_t* w;
  const uint16_t* xm;
  const uint8_t* xw;
  float* out;
  int rounds;
  uint32_t zero;      // 0 (see the round loops)
  uint32_t lbo, sbo;  // wgmma B descriptor's byte offsets (k-halves, 8-token groups)
  const uint8_t* xi;  // the int8 paths: x's image (wo_loop::XI8), its scales and corr
  const float* sc;
  const float* corr;
  int n_sc;
};

// d += A (16 x 32 u8, row) * B (32 x 8 s8, col), exact s32 accumulation.
__device__ __forceinline__ void imma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The compiler must not see that the resident operands repeat from round to round (ptxas would hoist the
// loads and the unpack out of the loop, as it did for one instance with an asm move): each round's base
// address is base + round * p.zero, p.zero = 0 known only at run time.
// (The wgmma path's pieces are the kernel's: dsx_cuda::sm90::wgmma_bf16_rs, interleave_desc and keep_reg, and
// dsx_wo::a_frag for k-step ks = 2 i + h of one tile.)

// PATH 0: mma.sync (step_q_tiles); 1: wgmma, one fence / commit / wait a k-step, the chain drained at every
// step; 2: the same, a step's chain promoted while the next step's first k-step runs (two partial sets);
// 3: wgmma, a step's 8 k-steps unpacked first (8 register sets), then one fence, all its wgmma, one commit
// and one wait (fewer warpgroup instructions, more registers).
// PATH 4 ("imma-tok") and 5 ("imma-step"): the nibbles as unsigned bytes 16 u (two lop3 and a shift a word of
// eight) into mma.sync m16n8k32 u8 x s8 chains against x's two int8 pieces (wo_loop::XI8): 4 k-steps a step and
// piece, the same instruction count as the bf16 path's 8 (each does twice the k); 4 keeps its chains over every
// step and scales once at the end (one scale a token over all k), 5 promotes a step's chains to fp32 with that
// step's scale (one a token a step: an outlier costs only its own step's precision).
template <int CT, int MT, int PATH>
__global__ void __launch_bounds__(kWarps * 32) loop_probe(const __grid_constant__ LP p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const wo_loop::Shape sh{kWarps, CT, MT, kSteps};
  uint8_t* wsm = smem;
  uint16_t* xm = reinterpret_cast<uint16_t*>(smem + sh.w_bytes());
  uint8_t* xw = smem + sh.w_bytes() + ((sh.x_mma_elems() * 2 + 127) / 128) * 128;
  uint8_t* xi = smem + sh.w_bytes();  // (the int8 paths: in x's place, then the scales and corr)
  float* scs = reinterpret_cast<float*>(xi + sh.xi8_bytes());
  for (int i = threadIdx.x; i < sh.w_bytes() / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(wsm)[i] = reinterpret_cast<const uint4*>(p.w)[i];
  if constexpr (PATH < 4) {
    for (int i = threadIdx.x; i < sh.x_mma_elems() / 8; i += blockDim.x)
      reinterpret_cast<uint4*>(xm)[i] = reinterpret_cast<const uint4*>(p.xm)[i];
    for (int i = threadIdx.x; i < sh.x_wg_bytes() / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(xw)[i] = reinterpret_cast<const uint4*>(p.xw)[i];
  } else {
    for (int i = threadIdx.x; i < sh.xi8_bytes() / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(xi)[i] = reinterpret_cast<const uint4*>(p.xi)[i];
    for (int i = threadIdx.x; i < p.n_sc + sh.tokens(); i += blockDim.x)
      scs[i] = i < p.n_sc ? p.sc[i] : p.corr[i - p.n_sc];
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (generic writes before wgmma's reads)
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  float acc[CT][MT][4];
#pragma unroll
  for (int n = 0; n < CT; ++n)
#pragma unroll
    for (int t = 0; t < MT; ++t) acc[n][t][0] = acc[n][t][1] = acc[n][t][2] = acc[n][t][3] = 0.f;
  const uint32_t w0 = dsx_wo::smem_addr(wsm) + static_cast<uint32_t>((warp * CT * wo_loop::kTileBytes) + 32 * lane);
  auto load = [&](dsx_wo::Stage (&st)[CT], uint32_t wb, int s) {
#pragma unroll
    for (int n = 0; n < CT; ++n) {
      const uint8_t* b = smem + (wb - dsx_wo::smem_addr(smem)) + (s * sh.tiles() + n) * wo_loop::kTileBytes;
      st[n].w[0] = dsx_wo::lds128(b);
      st[n].w[1] = dsx_wo::lds128(b + 16);
      st[n].s[0] = st[n].s[1] = 0;
    }
  };

  if constexpr (PATH == 0) {
    int xo[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) xo[t] = (8 * t + g) * sh.x_ld() + 8 * c;
    const uint32_t x0 = dsx_wo::smem_addr(xm);
#pragma unroll 1
    for (int r = 0; r < p.rounds; ++r) {
      const uint32_t wb = w0 + r * p.zero, xb = x0 + r * p.zero;
      const uint16_t* xs = xm + (xb - x0) / 2;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        dsx_wo::Stage st[CT];
        load(st, wb, s);
        dsx_wo::step_q_tiles<4, MT, 0, CT>(acc, st, xs + s * wo_loop::kStepK, xo);
      }
    }
  } else if constexpr (PATH >= 4) {
    constexpr int T = 8 * MT;
    int ci[CT][MT][2][4];
#pragma unroll
    for (int n = 0; n < CT; ++n)
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int i = 0; i < 8; ++i) ci[n][t][i >> 2][i & 3] = 0;
#pragma unroll 1
    for (int r = 0; r < p.rounds; ++r) {
      const uint32_t wb = w0 + r * p.zero;
      const uint8_t* xr = xi + r * p.zero;
      const float* sr = scs + r * p.zero;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        dsx_wo::Stage st[CT];
        load(st, wb, s);
        uint4 xv[MT][2][2];  // [token tile][piece h, l][chain hh]
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int pc = 0; pc < 2; ++pc)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
              xv[t][pc][hh] = dsx_wo::lds128(xr + wo_loop::x_i8_lane(T, s, 8 * t + g, pc, hh, c, g & 1));
#pragma unroll
        for (int n = 0; n < CT; ++n)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              auto un = [&](uint32_t w) { return wo_loop::i8_nibbles(w, hh); };
              const uint32_t a[4] = {un(dsx_wo::word(st[n].w[0], 2 * q)), un(dsx_wo::word(st[n].w[1], 2 * q)),
                                     un(dsx_wo::word(st[n].w[0], 2 * q + 1)), un(dsx_wo::word(st[n].w[1], 2 * q + 1))};
#pragma unroll
              for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int pc = 0; pc < 2; ++pc)
                  imma_u8s8(ci[n][t][pc], a, dsx_wo::word(xv[t][pc][hh], 2 * q),
                            dsx_wo::word(xv[t][pc][hh], 2 * q + 1));
            }
        if constexpr (PATH == 5) {
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            const float2 sc2 = *reinterpret_cast<const float2*>(sr + s * T + 8 * t + 2 * c);
#pragma unroll
            for (int n = 0; n < CT; ++n)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int v = ci[n][t][0][i] * 254 + ci[n][t][1][i];
                acc[n][t][i] = fmaf(static_cast<float>(v), (i & 1) ? sc2.y : sc2.x, acc[n][t][i]);
                ci[n][t][0][i] = ci[n][t][1][i] = 0;
              }
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int n = 0; n < CT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = 8 * t + 2 * c + (i & 1);
          if constexpr (PATH == 4)
            acc[n][t][i] = fmaf(static_cast<float>(ci[n][t][0][i]), 254.f * scs[tok],
                                static_cast<float>(ci[n][t][1][i]) * scs[tok]);
          acc[n][t][i] -= static_cast<float>(p.rounds) * scs[p.n_sc + tok];
        }
  } else {
    const uint32_t xw0 = dsx_wo::smem_addr(xw);
    float part[PATH == 2 ? 2 : 1][CT][MT][4];
    auto promote = [&](float (&pt)[CT][MT][4]) {
#pragma unroll
      for (int n = 0; n < CT; ++n)
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            dsx_cuda::sm90::fence_reg(pt[n][t][i]);
            acc[n][t][i] += pt[n][t][i];
          }
    };
#pragma unroll 1
    for (int r = 0; r < p.rounds; ++r) {
      const uint32_t wb = w0 + r * p.zero;
      const uint64_t db = dsx_cuda::sm90::interleave_desc(xw0 + r * p.zero, p.lbo, p.sbo);  // (k-step (s, ks): + its offset >> 4)
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        float(&pt)[CT][MT][4] = part[PATH == 2 ? s & 1 : 0];
        dsx_wo::Stage st[CT];
        load(st, wb, s);
        if constexpr (PATH == 3) {
          uint32_t a8[8][CT][4];
#pragma unroll
          for (int ks = 0; ks < 8; ++ks)
#pragma unroll
            for (int n = 0; n < CT; ++n) dsx_wo::a_frag<4>(a8[ks][n], st[n], ks >> 1, ks & 1);
          dsx_cuda::sm90::wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < 8; ++ks)
#pragma unroll
            for (int n = 0; n < CT; ++n)
              dsx_cuda::sm90::wgmma_bf16_rs<MT>(pt[n], a8[ks][n], db + static_cast<uint64_t>((s * 8 + ks) * MT * 16), ks > 0);
          dsx_cuda::sm90::wgmma_commit();
          dsx_cuda::sm90::wgmma_wait<0>();
#pragma unroll
          for (int ks = 0; ks < 8; ++ks)
#pragma unroll
            for (int n = 0; n < CT; ++n)
#pragma unroll
              for (int j = 0; j < 4; ++j) dsx_cuda::sm90::keep_reg(a8[ks][n][j]);
          promote(pt);
          continue;
        }
        uint32_t a[2][CT][4];
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
          for (int n = 0; n < CT; ++n) dsx_wo::a_frag<4>(a[ks & 1][n], st[n], ks >> 1, ks & 1);
          dsx_cuda::sm90::wgmma_fence();
#pragma unroll
          for (int n = 0; n < CT; ++n)
            dsx_cuda::sm90::wgmma_bf16_rs<MT>(pt[n], a[ks & 1][n], db + static_cast<uint64_t>((s * 8 + ks) * MT * 16), ks > 0);
          dsx_cuda::sm90::wgmma_commit();
          dsx_cuda::sm90::wgmma_wait<1>();
          if (ks > 0)  // (the set k-step ks - 1 read, done now, is live until here: no reuse while in flight)
#pragma unroll
            for (int n = 0; n < CT; ++n)
#pragma unroll
              for (int j = 0; j < 4; ++j) dsx_cuda::sm90::keep_reg(a[(ks + 1) & 1][n][j]);
          if (PATH == 2 && ks == 0 && s > 0) promote(part[(s + 1) & 1]);
        }
        if (PATH != 2 || s == kSteps - 1) {  // (PATH 2: drained once a round; ptxas serializes a chain in
          dsx_cuda::sm90::wgmma_wait<0>();   // flight across the loop's back edge, C7513)
          promote(pt);
        }
      }
    }
  }
  if (blockIdx.x == 0) {
#pragma unroll
    for (int n = 0; n < CT; ++n)
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) p.out[wo_loop::out_index(sh, warp * CT + n, t, lane, i)] = acc[n][t][i];
  }
}

template <int CT, int MT, int PATH>
size_t smem_of() {
  const wo_loop::Shape sh{kWarps, CT, MT, kSteps};
  if (PATH >= 4) return sh.w_bytes() + sh.xi8_bytes() + (kSteps + 1) * sh.tokens() * 4;  // (scales <= steps x tokens, corr)
  return sh.w_bytes() + ((sh.x_mma_elems() * 2 + 127) / 128) * 128 + sh.x_wg_bytes();
}

struct Result {
  const char* path;
  int ct, mt, regs, blocks_sm;
  float us;
  double rate;  // tile-steps a us per SM
  bool ok;
  double qerr;  // the int8 paths: worst |out - float64 of the bf16 x| / sum |w x| (x's two-piece rounding)
};

template <int CT, int MT, int PATH>
Result run(int sms, int rounds, uint32_t lbo, uint32_t sbo, const std::vector<float>* mma_bits, std::vector<float>& bits_out,
           int& fails) {
  const wo_loop::Shape sh{kWarps, CT, MT, kSteps};
  const wo_loop::Data d = wo_loop::make_data(sh, 7 + 3 * CT + MT);
  std::vector<double> ref, mag, ref_x, mag_x;
  wo_loop::XI8 q;
  if (PATH >= 4) {  // (the reference of what the int8 image stands for; the bf16 x's for the rounding it costs)
    q = wo_loop::make_xi8(sh, d, PATH == 5);
    wo_loop::reference(sh, d, 1, ref, mag, &q.xt);
    wo_loop::reference(sh, d, 1, ref_x, mag_x);
  } else {
    wo_loop::reference(sh, d, 1, ref, mag);
  }
  auto kernel = loop_probe<CT, MT, PATH>;
  const size_t smem = smem_of<CT, MT, PATH>();
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kernel));
  int bps = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kernel, kWarps * 32, smem));
  uint8_t *w, *xw, *xi = nullptr;
  uint16_t* xm;
  float *out, *sc = nullptr;
  CK(cudaMalloc(&w, d.w.size()));
  if (PATH >= 4) {
    CK(cudaMalloc(&xi, q.img.size()));
    CK(cudaMalloc(&sc, (q.sc.size() + q.corr.size()) * 4));
    CK(cudaMemcpy(xi, q.img.data(), q.img.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sc, q.sc.data(), q.sc.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sc + q.sc.size(), q.corr.data(), q.corr.size() * 4, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&xm, d.xmma.size() * 2));
  CK(cudaMalloc(&xw, d.xwg.size()));
  CK(cudaMalloc(&out, sh.out_floats() * 4));
  CK(cudaMemcpy(w, d.w.data(), d.w.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xm, d.xmma.data(), d.xmma.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xw, d.xwg.data(), d.xwg.size(), cudaMemcpyHostToDevice));
  LP p{w, xm, xw, out, 1, 0, lbo, sbo, xi, sc, sc + q.sc.size(), static_cast<int>(q.sc.size())};
  // check: one block, one round
  CK(cudaMemset(out, 0xFF, sh.out_floats() * 4));
  kernel<<<1, kWarps * 32, smem>>>(p);
  CK(cudaDeviceSynchronize());
  bits_out.resize(sh.out_floats());
  CK(cudaMemcpy(bits_out.data(), out, sh.out_floats() * 4, cudaMemcpyDeviceToHost));
  int off_ref = 0, off_bits = 0;
  double worst = 0, qerr = 0;
  for (int i = 0; i < sh.out_floats(); ++i) {
    const double err = std::fabs(bits_out[i] - ref[i]) / (mag[i] + 1e-30);
    worst = std::max(worst, err);
    if (PATH >= 4) qerr = std::max(qerr, std::fabs(bits_out[i] - ref_x[i]) / (mag_x[i] + 1e-30));
    if (!(err <= 2e-5)) ++off_ref;
    if (mma_bits && std::memcmp(&bits_out[i], &(*mma_bits)[i], 4) != 0) ++off_bits;
  }
  const bool ok = off_ref == 0;
  if (!ok) ++fails;
  static const char* names[] = {"mma", "wgmma", "wgmma2", "wgmma8", "imma-tok", "imma-step"};
  std::printf("check %-6s CT %d MT %d lbo %u sbo %u: %d of %d beyond 2e-5 of sum|w x| (worst %.2e)%s", names[PATH], CT, MT, lbo,
              sbo, off_ref, sh.out_floats(), worst, ok ? "" : "  FAIL");
  if (mma_bits && PATH < 4) std::printf(", %d differ from mma's bits", off_bits);
  if (PATH >= 4) std::printf(", against the bf16 x %.2e (x in two int8 pieces)", qerr);
  std::printf("\n");
  // time: every SM busy
  p.rounds = rounds;
  const int grid = sms * std::max(bps, 1);
  cudaStream_t st;
  cudaEvent_t e0, e1;
  CK(cudaStreamCreate(&st));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const float us = graph_median_us(st, e0, e1, 1, 4, 15, [&](int) { kernel<<<grid, kWarps * 32, smem, st>>>(p); });
  const double tile_steps = static_cast<double>(grid) * sh.tiles() * kSteps * rounds;
  CK(cudaStreamDestroy(st));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(w));
  CK(cudaFree(xm));
  CK(cudaFree(xw));
  CK(cudaFree(out));
  if (PATH >= 4) {
    CK(cudaFree(xi));
    CK(cudaFree(sc));
  }
  return {names[PATH], CT, MT, fa.numRegs, bps, us, tile_steps / us / sms, ok, qerr};
}

template <int CT, int MT>
void variant(int sms, int rounds, std::vector<Result>& rs, int& fails) {
  std::vector<float> mma_bits, bits;
  rs.push_back(run<CT, MT, 0>(sms, rounds, 0, 0, nullptr, mma_bits, fails));
  // (the descriptor's offsets as documented for K-major, no swizzle; if that fails, the other reading)
  uint32_t lbo = wo_loop::kLbo, sbo = wo_loop::kSbo;
  const int before = fails;
  Result r1 = run<CT, MT, 1>(sms, rounds, lbo, sbo, &mma_bits, bits, fails);
  if (!r1.ok) {
    Result r2 = run<CT, MT, 1>(sms, rounds, sbo, lbo, &mma_bits, bits, fails);
    if (r2.ok) {
      std::printf("  (the descriptor's offsets read the other way round: leading %d, stride %d)\n", sbo, lbo);
      std::swap(lbo, sbo), r1 = r2, fails = before;
    }
  }
  rs.push_back(r1);
  rs.push_back(run<CT, MT, 2>(sms, rounds, lbo, sbo, &mma_bits, bits, fails));
  rs.push_back(run<CT, MT, 3>(sms, rounds, lbo, sbo, &mma_bits, bits, fails));
  if constexpr (MT <= 4) {  // (the int8 paths: up to 32 rows; their chains are 2 x the registers of fp32's)
    rs.push_back(run<CT, MT, 4>(sms, rounds, lbo, sbo, nullptr, bits, fails));
    rs.push_back(run<CT, MT, 5>(sms, rounds, lbo, sbo, nullptr, bits, fails));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 256;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<Result> rs;
  int fails = 0;
  variant<1, 1>(sms, rounds, rs, fails);
  variant<1, 2>(sms, rounds, rs, fails);
  variant<2, 1>(sms, rounds, rs, fails);
  variant<2, 2>(sms, rounds, rs, fails);
  variant<4, 1>(sms, rounds, rs, fails);
  variant<4, 2>(sms, rounds, rs, fails);
  // (more token tiles: 17..32 and 33..64 rows)
  variant<1, 4>(sms, rounds, rs, fails);
  variant<2, 4>(sms, rounds, rs, fails);
  variant<1, 8>(sms, rounds, rs, fails);
  variant<2, 8>(sms, rounds, rs, fails);
  // 36864 x 7168 int4: 2304 tiles x 56 steps
  const double per_sm = 2304.0 * 56 / sms;
  std::printf("\n%-9s %3s %3s %5s %9s %10s %16s %14s %6s %s\n", "path", "CT", "MT", "regs", "blocks/SM", "us/launch",
              "tile-steps/us/SM", "36864x7168 us", "vs mma", "x err (int8 paths)");
  double base = 0;
  for (const Result& r : rs) {
    if (r.path[0] == 'm' && r.path[1] == 'm') base = r.rate;
    std::printf("%-9s %3d %3d %5d %9d %10.2f %16.2f %14.2f %5.2fx", r.path, r.ct, r.mt, r.regs, r.blocks_sm, r.us,
                r.rate, per_sm / r.rate, r.rate / base);
    if (r.path[0] == 'i') std::printf(" %.2e", r.qerr);
    std::printf("%s\n", r.ok ? "" : "  (check failed)");
  }
  std::printf("%s\n", fails ? "SOME CHECKS FAILED" : "all checks passed");
  return fails ? 1 : 0;
}
