// Shared by the diagnostic probes in bench/ (fp8_read_probe.cu, wo_stream_probe.cu): the CUDA error
// check, the mbarrier parity wait and the graph timer they both use, so that both time exactly as bench/gpu_timing.py does
// (a CUDA graph of `repeat` rounds of one launch per rotated input set, 3 warm-up replays, the
// median over `reps` replays, in us per launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);        \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// Spin until the mbarrier at shared address `bar` completes the phase of parity `par`.
__device__ __forceinline__ void probe_mbar_wait(uint32_t bar, uint32_t par) {
  uint32_t ok = 0;
  while (!ok) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(bar), "r"(par)
        : "memory");
  }
}

// launch_i(i) enqueues the launch on input set i (on stream st).
template <class Launch>
float graph_median_us(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int sets, int repeat, int reps,
                      Launch&& launch_i) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < repeat; ++r)
    for (int i = 0; i < sets; ++i) launch_i(i);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, st));
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.f / (sets * repeat));
  }
  CK(cudaGetLastError());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
