// Read-ceiling probe for the small-M block FP8 GEMM (diagnostic, not part of the library): how fast can
// the H200 read the e4m3 weights of a DeepSeek-V3 shape at all, timed exactly as bench/gpu_kernels.py
// times the GEMM (one CUDA-graph replay of one launch per input set, the sets rotated so that they
// exceed the L2 three times, median over replays), so that "ours at 1.5x cuBLAS" can be set against
// the fastest pure read of the same bytes.
//
// Per weight shape N x K (bytes = N * K):
//   empty        an empty kernel: the launch floor of one graph node
//   ld16 uU bB   a plain read kernel: 16-byte __ldg loads, U in flight per thread, B CTAs of 512 threads a
//                SM, grid-stride; nothing written (an XOR that never matches guards the loads)
//   bulk P sS oO 1-D bulk copies (cp.async.bulk) of P contiguous bytes into a ring of S slots, one thread a
//                CTA, O CTAs a SM, pieces dealt round-robin over the grid
//   gemm6 ...    algo 6's own loads with no arithmetic: grid (S splits, ceil(N/BM) weight tiles, T token tiles); per K block
//                one TMA box of BM weight rows x 128 B and one of MN token rows x 128 B (128B swizzle, 128 B L2
//                promotion, as the kernel), a ring of `st` stages refilled as soon as a stage lands (the
//                consumers' release made instant), O CTAs a SM by shared memory, clusters of S;
//                "mcC": the token tile shared by TMA multicast over C weight tiles (gemm6_loads_mc)
//   gemm6 ... skG the same loads dealt stream-K fashion (gemm6_loads_sk): G CTAs, the (weight tile, K block) units in
//                tile-major order cut into G equal runs, one a CTA (thirty-fifth session: would all 132 SMs reading
//                help where the 64-row tiles leave 20 idle, 7168 x 2048?)
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda bench/fp8_read_probe.cu -o fp8_read_probe
// Run:   ./fp8_read_probe            (one line per variant: us per launch and TB/s of weight bytes read)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_common.cuh"
#include "sm90_ptx.cuh"  // csrc/cuda: the TMA and mbarrier wrappers the kernels use

namespace sm90 = dsx_cuda::sm90;
using dsx_cuda::sm90::mbar_arrive_expect_tx;
using dsx_cuda::sm90::tma_load_2d;

__global__ void empty_kernel() {}

template <int U>
__global__ void __launch_bounds__(512) read16(const uint4* __restrict__ src, long long n16, uint4* sink) {
  uint4 a = make_uint4(0, 0, 0, 0);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int j = 0; j < U; ++j) v[j] = __ldg(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < U; ++j) a.x ^= v[j].x, a.y ^= v[j].y, a.z ^= v[j].z, a.w ^= v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldg(src + i);
    a.x ^= v.x, a.y ^= v.y, a.z ^= v.z, a.w ^= v.w;
  }
  if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) sink[threadIdx.x] = a;
}

// 1-D bulk copies: piece i (P bytes) to CTA i % grid, a ring of S slots
__global__ void bulk_read(const uint8_t* src, long long bytes, int piece, int slots) {
  extern __shared__ __align__(128) uint8_t sm[];
  if (threadIdx.x != 0) return;
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(sm)), ring = bars + 1024;
  for (int s = 0; s < slots; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  const long long np = bytes / piece;
  long long n = 0;
  for (long long i = blockIdx.x; i < np; i += gridDim.x, ++n) {
    const int s = static_cast<int>(n % slots);
    if (n >= slots) probe_mbar_wait(bars + 8 * s, static_cast<uint32_t>((n / slots - 1) & 1));
    mbar_arrive_expect_tx(bars + 8 * s, piece);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     ring + s * piece),
                 "l"(src + i * piece), "r"(piece), "r"(bars + 8 * s)
                 : "memory");
  }
  for (long long j = n > slots ? n - slots : 0; j < n; ++j)
    probe_mbar_wait(bars + 8 * static_cast<int>(j % slots), static_cast<uint32_t>((j / slots) & 1));
}

// algo 6's loads, no arithmetic: CTA (split, tile, t) reads K blocks [kb0, kb0 + nk) of weight rows
// [tile * bm, +bm) and token rows [t * mn, +mn)
struct G6 {
  CUtensorMap tw, tx;
  int kbt, splits, stages, bm, mn;
};
// One thread's ring of `nk` loads: load i is K block kb(i) of weight rows [row(i), +bm) and token rows [tok, +mn)
// (unit(i) -> {kb, row}); each stage refilled as soon as it lands.
template <class Unit>
__device__ void gemm6_ring(const G6& p, int nk, int tok, Unit unit) {
  extern __shared__ uint8_t smraw[];
  uint8_t* sm = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smraw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const int wb = p.bm * 128, xb = p.mn * 128, stage = wb + xb;
  const uint32_t bars = base + p.stages * stage;
  for (int s = 0; s < p.stages; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8 * s));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  for (int i = 0; i < nk; ++i) {
    const int s = i % p.stages;
    if (i >= p.stages) probe_mbar_wait(bars + 8 * s, static_cast<uint32_t>((i / p.stages - 1) & 1));
    mbar_arrive_expect_tx(bars + 8 * s, stage);
    const uint32_t dst = base + s * stage;
    const int2 u = unit(i);
    tma_load_2d(dst, &p.tw, bars + 8 * s, u.x * 128, u.y);
    tma_load_2d(dst + wb, &p.tx, bars + 8 * s, u.x * 128, tok);
  }
  for (int j = nk > p.stages ? nk - p.stages : 0; j < nk; ++j)
    probe_mbar_wait(bars + 8 * (j % p.stages), static_cast<uint32_t>((j / p.stages) & 1));
}

__global__ void gemm6_loads(const __grid_constant__ G6 p) {
  if (threadIdx.x != 0) return;
  const int split = blockIdx.x, row = blockIdx.y * p.bm;
  const int kb0 = split * p.kbt / p.splits, nk = (split + 1) * p.kbt / p.splits - kb0;
  gemm6_ring(p, nk, static_cast<int>(blockIdx.z) * p.mn, [&](int i) { return make_int2(kb0 + i, row); });
}

// The same loads, stream-K: CTA c reads units [c U / G, (c + 1) U / G) of the U = tiles x K blocks, unit u being
// K block u % kbt of weight tile u / kbt (with the token rows of that K block).
__global__ void gemm6_loads_sk(const __grid_constant__ G6 p, int tiles) {
  if (threadIdx.x != 0) return;
  const long long units = static_cast<long long>(tiles) * p.kbt;
  const int u0 = static_cast<int>(blockIdx.x * units / gridDim.x);
  const int nk = static_cast<int>((blockIdx.x + 1) * units / gridDim.x) - u0;
  gemm6_ring(p, nk, 0, [&](int i) { return make_int2((u0 + i) % p.kbt, (u0 + i) / p.kbt * p.bm); });
}

// The same loads with the token tile shared by multicast (probe only, asked in the twenty-first session: is the
// L2 -> SM traffic of the token tile, read once per weight tile, what bounds M = 64 / 128?): clusters of S splits x
// C weight tiles; the CTA at cluster position (x, y) loads token rows [y mn / C, +mn / C) of the stage and
// multicasts them to the C CTAs of its split (same x), its weight tile alone; a slot is refilled once all C CTAs
// have seen it land (each arrives on the `empty` barrier of every CTA of its group). 32 threads, lane 0 works.
__global__ void gemm6_loads_mc(const __grid_constant__ G6 p, int mc) {
  extern __shared__ uint8_t smraw[];
  uint8_t* sm = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smraw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const int wb = p.bm * 128, xb = p.mn * 128, stage = wb + xb;
  const uint32_t full = base + p.stages * stage, empty = full + 8 * p.stages;
  const uint32_t rank = sm90::cluster_rank();
  const int sx = static_cast<int>(rank) % p.splits, cy = static_cast<int>(rank) / p.splits;
  uint16_t mask = 0;
  for (int c = 0; c < mc; ++c) mask |= static_cast<uint16_t>(1u << (sx + c * p.splits));
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      sm90::mbar_init(full + 8 * s, 1);
      sm90::mbar_init(empty + 8 * s, mc);
    }
    sm90::mbar_init_fence();
  }
  __syncwarp();
  sm90::cluster_sync();
  if (threadIdx.x == 0) {
    const int split = blockIdx.x, tile = blockIdx.y;
    const int kb0 = split * p.kbt / p.splits, nk = (split + 1) * p.kbt / p.splits - kb0;
    const int xrows = p.mn / mc;
    auto consume = [&](int j) {  // round j has landed here: tell every CTA of the group
      probe_mbar_wait(full + 8 * (j % p.stages), static_cast<uint32_t>((j / p.stages) & 1));
      for (int c = 0; c < mc; ++c) sm90::mbar_arrive_rank(empty + 8 * (j % p.stages), static_cast<uint32_t>(sx + c * p.splits));
    };
    for (int i = 0; i < nk; ++i) {
      const int s = i % p.stages;
      if (i >= p.stages) {
        consume(i - p.stages);
        probe_mbar_wait(empty + 8 * s, static_cast<uint32_t>((i / p.stages - 1) & 1));
      }
      mbar_arrive_expect_tx(full + 8 * s, stage);
      const uint32_t dst = base + s * stage;
      tma_load_2d(dst, &p.tw, full + 8 * s, (kb0 + i) * 128, tile * p.bm);
      sm90::tma_load_2d_multicast(dst + wb + cy * xrows * 128, &p.tx, full + 8 * s, (kb0 + i) * 128,
                                            static_cast<int>(blockIdx.z) * p.mn + cy * xrows, mask);
    }
    for (int j = nk > p.stages ? nk - p.stages : 0; j < nk; ++j) consume(j);
  }
  __syncwarp();
  sm90::cluster_sync();
}

static PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

static bool encode(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap* m, const void* p, long long rows, long long k,
                   int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {128, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t es[2] = {1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(p), dims, strides, box, es,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

struct Cfg6 {
  int bm, mn, splits, occ, stages, tt = 1;  // tt: token tiles of mn rows along the grid
  int mc = 1;                               // weight tiles a cluster sharing the token tile by multicast
  int sk = 0;                               // stream-K: this many CTAs (per `occ` a SM), splits 1, tt 1, mc 1
};

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const auto enc = encoder();
  const int reps = 30;
  struct Shape {
    long long n, k;
    std::vector<Cfg6> g6;
  };
  // the configurations algo 6 runs (auto at M = 16 / 64) and stage counts around them
  std::vector<Shape> shapes = {
      {24576, 1536, {{64, 16, 1, 3, 7}, {64, 16, 1, 3, 5}, {64, 16, 1, 3, 4}, {64, 16, 1, 3, 3}, {64, 16, 1, 3, 2},
                     {64, 64, 1, 3, 4}, {64, 64, 1, 3, 3}, {64, 64, 1, 3, 2}, {128, 16, 1, 1, 8}, {64, 16, 1, 2, 7}}},
      {7168, 18432, {{64, 16, 2, 3, 7}, {64, 16, 2, 3, 4}, {64, 16, 2, 3, 3}, {64, 16, 3, 3, 7}, {64, 16, 3, 3, 4},
                     {128, 64, 2, 1, 8}, {128, 64, 2, 1, 4}, {128, 16, 2, 1, 8}, {64, 16, 1, 3, 7}}},
      // (M = 16: 64 rows, 7 stages at three CTAs a SM, or 12 at one; M = 64: two 32-token tiles of 128 rows; M = 128:
      // two 64-token tiles; the K halves' tiles: 64 rows, all 64 / 128 tokens, one CTA a SM)
      // (twenty-first session: the M = 128 layouts, the token tile also multicast over 2 / 4 weight tiles)
      {4608, 7168, {{128, 128, 3, 1, 6, 1, 1}, {128, 128, 3, 1, 6, 1, 2}, {64, 128, 2, 1, 8, 1, 1},
                    {64, 128, 2, 1, 8, 1, 2}, {64, 128, 2, 1, 8, 1, 4},
                    // (thirty-fifth session: stream-K over 132 CTAs, 64- and 128-row tiles, all 128 tokens)
                    {64, 128, 1, 1, 8, 1, 1, 132}, {64, 128, 1, 2, 4, 1, 1, 264}, {128, 128, 1, 1, 6, 1, 1, 132}}},
      {4096, 7168, {{64, 128, 2, 1, 8, 1, 1}, {64, 128, 2, 1, 8, 1, 2}, {64, 128, 2, 1, 8, 1, 4}}},
      {7168, 2048, {{64, 16, 1, 3, 7}, {64, 16, 1, 3, 4}, {64, 16, 1, 1, 12}, {128, 32, 1, 1, 8}, {128, 32, 1, 1, 8, 2},
                    {128, 32, 1, 1, 10, 2}, {128, 64, 1, 1, 8, 2}, {64, 64, 1, 1, 12}, {64, 128, 1, 1, 8},
                    {64, 128, 1, 1, 8, 1, 2}, {64, 128, 1, 1, 8, 1, 4}, {64, 64, 1, 1, 12, 1, 2}, {64, 64, 1, 1, 12, 1, 4},
                    {128, 128, 2, 1, 6}, {128, 128, 2, 1, 6, 1, 2}, {128, 128, 2, 1, 6, 1, 4},
                    // (thirty-fifth session: the K halves' loads at M = 64 / 128 against stream-K over 112 / 128 /
                    // 132 CTAs, and two a SM)
                    {64, 64, 1, 1, 12, 1, 1, 112}, {64, 64, 1, 1, 12, 1, 1, 128}, {64, 64, 1, 1, 12, 1, 1, 132},
                    {64, 64, 1, 2, 6, 1, 1, 264}, {64, 128, 1, 1, 8, 1, 1, 112}, {64, 128, 1, 1, 8, 1, 1, 132},
                    {64, 128, 1, 2, 4, 1, 1, 264}}},
  };
  const char* only = argc > 1 ? argv[1] : nullptr;
  uint4* sink;
  CK(cudaMalloc(&sink, 1 << 16));
  uint8_t* tok;  // token rows (L2-resident after the first touch, as in the GEMM)
  CK(cudaMalloc(&tok, 128 * 18432));
  CK(cudaMemset(tok, 0x38, 128 * 18432));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Shape& sh : shapes) {
    char tag[32];
    std::snprintf(tag, sizeof tag, "%lldx%lld", sh.n, sh.k);
    if (only && std::strcmp(only, tag) != 0) continue;
    const long long bytes = sh.n * sh.k;
    // bench/gpu_timing.py n_sets: ceil(3 * 60 MB / bytes) sets, 2..16; one launch per set in the graph
    const int sets = static_cast<int>(std::min<long long>(16, std::max<long long>(2, (3LL * (60 << 20) + bytes - 1) / bytes)));
    std::vector<uint8_t*> bufs(sets);
    for (auto& b : bufs) {
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(b, 0x5A, bytes));
    }
    auto timeit = [&](auto launch_i, int repeat) { return graph_median_us(st, e0, e1, sets, repeat, reps, launch_i); };
    auto report = [&](const char* name, float us, float us_long) {
      std::printf("%-12s %-34s %8.2f us %6.3f TB/s | graph x4: %8.2f us %6.3f TB/s\n", tag, name, us, bytes / us / 1e6,
                  us_long, bytes / us_long / 1e6);
      std::fflush(stdout);
    };
    {
      auto l = [&](int) { empty_kernel<<<sms, 128, 0, st>>>(); };
      const float a = timeit(l, 1), b = timeit(l, 4);
      std::printf("%-12s %-34s %8.2f us | graph x4: %8.2f us (sets %d)\n", tag, "empty kernel", a, b, sets);
    }
    auto run_ld = [&](auto kern, int u, int per_sm) {
      char name[64];
      std::snprintf(name, sizeof name, "ld16 u%d b%d", u, per_sm);
      auto l = [&](int i) { kern<<<per_sm * sms, 512, 0, st>>>(reinterpret_cast<const uint4*>(bufs[i]), bytes / 16, sink); };
      report(name, timeit(l, 1), timeit(l, 4));
    };
    run_ld(read16<4>, 4, 4);
    run_ld(read16<8>, 8, 4);
    run_ld(read16<8>, 8, 2);
    run_ld(read16<16>, 16, 2);
    run_ld(read16<4>, 4, 2);
    for (int piece : {8192, 16384, 32768}) {
      for (int occ : {1, 2, 4}) {
        const int slots = std::max(2, std::min(8, (200 * 1024 / occ) / piece));
        const int smem = std::max(1024 + slots * piece, 233472 / occ - 2048);
        if (smem > 232448) continue;
        CK(cudaFuncSetAttribute(bulk_read, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        char name[64];
        std::snprintf(name, sizeof name, "bulk %dK s%d o%d", piece / 1024, slots, occ);
        auto l = [&](int i) { bulk_read<<<occ * sms, 32, smem, st>>>(bufs[i], bytes, piece, slots); };
        report(name, timeit(l, 1), timeit(l, 4));
      }
    }
    for (const Cfg6& c : sh.g6) {
      const int stage = c.bm * 128 + c.mn * 128;
      const int need = 1024 + c.stages * (stage + 16);
      const int smem = std::max(need, c.occ == 1 ? need : 233472 / c.occ - 1024 - 64);
      if (smem > 232448) continue;
      CK(cudaFuncSetAttribute(gemm6_loads, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      CK(cudaFuncSetAttribute(gemm6_loads_mc, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      CK(cudaFuncSetAttribute(gemm6_loads_sk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      if (c.mc > 1) CK(cudaFuncSetAttribute(gemm6_loads_mc, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      std::vector<G6> ps(sets);
      bool ok = true;
      for (int i = 0; i < sets; ++i) {
        ps[i].kbt = static_cast<int>((sh.k + 127) / 128), ps[i].splits = c.splits, ps[i].stages = c.stages;
        ps[i].bm = c.bm, ps[i].mn = c.mn;
        ok = ok && encode(enc, &ps[i].tw, bufs[i], sh.n, sh.k, c.bm) &&
             encode(enc, &ps[i].tx, tok, static_cast<long long>(c.mn) * c.tt, sh.k, c.mn / c.mc);
      }
      if (!ok) {
        std::printf("%-12s encode failed\n", tag);
        continue;
      }
      cudaLaunchConfig_t lc = {};
      lc.gridDim = dim3(c.splits, static_cast<unsigned>((sh.n + c.bm - 1) / c.bm), c.tt);
      lc.blockDim = dim3(32, 1, 1);
      lc.dynamicSmemBytes = smem;
      lc.stream = st;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = c.splits, at[0].val.clusterDim.y = c.mc, at[0].val.clusterDim.z = 1;
      lc.attrs = at;
      lc.numAttrs = c.splits * c.mc > 1 ? 1 : 0;
      if (c.sk) lc.gridDim = dim3(c.sk, 1, 1), lc.numAttrs = 0;
      const int tiles = static_cast<int>((sh.n + c.bm - 1) / c.bm);
      char name[64];
      std::snprintf(name, sizeof name, "gemm6 bm%d mn%dx%d S%d o%d st%d mc%d (%d CTAs)", c.bm, c.mn, c.tt, c.splits,
                    c.occ, c.stages, c.mc, c.splits * c.tt * static_cast<int>(lc.gridDim.y));
      if (c.sk) std::snprintf(name, sizeof name, "gemm6 bm%d mn%d o%d st%d sk%d", c.bm, c.mn, c.occ, c.stages, c.sk);
      auto l = [&](int i) {
        if (c.sk)
          CK(cudaLaunchKernelEx(&lc, gemm6_loads_sk, ps[i], tiles));
        else if (c.mc > 1)
          CK(cudaLaunchKernelEx(&lc, gemm6_loads_mc, ps[i], c.mc));
        else
          CK(cudaLaunchKernelEx(&lc, gemm6_loads, ps[i]));
      };
      report(name, timeit(l, 1), timeit(l, 4));
    }
    for (auto b : bufs) CK(cudaFree(b));
  }
  return 0;
}
