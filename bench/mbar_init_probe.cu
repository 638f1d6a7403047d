// What a CTA's barrier set-up costs (asked by bench/fp8_timeline.cu: algo 6 spends 0.35 us from entry to its CTA
// barrier, initializing 2 x 12 mbarriers in one thread and fencing them): each variant below runs once at the start
// of every CTA of a one-wave grid (one CTA an SM, algo 6's 320 threads), timed by thread 0 with the SM clock from
// its entry to just after the CTA barrier that follows the set-up; medians over the CTAs and over 20 launches.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda bench/mbar_init_probe.cu -o mbar && ./mbar
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_common.cuh"
#include "sm90_ptx.cuh"  // csrc/cuda: the mbarrier init and fences the kernels use

constexpr int kBars = 24;  // algo 6's K halves at 64 tokens: 12 stages, a full and an empty barrier each

using dsx_cuda::sm90::fence_async_smem;  // fence.proxy.async.shared::cta
using dsx_cuda::sm90::mbar_init;
using dsx_cuda::sm90::mbar_init_fence;   // fence.mbarrier_init.release.cluster
__device__ __forceinline__ long long clk() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}

// variant: 0 nothing; 1 one thread inits all; 2 one thread inits all and fences; 3 one thread fences only;
// 4 a lane a barrier pair (12 lanes), each lane fencing; 5 a lane a pair, __syncwarp, lane 0 fences;
// 6 one thread inits all, proxy fence; 7 a lane a pair, no fence; 8 one thread inits all, every thread fences (the
// weight-only kernel's set-up: gemm_weight_only_ws.cuh); 9 one thread inits all, lane 0 of every warp fences
__global__ void setup(int variant, long long* out) {
  __shared__ alignas(8) uint64_t bars[kBars];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(bars));
  const int tid = threadIdx.x;
  const long long c0 = clk();
  if (variant == 1 || variant == 2 || variant == 6) {
    if (tid == 0) {
      for (int s = 0; s < kBars; ++s) mbar_init(base + 8 * s, 33);
      if (variant == 2) mbar_init_fence();
      if (variant == 6) fence_async_smem();
    }
  } else if (variant == 8 || variant == 9) {
    if (tid == 0) {
      for (int s = 0; s < kBars; ++s) mbar_init(base + 8 * s, 33);
    }
    if (variant == 8 || tid % 32 == 0) mbar_init_fence();
  } else if (variant == 3) {
    if (tid == 0) mbar_init_fence();
  } else if (variant == 4 || variant == 5 || variant == 7) {
    if (tid < 32) {
      if (tid < kBars / 2) {
        mbar_init(base + 16 * tid, 33);
        mbar_init(base + 16 * tid + 8, 128);
        if (variant == 4) mbar_init_fence();
      }
      __syncwarp();
      if (variant == 5 && tid == 0) mbar_init_fence();
    }
  }
  __syncthreads();
  if (tid == 0) out[blockIdx.x] = clk() - c0;
}

int main() {
  int sms = 0, khz = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  long long* d;
  CK(cudaMalloc(&d, sizeof(long long) * sms));
  const char* names[] = {"nothing (the CTA barrier alone)", "one thread: 24 inits",
                         "one thread: 24 inits + fence.mbarrier_init", "one thread: fence.mbarrier_init alone",
                         "12 lanes: 2 inits + fence.mbarrier_init each", "12 lanes: 2 inits, syncwarp, lane 0 fences",
                         "one thread: 24 inits + fence.proxy.async", "12 lanes: 2 inits, no fence",
                         "one thread: 24 inits; all 320 threads fence", "one thread: 24 inits; lane 0 of each warp fences"};
  std::printf("%d SMs; cycles from entry to after the CTA barrier (median over CTAs, then over 20 launches)\n", sms);
  for (int v = 0; v < 10; ++v) {
    std::vector<long long> meds;
    for (int r = 0; r < 21; ++r) {
      setup<<<sms, 320>>>(v, d);
      CK(cudaGetLastError());
      std::vector<long long> h(sms);
      CK(cudaMemcpy(h.data(), d, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
      std::sort(h.begin(), h.end());
      if (r > 0) meds.push_back(h[sms / 2]);  // (the first launch warms up)
    }
    std::sort(meds.begin(), meds.end());
    const long long m = meds[meds.size() / 2];
    std::printf("  %-48s %6lld cycles (%.3f us at the %.2f GHz clock attribute)\n", names[v], m, m / (khz * 1e-3),
                khz * 1e-6);
  }
  return 0;
}
