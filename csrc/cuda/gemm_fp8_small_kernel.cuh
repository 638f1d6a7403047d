// Block FP8 GEMM for M <= 128, the kernel (algo 6, "small"; gemm_fp8_small.cu has the design, the measured
// knobs and the host side): Layout (the shared-memory plan of a configuration) and gemm_fp8_small_kernel.
// Included by gemm_fp8_small.cu after Config, Params and `using namespace sm90`, inside the same namespaces.
#pragma once

namespace dsx_cuda {
namespace {


// (sm90::cluster_sync without .aligned: here every warp reaches it converged)
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t local_addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_addr), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}

__device__ __forceinline__ void st_cluster_f4(uint32_t local_addr, uint32_t rank, float4 v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_addr), "r"(rank));
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_f4(uint32_t addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ float4 ld_shared_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void wgmma_n16(float* d, uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n32(float* d, uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n64(float* d, uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

template <int MN>
__device__ __forceinline__ void wgmma_tile(float* d, uint64_t da, uint64_t db, int accumulate) {
  if constexpr (MN == 16) wgmma_n16(d, da, db, accumulate);
  if constexpr (MN == 32) wgmma_n32(d, da, db, accumulate);
  if constexpr (MN == 64) wgmma_n64(d, da, db, accumulate);
  if constexpr (MN == 128) wgmma_m64n128k32(d, da, db, accumulate);
}

// Shared memory (from a 1024-byte aligned base): weight tiles [stages][BM rows][128 B], token
// tiles [stages][MN rows][128 B] (both 128B-swizzled by TMA), scale slots [stages][MN + 4] fp32
// (token scales, then the weight block scale), barriers full[stages], empty[stages].
// After the main loop the front is reused for the fp32 partial tile [MN][kRedLd].
template <int MN, int BM, int KS = 1>
struct Layout {
  static constexpr int kRedLd = BM + 4;  // fp32 row pitch of the reduction tile (bank-conflict free)
  static constexpr int kW = BM * kBK;
  static constexpr int kX = MN * kBK;
  static constexpr int kStage = kW + kX;
  static constexpr int kScale = MN * 4 + 16;
  static constexpr int kRed = MN * kRedLd * 4;
  static constexpr int bytes(int stages) { return 1024 + stages * (kStage + kScale + 2 * 8); }
  static constexpr int max_stages(int cap = Config<MN, BM, KS>::kSmemCap) {
    int s = kMaxStages;
    while (s > 2 && bytes(s) > cap) --s;
    return KS == 2 ? s & ~1 : s;  // KS = 2: an even count, half of the ring a warpgroup
  }
  static_assert(kX % 1024 == 0 && kW % 1024 == 0, "tiles stay 1024-byte aligned");
};

// Loads the TMA thread issues before the CTA barrier (the kernel's early loads), by the bytes of a stage. H200, the
// timeline probe (thirty-eighth session, 2 rounds, us a launch, none / 1 / 2 / 4 early): 16x7168x2048 (10 KB stages)
// 6.75 / 6.58 / 6.62 / 6.35, 64x7168x2048 (16 KB) 7.48 / 7.35 / 7.34 / 7.28, 16x2048x7168 (18 KB) 7.66 / 7.41 / 7.35 /
// 7.31, 128x7168x2048 (24 KB) 9.18 / 9.13 / 9.20 / 9.65, 128x4608x7168 (32 KB) 18.27 / 18.37 / 18.86 / 19.7. The
// library with them, against main's build (bench/gemm_fp8_ab_libs.py, 3 rounds, bits equal, auto): 64x4096x7168
// 13.03-13.13 -> 12.31-12.51 us, 128x4096x7168 15.35-15.52 -> 14.76-14.99, 64x2048x7168 10.39-10.41 -> 10.03-10.06,
// 64x24576x1536 14.34-14.39 -> 13.82-14.05, 32x2304x7168 8.52-8.59 -> 8.25-8.40, 16x2048x7168 7.76-7.81 -> 7.61-7.66;
// but in the K halves (64x7168x2048 7.10-7.29 -> 7.39-7.54, 128x7168x2048 9.12-9.20 -> 9.22-9.28; their launches with
// PDL, which issue none early, slower too: 16x7168x2048 5.34-5.36 -> 5.60-5.68) and in 64-row tiles of 16 tokens
// (16x4096x7168 10.83-10.99 -> 11.00-11.17, with PDL too) they lost: those forms are compiled without them.
__host__ __device__ constexpr int kEarlyLoads(int stage_bytes) {
  return stage_bytes <= 12 * 1024 ? 4 : stage_bytes <= 20 * 1024 ? 2 : stage_bytes <= 24 * 1024 ? 1 : 0;
}

// Diagnostic timeline (bench/fp8_timeline.cu defines DSX_FP8_TIMELINE before including gemm_fp8_small.cu;
// the library never does): per CTA, TL_SLOTS stamps of the global timer (ns) and counts in a device array that
// the probe reads back. Compiled out otherwise (the stamps are no-ops).
#ifdef DSX_FP8_TIMELINE
enum TlSlot {
  TL_ENTRY, TL_READY, TL_SMID,                       // entry; after the set-up; the SM
  TL_P_FIRST, TL_P_BLOCKED, TL_P_LAST,               // producer: first / last TMA issued, time waiting on empty
  TL_C0_FIRST, TL_C0_LAST, TL_C0_LOOP,               // consumer warpgroup 0: first / last full barrier passed, loop done
  TL_C1_FIRST, TL_C1_LAST, TL_C1_LOOP,               // warpgroup 1 the same
  TL_END, TL_C0_WAITED,                              // after the stores; wg 0's time in full waits
  TL_EPI_BAR1, TL_EPI_BAR2,                          // K halves: wg0 past the epilogue's first / second barrier
  TL_P_IN, TL_P_TX, TL_P_W,                          // producer's first step: in, bytes expected, weight load issued
  TL_CLUSTER,                                        // the CTA's cluster (its K splits' tile): 1 + its index
  TL_SLOTS
};
constexpr int kTlMaxCtas = 4096;
__device__ unsigned long long dsx_fp8_tl[kTlMaxCtas * TL_SLOTS];
__device__ __forceinline__ unsigned long long tl_clock() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(c)::"memory");
  return c;
}
__device__ __forceinline__ void tl_put(int slot, unsigned long long v) {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta < kTlMaxCtas) dsx_fp8_tl[cta * TL_SLOTS + slot] = v;
}
__device__ __forceinline__ void tl_end(bool me) {
  if (me) tl_put(TL_END, tl_clock());
}
#define DSX_TL(slot, v) tl_put(slot, v)
#define DSX_TL_CLOCK() tl_clock()
#else
__device__ __forceinline__ void tl_end(bool) {}
#define DSX_TL(slot, v) ((void)0)
#define DSX_TL_CLOCK() 0ull
#endif

// kOverlap: two temporaries alternate, so that the wgmma of K step i+1 is issued before step i is
// promoted (the same promotions in the same order: the bits of the one-temporary loop).
// kAhead (with kOverlap and kUni): each K step's scales are read right after its stage's barrier wait,
// into the register set of its temporary, and multiplied at its promotion one step later (no scale
// load waited for between the wgmma of a step; the same products, the same bits).
// KS = 2 (Config): two consumer warpgroups over the K halves of 64 weight rows (the uniform form only, one
// CTA split); stage 2 j + w of the ring belongs to warpgroup w (its j-th), the producers fill the two halves
// alternately in K order.
template <int MN, int BM, bool kOverlap, bool kUni, bool kAhead, int KS>
__global__ void __launch_bounds__(Config<MN, BM, KS>::kThreads, Config<MN, BM, KS>::kBlocks)
    small_gemm_kernel(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, const Params p) {
  using L = Layout<MN, BM, KS>;
  static_assert(KS == 1 || kUni, "K halves: the uniform form");
  constexpr int kThreads = Config<MN, BM, KS>::kThreads;
  constexpr int kConsumerWarps = 4 * Config<MN, BM, KS>::kConsumerWarpgroups;
  constexpr int kRedLd = L::kRedLd;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int stages = p.stages;
  const uint32_t base = smem_u32(smem);
  const uint32_t w_smem = base, x_smem = base + stages * L::kW;
  float* scales = reinterpret_cast<float*>(smem + stages * L::kStage);
  const uint32_t bars = base + stages * (L::kStage + L::kScale);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (stages + s); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int split = blockIdx.x, tile = p.token_major ? blockIdx.z : blockIdx.y;
  const int m0 = (p.token_major ? blockIdx.y : blockIdx.z) * MN;  // this CTA's tokens [m0, m0 + MN)
  const int kb0 = split * p.kbt / p.splits, nk = (split + 1) * p.kbt / p.splits - kb0;

#ifdef DSX_FP8_TIMELINE
  if (tid == 0) {
    DSX_TL(TL_ENTRY, tl_clock());
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    DSX_TL(TL_SMID, smid);
    DSX_TL(TL_CLUSTER, 1 + blockIdx.y + gridDim.y * blockIdx.z);
  }
#endif
  // Early loads: without PDL, the TMA thread sets the barriers up and issues the first kEarly loads (weight and token
  // tiles; the scale warp adds its part after the CTA barrier) before that barrier, so that the first bytes are on
  // their way one set-up earlier. As many as keep the issue short: 4 loads of 10-12 KB stages, 2 of 16-20 KB,
  // 1 of 24 KB, none of 32 KB (there the CTA barrier waited for the issue; kEarlyLoads). DSX_FP8_EARLY overrides it
  // (bench/fp8_timeline.cu builds).
  // With PDL the same thread issues the weight tiles of the ring's first kPdlEarly stages before the CTA barrier (each
  // with its stage's bytes expected), and the producer loop adds their token tiles after griddepcontrol.wait: the
  // weights are no output of the previous grid (gemm_fp8.h, bit 28), so their first bytes stream under its tail, while
  // the tokens and every scale are read only after it. Two stages: H100, PDL launches against main's library
  // (bench/gemm_fp8_ab_libs.py, sixty-sixth session, bits equal) 16x24576x1536 15.88 -> 15.18 us, 16x7168x2048 6.91 ->
  // 6.58, 64x7168x2048 7.63 -> 7.35, 128x7168x2048 8.81 -> 8.59, 64x4096x7168 15.01 -> 14.54, 128x4608x7168 20.05 ->
  // 20.21; the whole first pass instead lost at 128x7168x2048 (8.83 -> 9.61) and 64x7168x2048 (7.67 -> 7.81).
  // DSX_FP8_PDL_EARLY overrides the count (a bench build's knob).
#ifdef DSX_FP8_PDL_EARLY
  constexpr int kPdlEarly = DSX_FP8_PDL_EARLY;
#else
  constexpr int kPdlEarly = 2;
#endif
#ifdef DSX_FP8_EARLY
  constexpr int kEarly = DSX_FP8_EARLY;
#else
  constexpr int kEarly = KS == 2 || (BM == 64 && MN == 16) ? 0 : kEarlyLoads(L::kStage);  // (kEarlyLoads' note)
#endif
  // (KS = 2: the first pass's loads of the two warpgroups' first nk / 2 K blocks, alternately)
  const int first_pass = KS == 2 ? (2 * (nk / 2) < stages ? 2 * (nk / 2) : stages) : nk < stages ? nk : stages;
  const int early_cap = KS == 2 ? 2 * (nk / 2) : first_pass;
  const int early = p.pdl ? (kPdlEarly < first_pass ? kPdlEarly : first_pass)
                          : kEarly > 0 ? (kEarly < early_cap ? kEarly : early_cap) : 0;
  if (tid == (early > 0 ? 32 * kConsumerWarps : 0)) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(full(s), 1 + 32);               // the TMA thread's arrive.expect_tx + 32 scale lanes
      mbar_init(empty(s), 32 * kConsumerWarps / KS);  // every consumer thread (KS = 2: of the stage's warpgroup)
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    // load i: stage i (KS = 2: warpgroup i % 2's first, K block kb0 + (i % 2) nh): slot_of's map on the ring's first
    // pass, written out (slot_of itself here, defined before the set-up, changed the SASS of every form, and the
    // forms were timed as they are; a mismatch would load the wrong K block, which the GPU tests' bits of launches
    // with PDL, none early, against launches without would show)
    for (int i = 0; i < early; ++i) {
      const int kb = kb0 + (KS == 2 ? (i % 2) * (nk / 2) + i / 2 : i);
      mbar_arrive_expect_tx(full(i), L::kStage);
      tma_load_2d(w_smem + i * L::kW, &tw, full(i), kb * kBK, tile * BM);
      if (kEarly > 0 && !p.pdl) tma_load_2d(x_smem + i * L::kX, &tx, full(i), kb * kBK, m0);  // (PDL: after the wait)
    }
  } else if (tid == 32) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tw)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tx)) : "memory");
  }
  __syncthreads();
  // Programmatic dependent launch: no-ops unless launched with it. With it, nothing but weight tiles was read yet.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (tid == 0) DSX_TL(TL_READY, DSX_TL_CLOCK());

  float acc[MN / 2];
  // reg_out: accumulator group j of a consumer thread (tokens c = 8j + 2 (lane % 4) and c + 1, weight rows
  // r and r + 8) rounded to bf16 and stored; two adjacent weight rows of one token paired with the
  // neighbouring row's lane (lane ^ 4) into one 4-byte store (N is a multiple of 8)
  auto store_group = [&](int j, const float* v) {
    const int r = (KS == 2 ? 0 : warp / 4) * 64 + (warp % 4) * 16 + lane / 4, c = 8 * j + 2 * (lane % 4);
    const bool odd = (lane / 4) & 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float vc = v[2 * h], vc1 = v[2 * h + 1];
      const float got = __shfl_xor_sync(0xffffffffu, odd ? vc : vc1, 4);
      // even row: rows (r, r + 1) of token c; odd row: rows (r - 1, r) of token c + 1
      const int tok = m0 + (odd ? c + 1 : c), row = tile * BM + r + 8 * h - (odd ? 1 : 0);
      const __nv_bfloat162 pr = odd ? __floats2bfloat162_rn(got, vc1) : __floats2bfloat162_rn(vc, got);
      if (tok < p.m && row < p.n) *reinterpret_cast<__nv_bfloat162*>(p.out + static_cast<size_t>(tok) * p.n + row) = pr;
    }
  };
  // KS = 2: the i-th load goes to warpgroup w = i % 2 (its j-th K block, j = i / 2; K block nh w + j with
  // nh = nk / 2, the last one of an odd nk to warpgroup 1 alone), stage 2 (j % (stages / 2)) + w
  const int nh = nk / 2, nl = KS == 2 ? 2 * (nk - nh) : nk;  // KS = 2: load slots (nk odd: one empty)
  auto slot_of = [&](int i, int& s, uint32_t& ph, int& kb) {
    if constexpr (KS == 2) {
      const int w = i & 1, j = i >> 1, hs = stages / 2;
      s = 2 * (j % hs) + w;
      ph = static_cast<uint32_t>(j / hs) & 1;
      kb = kb0 + (w == 0 ? j : nh + j);
      return w == 1 || j < nh;
    } else {
      s = i % stages;
      ph = static_cast<uint32_t>(i / stages) & 1;
      kb = kb0 + i;
      return true;
    }
  };
  if (warp == kConsumerWarps) {  // TMA producer
    if (lane == 0) {
      unsigned long long tl_blocked = 0;
      (void)tl_blocked;
      for (int i = 0; i < nl; ++i) {
        int s, kb;
        uint32_t ph;
        if (!slot_of(i, s, ph, kb) || (i < early && !p.pdl)) continue;
        const unsigned long long c0 = DSX_TL_CLOCK();
        if (i == 0) DSX_TL(TL_P_IN, c0);
        const int kx = kb * kBK;
        if (i >= early) {  // (PDL: an early load's bytes were expected and its weight tile issued before the wait)
          mbar_wait(empty(s), ph ^ 1);
          tl_blocked += DSX_TL_CLOCK() - c0;
          mbar_arrive_expect_tx(full(s), L::kStage);
          if (i == 0) DSX_TL(TL_P_TX, DSX_TL_CLOCK());
          tma_load_2d(w_smem + s * L::kW, &tw, full(s), kx, tile * BM);
        }
        if (i == 0) DSX_TL(TL_P_W, DSX_TL_CLOCK());
        tma_load_2d(x_smem + s * L::kX, &tx, full(s), kx, m0);
        if (i == 0) DSX_TL(TL_P_FIRST, DSX_TL_CLOCK());
      }
      DSX_TL(TL_P_LAST, DSX_TL_CLOCK());
      DSX_TL(TL_P_BLOCKED, tl_blocked);
    }
    __syncwarp();
  } else if (warp == kConsumerWarps + 1) {  // scale producer
    const int sb_row = tile * BM / kRows;
    for (int i = 0; i < nl; ++i) {
      int s, kb;
      uint32_t ph;
      if (!slot_of(i, s, ph, kb)) continue;
      mbar_wait(empty(s), ph ^ 1);
      float* slot = scales + s * (L::kScale / 4);
#pragma unroll
      for (int j = lane; j < MN; j += 32) {
        const bool in = m0 + j < p.m;
        cp_async_4(smem_u32(slot + j), p.sa + static_cast<size_t>(in ? m0 + j : 0) * p.kbt + kb, in ? 4 : 0);
      }
      if (lane == 0) cp_async_4(smem_u32(slot + MN), p.sb + static_cast<size_t>(sb_row) * p.kbt + kb, 4);
      cp_async_arrive_noinc(full(s));
    }
  } else {  // consumers: warpgroup cw takes weight rows [64 cw, 64 cw + 64) of the tile (KS = 2: K half cw)
    const int cw = warp / 4, wl = warp % 4;
    // KS = 2: this warpgroup's K blocks, its ring of stages / 2 (local stage s is stage 2 s + cw)
    const int nkc = KS == 2 ? (cw == 0 ? nh : nk - nh) : nk, ring = stages / KS;
    auto phys = [&](int s) { return KS == 2 ? 2 * s + cw : s; };
#pragma unroll
    for (int r = 0; r < MN / 2; ++r) acc[r] = 0.f;
    // K step i: wait for its stage, issue its 4 wgmma into t (one commit group).
    // kUni: the stage and its parity are counted along (no division by the runtime stage count), the
    // wgmma descriptors are the low words of the ring's first tiles plus stage and K offsets, with the
    // warpgroup's row offset passed through a shuffle from lane 0 so that ptxas keeps them in uniform
    // registers (built from the thread index they were computed per thread and moved over by R2UR
    // before every wgmma), and the scales are read with ld.shared (a generic pointer gave LD.E).
    // Without kUni: the form before (same arithmetic, same bits).
    int s_iss = 0, s_pro = 0;  // kUni: the stage of the next K step to issue / to promote
    uint32_t ph_iss = 0;       // kUni: the full-barrier parity of the next K step to issue
    // (KS = 2: both warpgroups on rows [0, 64), the ring's first tiles at stage cw)
    const uint32_t w_lo0 = sw128_desc_lo(w_smem) +
                           __shfl_sync(0xffffffffu, KS == 2 ? cw * (L::kW / 16) : cw * (64 * kBK / 16), 0);
    const uint32_t x_lo0 = sw128_desc_lo(x_smem) + __shfl_sync(0xffffffffu, KS == 2 ? cw * (L::kX / 16) : 0, 0);
    const uint32_t sc_u32 = smem_u32(scales);
    // (timeline: the first and last full-barrier passes of this warpgroup and its time spent waiting, kept
    // in registers by selects, no branch: a divergent store here made ptxas serialize the wgmma)
    unsigned long long tl_waited = 0, tl_first = 0, tl_last = 0;
    const bool tl_me = wl == 0 && lane == 0;
    auto tl_mark = [&](int i, unsigned long long c0) {
      (void)i;
      (void)c0;
#ifdef DSX_FP8_TIMELINE
      const unsigned long long c = tl_clock();
      tl_waited += c - c0;
      tl_first = i == 0 ? c : tl_first;
      tl_last = i == nkc - 1 ? c : tl_last;
#endif
    };
    (void)tl_waited;
    (void)tl_first;
    (void)tl_last;
    (void)tl_me;
    auto issue = [&](float* t, int i) {
      if constexpr (kUni) {
        const int s = s_iss;
        const unsigned long long c0 = DSX_TL_CLOCK();
        mbar_wait(full(phys(s)), ph_iss);
        tl_mark(i, c0);
        const int s1 = s + 1 < ring ? s + 1 : 0;
        ph_iss ^= s1 == 0 ? 1u : 0u;
        s_iss = s1;
#pragma unroll
        for (int r = 0; r < MN / 2; ++r) fence_reg(t[r]);
        wgmma_fence();
        const uint32_t wl_ = w_lo0 + s * (KS * L::kW / 16), xl_ = x_lo0 + s * (KS * L::kX / 16);
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {
          wgmma_tile<MN>(t, sw128_desc_of_lo(wl_ + kk * (32 / 16)), sw128_desc_of_lo(xl_ + kk * (32 / 16)), kk > 0);
        }
        wgmma_commit();
      } else {
        const int s = i % stages;
        const unsigned long long c0 = DSX_TL_CLOCK();
        mbar_wait(full(s), (i / stages) & 1);
        tl_mark(i, c0);
#pragma unroll
        for (int r = 0; r < MN / 2; ++r) fence_reg(t[r]);
        wgmma_fence();
        const uint32_t wa = w_smem + s * L::kW + cw * 64 * kBK, xa = x_smem + s * L::kX;
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {
          wgmma_tile<MN>(t, sw128_desc(wa + kk * 32), sw128_desc(xa + kk * 32), kk > 0);
        }
        wgmma_commit();
      }
    };
    // K step i's scale products sa * sb into sc (its stage's full barrier was waited for in issue):
    // read before the wgmma wait, so that the shared-memory latency runs under the tensor-core work
    auto load_scales = [&](float* sc, int i) {
      if constexpr (kUni) {
        const uint32_t slot = sc_u32 + phys(s_pro) * L::kScale;
        const float sbv = ld_shared_f32(slot + 4 * MN);
#pragma unroll
        for (int j = 0; j < MN / 8; ++j) {
          const float2 v = ld_shared_f32x2(slot + 4 * (8 * j + 2 * (lane % 4)));
          sc[2 * j] = v.x * sbv;
          sc[2 * j + 1] = v.y * sbv;
        }
      } else {
        const float* slot = scales + (i % stages) * (L::kScale / 4);
        const float sbv = slot[MN];
#pragma unroll
        for (int j = 0; j < MN / 8; ++j) {
          const float2 v = *reinterpret_cast<const float2*>(slot + 8 * j + 2 * (lane % 4));
          sc[2 * j] = v.x * sbv;
          sc[2 * j + 1] = v.y * sbv;
        }
      }
    };
    // K step i's wgmma has completed into t: the stage given back, then acc += t * sc
    auto promote = [&](float* t, const float* sc, int i) {
#pragma unroll
      for (int r = 0; r < MN / 2; ++r) fence_reg(t[r]);
      if constexpr (kUni) {
        mbar_arrive(empty(phys(s_pro)));
        s_pro = s_pro + 1 < ring ? s_pro + 1 : 0;
      } else {
        mbar_arrive(empty(i % stages));
      }
#pragma unroll
      for (int j = 0; j < MN / 8; ++j) {
        acc[4 * j + 0] = fmaf(t[4 * j + 0], sc[2 * j], acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(t[4 * j + 1], sc[2 * j + 1], acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(t[4 * j + 2], sc[2 * j], acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(t[4 * j + 3], sc[2 * j + 1], acc[4 * j + 3]);
      }
    };
    float t0[MN / 2], sc[MN / 4];
    if constexpr (kAhead) {
      static_assert(kOverlap && kUni, "scales ahead: two temporaries, the uniform form");
      // K step i's raw scales (token scales v, weight block scale sbv) from the stage of the K step just
      // issued (its barrier waited for: s_iss was advanced past it)
      auto load_raw = [&](float* v, float& sbv) {
        const int s = s_iss > 0 ? s_iss - 1 : ring - 1;
        const uint32_t slot = sc_u32 + phys(s) * L::kScale;
        sbv = ld_shared_f32(slot + 4 * MN);
#pragma unroll
        for (int j = 0; j < MN / 8; ++j) {
          const float2 x = ld_shared_f32x2(slot + 4 * (8 * j + 2 * (lane % 4)));
          v[2 * j] = x.x;
          v[2 * j + 1] = x.y;
        }
      };
      // the products v * sbv formed here, one step after their loads (load_scales' products)
      auto promote_raw = [&](float* t, const float* v, float sbv) {
        float q[MN / 4];
#pragma unroll
        for (int j = 0; j < MN / 4; ++j) q[j] = v[j] * sbv;
        promote(t, q, 0);
      };
      float t1[MN / 2], va[MN / 4], vb[MN / 4], sba, sbb;
      issue(t0, 0);
      load_raw(va, sba);
      int i = 1;
      for (; i + 1 < nkc; i += 2) {
        issue(t1, i);
        load_raw(vb, sbb);
        wgmma_wait<1>();
        promote_raw(t0, va, sba);
        issue(t0, i + 1);
        load_raw(va, sba);
        wgmma_wait<1>();
        promote_raw(t1, vb, sbb);
      }
      if (i < nkc) {
        issue(t1, i);
        load_raw(vb, sbb);
        wgmma_wait<1>();
        promote_raw(t0, va, sba);
        wgmma_wait<0>();
        promote_raw(t1, vb, sbb);
      } else {
        wgmma_wait<0>();
        promote_raw(t0, va, sba);
      }
    } else if constexpr (kOverlap) {
      // t0 pending at the loop head, t1 issued before t0 is promoted (one shape of in-flight state
      // at the back-edge, so that ptxas sees which accumulators are free; nkc >= 1)
      float t1[MN / 2];
      issue(t0, 0);
      int i = 1;
      if (p.scale_point == 2) {
        // the products of step i - 1 (its stage waited for in the issue before) read before step i's
        // barrier wait: their latency under that wait when the data is late
        for (; i + 1 < nkc; i += 2) {
          load_scales(sc, i - 1);
          issue(t1, i);
          wgmma_wait<1>();
          promote(t0, sc, i - 1);
          load_scales(sc, i);
          issue(t0, i + 1);
          wgmma_wait<1>();
          promote(t1, sc, i);
        }
      } else if (p.scale_point == 1) {
        for (; i + 1 < nkc; i += 2) {
          issue(t1, i);
          wgmma_wait<1>();
          load_scales(sc, i - 1);
          promote(t0, sc, i - 1);
          issue(t0, i + 1);
          wgmma_wait<1>();
          load_scales(sc, i);
          promote(t1, sc, i);
        }
      } else {
        for (; i + 1 < nkc; i += 2) {
          issue(t1, i);
          load_scales(sc, i - 1);
          wgmma_wait<1>();
          promote(t0, sc, i - 1);
          issue(t0, i + 1);
          load_scales(sc, i);
          wgmma_wait<1>();
          promote(t1, sc, i);
        }
      }
      if (i < nkc) {
        issue(t1, i);
        load_scales(sc, i - 1);
        wgmma_wait<1>();
        promote(t0, sc, i - 1);
        load_scales(sc, i);
        wgmma_wait<0>();
        promote(t1, sc, i);
      } else {
        load_scales(sc, i - 1);
        wgmma_wait<0>();
        promote(t0, sc, i - 1);
      }
    } else {
      // (at 128 tokens the scale products are read after the wait: held across it, they spilled)
      const bool late = MN == 128 || p.scale_point == 1;
      for (int i = 0; i < nkc; ++i) {
        issue(t0, i);
        if (!late) load_scales(sc, i);
        wgmma_wait<0>();
        if (late) load_scales(sc, i);
        promote(t0, sc, i);
      }
    }
    if (tl_me) {
      DSX_TL(cw == 0 ? TL_C0_LOOP : TL_C1_LOOP, DSX_TL_CLOCK());
      DSX_TL(cw == 0 ? TL_C0_FIRST : TL_C1_FIRST, tl_first);
      DSX_TL(cw == 0 ? TL_C0_LAST : TL_C1_LAST, tl_last);
      if (cw == 0) DSX_TL(TL_C0_WAITED, tl_waited);
    }
#ifdef DSX_FP8_DIAG_NORED
    // Diagnostic only (bench/fp8_timeline.cu builds it; wrong values): no split or K-halves sum, each CTA's consumers
    // (K halves: warpgroup 0) store their own partial sums straight from the registers: the epilogue's lower bound.
    if (KS == 1 || cw == 0) {
#pragma unroll
      for (int j = 0; j < MN / 8; ++j) store_group(j, acc + 4 * j);
    }
    tl_end(tid == 0);
    return;
#endif
    if constexpr (KS == 2) {
      // The K halves: once both warpgroups are done with the stage buffers (every load was waited for),
      // warpgroup 1 leaves its partial sums in the front of shared memory (each thread its own 16-byte
      // slots), warpgroup 0 adds them to its own, p0 + p1 (commutative: the bits of S = 2), and stores.
      asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumerWarps) : "memory");
      if (tid == 0) DSX_TL(TL_EPI_BAR1, DSX_TL_CLOCK());
      const uint32_t xb = smem_u32(smem) + 16u * (tid % 128);
      if (cw == 1) {
#pragma unroll
        for (int j = 0; j < MN / 8; ++j) {
          st_shared_f4(xb + 16u * 128 * j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
        }
      }
      asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumerWarps) : "memory");
      if (tid == 0) DSX_TL(TL_EPI_BAR2, DSX_TL_CLOCK());
      if (cw == 0) {
#pragma unroll
        for (int j = 0; j < MN / 8; ++j) {
          const float4 u = ld_shared_f4(xb + 16u * 128 * j);
          const float v[4] = {acc[4 * j] + u.x, acc[4 * j + 1] + u.y, acc[4 * j + 2] + u.z, acc[4 * j + 3] + u.w};
          store_group(j, v);
        }
        tl_end(tid == 0);
      }
      return;
    }
    if (p.reg_out && p.splits == 1) {  // no K split: the output straight from the registers
#pragma unroll
      for (int j = 0; j < MN / 8; ++j) store_group(j, acc + 4 * j);
      tl_end(tid == 0);
      return;
    }
    if (!p.reg_out) {  // (two K splits with reg_out: exchanged below)
      // Every consumer warp is done with the stage buffers: the front becomes the fp32 partial tile
      // red[token][weight row].
      asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumerWarps) : "memory");
      float* red = reinterpret_cast<float*>(smem);
      const int r = cw * 64 + wl * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < MN / 8; ++j) {
        const int c = 8 * j + 2 * (lane % 4);
        red[c * kRedLd + r] = acc[4 * j + 0];
        red[(c + 1) * kRedLd + r] = acc[4 * j + 1];
        red[c * kRedLd + r + 8] = acc[4 * j + 2];
        red[(c + 1) * kRedLd + r + 8] = acc[4 * j + 3];
      }
    }
  }

#ifdef DSX_FP8_DIAG_NORED
  return;  // (the producers: no cluster barrier to join)
#endif
  const int S = p.splits;
  if (p.reg_out) {
    // S = 1: the consumers stored the output. S = 2: once both CTAs are done with their stage buffers,
    // each consumer thread sends the accumulator groups j of the other CTA's half (rank r stores groups
    // [r, r + 1) * MN / 16) into that CTA's front, at the same slot of the same thread, and after the
    // second cluster barrier adds what it received to its own: p0 + p1 (one addition, commutative: the
    // bits of the split-order reduction below).
    if (S == 1) return;
    constexpr int kHalf = MN / 16, kConsumerThreads = 32 * kConsumerWarps;
    if constexpr (KS == 1 && MN <= 32) {  // (only there: compiled into the other forms it slowed them, l2x_note)
      if (S > 2) {
        // S >= 3, through L2 (the workspace): rank r stores the accumulator groups j (8 tokens each, G = MN / 8) with
        // j S / G = r. Every consumer thread writes each group another rank stores to the workspace at [cluster][its
        // rank][j][thread] (16-byte stores, a warp's 512 bytes contiguous), and after the cluster barrier (release /
        // acquire at cluster scope: those writes visible) the owner reads the others' (ld.global.cg, past L1) and adds
        // the S partial sums in split order, ((p0 + p1) + p2) + ...: the bits of the fp32 tile's reduction below.
        // (Distributed shared memory moves about 20 GB/s a SM here: that reduction read its tile slices at that rate.)
        constexpr int G = MN / 8;
        const int me = static_cast<int>(blockIdx.x), cl = static_cast<int>(blockIdx.y + gridDim.y * blockIdx.z);
        float4* ws = p.ws + static_cast<size_t>(cl) * S * G * kConsumerThreads + tid;
        if (warp < kConsumerWarps) {
#pragma unroll
          for (int j = 0; j < G; ++j) {
            if (j * S / G != me) {
              ws[static_cast<size_t>(me * G + j) * kConsumerThreads] =
                  make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
            }
          }
        }
        cluster_sync();
        if (warp < kConsumerWarps) {
#pragma unroll
          for (int j = 0; j < G; ++j) {
            if (j * S / G == me) {
              const float4 a4 = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
              float4 u[kMaxSplits];
#pragma unroll
              for (int s = 0; s < kMaxSplits; ++s) {
                if (s < S) u[s] = s == me ? a4 : __ldcg(ws + static_cast<size_t>(s * G + j) * kConsumerThreads);
              }
              float4 v = u[0];
#pragma unroll
              for (int s = 1; s < kMaxSplits; ++s) {
                if (s < S) {
                  v.x += u[s].x;
                  v.y += u[s].y;
                  v.z += u[s].z;
                  v.w += u[s].w;
                }
              }
              const float w4[4] = {v.x, v.y, v.z, v.w};
              store_group(j, w4);
            }
          }
        }
        tl_end(tid == 0);
        return;
      }
    }
    cluster_sync();
    const uint32_t me = cluster_rank(), xb = smem_u32(smem) + 16u * tid;
    // (the groups are walked with constant indices and chosen by rank: acc stays in registers)
    if (warp < kConsumerWarps) {
#pragma unroll
      for (int j = 0; j < MN / 8; ++j) {
        if ((j < kHalf) == (me == 1)) {
          st_cluster_f4(xb + 16u * kConsumerThreads * (j % kHalf), me ^ 1,
                        make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
        }
      }
    }
    cluster_sync();
    if (warp < kConsumerWarps) {
#pragma unroll
      for (int j = 0; j < MN / 8; ++j) {
        if ((j < kHalf) == (me == 0)) {
          const float4 u = ld_shared_f4(xb + 16u * kConsumerThreads * (j % kHalf));
          const float v[4] = {acc[4 * j] + u.x, acc[4 * j + 1] + u.y, acc[4 * j + 2] + u.z, acc[4 * j + 3] + u.w};
          store_group(j, v);
        }
      }
    }
    tl_end(tid == 0);
    return;
  }
  // Reduction over the cluster's K splits in split order, bf16 out; CTA `rank` writes its share
  // of the tile's (token, 4 weight rows) items.
  if (S > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  const float* red = reinterpret_cast<const float*>(smem);
  const uint32_t rank = S > 1 ? cluster_rank() : 0;
  const int items = min(MN, p.m - m0) * (BM / 4), n0 = tile * BM;
  const int q1 = static_cast<int>((rank + 1) * items / S);
  for (int q = static_cast<int>(rank * items / S) + tid; q < q1; q += kThreads) {
    const int mm = q / (BM / 4), n4 = (q % (BM / 4)) * 4;
    if (n0 + n4 >= p.n) continue;
    const float* src = red + mm * kRedLd + n4;
    float4 v;
    if (S > 1) {
      const uint32_t la = smem_u32(src);
      v = ld_cluster_f4(la, 0);
      for (int s = 1; s < S; ++s) {
        const float4 u = ld_cluster_f4(la, s);
        v.x += u.x;
        v.y += u.y;
        v.z += u.z;
        v.w += u.w;
      }
    } else {
      v = *reinterpret_cast<const float4*>(src);
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p.out + static_cast<size_t>(m0 + mm) * p.n + n0 + n4) = packed;
  }
  if (S > 1) cluster_sync();  // peers may still read this CTA's partial tile
  tl_end(tid == 0);
}

}  // namespace
}  // namespace dsx_cuda
