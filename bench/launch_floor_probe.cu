// What one launch costs before any work, in a CUDA graph as bench/gpu_timing.py times it: empty kernels with algo 6's
// launch configuration added piece by piece (its grid and block, its 201 KB of dynamic shared memory, its kernel
// parameters, a cluster, the programmatic-dependent-launch attribute), then the same kernel storing a 64-token output
// tile a CTA in the register layout's 4-byte pieces (8 tokens an instruction) or in coalesced 16-byte pieces. The
// timeline probe (bench/fp8_timeline.cu) finds about 1.2 us between the last CTA's end of one launch and the first
// CTA's entry of the next; this says how much of that the configuration and the stores' drain take.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/launch_floor_probe.cu -o lf && ./lf
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "probe_common.cuh"

namespace {

struct alignas(64) Map {  // a CUtensorMap's size and alignment, as algo 6 passes two of them
  uint8_t b[128];
};
struct Params {  // algo 6's Params size
  uint8_t b[72];
};

constexpr int kCtas = 112, kThreads = 320, kSmem = 201 * 1024, kTokens = 64, kRows = 64, kN = kCtas * kRows;

__global__ void empty_small() {}

__global__ void __launch_bounds__(kThreads, 1) empty_big() {
  extern __shared__ uint8_t smem[];
  if (threadIdx.x == 1024) smem[0] = 0;  // (never: keeps the dynamic shared memory declared)
}

__global__ void __launch_bounds__(kThreads, 1)
    empty_params(const __grid_constant__ Map tw, const __grid_constant__ Map tx, const Params p) {
  extern __shared__ uint8_t smem[];
  if (threadIdx.x == 1024) smem[0] = tw.b[0] + tx.b[1] + p.b[2];
}

__global__ void __launch_bounds__(kThreads, 1)
    empty_pdl(const __grid_constant__ Map tw, const __grid_constant__ Map tx, const Params p) {
  extern __shared__ uint8_t smem[];
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 1024) smem[0] = tw.b[0] + tx.b[1] + p.b[2];
}

// The first 128 threads (a consumer warpgroup) store the CTA's 64 weight rows x 64 tokens of out[token][n]:
// scattered = algo 6's register layout (each thread 2 adjacent rows of one token a store, a warp's store covering
// 8 tokens' 16-byte runs), coalesced = 16 bytes a thread along n (a warp 4 tokens' whole 128-byte rows).
template <bool kScattered>
__global__ void __launch_bounds__(kThreads, 1)
    store_tile(const __grid_constant__ Map tw, const __grid_constant__ Map tx, const Params p, uint16_t* out) {
  extern __shared__ uint8_t smem[];
  if (threadIdx.x == 1024) smem[0] = tw.b[0] + tx.b[1] + p.b[2];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, n0 = blockIdx.x * kRows;
  if (tid >= 128) return;
  if constexpr (kScattered) {
    const uint32_t v = 0x3f803f80u + tid;
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp * 16 + (lane / 4 & ~1) + 8 * h, tok = 8 * j + 2 * (lane % 4) + (lane / 4 & 1);
        *reinterpret_cast<uint32_t*>(out + static_cast<size_t>(tok) * kN + n0 + r) = v + j;
      }
    }
  } else {
    const uint4 v = make_uint4(tid, 1, 2, 3);
#pragma unroll
    for (int i = 0; i < kTokens * kRows / 8 / 128; ++i) {
      const int q = i * 128 + tid, tok = q / (kRows / 8), c = q % (kRows / 8);
      *reinterpret_cast<uint4*>(out + static_cast<size_t>(tok) * kN + n0 + 8 * c) = v;
    }
  }
}

template <class K, class... Args>
void launch_ex(K kernel, int cluster, bool pdl, cudaStream_t st, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kCtas);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (cluster > 0) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = cluster;
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  if (pdl) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  CK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

}  // namespace

int main() {
  cudaStream_t st;
  cudaEvent_t e0, e1;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaFuncSetAttribute(empty_big, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(empty_params, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(empty_pdl, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(store_tile<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(store_tile<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  constexpr int kSets = 8;
  uint16_t* outs[kSets];
  for (auto& o : outs) CK(cudaMalloc(&o, size_t{2} * kTokens * kN));
  const Map m{};
  const Params p{};
  struct Case {
    const char* what;
    void (*run)(cudaStream_t, const Map&, const Params&, uint16_t*);
  };
  static const Case cases[] = {
      {"empty, 1 CTA of 32 threads", [](cudaStream_t s, const Map&, const Params&, uint16_t*) { empty_small<<<1, 32, 0, s>>>(); }},
      {"empty, 112 CTAs of 32 threads", [](cudaStream_t s, const Map&, const Params&, uint16_t*) { empty_small<<<kCtas, 32, 0, s>>>(); }},
      {"empty, 112 x 320 threads", [](cudaStream_t s, const Map&, const Params&, uint16_t*) { empty_big<<<kCtas, kThreads, 0, s>>>(); }},
      {"  + 201 KB dynamic shared memory", [](cudaStream_t s, const Map&, const Params&, uint16_t*) { empty_big<<<kCtas, kThreads, kSmem, s>>>(); }},
      {"  + algo 6's parameters (2 maps + 72 B)", [](cudaStream_t s, const Map& m, const Params& p, uint16_t*) { launch_ex(empty_params, 0, false, s, m, m, p); }},
      {"  + cluster of 1 (launch attribute)", [](cudaStream_t s, const Map& m, const Params& p, uint16_t*) { launch_ex(empty_params, 1, false, s, m, m, p); }},
      {"  + cluster of 2", [](cudaStream_t s, const Map& m, const Params& p, uint16_t*) { launch_ex(empty_params, 2, false, s, m, m, p); }},
      {"  no cluster, PDL (griddepcontrol inside)", [](cudaStream_t s, const Map& m, const Params& p, uint16_t*) { launch_ex(empty_pdl, 0, true, s, m, m, p); }},
      {"parameters + 64x64 tile a CTA, 4-byte scattered", [](cudaStream_t s, const Map& m, const Params& p, uint16_t* o) { launch_ex(store_tile<true>, 0, false, s, m, m, p, o); }},
      {"parameters + 64x64 tile a CTA, 16-byte coalesced", [](cudaStream_t s, const Map& m, const Params& p, uint16_t* o) { launch_ex(store_tile<false>, 0, false, s, m, m, p, o); }},
  };
  for (int round = 0; round < 3; ++round) {
    std::printf("round %d\n", round + 1);
    for (const auto& c : cases) {
      const float us = graph_median_us(st, e0, e1, kSets, 8, 30, [&](int i) { c.run(st, m, p, outs[i]); });
      std::printf("  %-52s %6.2f us a launch\n", c.what, us);
    }
  }
  for (auto& o : outs) CK(cudaFree(o));
  return 0;
}
