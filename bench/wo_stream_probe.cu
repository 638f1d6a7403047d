// Weight-stream probe for the weight-only GEMM (diagnostic, not part of the library): how fast
// do different bulk-copy access patterns stream a [rows, rowbytes] byte matrix (Paddle's int4
// layout viewed as channel-group rows of 2K bytes) into shared memory, with no arithmetic?
//
// A "unit" is one thread that keeps a ring of `stages` slots full with tensor copies of one
// box (`bw` bytes x `rh` rows). A block holds `un` x `uk` units (along rows x along K); a
// cluster holds `splits` blocks along K. Each row group (un * rh rows) is cut along K into
// pieces of bw bytes, dealt to the P = uk * splits K lanes either contiguously (lane l takes
// pieces [np l / P, np (l + 1) / P)) or interleaved (lane l takes pieces l, l + P, ...).
// Blocks are persistent over row groups. Mode "linear": each unit reads 1-D bulk copies of
// `bw` bytes, piece i = unit + j * units, sweeping the whole buffer in address order.
// Anchor: a plain 16-byte-load read kernel over the same bytes.
//
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/wo_stream_probe.cu -o probe
// Run:   ./probe   (prints one line per variant: us per pass and TB/s read)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_common.cuh"

struct PP {
  CUtensorMap map;
  const uint8_t* base;
  long long total;  // bytes (linear mode)
  int rows, rowbytes, rh, bw, un, uk, stages, ileave, hint, linear, groups, slot;
};

__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }


__global__ void probe(const __grid_constant__ PP p) {
  extern __shared__ __align__(128) uint8_t sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int units = p.un * p.uk;
  if (warp >= units || lane != 0) return;
  const uint32_t bar0 = saddr(sm) + warp * p.stages * 8;
  const uint32_t ring = saddr(sm) + 2048 + warp * p.stages * p.slot;
  for (int i = 0; i < p.stages; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * i));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  uint64_t pol = 0;
  if (p.hint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  long long n = 0;
  auto issue = [&](int c0, int r0, const void* src1d) {
    const int s = static_cast<int>(n % p.stages);
    if (n >= p.stages) probe_mbar_wait(bar0 + 8 * s, static_cast<uint32_t>((n / p.stages - 1) & 1));
    const uint32_t bytes = p.linear ? p.bw : p.bw * p.rh;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar0 + 8 * s), "r"(bytes) : "memory");
    const uint32_t dst = ring + s * p.slot;
    if (p.linear) {
      if (p.hint)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(dst),
            "l"(src1d), "r"(bytes), "r"(bar0 + 8 * s), "l"(pol)
            : "memory");
      else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                     "l"(src1d), "r"(bytes), "r"(bar0 + 8 * s)
                     : "memory");
    } else if (p.hint) {
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
          " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
          "l"(reinterpret_cast<uint64_t>(&p.map)), "r"(c0), "r"(r0), "r"(bar0 + 8 * s), "l"(pol)
          : "memory");
    } else {
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
          " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
          "l"(reinterpret_cast<uint64_t>(&p.map)), "r"(c0), "r"(r0), "r"(bar0 + 8 * s)
          : "memory");
    }
    ++n;
  };
  if (p.linear) {
    const long long nunits = static_cast<long long>(gridDim.x) * gridDim.y * units;
    const long long me = (static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x) * units + warp;
    for (long long i = me; (i + 1) * p.bw <= p.total; i += nunits) issue(0, 0, p.base + i * p.bw);
  } else {
    const int ui = warp % p.un, ki = warp / p.un;
    const int P = p.uk * gridDim.x, kl = blockIdx.x * p.uk + ki;
    const int np = (p.rowbytes + p.bw - 1) / p.bw;
    for (int u = blockIdx.y; u < p.groups; u += gridDim.y) {
      const int r0 = (u * p.un + ui) * p.rh;
      if (r0 >= p.rows) break;
      if (p.ileave) {
        for (int pc = kl; pc < np; pc += P) issue(pc * p.bw / 8, r0, nullptr);
      } else {
        const int b = static_cast<int>(static_cast<long long>(np) * kl / P), e = static_cast<int>(static_cast<long long>(np) * (kl + 1) / P);
        for (int pc = b; pc < e; ++pc) issue(pc * p.bw / 8, r0, nullptr);
      }
    }
  }
  for (long long j = n > p.stages ? n - p.stages : 0; j < n; ++j)
    probe_mbar_wait(bar0 + 8 * static_cast<int>(j % p.stages), static_cast<uint32_t>((j / p.stages) & 1));
}

__global__ void readk(const uint4* __restrict__ src, long long n16, uint4* sink) {
  uint4 a = make_uint4(0, 0, 0, 0);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ldg(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 4; ++j) a.x ^= v[j].x, a.y ^= v[j].y, a.z ^= v[j].z, a.w ^= v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldg(src + i);
    a.x ^= v.x, a.y ^= v.y, a.z ^= v.z, a.w ^= v.w;
  }
  if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) sink[threadIdx.x] = a;
}

static PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
}

struct V {
  std::string name;
  int rh, bw, un, uk, stages, splits, ileave, hint, promo, linear, occ;  // occ: blocks per SM wanted
};

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto enc = encoder();
  const int reps = 20;
  struct Shape {
    int n, k;
  };
  std::vector<Shape> shapes = {{36864, 7168}, {7168, 18432}};
  // (PROBE_SHAPES=NxK,NxK,...: other shapes instead, e.g. the same N at two K to fit a fixed cost)
  if (const char* env = std::getenv("PROBE_SHAPES")) {
    shapes.clear();
    for (const char* q = env; *q;) {
      int n = 0, k = 0, used = 0;
      if (std::sscanf(q, "%dx%d%n", &n, &k, &used) != 2) break;
      shapes.push_back({n, k});
      q += used;
      if (*q == ',') ++q;
    }
  }
  std::vector<V> vs = {
      // name rh bw un uk st sp il hint promo linear occ
      {"cur: warp 4r x512 s8 contig", 4, 512, 8, 1, 2, 8, 0, 1, 2, 0, 4},
      {"cur s4", 4, 512, 8, 1, 2, 4, 0, 1, 2, 0, 4},
      {"cur s8 nohint", 4, 512, 8, 1, 2, 8, 0, 0, 2, 0, 4},
      {"cur s8 promo128", 4, 512, 8, 1, 2, 8, 0, 1, 1, 0, 4},
      {"cur s8 promoNone", 4, 512, 8, 1, 2, 8, 0, 1, 0, 0, 4},
      {"cur s8 occ2", 4, 512, 8, 1, 2, 8, 0, 1, 2, 0, 2},
      {"cur s8 st4", 4, 512, 8, 1, 4, 8, 0, 1, 2, 0, 4},
      {"cur s8 st1", 4, 512, 8, 1, 1, 8, 0, 1, 2, 0, 4},
      {"clu-ileave s8", 4, 512, 8, 1, 2, 8, 1, 1, 2, 0, 4},
      {"clu-ileave s4", 4, 512, 8, 1, 2, 4, 1, 1, 2, 0, 4},
      {"clu-ileave s8 nohint", 4, 512, 8, 1, 2, 8, 1, 0, 2, 0, 4},
      {"clu-ileave s8 occ2", 4, 512, 8, 1, 2, 8, 1, 1, 2, 0, 2},
      {"clu-ileave s8 st1", 4, 512, 8, 1, 1, 8, 1, 1, 2, 0, 4},
      {"clu-ileave s2", 4, 512, 8, 1, 2, 2, 1, 1, 2, 0, 4},
      {"blk-kil uk8 s1", 4, 512, 1, 8, 2, 1, 1, 1, 2, 0, 4},
      {"blk-kil uk8 s4", 4, 512, 1, 8, 2, 4, 1, 1, 2, 0, 4},
      {"blk-kil uk8 s8", 4, 512, 1, 8, 2, 8, 1, 1, 2, 0, 4},
      {"blk-kil un2uk4 s4", 4, 512, 2, 4, 2, 4, 1, 1, 2, 0, 4},
      {"blk-kil uk8 s4 st1", 4, 512, 1, 8, 1, 4, 1, 1, 2, 0, 4},
      {"clu-ileave x256 s8 st4", 4, 256, 8, 1, 4, 8, 1, 1, 2, 0, 4},
      {"clu-ileave x1024 s8", 4, 1024, 8, 1, 2, 8, 1, 1, 2, 0, 4},
      {"clu-ileave s8 promoNone nohint", 4, 512, 8, 1, 2, 8, 1, 0, 0, 0, 4},
      {"blk-kil uk8 s4 nohint promoNone", 4, 512, 1, 8, 2, 4, 1, 0, 0, 0, 4},
      {"blk-kil uk4 un2 s8", 4, 512, 2, 4, 2, 8, 1, 1, 2, 0, 4},
      {"blk-kil uk8 s2", 4, 512, 1, 8, 2, 2, 1, 1, 2, 0, 4},
      {"cur s8 occ3", 4, 512, 8, 1, 2, 8, 0, 1, 2, 0, 3},
      {"clu-ileave s8 occ3", 4, 512, 8, 1, 2, 8, 1, 1, 2, 0, 3},
      {"warp 4r x1024 s8 contig", 4, 1024, 8, 1, 2, 8, 0, 1, 2, 0, 4},
      {"warp 4r x2048 s4 contig occ2", 4, 2048, 8, 1, 2, 4, 0, 1, 2, 0, 2},
      {"warp 4r x256 s8 contig st4", 4, 256, 8, 1, 4, 8, 0, 1, 2, 0, 4},
      {"cta 32r x512 s8 st2", 32, 512, 1, 1, 2, 8, 0, 1, 2, 0, 4},
      {"cta 32r x512 s8 ileave", 32, 512, 1, 1, 2, 8, 1, 1, 2, 0, 4},
      {"cta 32r x512 s8 st4", 32, 512, 1, 1, 4, 8, 0, 1, 2, 0, 2},
      {"cta 4r x2048 uk1 s8 ileave", 4, 2048, 1, 1, 4, 8, 1, 1, 2, 0, 4},
      {"cta 16r x1024 s8 ileave", 16, 1024, 1, 1, 2, 8, 1, 1, 2, 0, 4},
      {"linear 1d 2K x8 units", 1, 2048, 8, 1, 2, 1, 0, 1, 2, 1, 4},
      {"linear 1d 8K x8 units", 1, 8192, 8, 1, 2, 1, 0, 1, 2, 1, 2},
      {"linear 1d 512 x8 units st4", 1, 512, 8, 1, 4, 1, 0, 1, 2, 1, 4},
      {"linear 1d 16K x1 unit", 1, 16384, 1, 1, 2, 1, 0, 1, 2, 1, 4},
      // the warp-specialized kernel's block rings (one copy a slot of all the block's rows; seventeenth
      // session): 64 rows = two tiles a warp x 8 warps, 32 = one tile; x512 = 2 steps a slot
      {"ws 64r x512 s8 st2 occ2 (7168x18432 M1)", 64, 512, 1, 1, 2, 8, 0, 1, 2, 0, 2},
      {"ws 64r x512 s4 st2 occ2 (36864x7168 M1)", 64, 512, 1, 1, 2, 4, 0, 1, 2, 0, 2},
      {"ws 64r x256 s8 st2 occ2", 64, 256, 1, 1, 2, 8, 0, 1, 2, 0, 2},
      {"ws 64r x256 s8 st3 occ2", 64, 256, 1, 1, 3, 8, 0, 1, 2, 0, 2},
      {"ws 64r x256 s4 st2 occ2", 64, 256, 1, 1, 2, 4, 0, 1, 2, 0, 2},
      {"ws 64r x1024 s8 st2 occ1", 64, 1024, 1, 1, 2, 8, 0, 1, 2, 0, 1},
      {"ws 64r x512 s8 st2 occ2 nohint", 64, 512, 1, 1, 2, 8, 0, 0, 2, 0, 2},
      {"ws 32r x512 s8 st2 occ3", 32, 512, 1, 1, 2, 8, 0, 1, 2, 0, 3},
      {"ws 128r x512 s8 st2 occ1", 128, 512, 1, 1, 2, 8, 0, 1, 2, 0, 1},
      {"ws 64r x512 s8 st2 occ2 ileave", 64, 512, 1, 1, 2, 8, 1, 1, 2, 0, 2},
  };
  // argv[1]: one variant's index, or +I: the variants from index I on
  const bool from = argc > 1 && argv[1][0] == '+';
  int only = argc > 1 ? std::atoi(argv[1] + (from ? 1 : 0)) : -1;
  uint4* sink;
  CK(cudaMalloc(&sink, 4096));
  for (const Shape& sh : shapes) {
    const long long bytes = static_cast<long long>(sh.n) / 2 * sh.k;
    const int sets = static_cast<int>(std::max<long long>(3, (200LL << 20) / bytes + 1));
    std::vector<uint8_t*> bufs(sets);
    for (auto& b : bufs) {
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(b, 0x5A, bytes));
    }
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto timeit = [&](auto launch_i) { return graph_median_us(st, e0, e1, sets, 1, reps, launch_i); };
    {
      int bpsm = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bpsm, readk, 512, 0));
      const float us = timeit([&](int i) {
        readk<<<bpsm * sms, 512, 0, st>>>(reinterpret_cast<const uint4*>(bufs[i]), bytes / 16, sink);
      });
      std::printf("%6d x %5d  %-34s %8.2f us %6.3f TB/s\n", sh.n, sh.k, "anchor: ld.global 16B read", us, bytes / us / 1e6);
    }
    for (size_t vi = 0; vi < vs.size(); ++vi) {
      if (only >= 0 && (from ? static_cast<int>(vi) < only : static_cast<int>(vi) != only)) continue;
      const V& v = vs[vi];
      PP p{};
      p.rows = sh.n / 4, p.rowbytes = 2 * sh.k, p.rh = v.rh, p.bw = v.bw, p.un = v.un, p.uk = v.uk;
      p.stages = v.stages, p.ileave = v.ileave, p.hint = v.hint, p.linear = v.linear, p.total = bytes;
      p.slot = (v.linear ? v.bw : v.bw * v.rh + 127) / 128 * 128;
      p.groups = (p.rows + v.un * v.rh - 1) / (v.un * v.rh);
      const int units = v.un * v.uk;
      int smem = 2048 + units * v.stages * p.slot;
      const int want = 233472 / v.occ - 1024 - 64;
      if (smem < want) smem = want;
      if (smem > 232448) {
        std::printf("%-34s smem %d too big\n", v.name.c_str(), smem);
        continue;
      }
      CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const int splits = v.linear ? 1 : v.splits;
      cudaLaunchConfig_t lc = {};
      lc.blockDim = dim3(256, 1, 1);
      lc.dynamicSmemBytes = smem;
      lc.stream = st;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = splits, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
      lc.attrs = at;
      lc.numAttrs = 1;
      lc.gridDim = dim3(splits, 1, 1);
      int ncl = 0;
      CK(cudaOccupancyMaxActiveClusters(&ncl, probe, &lc));
      int gy = v.linear ? ncl : std::min(ncl, p.groups);
      lc.gridDim = dim3(splits, gy, 1);
      std::vector<PP> ps(sets, p);
      bool ok = true;
      for (int i = 0; i < sets && !v.linear; ++i) {
        const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.rowbytes / 8), static_cast<cuuint64_t>(p.rows)};
        const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.rowbytes)};
        const cuuint32_t box[2] = {static_cast<cuuint32_t>(v.bw / 8), static_cast<cuuint32_t>(v.rh)};
        const cuuint32_t es[2] = {1, 1};
        const CUtensorMapL2promotion pr = v.promo == 0   ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                          : v.promo == 1 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                         : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
        ok = ok && enc(&ps[i].map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, bufs[i], dims, strides, box, es,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, pr,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
      }
      for (int i = 0; i < sets; ++i) ps[i].base = bufs[i];
      if (!ok) {
        std::printf("%-34s encode failed\n", v.name.c_str());
        continue;
      }
      const float us = timeit([&](int i) { CK(cudaLaunchKernelEx(&lc, probe, ps[i])); });
      CK(cudaGetLastError());
      std::printf("%6d x %5d  %-34s %8.2f us %6.3f TB/s  (grid %d x %d, smem %d)\n", sh.n, sh.k, v.name.c_str(), us,
                  bytes / us / 1e6, splits, gy, smem);
      std::fflush(stdout);
    }
    for (auto b : bufs) CK(cudaFree(b));
    CK(cudaStreamDestroy(st));
  }
  return 0;
}
