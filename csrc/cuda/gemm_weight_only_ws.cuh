// Weight-only GEMM, warp-specialized path (algo bit 28): the kernel and its shared-memory layout
// (included by gemm_weight_only.cu after its host helpers, inside its anonymous namespace's reach: it
// uses Params and the layout constants from there). Its host side, the configurations, rules, table and launches, is
// gemm_weight_only_ws_host.cuh.
//
// The same arithmetic as wo_gemm_kernel (each consumer warp owns 16 output channels, unpacks
// Paddle's bytes in registers and runs the same step_q / step_g64_tiles on them, with the same
// x layout in shared memory, the same per-step partials joined in increasing k and the same
// cluster reduction in slice order: for a given split the output bits are those of the
// existing path), but the weights reach shared memory differently: one producer warp (the
// block's last; lane 0 issues) fills ONE ring shared by the block's `warps` consumer warps.
// A ring slot holds `box` steps of all the block's channels (box x warps KB, one tensor copy
// for the whole block: rows of 4 (int4) or 8 (int8) channel groups a warp, warp after warp),
// completing on the slot's `full` mbarrier; each consumer warp, once it has read the slot,
// arrives on the slot's `empty` mbarrier (count = consumer warps), and the producer refills
// the slot when all have. So the consumers issue no copies and never wait for a refill
// decision; the producer runs up to `stages` slots ahead of the slowest consumer warp, across
// tile groups too (persistent blocks).
// The producer warp also takes part in the cluster barriers of each tile group's reduction
// (barrier.cluster counts every thread): it joins group u's barriers only once its next wait
// would depend on the consumers having passed them (the slot to refill was last filled with a
// later group's steps), so it never blocks the consumers and is never blocked by them.
//
// What limits it and what was tried on it (profiles, diagnostic builds, dropped variants, sessions 13 to 25):
// docs/benchmarks.md, "The warp-specialized kernel's source notes" (indexed in docs/kernel-experiments.md).
#pragma once

namespace {

// Bytes of one block-wide scale row copy (lead + 16 bf16 a channel tile, for the most tiles a
// block of ct tiles a warp has: a constant of the kernel instance).
__host__ __device__ constexpr int ws_scale_row(int ct) { return 16 + 32 * kMaxWarps * ct; }

// Scale rows one step holds: two with two groups a step (GMODE 2: int4, group 64), else one (GMODE 1: a
// group spans a step or more). Twenty-seventh session: GMODE 1 had room for two as well, 2 x box x 528 bytes
// a slot never written, which put int4 group 128 at 8 splits and 16 rows 384 bytes over two blocks an SM.
__host__ __device__ constexpr int ws_scale_rows(int gmode) { return gmode == 2 ? 2 : gmode == 1 ? 1 : 0; }
// A block ring slot: `box` steps of all `tiles` channel tiles (1 KB each; tiles = ct * warps,
// ct = 2 or 4 with algo bits 29..30), then (group scales) the scale rows of each step, in step order.
__host__ __device__ constexpr int ws_slot_bytes(int gmode, int box, int tiles, int ct) {
  return (box * (tiles * kWBytes + ws_scale_rows(gmode) * ws_scale_row(ct)) + 127) / 128 * 128;
}
// x through the ring (XR; the producer's copies by TMA since the twenty-eighth session): x's rows for each slot's steps
// sit in a second ring after the weights' one (the x ring: `stages` x `box` steps, kXrStepBytes a step, from the first
// 512-byte boundary after the weight ring, so that a copy's 64-byte swizzle, applied by the copy engine on shared
// address bits, is the same whether it counts from the box or from the address). One 3-D tensor copy a step (the
// x map: 32 k x K/32 segments x rows) writes 16 rows (rows past M and k past K zero) x 4 segments of 32 k, row r's
// segment c at 256 r + 64 c, its 16-byte piece i at piece i ^ ((2 r + c / 2) & 3): the 8 lanes of each quarter-warp
// (rows g, g + 1 of a pair, the four c) read 8 distinct 16-byte bank groups (step_q_tiles_xr). Where the block's x slice
// staged whole does not fit beside the ring in a half of the SM's shared memory (int4 per channel at 4 splits: 11..16
// rows; group 128: 10..16), so that two blocks an SM hold the deeper ring anyway.
constexpr int kXrStepBytes = 16 * 256;  // one step of x in the x ring: 16 rows x 128 k bf16
__host__ __device__ constexpr int ws_xring_bytes(int stages, int box) { return 512 + stages * box * kXrStepBytes; }
// full[stages] then empty[stages] mbarriers; a kernel that pushes its cluster sum (PUSH) has two more
// in the padding after them (ws_push: only where they fit): recv (this block's pieces of a tile group
// have landed) and send (every block of the cluster has read the pieces this one sent it).
__host__ __device__ constexpr int ws_barrier_bytes(int stages) { return (2 * stages * 8 + 127) / 128 * 128; }
// Barriers that fit in that padding, after the full and empty ones (8 bytes each, from 16 * stages): the pushed
// sum's recv and send (the first two), the x gate's (the third).
__host__ __device__ constexpr int ws_spare_barriers(int stages) { return (ws_barrier_bytes(stages) - 16 * stages) / 8; }
// The x gate (below): ring fills the producer issues before the consumers' x slice is staged. Twenty-fourth session
// (H200, bench/wo_ab.sh, 6 rounds interleaved, int4 per channel, us, no gate / gate after 1 fill / after 0): 36864 x
// 7168 M = 8 / 9 / 16 44.30 / 50.53 / 57.31 -> 43.66 / 49.12 / 56.06 (0: 44.89 / 49.97 / 56.54); 7168 x 18432 M = 8
// / 16 27.03 / 32.36 -> 25.83 / 31.94; 24576 x 1536 M = 9 / 16 13.83 / 14.77 -> 12.73 / 13.83; 2048 x 7168 M = 16
// 10.32 -> 9.94; M = 1 the same or up to 1.8% faster (0: up to 9% slower). With every first fill in flight (64 KB a
// block, ~15 MB over the GPU) the blocks' x loads queued behind them: staging x took 10-13% of the warp samples
// (ncu, 36864 x 7168).
constexpr int kXGateFill = 1;
// The reducer warp (twenty-fifth session): in a kernel that pushes its cluster sum with several tiles a warp, one
// more warp (after the producer) waits for the pieces of each tile group, sums the ones its block owns and writes
// them out, while the consumer warps go on to the next group's steps (they send their pieces, own one included, by
// st.async and never wait for the sum). Before, the consumers summed: every group's sum, and the wait for the
// cluster's slowest slice before it, stood between two groups' step loops (ncu: 31% of the warp samples at M = 16,
// 36864 x 7168). Only where the extra warp keeps the blocks an SM (ws_blocks_per_sm, by registers: two tiles a warp
// with two token tiles, four tiles a warp); with two tiles a warp and one token tile the 32 more threads took the
// block from three an SM to two (76 registers), and with one tile a warp its three blocks would leave 64 registers.
// The kernel with it is launched only where blocks loop over two tile groups or more (ws_launch_inst). Measured (H200,
// bench/wo_ab.sh, 6 rounds interleaved with main's build, us, before -> with; `.dsxc-run25c/run25c.sh`): int4 per
// channel 36864 x 7168 M = 4 / 8 / 9 / 12 / 16 42.62 / 44.00 / 48.83 / 53.22 / 55.10 -> 41.68 / 43.14 / 48.37 / 52.55
// / 52.57 (torch 139.4-140.7: 2.68x at 16 rows); 18432 x 7168 M = 9 / 12 / 16 28.98 / 29.29 / 29.81 -> 28.12 / 28.51
// / 28.98; int4 group 128 36864 x 7168 M = 9 / 16 54.35 / 59.70 -> 53.10 / 58.08; int8 per channel within 1%; the
// one-group grids (7168 x 18432, 2048 x 7168, 24576 x 1536, 7168 x 2048) within 0.7%. Summing the last group too,
// by the one warp (the consumers idle meanwhile), made the one-group grids 1-10% slower (7168 x 18432 M = 9 30.38 ->
// 32.15); launching the kernel with the warp there even unused, 1-2.5% (2048 x 7168 M = 12 9.44 -> 9.67).
__host__ __device__ constexpr bool ws_red_warp(int ct, int mt, bool push) {
#ifdef DSX_WO_NO_RED_WARP  // (A/B builds: the consumers sum, as before)
  return false;
#else
  return push && (ct == 4 || (ct == 2 && mt == 2));
#endif
}

__device__ __forceinline__ void ws_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void ws_consumer_sync(int threads) {  // the consumer warps only (named barrier 1)
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}
__device__ __forceinline__ void ws_cluster_sync_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address of this CTA's shared-memory byte `addr` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t ws_mapa(uint32_t addr, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// Two floats into another CTA's shared memory, their 8 bytes completing on that CTA's barrier
// (no fence, no wait: the sender goes on at once).
__device__ __forceinline__ void ws_st_async2(uint32_t raddr, float a, float b, uint32_t rbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(raddr),
               "f"(a), "f"(b), "r"(rbar)
               : "memory");
}

// The block's tensor maps (Params::wmap: `box` steps x all tiles' rows; wmap1: one step).
// CT: 16-channel tiles a consumer warp owns (2, 4: algo bits 29..30; warp w owns tiles CT w .. CT w +
// CT - 1, contiguous channels; one x load feeds the mma of all of them: step_q_tiles).
// WG (four or eight token tiles, one tile a warp; ws_wgmma): the consumer warps run as warpgroups (4 or 8 warps) and
// each step's products go through wgmma, the unpacked weights its register A operand (each warp's 16 channels its 16
// rows of the m64) and x its shared-memory B (stage_x_wgmma's layout, ceil(M / 8) token groups); the same
// k-steps as step_q's mma chain, from 0 a step and promoted as there (step_q_wgmma; int4 group 64: step_g64_wgmma, x in
// the group-64 k order): the same bits. Eight token tiles (33..64 rows in one launch, kWsWideRows) run only this way.
template <int BITS, int MT, int GMODE, int CT = 1, bool PUSH = false, bool PARTS = false, bool RED = false,
          bool XR = false, bool FOLD = false, bool WG = false, bool STMA = false>
__global__ void __launch_bounds__((kMaxWarps + (RED ? 2 : 1)) * 32, CT == 4 || MT == 8 ? (MT == 1 ? 2 : 1)
                                                                  : (CT == 2 && (MT == 2 || PUSH)) || (MT == 2 && GMODE == 2) || MT == 4 ? 2 : 3)
    wo_gemm_ws_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kStepK = BITS == 8 ? 64 : 128;
  constexpr int kRowStep = BITS == 8 ? 128 : 256;  // bytes of one step in one channel-group row
  constexpr int kElemStep = kRowStep / 8;          // the same in tensor-map elements
  constexpr int kRowsPerWarp = BITS == 8 ? 8 : 4;  // channel-group rows of one warp's 16 channels
  static_assert(!RED || ws_red_warp(CT, MT, PUSH), "the reducer warp: pushed sums with several tiles a warp only");
  static_assert(!XR || (BITS == 4 && MT == 2 && CT == 2 && !PARTS), "x through the ring: ws_xring_ok");
  static_assert(!FOLD || (XR && GMODE == 0), "the fold: x through the ring, int4 per channel (ws_choose)");
  static_assert(!WG || (MT >= 4 && CT == 1 && !XR), "wgmma consumers: ws_wgmma");
  static_assert(!STMA || (BITS == 4 && GMODE != 0 && XR), "scale rows by one tensor copy a slot: ws_smap_pays");
  const int lane = threadIdx.x & 31, nwarps = (blockDim.x >> 5) - (RED ? 2 : 1);  // consumer warps
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  const int g = lane >> 2, c = lane & 3;
  const int splits = gridDim.x, rank = blockIdx.x;
  const int kt = p.k / 64;
  const int nsteps_all = BITS == 8 ? kt : (kt + 1) / 2;
  const int s_begin = static_cast<int>(static_cast<int64_t>(nsteps_all) * rank / splits);
  const int s_end = static_cast<int>(static_cast<int64_t>(nsteps_all) * (rank + 1) / splits);
  const int nst = p.stages, box = p.box;
  const int tiles = CT * nwarps;  // 16-channel tiles of the block
  const int slot_sz = ws_slot_bytes(GMODE, box, tiles, CT);
  const int ld = p.chunk * kStepK + kXPadElems;
  const int nloc = s_end - s_begin;
  const int ustride = gridDim.y;
  // PARTS (four token tiles only; plan_launch: two launches' rows side by side in one grid where both fit
  // one wave): this block's grid-z part, rows z * part_m .., and its x and out rows (computed where used, as
  // the sizes below). Without PARTS, the launch's rows, x and out (the instances compile as before it).
  auto rows_of = [&]() {
    if constexpr (PARTS) return min(p.part_m, p.m - static_cast<int>(blockIdx.z) * p.part_m);
    return p.m;
  };
  auto x_of = [&]() {
    if constexpr (PARTS) return p.x + static_cast<int64_t>(blockIdx.z) * p.part_m * p.k;
    return p.x;
  };
  auto out_of = [&]() {
    if constexpr (PARTS) return p.out + static_cast<int64_t>(blockIdx.z) * p.part_m * p.n;
    return p.out;
  };

  // Shared memory: [full, empty barriers][ring][x slice][partial tile].
  const uint32_t full0 = dsx_wo::smem_addr(smem), empty0 = full0 + 8 * nst;
  // (computed where used, from kernel parameters: no register held through the step loop)
  auto recv_bar = [&]() { return dsx_wo::smem_addr(smem) + 16 * p.stages; };
  auto send_bar = [&]() { return dsx_wo::smem_addr(smem) + 16 * p.stages + 8; };
  // x gate: the consumers' x slice is staged (one arrival, after their barrier); the producer issues no more than
  // kXGateFill ring fills before it (where the barrier fits in the padding after the others; otherwise no gate).
  auto xready_bar = [&]() { return dsx_wo::smem_addr(smem) + 16 * p.stages + 16; };
  // (int4 per channel up to 16 rows, where it was measured: at four token tiles, 17..32 rows, its code spilled at the
  // register cap, and group-128 instances with two tiles a warp passed their 72-register limit, ptxas; computed where
  // used)
  constexpr bool kXGate = BITS == 4 && GMODE == 0 && MT <= 2 && !XR;
  auto xgate = [&]() { return ws_spare_barriers(p.stages) >= 3; };
  // PUSH: the cluster's sum of a tile group is pushed (the host takes it where the block's tiles
  // divide by splits, ws_push): 16-channel tile v of the group is summed by block v / (tiles /
  // splits); each block sends its pieces there (st.async, completing on the owner's recv barrier)
  // and sums only what it owns. Otherwise pulled (below). (A template argument, not a runtime
  // branch: with both sums in one kernel the pulled instances lost 1-2%, register allocation.)
  const uint8_t* ring = smem + ws_barrier_bytes(nst);
  uint16_t* xbuf = reinterpret_cast<uint16_t*>(smem + ws_barrier_bytes(nst) + nst * slot_sz);
  auto part_of = [&]() {
    if constexpr (XR)
      return reinterpret_cast<float*>(smem + ws_barrier_bytes(p.stages) + p.stages * ws_slot_bytes(GMODE, p.box, CT * nwarps, CT) +
                                      ws_xring_bytes(p.stages, p.box));
    return reinterpret_cast<float*>(smem + ws_barrier_bytes(p.stages) + p.stages * ws_slot_bytes(GMODE, p.box, CT * nwarps, CT) +
                                    2 * (((PARTS ? p.part_m : p.m) + (WG ? 7 : 0)) & ~(WG ? 7 : 0)) * (p.chunk * kStepK + kXPadElems));
  };
  // XR: the x ring's first byte (a shared address; computed where used)
  auto xring0 = [&]() {
    return (dsx_wo::smem_addr(smem) + ws_barrier_bytes(p.stages) + p.stages * ws_slot_bytes(GMODE, p.box, CT * nwarps, CT) +
            511u) & ~511u;
  };
  // FOLD (x through the ring, int4 per channel, where every block loops over two tile groups or more: ws_fold_pays): the
  // unpack leaves each weight at 128 + u = q + 136 (no bf16 fma: 64 of the step loop's 252 instructions), and the
  // accumulators of a tile group, before they are scaled and summed over the cluster, get - 136 x the sum of the
  // block's x rows over its K slice (the block's own slice: the cluster's sum then holds - 136 x the sum over K).
  // The producer warp sums x, from the x ring, while the consumers run the first tile group: each fill once the
  // next nst - 1 are issued (landed by then, or nearly, and not yet refilled), the rest after its last fill; a
  // step's sum is one chain of 8 mma (fold_step_sum_xr), the steps added in order (the same bits for every
  // block shape at a split). The consumers wait for the sums (sums_bar) only at the first group's end.
  // the fold's sums of x (16 floats) and their barrier (the producer arrives once they are written), after the partial
  // tile (ws_choose adds their room)
  auto sums_of = [&]() { return part_of() + p.m * 16 * CT * nwarps; };
  auto sums_bar = [&]() { return dsx_wo::smem_addr(sums_of()) + 64; };
  auto ngroups = [&]() { return GMODE == 2 ? kt : p.group > 0 ? (p.k + p.group - 1) / p.group : 1; };
  auto lead = [&]() { return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p.scale) & 15); };

  // The owner's sum of one pushed tile group (PUSH; its pieces have landed): this block's owned tiles, by threads t0,
  // t0 + tstride, ... (the consumers, or the reducer warp).
  auto push_sum = [&](const float* part, int n_blk, int rows, int me, int owned, int sp, int t0, int tstride) {
    const int blk = owned * rows * 16;
    const int quads = owned * rows * 4;
    for (int e = t0; e < quads; e += tstride) {
      const int q4 = e & 3, row = e >> 2, lv = row / rows, tok = row - lv * rows;
      const int n = n_blk + (me * owned + lv) * 16 + 4 * q4;
      if (n >= p.n) continue;
      const int off = row * 16 + 4 * (q4 ^ (tok & 2));
      // Per-channel scales: applied here, by the owner, to each piece before it is added (rounded
      // products, then rounded sums in slice order: the bits of the pulled sum, whose blocks scale their
      // partial tiles in put_partial); the senders hold no scales.
      float sc[4] = {1.f, 1.f, 1.f, 1.f};
      if (GMODE == 0)
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[i] = dsx_wo::bf16_bits_to_f32(__ldg(p.scale + n + i));
      auto scaled = [&](float4 w) {
        if (GMODE == 0)
          w.x = __fmul_rn(w.x, sc[0]), w.y = __fmul_rn(w.y, sc[1]), w.z = __fmul_rn(w.z, sc[2]), w.w = __fmul_rn(w.w, sc[3]);
        return w;
      };
      float4 s = scaled(*reinterpret_cast<const float4*>(part + off));
#pragma unroll
      for (int r = 1; r < kMaxSplits; ++r)
        if (r < sp) {  // slice order: deterministic, the pulled sum's bits
          const float4 w = scaled(*reinterpret_cast<const float4*>(part + r * blk + off));
          s.x = __fadd_rn(s.x, w.x), s.y = __fadd_rn(s.y, w.y), s.z = __fadd_rn(s.z, w.z), s.w = __fadd_rn(s.w, w.w);
        }
      uint16_t* out = out_of() + static_cast<int64_t>(tok) * p.n + n;
      out[0] = dsx_wo::f32_to_bf16_rne(s.x), out[1] = dsx_wo::f32_to_bf16_rne(s.y);
      out[2] = dsx_wo::f32_to_bf16_rne(s.z), out[3] = dsx_wo::f32_to_bf16_rne(s.w);
    }
  };

  if (threadIdx.x == 0) {
    dsx_wo::prefetch_tmap(&p.wmap);
    if constexpr (XR) dsx_wo::prefetch_tmap(&p.xmap);
    if constexpr (STMA) dsx_wo::prefetch_tmap(&p.smap);
    for (int i = 0; i < nst; ++i) {
      dsx_wo::mbar_init(full0 + 8 * i, 1);
      dsx_wo::mbar_init(empty0 + 8 * i, nwarps);
    }
    if constexpr (PUSH) {
      dsx_wo::mbar_init(recv_bar(), 1);
      dsx_wo::mbar_init(send_bar(), splits);
    }
    if constexpr (kXGate) {
      if (xgate()) dsx_wo::mbar_init(xready_bar(), 1);
    }
    if constexpr (FOLD) dsx_wo::mbar_init(sums_bar(), 1);
  }
  dsx_wo::fence_barrier_init();
  __syncthreads();
  // (pushed sum: no block writes into a peer before the peer's barriers are initialized; waited on
  // just before the first send)
  if constexpr (PUSH) dsx_wo::cluster_arrive_relaxed();

  // Tile groups of this block: blockIdx.y, + gridDim.y, ... (every block of a cluster the same).
  const int my_groups = static_cast<int>(blockIdx.y) < p.groups ? (p.groups - 1 - blockIdx.y) / ustride + 1 : 0;
  // The reducer warp works where the block has two tile groups or more (it sums all but the last); with one, the
  // consumers push and sum as without it.
  const bool red = RED && my_groups > 1;

  if (warp == nwarps) {  // ---------------------------------------------------------- producer
    const int fpg = (nloc + box - 1) / box;  // ring fills per tile group
    int joined = 0;                          // tile groups whose cluster barriers this warp has passed
    auto join = [&]() {                      // the two cluster barriers of one group's reduction
#if !defined(DSX_WO_DIAG_NORED) || DSX_WO_DIAG_NORED < 2
      if (splits > 1 && !PUSH) {
        ws_cluster_sync_release();
        dsx_wo::cluster_arrive_relaxed();
        dsx_wo::cluster_wait();
      }
#endif
      ++joined;
    };
    int f = 0, slot = 0;
    // The fold: the first tile group's fills summed in order, each once the next nst - 1 fills are issued (so that it
    // has landed or is about to, and before its slot is refilled), the rest after the last fill; then the sums go to
    // shared memory for the consumers (one arrival on sums_bar).
    float fs[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // (an empty slice publishes these zeros)
    int summed = 0;
    auto publish = [&]() {
      float* sums = sums_of();
      if (g == 0)
        sums[2 * c] = fs[0][0], sums[2 * c + 1] = fs[0][1], sums[8 + 2 * c] = fs[1][0], sums[9 + 2 * c] = fs[1][1];
      __syncwarp();
      if (lane == 0) ws_mbar_arrive(sums_bar());
    };
    auto sum_to = [&](int upto) {
      if constexpr (FOLD) {
        if (my_groups == 0) return;
        for (; summed < fpg && summed <= upto; ++summed) {
          const int sl = summed % nst, len = min(box, s_end - (s_begin + summed * box));
          dsx_wo::mbar_wait(full0 + 8 * sl, static_cast<uint32_t>((summed / nst) & 1));
          const uint32_t off = xring0() - dsx_wo::smem_addr(smem) + static_cast<uint32_t>(sl * box * kXrStepBytes);
          for (int j = 0; j < len; ++j)
            dsx_wo::fold_step_sum_xr(fs, smem, off + j * kXrStepBytes, dsx_wo::xr_lane_off(g, c));
          if (summed + 1 == fpg) publish();
        }
      }
    };
    if (fpg > 0) {
      for (int o = 0; o < my_groups; ++o) {
        const int u = blockIdx.y + o * ustride;
        const int n_blk = u * 16 * tiles;
        const int row0 = BITS == 8 ? n_blk / 2 : n_blk / 4;
        const int nch = min(16 * tiles, p.n - n_blk);
        const uint32_t srow = (lead() + 2 * nch + 15) & ~15u;
        for (int first = s_begin; first < s_end; first += box, ++f) {
          if constexpr (kXGate) {
            if (f == kXGateFill && xgate()) dsx_wo::mbar_wait(xready_bar(), 0);
          }
          if (f >= nst) {
            // The slot was last filled by fill f - nst: its consumption may need the consumers to
            // have passed the reductions of the groups before that fill's group.
            if (!PUSH)
              while (joined < (f - nst) / fpg) join();
            dsx_wo::mbar_wait(empty0 + 8 * slot, static_cast<uint32_t>((f / nst - 1) & 1));
          }
          if (lane == 0) {
            const int len = min(box, s_end - first);
            uint32_t bytes = len * tiles * kWBytes;
            // (STMA's tensor copy: its whole box, ws_scale_rows(GMODE) rows a step, zeros past K and N counted too)
            if (STMA) bytes += ws_scale_rows(GMODE) * box * 32 * tiles;
            if (GMODE == 1 && !STMA) bytes += len * srow;
            if (GMODE == 2 && !STMA)
              for (int j = 0; j < len; ++j) bytes += srow * (2 * (first + j) + 1 < ngroups() ? 2u : 1u);
            if (XR) bytes += len * kXrStepBytes;
            const uint32_t bar = full0 + 8 * slot, dst = dsx_wo::smem_addr(ring) + slot * slot_sz;
            const uint64_t policy = dsx_wo::l2_evict_first();
            dsx_wo::mbar_arrive_expect_tx(bar, bytes);
            if (len == box) {
              dsx_wo::tma_load_2d(dst, &p.wmap, first * kElemStep, row0, bar, policy);
            } else {
              for (int j = 0; j < len; ++j)
                dsx_wo::tma_load_2d(dst + j * tiles * kWBytes, &p.wmap1, (first + j) * kElemStep, row0, bar, policy);
            }
            if (STMA) {  // (int4 groups: the slot's scale rows in one tensor copy, ws_encode_smap; group 64 two a step)
              dsx_cuda::sm90::tma_load_2d(dst + box * tiles * kWBytes, &p.smap, bar, n_blk, ws_scale_rows(GMODE) * first);
            } else if (GMODE != 0) {
              for (int j = 0; j < len; ++j) {
                const int step = first + j;
                for (int i = 0; i < 2; ++i) {
                  const int grp = GMODE == 1 ? (i == 0 ? step * kStepK / p.group : -1)
                                             : (i == 0 ? 2 * step : (2 * step + 1 < ngroups() ? 2 * step + 1 : -1));
                  if (grp < 0) break;
                  const uint8_t* src =
                      reinterpret_cast<const uint8_t*>(p.scale + static_cast<int64_t>(grp) * p.n + n_blk) - lead();
                  const uint32_t row = dst + box * tiles * kWBytes + (ws_scale_rows(GMODE) * j + i) * ws_scale_row(CT);
                  dsx_wo::bulk_g2s(row, src, srow, bar, policy);
                }
              }
            }
            if constexpr (XR) {
              // x's rows for this fill's steps, one tensor copy a step (zeros past K and M; ws_xring_bytes). x may come
              // from the previous kernel: waited for before the first copy (the first weights are already on their way).
              if (f == 0) dsx_wo::pdl_wait();
              const uint32_t xdst = xring0() + static_cast<uint32_t>(slot * box * kXrStepBytes);
              for (int j = 0; j < len; ++j)
                dsx_cuda::sm90::tma_load_3d(xdst + j * kXrStepBytes, &p.xmap, bar, 0, 4 * (first + j), 0);
            }
          }
          __syncwarp();
          if (++slot == nst) slot = 0;
          sum_to(f - (nst - 1));
        }
      }
      sum_to(fpg);
    } else if (FOLD && my_groups > 0) {  // (an empty slice: sums of zero)
      publish();
    }
    if constexpr (PUSH)
      dsx_wo::cluster_wait();
    else
      while (joined < my_groups) join();
    return;
  }

  if constexpr (RED) {
    if (warp == nwarps + 1) {  // --------------------------------------------------- reducer (ws_red_warp)
      dsx_wo::cluster_wait();  // (the start's arrive: every peer's barriers are initialized)
      const int rows = rows_of(), sp = splits;
      const uint32_t bytes = static_cast<uint32_t>(sp * (tiles / sp) * rows * 16 * 4);  // (every piece, own one too)
      // Every group but the last: the last one's sum has no step loop to hide behind, and the consumers, all of
      // them idle by then, sum it faster than one warp.
      for (int o = 0; o + 1 < my_groups; ++o) {
        if (lane == 0) dsx_wo::mbar_arrive_expect_tx(recv_bar(), bytes);
        dsx_wo::mbar_wait(recv_bar(), static_cast<uint32_t>(o & 1));  // the group's pieces have landed
        push_sum(part_of(), (blockIdx.y + o * ustride) * 16 * tiles, rows, rank, tiles / sp, sp, lane, 32);
        __syncwarp();  // every read of this group's pieces is done: the peers may send the next
        if (lane < sp) dsx_cuda::sm90::mbar_arrive_rank(send_bar(), lane);
      }
      return;
    }
  }

  // ---------------------------------------------------------------------------- consumers
  const int cthreads = 32 * nwarps;
  constexpr int kRowGap = BITS == 8 ? 4 : 2;
  const int wrow = BITS == 8 ? g >> 1 : g >> 2;
  // (int4 group 64: the lane's two 8-byte halves in g64 order, dsx_wo::g64_stage: 128 bytes apart)
  const int win = BITS == 8 ? (g & 1) * 64 + 16 * c
                  : GMODE == 2 ? (g & 3) * 32 + (c & 1) * 16 + (c >> 1) * 8
                               : (g & 3) * 32 + (c >> 1) * 128 + (c & 1) * 16;
  auto read_scale = [&](const uint8_t* sl, int j, int i, int v) -> uint32_t {  // (v: the block's tile)
    // (STMA, int4 group 128 and 64 (since the forty-third session) through the x ring where ws_smap_pays: the slot's
    // rows by one tensor copy, Params::smap, packed 32 * tiles bytes apart; otherwise a bulk copy a step,
    // ws_scale_row(CT) apart, from the 16-byte boundary below the scales' address)
    const uint8_t* b =
        STMA ? sl + box * tiles * kWBytes + (ws_scale_rows(GMODE) * j + i) * 32 * tiles + 2 * (16 * v + g)
               : sl + box * tiles * kWBytes + (ws_scale_rows(GMODE) * j + i) * ws_scale_row(CT) + lead() + 2 * (16 * v + g);
    return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(b)) |
           static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(b + 16)) << 16;
  };
  // int4 group 64: a step's two scale rows (the second past K on a half step: 0, its weights and x are zeros; STMA's
  // tensor copy fills that row with zeros itself)
  auto g64_scales = [&](Stage& st, const uint8_t* sl, int j, int step, int v) {
    st.s[0] = read_scale(sl, j, 0, v);
    st.s[1] = STMA || 2 * step + 1 < ngroups() ? read_scale(sl, j, 1, v) : 0u;
  };
  // x: the block's whole K slice, staged once (ws_choose requires that it fits), pieces permuted
  // as in the existing path (gemm_weight_only.cuh).
  {
    dsx_wo::pdl_wait();  // x may come from the previous kernel (the producer does not read it)
#ifndef DSX_WO_DIAG_NOX  // (diagnostic builds: x not staged, wrong results)
    if constexpr (!XR) {  // (XR: the producer copies x into each ring slot)
      // (through registers with one or two tiles a warp; four keep cp.async: there the register path
      // was 0.7-5% slower on 36864 x 7168 M = 8 and 7168 x 18432 M = 8..16 in the same run, 1-4% faster
      // on 24576 x 1536; stage_x_steps has the figures)
      // (4 loads in flight in the pulled int4-per-channel instance with one tile a warp and two token
      // tiles: 8 spilled there at its 72 registers)
      constexpr int kXLoads = BITS == 4 && GMODE == 0 && CT == 1 && MT == 2 && !PUSH ? 4 : 8;
      if constexpr (WG) {
        dsx_wo::stage_x_wgmma<BITS, kXLoads, GMODE == 2>(xbuf, x_of(), rows_of(), p.k, s_begin, nloc, threadIdx.x,
                                                         cthreads);
        dsx_cuda::sm90::fence_async_smem();  // (generic-proxy stores, read by wgmma)
      } else {
        dsx_wo::stage_x_steps<BITS, CT <= 2, kXLoads>(xbuf, ld, x_of(), rows_of(), p.k, s_begin, nloc, threadIdx.x, cthreads);
      }
    }
#endif
    if constexpr (CT > 2) dsx_wo::cp_async_wait<0>();
    ws_consumer_sync(cthreads);
    if constexpr (kXGate) {
      if (threadIdx.x == 0 && xgate()) ws_mbar_arrive(xready_bar());
    }
  }
  int xo[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t)
    xo[t] = min(8 * t + g, rows_of() - 1) * ld + (BITS == 4 && GMODE == 2 ? 8 * (c & 1) + 4 * (c >> 1) : 8 * c);
  if constexpr (XR)  // (XR: the lane's row-g bytes in a step of the x ring: step_q_tiles_xr, int4 group 64 step_g64_tiles_xr)
    xo[0] = GMODE == 2 ? dsx_wo::xr_g64_off(g, c) : dsx_wo::xr_lane_off(g, c);
  constexpr bool kPair = MT == 1 ? !(BITS == 4 && GMODE == 2) : MT == 2 && BITS == 4 && GMODE == 0;
  const bool pair = kPair && p.pair != 0;
  int slot = 0;
  uint32_t parity = 0;
  float wpart[WG ? MT : 1][4] = {};  // (WG: a step's tensor-core partials)
  for (int o = 0; o < my_groups; ++o) {
    const int u = blockIdx.y + o * ustride;
    const int n_blk = u * 16 * tiles, n0 = n_blk + warp * 16 * CT;
    const bool active = n0 < p.n;  // warp-uniform (N % 64 == 0: all CT tiles or none)
    float acc[CT][MT][4];
#pragma unroll
    for (int q = 0; q < CT; ++q)
#pragma unroll
      for (int t = 0; t < MT; ++t) acc[q][t][0] = acc[q][t][1] = acc[q][t][2] = acc[q][t][3] = 0.f;
    // Slot by slot (a group's slots start at s_begin + a multiple of box, as the producer fills them).
    for (int first = s_begin; first < s_end; first += box) {
      dsx_wo::mbar_wait(full0 + 8 * slot, parity);
      const int slot_len = min(box, s_end - first);
      if (active || WG) {  // (WG: every warp of a warpgroup runs its wgmma; past N the weights are zeros)
        // A full slot (one copy): tile v's rows at v * box KB, rows box * kRowStep apart, steps
        // kRowStep apart; a short one (a copy a step): steps `tiles` KB apart, tile v's rows at
        // v KB inside each, kRowStep apart. (Warp w's tiles: v = CT w + q.)
        const uint8_t* sl = ring + slot * slot_sz;
        const bool fullslot = slot_len == box;
        const int rstride = fullslot ? box * kRowStep : kRowStep;
        const int jstride = fullslot ? kRowStep : tiles * kWBytes;
        const int rgap = kRowGap * rstride;
        const uint8_t* wbase = sl + (CT * warp * kRowsPerWarp + wrow) * rstride + win;
        const int tstride = kRowsPerWarp * rstride;  // from one tile's rows to the next's
        for (int j = 0; j < slot_len;) {
          const uint16_t* xs = xbuf + (first + j - s_begin) * kStepK;
          if constexpr (WG) {
            Stage st;
            const uint8_t* wp = wbase + j * jstride;
            if constexpr (GMODE == 2) {
              dsx_wo::g64_stage(st, wp, rgap);
              g64_scales(st, sl, j, first + j, warp);
            } else {
              st.w[0] = dsx_wo::lds128(wp);
              st.w[1] = dsx_wo::lds128(wp + rgap);
              st.s[0] = GMODE == 1 ? read_scale(sl, j, 0, warp) : 0u;
            }
            const uint32_t nt = static_cast<uint32_t>(rows_of() + 7) >> 3;  // (x's token groups: stage_x_wgmma)
            const uint32_t xa = dsx_wo::smem_addr(xbuf) + static_cast<uint32_t>(first + j - s_begin) * kStepK * 16 * nt;
            if constexpr (GMODE == 2)
              dsx_wo::step_g64_wgmma<MT>(acc[0], wpart, st, xa, nt);
            else
              dsx_wo::step_q_wgmma<BITS, MT, GMODE>(acc[0], wpart, st, xa, nt);
            j += 1;
          } else if constexpr (CT > 1) {
            Stage st[CT];
#pragma unroll
            for (int q = 0; q < CT; ++q) {
              const uint8_t* wp = wbase + q * tstride + j * jstride;
              if constexpr (GMODE == 2) {
                dsx_wo::g64_stage(st[q], wp, rgap);
                g64_scales(st[q], sl, j, first + j, CT * warp + q);
              } else {
                st[q].w[0] = dsx_wo::lds128(wp);
                st[q].w[1] = dsx_wo::lds128(wp + rgap);
                if (GMODE == 1) st[q].s[0] = read_scale(sl, j, 0, CT * warp + q);
              }
            }
#ifndef DSX_WO_NOMATH
            if constexpr (XR) {
              const uint32_t xoff = xring0() - dsx_wo::smem_addr(smem) + static_cast<uint32_t>((slot * box + j) * kXrStepBytes);
              if constexpr (GMODE == 2)
                dsx_wo::step_g64_tiles_xr<MT, CT>(acc, st, smem, xoff, xo[0]);
              else
                dsx_wo::step_q_tiles_xr<BITS, MT, GMODE, CT, !FOLD>(acc, st, smem, xoff, xo[0]);
            } else if constexpr (GMODE == 2) {
              dsx_wo::step_g64_tiles<MT, CT>(acc, st, xs, xo);
            } else {
              dsx_wo::step_q_tiles<BITS, MT, GMODE, CT>(acc, st, xs, xo);
            }
#else
            acc[0][0][0] += __uint_as_float((st[0].w[0].x ^ st[CT - 1].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
            j += 1;
          } else if (kPair && pair && j + 1 < slot_len) {
            Stage st[2];
#pragma unroll
            for (int n = 0; n < 2; ++n) {
              const uint8_t* wp = wbase + (j + n) * jstride;
              st[n].w[0] = dsx_wo::lds128(wp);
              st[n].w[1] = dsx_wo::lds128(wp + rgap);
              if (GMODE == 1) st[n].s[0] = read_scale(sl, j + n, 0, warp);
            }
#ifndef DSX_WO_NOMATH
            if (BITS == 8) {
              dsx_wo::step_q<8, MT, GMODE, 2>(acc[0], st, xs, xo);
            } else {
              dsx_wo::step_q<4, MT, GMODE, 2>(acc[0], st, xs, xo);
            }
#else  // diagnostic build: the weight stream alone, wrong results
            acc[0][0][0] += __uint_as_float((st[0].w[0].x ^ st[1].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
            j += 2;
          } else {
            Stage st[1];
            const uint8_t* wp = wbase + j * jstride;
            if constexpr (GMODE == 2) {
              dsx_wo::g64_stage(st[0], wp, rgap);
              g64_scales(st[0], sl, j, first + j, warp);
            } else {
              st[0].w[0] = dsx_wo::lds128(wp);
              st[0].w[1] = dsx_wo::lds128(wp + rgap);
              if (GMODE == 1) st[0].s[0] = read_scale(sl, j, 0, warp);
            }
#ifndef DSX_WO_NOMATH
            if (BITS == 8) {
              dsx_wo::step_q<8, MT, GMODE, 1>(acc[0], st, xs, xo);
            } else if constexpr (GMODE == 2) {
              dsx_wo::step_g64_tiles<MT, 1>(acc, st, xs, xo);
            } else {
              dsx_wo::step_q<4, MT, GMODE, 1>(acc[0], st, xs, xo);
            }
#else
            acc[0][0][0] += __uint_as_float((st[0].w[0].x ^ st[0].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
            j += 1;
          }
        }
      }
      // The slot is read by this warp: one arrival on its empty barrier.
      __syncwarp();
      if (lane == 0) ws_mbar_arrive(empty0 + 8 * slot);
      if (++slot == nst) slot = 0, parity ^= 1u;
    }
    if (o + 1 == my_groups) dsx_wo::pdl_launch_dependents();
    if constexpr (FOLD) {  // (the fold: - 136 x the sums of x, once the producer has them)
      if (o == 0) dsx_wo::mbar_wait(sums_bar(), 0);
      if (active) {
        const float* sums = sums_of();
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float sx = sums[8 * t + 2 * c + e];
#pragma unroll
            for (int q = 0; q < CT; ++q)
              acc[q][t][e] = fmaf(-136.f, sx, acc[q][t][e]), acc[q][t][2 + e] = fmaf(-136.f, sx, acc[q][t][2 + e]);
          }
      }
    }

    float* part = part_of();
    const int width = 16 * tiles, total = rows_of() * width;
    if constexpr (PUSH) {
      // Pushed sum. The owner's partial-tile room holds one piece a slice, in slice order: piece r
      // = [owned tiles][rows][16 channels] fp32 from block r, each row's four 4-channel quads
      // swizzled (quad ^ 2 on rows 2, 3 mod 4) so that neither the senders' 8-byte stores nor the
      // owner's 16-byte loads meet bank conflicts. The values are the accumulators (the owner applies
      // per-channel scales, below) and each element's sum runs in slice order: the bits of the pulled sum.
      // (rows, rank, split made opaque here: what is computed from them stays in this section instead of
      // being hoisted out of the group loop into registers held through the step loop; it spilled)
      int rows = rows_of(), me = rank, sp = splits, ln = lane;
      asm volatile("" : "+r"(rows), "+r"(me), "+r"(sp), "+r"(ln));
      const int g = ln >> 2, c = ln & 3;
      const int owned = tiles / sp, blk = owned * rows * 16;
      const uint32_t recv = dsx_wo::smem_addr(part);
      if (o == 0)
        dsx_wo::cluster_wait();  // (the start's arrive: every peer's barriers are initialized)
      else
        dsx_wo::mbar_wait(send_bar(), static_cast<uint32_t>((o - 1) & 1));  // peers done with group o - 1
      const bool odd = g & 1;
      const int chb = g & ~1;
#pragma unroll
      for (int q = 0; q < CT; ++q) {
        const int v = CT * warp + q, dst = v / owned;
        const uint32_t mine = recv + 4u * static_cast<uint32_t>(me * blk + (v - dst * owned) * rows * 16);
        const bool local = dst == me && !red;  // (with the reducer warp the own piece goes by st.async too)
        const uint32_t to = local ? mine : ws_mapa(mine, dst), bar = ws_mapa(recv_bar(), dst);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          // Lanes g, g ^ 1 trade values so that each holds two adjacent channels of one row:
          // even g row 2c (channels g, g + 1 and g + 8, g + 9), odd g row 2c + 1 (g - 1, g; g + 7, g + 8).
          const float a0 = acc[q][t][0], a1 = acc[q][t][1], a2 = acc[q][t][2], a3 = acc[q][t][3];
          const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 4);
          const float r2 = __shfl_xor_sync(0xffffffffu, odd ? a2 : a3, 4);
          const int tok = 8 * t + 2 * c + (odd ? 1 : 0);
          if (tok < rows) {
            const int sw = tok & 2;
            const uint32_t lo = to + 4u * (tok * 16 + 4 * ((chb >> 2) ^ sw) + (chb & 2));
            const uint32_t hi = to + 4u * (tok * 16 + 4 * (((chb + 8) >> 2) ^ sw) + (chb & 2));
            if (local) {
              dsx_cuda::sm90::st_shared_u32x2(lo, __float_as_uint(odd ? r0 : a0), __float_as_uint(odd ? a1 : r0));
              dsx_cuda::sm90::st_shared_u32x2(hi, __float_as_uint(odd ? r2 : a2), __float_as_uint(odd ? a3 : r2));
            } else {
              ws_st_async2(lo, odd ? r0 : a0, odd ? a1 : r0, bar);
              ws_st_async2(hi, odd ? r2 : a2, odd ? a3 : r2, bar);
            }
          }
        }
      }
      if (red) {
        if (o + 1 < my_groups) continue;  // (the reducer warp sums every group but the last)
      } else {
        ws_consumer_sync(cthreads);  // this block's own piece is written
      }
      if (threadIdx.x == 0)
        dsx_wo::mbar_arrive_expect_tx(recv_bar(), static_cast<uint32_t>((red ? sp : sp - 1) * blk * 4));
      dsx_wo::mbar_wait(recv_bar(), static_cast<uint32_t>(o & 1));  // the peers' pieces have landed
      push_sum(part, n_blk, rows, me, owned, sp, threadIdx.x, cthreads);
      if (o + 1 < my_groups) {
        ws_consumer_sync(cthreads);  // every read of this group's pieces is done:
        if (static_cast<int>(threadIdx.x) < sp) dsx_cuda::sm90::mbar_arrive_rank(send_bar(), threadIdx.x);  // peers may send again
      }
      continue;
    }
    if (active) {
#pragma unroll
      for (int q = 0; q < CT; ++q)
        dsx_wo::put_partial<MT, GMODE == 0>(part, width, (CT * warp + q) * 16, acc[q], p.scale, n0 + 16 * q, rows_of(), g, c);
    }
    if (splits == 1) {
      ws_consumer_sync(cthreads);
      for (int e = threadIdx.x; e < total; e += cthreads) {
        const int tok = e / width, n = n_blk + (e - tok * width);
        if (n < p.n) out_of()[static_cast<int64_t>(tok) * p.n + n] = dsx_wo::f32_to_bf16_rne(part[e]);
      }
      ws_consumer_sync(cthreads);
      continue;
    }
#ifdef DSX_WO_DIAG_NORED  // diagnostic builds: 1 = no cross-slice sum (barriers kept), 2 = no barriers either
    if (DSX_WO_DIAG_NORED >= 2) continue;
    ws_cluster_sync_release();
    dsx_wo::cluster_arrive_relaxed();
    dsx_wo::cluster_wait();
    continue;
#endif
    ws_cluster_sync_release();  // every slice's partial tile is written (the producer joins too)
    cg::cluster_group cluster = cg::this_cluster();
    // Four elements a thread at a time (16-byte remote loads; width % 16 == 0 and N % 64 == 0:
    // a quad is one token's, all inside N or all past it); each element's sum as before (same
    // bits). Measured (wo16, H200, bench --ab --alt-lib HEAD.so, 8 rounds interleaved, one call,
    // us, this / one element at a time): 36864 x 7168 M = 16 / 12 / 9 / 8 63.49 / 63.94, 62.66 /
    // 63.22, 53.82 / 55.28, 49.46 / 49.60; 7168 x 18432 33.80 / 33.94, 32.70 / 32.87, 31.60 /
    // 32.03, 28.99 / 29.08 (0.3-2.6% faster; the profile put the sum at 13% of the consumers' time).
    const float4* src[kMaxSplits];
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r)
      src[r] = r < splits ? reinterpret_cast<const float4*>(cluster.map_shared_rank(part, r)) : nullptr;
    const int quads = total / 4;
    const int e0 = static_cast<int>(static_cast<int64_t>(quads) * rank / splits);
    const int e1 = static_cast<int>(static_cast<int64_t>(quads) * (rank + 1) / splits);
    for (int e = e0 + threadIdx.x; e < e1; e += cthreads) {
      const int tok = 4 * e / width, n = n_blk + (4 * e - tok * width);
      if (n >= p.n) continue;
      float4 v = src[0][e];
#pragma unroll
      for (int r = 1; r < kMaxSplits; ++r)
        if (r < splits) {  // slice order: deterministic
          const float4 w = src[r][e];
          v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
        }
      uint16_t* o = out_of() + static_cast<int64_t>(tok) * p.n + n;
      o[0] = dsx_wo::f32_to_bf16_rne(v.x), o[1] = dsx_wo::f32_to_bf16_rne(v.y);
      o[2] = dsx_wo::f32_to_bf16_rne(v.z), o[3] = dsx_wo::f32_to_bf16_rne(v.w);
    }
    dsx_wo::cluster_arrive_relaxed();
    dsx_wo::cluster_wait();
  }
  if (PUSH && my_groups == 0) dsx_wo::cluster_wait();  // (the start's arrive, never waited on above)
}

}  // namespace
