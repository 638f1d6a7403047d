// Weight-only GEMM, the kernels of the existing path (not warp-specialized): wo_gemm_kernel (one weight
// ring a warp; algo bits 24..26) and wo_gemm_bal_kernel (the balanced grid, algo bit 27). Included by
// gemm_weight_only.cu after Params and the layout constants, which it uses; gemm_weight_only.cu's header
// describes the design, its host side chooses and launches these.
#pragma once

namespace {


// EARLY (one ring slot a warp, M <= 8 only): the slot is refilled as soon as its last steps are
// in registers, before their arithmetic, so box steps a warp are always in flight (the default,
// two or more slots, refills a slot only after its arithmetic).
template <int BITS, int MT, int GMODE, bool EARLY = false>
__global__ void __launch_bounds__(kMaxWarps * 32, MT == 1 ? 4 : MT == 2 ? 3 : 1)
    wo_gemm_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kStepK = BITS == 8 ? 64 : 128;
  constexpr int kRowStep = BITS == 8 ? 128 : 256;  // bytes of one step in one channel-group row
  constexpr int kElemStep = kRowStep / 8;          // the same in tensor-map elements
  const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);  // provably warp-uniform
  const int g = lane >> 2, c = lane & 3;
  const int splits = gridDim.x, rank = blockIdx.x;
  const int kt = p.k / 64;
  const int nsteps_all = BITS == 8 ? kt : (kt + 1) / 2;
  const int s_begin = static_cast<int>(static_cast<int64_t>(nsteps_all) * rank / splits);
  const int s_end = static_cast<int>(static_cast<int64_t>(nsteps_all) * (rank + 1) / splits);
  const int nst = p.stages, box = p.box;
  const int slot_sz = slot_bytes(GMODE, box);
  const int ld = p.chunk * kStepK + kXPadElems;
  const int mlast = p.m - 1;
  // x staged whole (once for all tile groups of the block) or in chunks (per tile group).
  const bool whole = p.chunk >= (nsteps_all + splits - 1) / splits;

  // Shared memory: [barriers][weight rings, warp by warp][x buffers][partial tile] (the
  // partial tile overlays the x buffers when x comes in chunks: those are refilled anyway).
  const int bar_bytes = barrier_bytes(nwarps, nst);
  const uint32_t bar0 = dsx_wo::smem_addr(smem) + warp * nst * 8;
  const uint8_t* ring = smem + bar_bytes + warp * nst * slot_sz;
  const uint32_t ring_s = dsx_wo::smem_addr(ring);
  uint16_t* xbuf = reinterpret_cast<uint16_t*>(smem + bar_bytes + nwarps * nst * slot_sz);
  // (the partial tile: part_of(), computed where it is used, holds no register in the loop)
  auto part_of = [&]() {
    return reinterpret_cast<float*>(smem + barrier_bytes(nwarps, p.stages) +
                                    nwarps * p.stages * slot_bytes(GMODE, p.box) +
                                    (whole ? 2 * p.m * (p.chunk * kStepK + kXPadElems) : 0));
  };

  // This lane's 16 bytes of rows g and g+8 in a step (the same bytes, lane for lane, as
  // Paddle's layout gives: see the .cuh): row g lies in channel-group row wrow (row g+8 in
  // wrow + kRowGap), at byte win of the step.
  constexpr int kRowGap = BITS == 8 ? 4 : 2;
  const int wrow = BITS == 8 ? g >> 1 : g >> 2;
  const int win = BITS == 8 ? (g & 1) * 64 + 16 * c : (g & 3) * 32 + (c >> 1) * 128 + (c & 1) * 16;

  // (Recomputed from the parameters where used: no register held for them.)
  auto ngroups = [&]() { return GMODE == 2 ? kt : p.group > 0 ? (p.k + p.group - 1) / p.group : 1; };  // (g64: K / 64)
  // Scale rows are copied from the 16-byte boundary below them (scale is only 2-byte aligned).
  auto lead = [&]() { return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p.scale) & 15); };
  auto srow_bytes = [&]() { return (lead() + 32 + 15) & ~15u; };

  // The block works on tile groups (of nwarps * 16 channels) blockIdx.y, + gridDim.y, ...;
  // its warps' rings run on from one group into the next, so the weights of the next group
  // are on their way while this one is reduced and stored.
  const int ustride = gridDim.y;
  constexpr bool kPersist = !(BITS == 4 && GMODE == 2 && MT == 2);  // (registers: one group a block there)
  auto warp_n0 = [&](int u) { return (u * nwarps + warp) * 16; };
  auto warp_has = [&](int u) { return u < p.groups && warp_n0(u) < p.n; };  // warp-uniform

  // Fill ring slot `slot` with the steps [first, first + box) of the slice (fewer at its
  // end) of tile group u (lane 0 of the warp; every operand is warp-uniform).
  auto issue = [&](int u, int first, int slot) {
    const int n0 = warp_n0(u);
    const int row0 = BITS == 8 ? n0 / 2 : n0 / 4;  // first channel-group row of this warp
    const int len = min(box, s_end - first);
    uint32_t bytes = len * kWBytes;
    if (GMODE == 1) bytes += len * srow_bytes();
    if (GMODE == 2)
      for (int j = 0; j < len; ++j) bytes += srow_bytes() * (2 * (first + j) + 1 < ngroups() ? 2u : 1u);
    const uint32_t bar = bar0 + slot * 8, dst = ring_s + slot * slot_sz;
    const uint64_t policy = dsx_wo::l2_evict_first();  // (made here: no register held across steps)
    dsx_wo::mbar_arrive_expect_tx(bar, bytes);
    if (len == box) {
      dsx_wo::tma_load_2d(dst, &p.wmap, first * kElemStep, row0, bar, policy);
    } else {
      for (int j = 0; j < len; ++j)
        dsx_wo::tma_load_2d(dst + j * kWBytes, &p.wmap1, (first + j) * kElemStep, row0, bar, policy);
    }
    if (GMODE != 0) {
      for (int j = 0; j < len; ++j) {
        const int step = first + j;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int grp = GMODE == 1 ? (i == 0 ? step * kStepK / p.group : -1)
                                     : (i == 0 ? 2 * step : (2 * step + 1 < ngroups() ? 2 * step + 1 : -1));
          if (grp < 0) break;
          const uint8_t* src =
              reinterpret_cast<const uint8_t*>(p.scale + static_cast<int64_t>(grp) * p.n + n0) - lead();
          dsx_wo::bulk_g2s(dst + box * kWBytes + (2 * j + i) * kScaleSlot, src, srow_bytes(), bar, policy);
        }
      }
    }
  };
  auto read_scale = [&](const uint8_t* slot, int j, int i) -> uint32_t {
    const uint8_t* b = slot + box * kWBytes + (2 * j + i) * kScaleSlot + lead() + 2 * g;
    return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(b)) |
           static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(b + 16)) << 16;
  };
  // Stage x steps [cs, ce) of chunk ci into buf, pieces permuted (see the .cuh).
  auto stage_x = [&](int ci, uint16_t* buf) {
    const int cs = s_begin + ci * p.chunk, ce = min(cs + p.chunk, s_end);
    dsx_wo::stage_x_steps<BITS>(buf, ld, p.x, p.m, p.k, cs, ce - cs, threadIdx.x, blockDim.x);
  };

  if (lane == 0) {
    dsx_wo::prefetch_tmap(&p.wmap);
    for (int i = 0; i < nst; ++i) dsx_wo::mbar_init(bar0 + 8 * i, 1);
  }
  dsx_wo::fence_barrier_init();
  __syncwarp();
  const int nloc = s_end - s_begin;
  // The next slot to fill: tile group iss_u, steps from iss_s (all lanes keep this; lane 0 issues).
  // iss_u < 0: nothing more to fill.
  int iss_u = nloc > 0 && warp_has(blockIdx.y) ? static_cast<int>(blockIdx.y) : -1, iss_s = s_begin;
  auto advance = [&]() {
    iss_s += box;
    if (iss_s >= s_end) iss_u = kPersist && warp_has(iss_u + ustride) ? iss_u + ustride : -1, iss_s = s_begin;
  };
  for (int i = 0; i < nst && iss_u >= 0; ++i) {
    if (lane == 0) issue(iss_u, iss_s, i);
    advance();
  }

  int xo[MT];  // this lane's x offsets per token tile (rows past M repeat the last row)
#pragma unroll
  for (int t = 0; t < MT; ++t)
    xo[t] = min(8 * t + g, mlast) * ld + (BITS == 4 && GMODE == 2 ? 8 * (c & 1) + 4 * (c >> 1) : 8 * c);

  const int nchunks = (nloc + p.chunk - 1) / p.chunk;
  const int buf_elems = p.m * ld;
  // Two steps at a time where the slot and the x chunk hold them (MT <= 2: registers).
  constexpr bool kPair = MT == 1 ? !(BITS == 4 && GMODE == 2) : MT == 2 && BITS == 4 && GMODE == 0;
  const bool pair = kPair && p.pair != 0;
  int slot = 0, j = 0, slot_len = 0;  // ring slot, step inside it, its steps
  int jstride = 0, rgap = 0;          // bytes between a slot's steps; between rows g and g+8
  const uint8_t* wbase = ring;        // this lane's bytes of the slot's first step
  uint32_t parity = 0;
  dsx_wo::pdl_wait();  // x may come from the previous kernel (the weights were not waited for)
  if (whole && nchunks > 0) {
    stage_x(0, xbuf);
    dsx_wo::cp_async_wait<0>();
    __syncthreads();
  }
  for (int u = blockIdx.y; u < p.groups; u += ustride) {
    const int n_blk = u * 16 * nwarps, n0 = n_blk + warp * 16;
    const bool active = n0 < p.n;  // warp-uniform (N % 64 == 0: all 16 channels or none)
    float acc[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    for (int ci = 0; ci < nchunks; ++ci) {
      const uint16_t* buf = xbuf + (ci & 1) * buf_elems;
      if (!whole) {
        if (ci == 0) stage_x(0, xbuf);
        if (ci + 1 < nchunks) {
          stage_x(ci + 1, xbuf + ((ci + 1) & 1) * buf_elems);
          dsx_wo::cp_async_wait<1>();
        } else {
          dsx_wo::cp_async_wait<0>();
        }
        __syncthreads();
      }
      const int cs = s_begin + ci * p.chunk, ce = min(cs + p.chunk, s_end);
      if (active) {
        for (int step = cs; step < ce;) {
          if (j == 0) {
            dsx_wo::mbar_wait(bar0 + slot * 8, parity);
            slot_len = min(box, s_end - step);
            // A full slot: rows box * kRowStep apart, steps kRowStep apart; a short one (one
            // copy a step): rows kRowStep apart, steps 1 KB apart.
            const bool full = slot_len == box;
            const int rstride = full ? box * kRowStep : kRowStep;
            jstride = full ? kRowStep : kWBytes;
            rgap = kRowGap * rstride;
            wbase = ring + slot * slot_sz + wrow * rstride + win;
          }
          const uint8_t* sl = ring + slot * slot_sz;
          const uint16_t* xs = buf + (step - cs) * kStepK;
          // EARLY: once the slot's last steps are in registers the copy engine may refill it
          // while their arithmetic runs. The refill is issued after a shared store of a value
          // folded from every loaded word (into a scratch word of the warp behind its one
          // barrier), so only once the loads have landed (a warp issues in order).
          auto release = [&](uint32_t dep) {
            *reinterpret_cast<volatile uint32_t*>(smem + 8 * nwarps + 4 * warp) = dep;
            __syncwarp();
            if (iss_u >= 0) {
              if (lane == 0) issue(iss_u, iss_s, slot);
              advance();
            }
          };
          auto fold = [](const Stage& t) {
            return t.w[0].x ^ t.w[0].y ^ t.w[0].z ^ t.w[0].w ^ t.w[1].x ^ t.w[1].y ^ t.w[1].z ^ t.w[1].w;
          };
          if (kPair && pair && j + 1 < slot_len && step + 1 < ce) {
            Stage st[2];
#pragma unroll
            for (int n = 0; n < 2; ++n) {
              const uint8_t* wp = wbase + (j + n) * jstride;
              st[n].w[0] = dsx_wo::lds128(wp);
              st[n].w[1] = dsx_wo::lds128(wp + rgap);
              if (GMODE == 1) st[n].s[0] = read_scale(sl, j + n, 0);
            }
            if (EARLY && j + 2 == slot_len)
              release(fold(st[0]) ^ fold(st[1]) ^ (GMODE == 1 ? st[0].s[0] ^ st[1].s[0] : 0u));
#ifndef DSX_WO_NOMATH
            if (BITS == 8) {
              dsx_wo::step_q<8, MT, GMODE, 2>(acc, st, xs, xo);
            } else {
              dsx_wo::step_q<4, MT, GMODE, 2>(acc, st, xs, xo);
            }
#else  // diagnostic build (bench --diag-lib): the weight stream alone, wrong results
            acc[0][0] += __uint_as_float((st[0].w[0].x ^ st[1].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
            j += 2, step += 2;
          } else {
            Stage st[1];
            const uint8_t* wp = wbase + j * jstride;
            st[0].w[0] = dsx_wo::lds128(wp);
            st[0].w[1] = dsx_wo::lds128(wp + rgap);
            if (GMODE == 1) st[0].s[0] = read_scale(sl, j, 0);
            if (GMODE == 2) {
              st[0].s[0] = read_scale(sl, j, 0);
              st[0].s[1] = 2 * step + 1 < ngroups() ? read_scale(sl, j, 1) : 0u;
            }
            if (EARLY && j + 1 == slot_len)
              release(fold(st[0]) ^ (GMODE != 0 ? st[0].s[0] : 0u) ^ (GMODE == 2 ? st[0].s[1] : 0u));
#ifndef DSX_WO_NOMATH
            if (BITS == 8) {
              dsx_wo::step_q<8, MT, GMODE, 1>(acc, st, xs, xo);
            } else if (GMODE == 2) {
              dsx_wo::g64_words(st[0], c);  // (Paddle's 16 bytes a lane into g64 order)
              dsx_wo::step_g64_tiles<MT, 1>(reinterpret_cast<float(&)[1][MT][4]>(acc), st, xs, xo);
            } else {
              dsx_wo::step_q<4, MT, GMODE, 1>(acc, st, xs, xo);
            }
#else
            acc[0][0] += __uint_as_float((st[0].w[0].x ^ st[0].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
            j += 1, step += 1;
          }
          if (j == slot_len) {  // the slot is read: the copy engine may refill it (EARLY: it already was)
            if (!EARLY) {
              __syncwarp();
              if (iss_u >= 0) {
                if (lane == 0) issue(iss_u, iss_s, slot);
                advance();
              }
            }
            j = 0;
            if (++slot == nst) slot = 0, parity ^= 1u;
          }
        }
      }
      if (!whole) __syncthreads();  // all warps are done with buf before it is refilled
    }
    // The next kernel may start launching once every block is here (only a launch with the
    // PDL attribute is affected): its blocks then take the places of ours as they end, and
    // fetch their first weights during our reduction and stores. (Earlier, they would crowd
    // the SMs that have room first, and stay there unevenly.)
    if (u + ustride >= p.groups) dsx_wo::pdl_launch_dependents();

    // Partial tile [m][16 * nwarps] fp32 in shared memory.
    float* part = part_of();
    const int width = 16 * nwarps, total = p.m * width;
    if (active) dsx_wo::put_partial<MT, GMODE == 0>(part, width, warp * 16, acc, p.scale, n0, p.m, g, c);
    if (splits == 1) {
      __syncthreads();
      for (int e = threadIdx.x; e < total; e += blockDim.x) {
        const int tok = e / width, n = n_blk + (e - tok * width);
        if (n < p.n) p.out[static_cast<int64_t>(tok) * p.n + n] = dsx_wo::f32_to_bf16_rne(part[e]);
      }
      __syncthreads();  // part (and the x buffers it may overlay) is free again
      if (!kPersist) break;
      continue;
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every slice's partial tile is written
    const float* src[kMaxSplits];
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r) src[r] = r < splits ? cluster.map_shared_rank(part, r) : nullptr;
    const int e0 = static_cast<int>(static_cast<int64_t>(total) * rank / splits);
    const int e1 = static_cast<int>(static_cast<int64_t>(total) * (rank + 1) / splits);
    for (int e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
      const int tok = e / width, n = n_blk + (e - tok * width);
      if (n >= p.n) continue;
      float v = src[0][e];
#pragma unroll
      for (int r = 1; r < kMaxSplits; ++r)
        if (r < splits) v += src[r][e];  // slice order: deterministic
      p.out[static_cast<int64_t>(tok) * p.n + n] = dsx_wo::f32_to_bf16_rne(v);
    }
    // No block moves on (or leaves) while its partial tile may still be read. This barrier orders
    // no memory (the reads it protects are done: their values are stored), so its arrive is
    // relaxed: cluster.sync() would also fence every global store of the group first.
    dsx_wo::cluster_arrive_relaxed();
    dsx_wo::cluster_wait();
    if (!kPersist) break;
  }
}

// Balanced persistent grid (algo bit 27; int4 per channel, M <= 8): the persistent kernel
// above deals whole tile groups to the resident clusters in rounds, so where the groups are not
// a multiple of the clusters the last round leaves most SMs idle (36864 x 7168 at 4 splits: 288
// groups over 124 clusters, 40 of them run a third group). Here cluster c of the G launched
// instead owns the contiguous run of 16-channel tiles [tiles * c / G, tiles * (c + 1) / G)
// (T tiles; every cluster gets the same count within one), and each of its blocks (one K slice
// of L steps, as above) deals its T * L (tile, step) units to its warps in equal contiguous runs
// (tile-major, steps increasing; W = min(warps, T L) warps): warp w takes units
// [T L w / W, T L (w + 1) / W). A run is worked tile segment by tile segment, each an fp32
// accumulator from 0 over its steps in increasing k exactly as above. A tile that run
// boundaries cut is finished by the warp holding its first piece (the end of its run): it adds
// the later pieces (each the start of a later warp's run, left in shared memory) in k order,
// ((first + second) + third) ..., before the scale; every other tile's slice partial has
// exactly the bits of the kernel above. The partial tiles of all T
// tiles stay in shared memory and the cluster sums them once, at the end, in slice order through
// distributed shared memory (no workspace, no atomics; the cut points depend only on M, N, K,
// the algo word and the GPU's resident cluster count).
template <int BITS, int MT, int GMODE, bool EARLY>
__global__ void __launch_bounds__(kMaxWarps * 32, 4)
    wo_gemm_bal_kernel(const __grid_constant__ Params p) {
  static_assert(GMODE == 0, "balanced grid: per-channel scales only");
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kStepK = BITS == 8 ? 64 : 128;
  constexpr int kRowStep = BITS == 8 ? 128 : 256;
  constexpr int kElemStep = kRowStep / 8;
  const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  const int g = lane >> 2, c = lane & 3;
  const int splits = gridDim.x, rank = blockIdx.x;
  const int kt = p.k / 64;
  const int nsteps_all = BITS == 8 ? kt : (kt + 1) / 2;
  const int s_begin = static_cast<int>(static_cast<int64_t>(nsteps_all) * rank / splits);
  const int s_end = static_cast<int>(static_cast<int64_t>(nsteps_all) * (rank + 1) / splits);
  const int L = s_end - s_begin;
  const int nst = p.stages, box = p.box;
  const int slot_sz = slot_bytes(GMODE, box);
  const int ld = p.chunk * kStepK + kXPadElems;  // (x staged whole: chunk >= L)
  // This cluster's tiles [t0, t0 + T) and this warp's units [ua, ub).
  const int t0 = static_cast<int>(static_cast<int64_t>(p.groups) * blockIdx.y / gridDim.y);
  const int T = static_cast<int>(static_cast<int64_t>(p.groups) * (blockIdx.y + 1) / gridDim.y) - t0;
  const int units = T * L;
  const int wa = min(nwarps, units);  // warps with a (non-empty) run
  auto run_end = [&](int w) { return units * (w + 1) / wa; };
  const int ua = warp < wa ? units * warp / wa : 0, ub = warp < wa ? run_end(warp) : 0;

  // Shared memory: [barriers][weight rings][x, whole][upper pieces: warps x MT x 4 x 32 floats]
  // [partial tiles: m x 16 T floats].
  const int bar_bytes = barrier_bytes(nwarps, nst);
  const uint32_t bar0 = dsx_wo::smem_addr(smem) + warp * nst * 8;
  const uint8_t* ring = smem + bar_bytes + warp * nst * slot_sz;
  const uint32_t ring_s = dsx_wo::smem_addr(ring);
  uint16_t* xbuf = reinterpret_cast<uint16_t*>(smem + bar_bytes + nwarps * nst * slot_sz);
  auto carry_of = [&](int w) {
    return reinterpret_cast<float*>(smem + barrier_bytes(nwarps, p.stages) +
                                    nwarps * p.stages * slot_bytes(GMODE, p.box) + 2 * p.m * ld) +
           w * (MT * 4 * 32);
  };
  auto part_of = [&]() { return carry_of(nwarps); };

  constexpr int kRowGap = BITS == 8 ? 4 : 2;
  const int wrow = BITS == 8 ? g >> 1 : g >> 2;
  const int win = BITS == 8 ? (g & 1) * 64 + 16 * c : (g & 3) * 32 + (c >> 1) * 128 + (c & 1) * 16;

  // The end of the tile segment that unit v lies in (the run's end or its tile's last step).
  auto seg_end = [&](int v) { return min(ub, (v / L + 1) * L); };
  // Fill ring slot `slot` with the units [v, v + box) (fewer at a segment's end; lane 0).
  auto issue = [&](int v, int slot) {
    const int t = v / L, first = s_begin + (v - t * L);
    const int n0 = (t0 + t) * 16;
    const int row0 = BITS == 8 ? n0 / 2 : n0 / 4;
    const int len = min(box, seg_end(v) - v);
    const uint32_t bar = bar0 + slot * 8, dst = ring_s + slot * slot_sz;
    const uint64_t policy = dsx_wo::l2_evict_first();
    dsx_wo::mbar_arrive_expect_tx(bar, len * kWBytes);
    if (len == box) {
      dsx_wo::tma_load_2d(dst, &p.wmap, first * kElemStep, row0, bar, policy);
    } else {
      for (int j = 0; j < len; ++j)
        dsx_wo::tma_load_2d(dst + j * kWBytes, &p.wmap1, (first + j) * kElemStep, row0, bar, policy);
    }
  };
  auto stage_x = [&]() { dsx_wo::stage_x_steps<BITS>(xbuf, ld, p.x, p.m, p.k, s_begin, L, threadIdx.x, blockDim.x); };

  if (lane == 0) {
    dsx_wo::prefetch_tmap(&p.wmap);
    for (int i = 0; i < nst; ++i) dsx_wo::mbar_init(bar0 + 8 * i, 1);
  }
  dsx_wo::fence_barrier_init();
  __syncwarp();
  int iss = ua;  // the next unit to fill a slot from (all lanes keep it; lane 0 issues)
  auto advance = [&]() { iss += min(box, seg_end(iss) - iss); };
  for (int i = 0; i < nst && iss < ub; ++i) {
    if (lane == 0) issue(iss, i);
    advance();
  }

  int xo[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) xo[t] = min(8 * t + g, p.m - 1) * ld + 8 * c;

  constexpr bool kPair = MT <= 2;
  const bool pair = kPair && p.pair != 0;
  int slot = 0, j = 0, slot_len = 0, jstride = 0, rgap = 0;
  const uint8_t* wbase = ring;
  uint32_t parity = 0;
  dsx_wo::pdl_wait();
  if (L > 0) {
    stage_x();
    dsx_wo::cp_async_wait<0>();
  }
  __syncthreads();

  const int width = 16 * T;
  float acc[MT][4];
  bool lower = false;  // acc holds the lower piece of a cut tile (the run's last segment)
  int lower_t = 0;
  // A finished tile segment's partial, scaled, into the partial tiles.
  auto put = [&](int t, const float (&v)[MT][4]) {
    dsx_wo::put_partial<MT, true>(part_of(), width, t * 16, v, p.scale, (t0 + t) * 16, p.m, g, c);
  };
  for (int v = ua; v < ub;) {
    const int t = v / L, ve = seg_end(v);
    const bool from_start = v == t * L, to_end = ve == (t + 1) * L;
#pragma unroll
    for (int tt = 0; tt < MT; ++tt) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.f;
    while (v < ve) {
      if (j == 0) {
        dsx_wo::mbar_wait(bar0 + slot * 8, parity);
        slot_len = min(box, ve - v);
        const bool full = slot_len == box;
        const int rstride = full ? box * kRowStep : kRowStep;
        jstride = full ? kRowStep : kWBytes;
        rgap = kRowGap * rstride;
        wbase = ring + slot * slot_sz + wrow * rstride + win;
      }
      const uint16_t* xs = xbuf + (v - t * L) * kStepK;
      auto release = [&](uint32_t dep) {
        *reinterpret_cast<volatile uint32_t*>(smem + 8 * nwarps + 4 * warp) = dep;
        __syncwarp();
        if (iss < ub) {
          if (lane == 0) issue(iss, slot);
          advance();
        }
      };
      auto fold = [](const Stage& s) {
        return s.w[0].x ^ s.w[0].y ^ s.w[0].z ^ s.w[0].w ^ s.w[1].x ^ s.w[1].y ^ s.w[1].z ^ s.w[1].w;
      };
      if (kPair && pair && j + 1 < slot_len) {
        Stage st[2];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const uint8_t* wp = wbase + (j + n) * jstride;
          st[n].w[0] = dsx_wo::lds128(wp);
          st[n].w[1] = dsx_wo::lds128(wp + rgap);
        }
        if (EARLY && j + 2 == slot_len) release(fold(st[0]) ^ fold(st[1]));
#ifndef DSX_WO_NOMATH
        dsx_wo::step_q<BITS, MT, GMODE, 2>(acc, st, xs, xo);
#else
        acc[0][0] += __uint_as_float((st[0].w[0].x ^ st[1].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
        j += 2, v += 2;
      } else {
        Stage st[1];
        const uint8_t* wp = wbase + j * jstride;
        st[0].w[0] = dsx_wo::lds128(wp);
        st[0].w[1] = dsx_wo::lds128(wp + rgap);
        if (EARLY && j + 1 == slot_len) release(fold(st[0]));
#ifndef DSX_WO_NOMATH
        dsx_wo::step_q<BITS, MT, GMODE, 1>(acc, st, xs, xo);
#else
        acc[0][0] += __uint_as_float((st[0].w[0].x ^ st[0].w[1].y) & 1u) + __uint_as_float(xs[0] & 1u);
#endif
        j += 1, v += 1;
      }
      if (j == slot_len) {
        if (!EARLY) {
          __syncwarp();
          if (iss < ub) {
            if (lane == 0) issue(iss, slot);
            advance();
          }
        }
        j = 0;
        if (++slot == nst) slot = 0, parity ^= 1u;
      }
    }
    if (from_start && to_end) {
      put(t, acc);
    } else if (!from_start) {  // a later piece of a cut tile (the run's first segment): for the lower warp
      float* cw = carry_of(warp);
#pragma unroll
      for (int tt = 0; tt < MT; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) cw[(tt * 4 + i) * 32 + lane] = acc[tt][i];
    } else {
      lower = true, lower_t = t;  // (the run's last segment: acc stays in registers)
    }
  }
  dsx_wo::pdl_launch_dependents();
  __syncthreads();  // the later pieces are in shared memory
  if (lower) {  // add the later pieces of the tile in k order: warps warp + 1, ... up to the one that ends it
    for (int w = warp + 1;; ++w) {
      const float* cw = carry_of(w);
#pragma unroll
      for (int tt = 0; tt < MT; ++tt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[tt][i] = acc[tt][i] + cw[(tt * 4 + i) * 32 + lane];
      if (run_end(w) >= (lower_t + 1) * L) break;
    }
    put(lower_t, acc);
  }
  const int total = p.m * width;
  if (L == 0) {  // an empty slice (fewer steps than splits): its partial is zero
    float* part = part_of();
    for (int e = threadIdx.x; e < total; e += blockDim.x) part[e] = 0.f;
  }
  const int nb = t0 * 16;
  if (splits == 1) {
    __syncthreads();
    const float* part = part_of();
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
      const int tok = e / width;
      p.out[static_cast<int64_t>(tok) * p.n + nb + (e - tok * width)] = dsx_wo::f32_to_bf16_rne(part[e]);
    }
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const float* src[kMaxSplits];
  float* part = part_of();
#pragma unroll
  for (int r = 0; r < kMaxSplits; ++r) src[r] = r < splits ? cluster.map_shared_rank(part, r) : nullptr;
  const int e0 = static_cast<int>(static_cast<int64_t>(total) * rank / splits);
  const int e1 = static_cast<int>(static_cast<int64_t>(total) * (rank + 1) / splits);
  for (int e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int tok = e / width;
    float s = src[0][e];
#pragma unroll
    for (int r = 1; r < kMaxSplits; ++r)
      if (r < splits) s += src[r][e];  // slice order
    p.out[static_cast<int64_t>(tok) * p.n + nb + (e - tok * width)] = dsx_wo::f32_to_bf16_rne(s);
  }
  dsx_wo::cluster_arrive_relaxed();  // no block leaves while its partial tiles may still be read
  dsx_wo::cluster_wait();
}

}  // namespace
