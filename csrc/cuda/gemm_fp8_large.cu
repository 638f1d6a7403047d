// Block FP8 GEMM for large M (algo 7, "large"): a hand-written persistent sm_90a kernel.
//
// One CTA per SM walks the BM x BN output tiles (128x128, 128x192 or 256x128) t = blockIdx.x,
// blockIdx.x + gridDim.x, ... in a grouped order (`group` M tiles side by side, then the next N
// tile: neighbouring CTAs share operand tiles in L2). Warp roles (384 threads, 1 CTA per SM):
//   warpgroup 0 (registers lowered to 40 by setmaxnreg):
//     warp 0: TMA producer: per K block the A tile (BM rows x 128 K) and the B tile (BN x 128),
//             128B swizzle, into a ring of stages; it runs ahead across tile boundaries;
//     warp 1 (and 2 when BM = 256): scale producers: cp.async of the stage's BM token scales
//             sa[m0.., kb] (128 per warp) and the block scales of the tile's first and last
//             128-column block, completing on the same full barrier (arrive.noinc);
//     other warps: idle.
//   warpgroups 1, 2 (registers raised to 232): consumers, BM/2 rows of the tile each, in 64-row
//     blocks. Per K block and 64-row block, 4 wgmma m64nBNk32 into a temporary (the first
//     overwrites it), then acc = fma(tmp, sa*sb, acc): the order of gemm_fp8.h (one fp32 block sum
//     per K block, its scale product rounded to fp32, added in increasing K). 128x128 may use two
//     alternating temporaries, so that block k+1's wgmma runs while block k is promoted (3 x 64
//     accumulator registers); with one temporary the two warpgroups cover each other's promotion.
//     Epilogue: bf16 into a per-warpgroup 128B-swizzled staging buffer (conflict-free stores), one
//     thread issues the TMA stores; it runs after the next tile's first wgmma was issued (under
//     that wgmma), and the buffer is reused only after its stores have read it
//     (cp.async.bulk.wait_group.read), so the stores themselves overlap the next mainloop.
// Measured (H200, bench/gpu_kernels.py --large, interleaved with cuBLAS and algo 5): see the
// automatic choice in gemm_fp8_api.cu (use_large). kCta = 2 (variants 5..7): the same tiles in
// 2-CTA clusters sharing the B tile by TMA multicast (variants 8, 9: clusters of N-adjacent tiles
// sharing the A tile; see the kernel); the grid is the number of
// pairs resident at once (cudaOccupancyMaxActiveClusters: 66 on the H200, all 132 SMs). The
// consumers' remote arrive and the producers' waits use the default (CTA-scope) semantics: with
// .release.cluster / .acquire.cluster (changed together) the arrive compiled to a MEMBAR.ALL.GPU
// per K block and the kernel ran 1.5-2x slower (about 0.5 us more per K block).
// Ragged shapes: M, N clipped by TMA (loads of rows outside read zeros, stores outside are dropped),
// K any multiple of 16 (the last K block's columns past K read zeros). Deterministic: no atomics,
// a fixed summation order, every output element written by exactly one CTA.
#include "gemm_fp8_internal.cuh"
#include "launch_attrs.cuh"
#include "sm90_ptx.cuh"

#include <cuda_bf16.h>

#include <atomic>

namespace dsx_cuda {
namespace {

using namespace sm90;

constexpr int kBK = 128;
constexpr int kThreads = 384;
constexpr int kOutHalf = 64 * 64 * 2;  // bf16 64 rows x 64 columns (one TMA store box, 128B rows)
constexpr int kDefaultGroup = 16;      // 128-row M tiles per group of the tile order
constexpr int kSmemLimit = 227 * 1024;

// Tile BM x BN and the mainloop. Each consumer warpgroup owns BM/2 rows as kSub = BM/128 blocks of
// 64 rows (one wgmma m64 each). kOverlap: two alternating temporaries (block k+1's wgmma runs while
// block k is promoted; 3 x 64 accumulator registers: BM = BN = 128 only); else one temporary
// (wgmma, wait, promote per 64-row block; the two consumer warpgroups cover each other's
// promotion).
template <int BM, int BN, bool kOverlap>
struct Cfg {
  static_assert((BM == 128 && (BN == 128 || BN == 192)) || (BM == 256 && BN == 128), "tile shapes");
  static_assert(!kOverlap || (BM == 128 && BN == 128), "two temporaries fit the register budget at 128x128 only");
  static constexpr int kSub = BM / 128;
  static constexpr int kTileA = BM * kBK;
  static constexpr int kTileB = BN * kBK;
  static constexpr int kStage = kTileA + kTileB;
  static constexpr int kOutWg = kSub * (BN / 64) * kOutHalf;  // one consumer warpgroup's staging
  static constexpr int kScaleLd = BM + 4;  // floats per stage: BM token scales, 2 block scales, pad
  static constexpr int kScaleWarps = BM / 128;  // producer warps loading token scales (4 rows per lane)
  static constexpr int bytes(int stages) {
    return 1024 + stages * kStage + 2 * kOutWg + stages * kScaleLd * 4 + 2 * stages * 8;
  }
  static constexpr int stages() {
    int st = 6;
    while (st > 2 && bytes(st) > kSmemLimit) --st;
    return st;
  }
  static constexpr int kStages = stages();
  static constexpr int kSmem = bytes(kStages);
  static_assert(kTileA % 1024 == 0 && kTileB % 1024 == 0, "1024-byte aligned tiles (128B swizzle)");
};

struct Params {
  const float* sa;  // [m, kbt]
  const float* sb;  // [nbt, kbt], nbt = ceil(n/128)
  int m, n, kbt, nbt;
  int tiles_m, tiles_n, group;
};

__device__ __forceinline__ void tile_coords(int t, const Params& p, int& mt, int& nt) {
  const int per_group = p.group * p.tiles_n;
  const int g = t / per_group;
  const int first = g * p.group;
  const int gm = min(p.group, p.tiles_m - first);
  const int idx = t - g * per_group;
  mt = first + idx % gm;
  nt = idx / gm;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One K block of 64 rows of a consumer warpgroup: 4 wgmma (K = 32 each) into t, one commit group.
// a_lo, b_lo: the low words of the A and B descriptors (sw128_desc_lo of the tiles' addresses);
// each 32-byte K slice adds 32 >> 4 to them (no per-wgmma rebuild of the descriptor from the
// address: that cost about 8 integer and uniform instructions per wgmma).
template <int BN>
__device__ __forceinline__ void issue_block(float* t, uint32_t a_lo, uint32_t b_lo) {
#pragma unroll
  for (int r = 0; r < BN / 2; ++r) fence_reg(t[r]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBK / 32; ++kk) {
    wgmma_m64k32<BN>(t, sw128_desc_of_lo(a_lo + kk * (32 >> 4)), sw128_desc_of_lo(b_lo + kk * (32 >> 4)), kk > 0);
  }
  wgmma_commit();
}

// kCta = 2: a cluster of two CTAs computes the two M-adjacent tiles of one N tile (a "unit"); each
// CTA loads its own A tile and half of the shared B tile, multicast into both CTAs' stages, so the
// B bytes read from L2 halve. With kShareA the pair's tiles are instead the two N-adjacent tiles of
// one M tile, sharing A the same way (each CTA loads its own B tile and BM/2 rows of A into both).
// A stage is refilled only when the consumers of both CTAs released it: the empty barriers count
// the consumer warps of both CTAs.
template <int BM, int BN, bool kOverlap, int kCta, bool kShareA, bool kEarly>
__global__ void __launch_bounds__(kThreads, 1)
    large_gemm_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                      const __grid_constant__ CUtensorMap tout, const Params p) {
  static_assert(kCta == 1 || kCta == 2, "single CTAs or pairs");
  static_assert(!kShareA || kCta == 2, "A is shared within pairs only");
  static_assert(!kEarly || (kOverlap && BN == 128), "early scale products: two temporaries, one block scale");
  using C = Cfg<BM, BN, kOverlap>;
  constexpr int kStages = C::kStages, kSub = C::kSub, kScaleLd = C::kScaleLd;
  constexpr int kAcc = BN / 2;  // accumulator registers per thread per 64-row block
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = smem_u32(smem);
  const uint32_t a_smem = base, b_smem = base + kStages * C::kTileA;
  const uint32_t out_smem = base + kStages * C::kStage;
  float* scales = reinterpret_cast<float*>(smem + kStages * C::kStage + 2 * C::kOutWg);
  const uint32_t scales_u32 = smem_u32(scales);
  const uint32_t bars = smem_u32(scales + kStages * kScaleLd);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStages + s); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), 1 + 32 * C::kScaleWarps);  // the TMA thread's arrive.expect_tx + the scale lanes
      mbar_init(empty(s), 8 * kCta);                // one arrive per consumer warp of each CTA
    }
    mbar_init_fence();
  } else if (tid == 32) {
    tma_prefetch_map(&ta);
    tma_prefetch_map(&tb);
    tma_prefetch_map(&tout);
  }
  if constexpr (kCta > 1) {
    cluster_sync();  // the peer's barriers are initialised before its multicasts or arrivals reach them
  } else {
    __syncthreads();
  }

  // Work units t = (M unit, N unit) in the grouped order; a unit is kCta M-adjacent tiles (N-adjacent
  // with kShareA), this CTA's is tile kCta * unit + rank (a tile past M or N computes zeros and
  // stores nothing).
  const int tiles = p.tiles_m * p.tiles_n, nk = p.kbt;
  const int t0_ = blockIdx.x / kCta, dt = gridDim.x / kCta;
  auto my_tile = [&](int t, int rank, int& mt, int& nt) {
    tile_coords(t, p, mt, nt);
    if constexpr (kShareA) {
      nt = nt * kCta + rank;
    } else {
      mt = mt * kCta + rank;
    }
  };
  if (warp < 4) {
    setmaxnreg_dec<40>();
    if (warp == 0) {
      if (lane == 0) {
        int s = 0;
        uint32_t ph = 0;
        const uint32_t rank = kCta > 1 ? cluster_rank() : 0;
        for (int t = t0_; t < tiles; t += dt) {
          int mt, nt;
          my_tile(t, static_cast<int>(rank), mt, nt);
#pragma unroll 1
          for (int kb = 0; kb < nk; ++kb) {
            mbar_wait(empty(s), ph ^ 1);  // stage s free: its consumers (in both CTAs of a pair) released it
            mbar_arrive_expect_tx(full(s), C::kStage);  // (with kCta = 2, half of B (A) comes from the peer)
            if constexpr (kShareA) {
              constexpr int kPart = BM / kCta;  // this CTA's rows of the A tile, into both CTAs
              tma_load_2d_multicast(a_smem + s * C::kTileA + rank * kPart * kBK, &ta, full(s), kb * kBK,
                                    mt * BM + rank * kPart, static_cast<uint16_t>((1u << kCta) - 1));
              tma_load_2d(b_smem + s * C::kTileB, &tb, full(s), kb * kBK, nt * BN);
            } else if constexpr (kCta > 1) {
              tma_load_2d(a_smem + s * C::kTileA, &ta, full(s), kb * kBK, mt * BM);
              constexpr int kPart = BN / kCta;  // this CTA's rows of the B tile, into both CTAs
              tma_load_2d_multicast(b_smem + s * C::kTileB + rank * kPart * kBK, &tb, full(s), kb * kBK,
                                    nt * BN + rank * kPart, static_cast<uint16_t>((1u << kCta) - 1));
            } else {
              tma_load_2d(a_smem + s * C::kTileA, &ta, full(s), kb * kBK, mt * BM);
              tma_load_2d(b_smem + s * C::kTileB, &tb, full(s), kb * kBK, nt * BN);
            }
            if (++s == kStages) {
              s = 0;
              ph ^= 1;
            }
          }
        }
      }
      __syncwarp();
    } else if (warp <= C::kScaleWarps) {
      const int r0 = (warp - 1) * 128;  // this warp's 128 rows of the tile's token scales
      int s = 0;
      uint32_t ph = 0;
      for (int t = t0_; t < tiles; t += dt) {
        int mt, nt;
        my_tile(t, kCta > 1 ? static_cast<int>(cluster_rank()) : 0, mt, nt);
        const float* src[4];  // this lane's token-scale rows (row 0 again past M: 0 bytes read)
        int bytes[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = mt * BM + r0 + lane + 32 * q;
          bytes[q] = row < p.m ? 4 : 0;
          src[q] = p.sa + static_cast<size_t>(row < p.m ? row : 0) * nk;
        }
        // lanes 0, 1 of the first scale warp: the block scales of the tile's first and last
        // 128-column scale blocks
        int nb = (nt * BN + lane * (BN - 1)) / 128;
        nb = nb < p.nbt ? nb : p.nbt - 1;
        const float* sbrow = p.sb + static_cast<size_t>(nb) * nk;
#pragma unroll 1  // (unrolled, the loop needs more than the producer's 40 registers)
        for (int kb = 0; kb < nk; ++kb) {
          mbar_wait(empty(s), ph ^ 1);
          const uint32_t slot = smem_u32(scales + s * kScaleLd);
#pragma unroll
          for (int q = 0; q < 4; ++q) cp_async_4(slot + 4 * (r0 + lane + 32 * q), src[q] + kb, bytes[q]);
          if (r0 == 0 && lane < 2) cp_async_4(slot + 4 * (BM + lane), sbrow + kb, 4);
          cp_async_arrive_noinc(full(s));
          if (++s == kStages) {
            s = 0;
            ph ^= 1;
          }
        }
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int w = warp / 4 - 1, wl = warp % 4, wt = tid - 128 * (w + 1);
    const int r_lo = wl * 16 + lane / 4;  // this thread's rows in a 64-row block: r_lo, r_lo + 8
    const uint32_t out_buf = out_smem + w * C::kOutWg;
    float acc[kSub * kAcc], t0[kAcc], t1[kOverlap ? kAcc : 1];
#pragma unroll
    for (int r = 0; r < kAcc; ++r) {
      t0[r] = 0.f;
      fence_reg(t0[r]);
      if constexpr (kOverlap) {
        t1[r] = 0.f;
        fence_reg(t1[r]);
      }
    }
    int s = 0;
    uint32_t ph = 0;
    // waits for the next stage to be full, returns it
    auto next_stage = [&]() {
      const int cs = s;
      mbar_wait(full(s), ph);
      if (++s == kStages) {
        s = 0;
        ph ^= 1;
      }
      return cs;
    };
    // 64-row block h of this warpgroup's rows of stage cs: A rows (w * kSub + h) * 64
    // (as descriptor low words: the ring's first tile's, plus the byte offset / 16). The warpgroup's
    // row offset goes through a shuffle from lane 0 (the same value in every lane) so that ptxas
    // knows it is warp-uniform and keeps the descriptors in uniform registers: built from the
    // thread index, they were computed per thread and moved over by R2UR before every wgmma.
    const uint32_t a_lo0 = sw128_desc_lo(a_smem) + __shfl_sync(0xffffffffu, w * kSub * (64 * kBK / 16), 0);
    const uint32_t b_lo0 = sw128_desc_lo(b_smem);
    auto a_block = [&](int cs, int h) { return a_lo0 + cs * (C::kTileA / 16) + h * (64 * kBK / 16); };
    auto b_tile = [&](int cs) { return b_lo0 + cs * (C::kTileB / 16); };
    bool split = false;  // the tile's columns [64, BN) use the second block scale (BN = 192, odd 64-column offset)
    // acc[block h] += t * (sa * sb) for the K block held in stage cs; with `release` the stage is
    // given back once its scales are in registers (its wgmma reads completed before: wgmma_wait).
    // Columns [0, 128 - off) of the tile take block scale 0, the rest block scale 1 (off = tile
    // start mod 128, 0 or 64). The scales are read with ld.shared (through a generic pointer they
    // compiled to LD.E, and the FMUL after them stalled on the long scoreboard: 6% of the consumer's
    // stall samples) before the wait for the block's wgmma (pend: wgmma groups left in flight, 0 or 1),
    // so that their latency hides under it.
    // With kEarly (128x128) the products sa * sb of a stage are formed right after its full-barrier
    // wait, one K block ahead of its promotion (sc: lo, hi), so that neither the ld.shared nor the
    // multiply sits between the wgmma of the next block (ncu: short-scoreboard stalls, about 30
    // cycles a K block, with the loads placed just before the next block's last wgmma).
    auto early_scales = [&](int cs, float* sc) {
      const uint32_t slot = scales_u32 + cs * kScaleLd * 4;
      const int row = w * kSub * 64 + r_lo;
      const float sb0 = ld_shared_f32(slot + 4 * BM);
      const float sa_lo = ld_shared_f32(slot + 4 * row), sa_hi = ld_shared_f32(slot + 4 * (row + 8));
      sc[0] = sa_lo * sb0;
      sc[1] = sa_hi * sb0;
    };
    auto promote = [&](float* t, int cs, int h, bool release, int pend, const float* sc = nullptr) {
      const uint32_t slot = scales_u32 + cs * kScaleLd * 4;
      const int row = (w * kSub + h) * 64 + r_lo;
      float sb0 = 0.f, sb1 = 0.f, sa_lo = 0.f, sa_hi = 0.f;
      if constexpr (!kEarly) {
        sb0 = ld_shared_f32(slot + 4 * BM);
        sb1 = BN == 128 ? sb0 : ld_shared_f32(slot + 4 * (BM + 1));  // (BN = 128: never split)
        sa_lo = ld_shared_f32(slot + 4 * row);
        sa_hi = ld_shared_f32(slot + 4 * (row + 8));
      }
      if (pend) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
#pragma unroll
      for (int r = 0; r < kAcc; ++r) fence_reg(t[r]);
      if (release) {
        __syncwarp();
        if constexpr (kCta > 1) {
          if (lane < kCta) mbar_arrive_rank(empty(cs), lane);  // the stage's copy in each CTA
        } else {
          if (lane == 0) mbar_arrive(empty(cs));
        }
      }
      float lo0, h0, lo1, h1;
      if constexpr (kEarly) {
        lo0 = lo1 = sc[0];
        h0 = h1 = sc[1];
      } else {
        lo0 = sa_lo * sb0;
        h0 = sa_hi * sb0;
        lo1 = sa_lo * sb1;
        h1 = sa_hi * sb1;
      }
      const float lom = split ? lo1 : lo0, hm = split ? h1 : h0;
      float* a = acc + h * kAcc;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const float sl = j < 8 ? lo0 : j < 16 ? lom : lo1;
        const float sh = j < 8 ? h0 : j < 16 ? hm : h1;
        a[4 * j + 0] = fmaf(t[4 * j + 0], sl, a[4 * j + 0]);
        a[4 * j + 1] = fmaf(t[4 * j + 1], sl, a[4 * j + 1]);
        a[4 * j + 2] = fmaf(t[4 * j + 2], sh, a[4 * j + 2]);
        a[4 * j + 3] = fmaf(t[4 * j + 3], sh, a[4 * j + 3]);
      }
    };
    // Epilogue of the tile (mt, nt) held in acc: bf16 into the staging buffer (128B-swizzled
    // 64 x 64 boxes, conflict-free stores), one thread issues the TMA stores. The buffer is reused
    // once this warpgroup's previous stores have read it (cp.async.bulk.wait_group.read).
    auto epilogue = [&](int mt, int nt) {
      if (wt == 0) bulk_wait_read0();
      named_bar_sync(1 + w, 128);
      const uint32_t sw = static_cast<uint32_t>(lane / 4) & 7u;  // 128B swizzle: row % 8
#pragma unroll
      for (int h = 0; h < kSub; ++h) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const uint32_t off = (h * (BN / 64) + j / 8) * kOutHalf + ((static_cast<uint32_t>(j % 8) ^ sw) * 16) +
                               4 * (lane % 4);
          const float* a = acc + h * kAcc;
          st_shared_u32(out_buf + off + r_lo * 128, pack_bf16(a[4 * j + 0], a[4 * j + 1]));
          st_shared_u32(out_buf + off + (r_lo + 8) * 128, pack_bf16(a[4 * j + 2], a[4 * j + 3]));
        }
      }
      fence_async_smem();
      named_bar_sync(1 + w, 128);
      if (wt == 0) {
#pragma unroll
        for (int h = 0; h < kSub; ++h) {
          const int y = mt * BM + (w * kSub + h) * 64;
          if (y < p.m) {
#pragma unroll
            for (int c = 0; c < BN / 64; ++c) {
              const int x = nt * BN + c * 64;
              if (x < p.n) tma_store_2d(&tout, out_buf + (h * (BN / 64) + c) * kOutHalf, x, y);
            }
          }
        }
        bulk_commit();
      }
    };
    int prev_mt = -1, prev_nt = 0;  // the previous tile, its epilogue still to run
    // kEarly: the K-block count held in a register (else ptxas reloads it from the constant bank,
    // LDC + ISETP, every iteration)
    int nk_r = nk;
    if constexpr (kEarly) asm volatile("" : "+r"(nk_r));
    const int rank = kCta > 1 ? static_cast<int>(cluster_rank()) : 0;
    for (int t = t0_; t < tiles; t += dt) {
      int mt, nt;
      my_tile(t, rank, mt, nt);
      // The first K block's wgmma goes first; the previous tile's epilogue runs under it.
      int c0 = next_stage();  // stage of the block pending in t0
      float sc0[2], sc1[2];       // kEarly: the scale products of the blocks in t0, t1
      if constexpr (kEarly) early_scales(c0, sc0);
      issue_block<BN>(t0, a_block(c0, 0), b_tile(c0));
      if (prev_mt >= 0) epilogue(prev_mt, prev_nt);
      prev_mt = mt;
      prev_nt = nt;
      split = BN != 128 && ((nt * BN) & 127) != 0;
#pragma unroll
      for (int r = 0; r < kSub * kAcc; ++r) {
        acc[r] = 0.f;
        fence_reg(acc[r]);
      }
      if constexpr (kOverlap) {
        // Two temporaries alternate: block kb+1's wgmma is issued before block kb is promoted.
        // The loop keeps one shape of in-flight state (t0 pending at its head) so that ptxas can
        // prove which accumulators are free (else it serializes every wgmma: C7514).
        int kb = 1;
        for (; kb + 1 < nk_r; kb += 2) {
          const int c1 = next_stage();
          if constexpr (kEarly) early_scales(c1, sc1);
          issue_block<BN>(t1, a_block(c1, 0), b_tile(c1));
          promote(t0, c0, 0, true, 1, sc0);
          c0 = next_stage();
          if constexpr (kEarly) early_scales(c0, sc0);
          issue_block<BN>(t0, a_block(c0, 0), b_tile(c0));
          promote(t1, c1, 0, true, 1, sc1);
        }
        if (kb < nk_r) {
          const int c1 = next_stage();
          if constexpr (kEarly) early_scales(c1, sc1);
          issue_block<BN>(t1, a_block(c1, 0), b_tile(c1));
          promote(t0, c0, 0, true, 1, sc0);
          promote(t1, c1, 0, true, 0, sc1);
        } else {
          promote(t0, c0, 0, true, 0, sc0);
        }
      } else {
        for (int kb = 0;;) {
          promote(t0, c0, 0, kSub == 1, 0);
#pragma unroll
          for (int h = 1; h < kSub; ++h) {
            issue_block<BN>(t0, a_block(c0, h), b_tile(c0));
            promote(t0, c0, h, h == kSub - 1, 0);
          }
          if (++kb == nk) break;
          c0 = next_stage();
          issue_block<BN>(t0, a_block(c0, 0), b_tile(c0));
        }
      }
    }
    epilogue(prev_mt, prev_nt);  // every CTA has at least one tile
    if (wt == 0) bulk_wait0();
  }
  // A CTA of a pair leaves only once its peer no longer arrives on its barriers.
  if constexpr (kCta > 1) cluster_sync();
}

constexpr int kMaxDevices = 64;

template <int BM, int BN, bool kOverlap, int kCta, bool kShareA = false, bool kEarly = false>
int launch(const GemmNt& g, int group, cudaStream_t stream) {
  using C = Cfg<BM, BN, kOverlap>;
  auto kernel = large_gemm_kernel<BM, BN, kOverlap, kCta, kShareA, kEarly>;
  cudaLaunchConfig_t lc = {};
  dsx_launch::Attrs attrs;
  attrs.set(lc, kCta);
  lc.blockDim = dim3(kThreads, 1, 1);
  lc.dynamicSmemBytes = C::kSmem;
  lc.stream = stream;
  // Once per device: the shared-memory limit and how many CTAs run at once (1 per SM; pairs need
  // two SMs of one GPC, so fewer may fit: the grid is sized to what is resident, never a second round).
  static std::atomic<int> state[kMaxDevices];  // 0 new, > 0 resident CTAs, -1 failed
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return DSX_ECUDA;
  if (state[dev].load(std::memory_order_acquire) == 0) {
    bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem) == cudaSuccess;
    int n = ok ? sm_count() : 0;
    if (ok && kCta > 1) {
      int clusters = 0;
      ok = dsx_launch::max_active_clusters(&clusters, kernel, kCta, kThreads, C::kSmem) == cudaSuccess;
      n = clusters * kCta;
    }
    if (!ok) cudaGetLastError();
    state[dev].store(ok && n > 0 ? n : -1, std::memory_order_release);
  }
  const int slots = state[dev].load(std::memory_order_acquire);
  if (slots <= 0) return DSX_ECUDA;
  CUtensorMap ta, tb, tout;
  constexpr int kBoxA = kShareA ? BM / kCta : BM, kBoxB = kShareA ? BN : BN / kCta;  // (multicast halves)
  if (!encode_2d_sw128(&ta, g.a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, g.m, g.k, kBoxA, kBK) ||
      !encode_2d_sw128(&tb, g.b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, g.n, g.k, kBoxB, kBK) ||
      !encode_2d_sw128(&tout, g.out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, g.m, g.n, 64, 64)) {
    return DSX_EINVAL;
  }
  Params p{};
  p.sa = g.sa;
  p.sb = g.sb;
  p.m = static_cast<int>(g.m);
  p.n = static_cast<int>(g.n);
  p.kbt = static_cast<int>((g.k + kBK - 1) / kBK);
  p.nbt = static_cast<int>((g.n + 127) / 128);
  const int tiles_m = static_cast<int>((g.m + BM - 1) / BM), tiles_n = static_cast<int>((g.n + BN - 1) / BN);
  constexpr int kCtaM = kShareA ? 1 : kCta, kCtaN = kShareA ? kCta : 1;  // tiles per unit along M, N
  p.tiles_m = (tiles_m + kCtaM - 1) / kCtaM;  // M units: tiles, or pairs of tiles
  p.tiles_n = (tiles_n + kCtaN - 1) / kCtaN;  // N units
  p.group = (group > 0 ? group : kDefaultGroup) * 128 / (BM * kCtaM);  // in 128-row units
  if (p.group < 1) p.group = 1;
  if (p.group > p.tiles_m) p.group = p.tiles_m;
  const int64_t units = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
  const int64_t max_units = slots / kCta;
  lc.gridDim = dim3(static_cast<unsigned>((units < max_units ? units : max_units) * kCta), 1, 1);
  return cuda_rc(cudaLaunchKernelEx(&lc, kernel, ta, tb, tout, p));
}

}  // namespace

bool large_supported(const GemmNt& g) {
  return g.m >= 1 && g.n >= 1 && tma_compatible(g) && g.m <= (int64_t{1} << 30) && g.n <= (int64_t{1} << 30) &&
         g.k <= (int64_t{1} << 30) && ((g.m + 127) / 128) * ((g.n + 127) / 128) < (int64_t{1} << 31);
}

int large_run(const GemmNt& g, int variant, int group, cudaStream_t stream) {
  if (!large_supported(g) || group < 0) return DSX_EINVAL;
  switch (variant) {
    case 0:   // the default: variant 10's form (auto's 128x128)
    case 10:  // variant 1, each block's scale products formed one block ahead (same bits)
      return launch<128, 128, true, 1, false, true>(g, group, stream);
    case 1:  // the order before variant 10 (the same bits)
      return launch<128, 128, true, 1>(g, group, stream);
    case 2:
      return launch<128, 192, false, 1>(g, group, stream);
    case 3:
      return launch<128, 128, false, 1>(g, group, stream);
    case 4:
      return launch<256, 128, false, 1>(g, group, stream);
    case 5:  // the same tiles in 2-CTA clusters, B shared by multicast
      return launch<128, 128, true, 2>(g, group, stream);
    case 6:
      return launch<128, 192, false, 2>(g, group, stream);
    case 7:
      return launch<256, 128, false, 2>(g, group, stream);
    case 8:  // 2-CTA clusters of two N-adjacent tiles, A shared by multicast
      return launch<128, 128, true, 2, true>(g, group, stream);
    case 9:
      return launch<128, 192, false, 2, true>(g, group, stream);
    default:
      return DSX_EINVAL;
  }
}

}  // namespace dsx_cuda
