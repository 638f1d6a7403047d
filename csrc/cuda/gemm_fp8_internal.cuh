// Internal interface between the CUDA translation units of the block FP8 GEMM.
// The C ABI (include/dsx/gemm_fp8.h) is implemented in gemm_fp8_api.cu on top of these.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dsx.h"

#if defined(__has_include)
#if __has_include(<cutlass/cutlass.h>)
#define DSX_HAVE_CUTLASS 1
#endif
#endif

namespace dsx_cuda {

// One "nt" GEMM (see gemm_fp8.h): device pointers, row-major, fp8 as bytes, bf16 as bits.
struct GemmNt {
  const uint8_t* a;
  const float* sa;
  const uint8_t* b;
  const float* sb;
  uint16_t* out;
  int64_t m, n, k;
};

// Benchmark knobs for the CUTLASS tile scheduler (0 = CUTLASS's default everywhere).
struct Tuning {
  int raster;         // 0 heuristic, 1 along M, 2 along N
  int swizzle;        // 1, 2, 4 or 8
  int decomposition;  // dense only: 0 heuristic, 1 data-parallel, 2 split-K, 3 stream-K
  int splits;         // dense only: K splits for split-K (1..255)
  int reduction;      // dense stream-K/split-K: 0 deterministic (turnstile), 1 atomic order
};

inline int cuda_rc(cudaError_t e) { return e == cudaSuccess ? DSX_OK : DSX_ECUDA; }

// Can the CUTLASS TMA kernels take this problem? (16-byte row strides and base pointers.)
inline bool tma_compatible(const GemmNt& g) {
  auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return g.k % 16 == 0 && g.n % 8 == 0 && al(g.a) && al(g.b) && al(g.out) && g.m <= INT32_MAX &&
         g.n <= INT32_MAX && g.k <= INT32_MAX;
}

// SMs of the current device (queried once per device; 0 if the runtime cannot tell): the
// automatic choices size their grids by it (gemm_fp8_api.cu).
int sm_count();

// ---- CUTLASS sm90a kernels (gemm_fp8_cutlass_{dense,pingpong,swapab,overlap,grouped}.cu) ----
bool cutlass_built();
int cutlass_dense_workspace(int64_t m, int64_t n, int64_t k, Tuning t, size_t* bytes);
int cutlass_dense_run(const GemmNt& g, void* ws, size_t ws_bytes, Tuning t, cudaStream_t s);
int cutlass_pingpong_workspace(int64_t m, int64_t n, int64_t k, Tuning t, size_t* bytes);
int cutlass_pingpong_run(const GemmNt& g, void* ws, size_t ws_bytes, Tuning t, cudaStream_t s);
int cutlass_swapab_workspace(int64_t m, int64_t n, int64_t k, Tuning t, size_t* bytes);
int cutlass_swapab_run(const GemmNt& g, void* ws, size_t ws_bytes, Tuning t, cudaStream_t s);
int cutlass_overlap_workspace(int64_t m, int64_t n, int64_t k, Tuning t, size_t* bytes);
int cutlass_overlap_run(const GemmNt& g, void* ws, size_t ws_bytes, Tuning t, cudaStream_t s);
int cutlass_grouped_workspace(int64_t experts, int64_t m, int64_t n, int64_t k, size_t* bytes);
int cutlass_grouped_run(const GemmNt& g, const int32_t* offsets, int64_t experts, void* ws,
                        size_t ws_bytes, Tuning t, cudaStream_t s);

// ---- hand-written sm_90a kernel for decode-sized M (gemm_fp8_small.cu) ----
// Swapped operands (weights on the 64-row wgmma side), K split over a thread-block cluster of S
// CTAs with a fixed-order reduction. knobs: S, stages, weight rows, wgmma temporaries, L2 promotion,
// tokens per CTA (bit layout at small_run in gemm_fp8_small.cu); pdl: programmatic dependent launch.
// small_auto: algo 0 takes it for this problem.
constexpr int64_t kSmallMaxRows = 128;
bool small_supported(const GemmNt& g);
bool small_auto(const GemmNt& g);
// algo 0 prefers the small-M kernel to swap-AB data-parallel here (where small_auto also holds)
bool small_before_swap_dp(const GemmNt& g);
// ws / ws_bytes: the caller's workspace (the split sums through L2 at S >= 3 where it suffices); with `query` set,
// nothing runs: the bytes of workspace that launch would use are stored there (0: none)
int small_run(const GemmNt& g, int knobs, bool pdl, cudaStream_t s, void* ws = nullptr, int64_t ws_bytes = 0,
              int64_t* query = nullptr);

// ---- hand-written persistent sm_90a kernel for large M (gemm_fp8_large.cu) ----
// BM x BN tiles, one CTA per SM walking them in a grouped order (`group` 128-row M tiles, 0 =
// default), TMA producer + two consumer warpgroups, TMA-store epilogue overlapped with the next
// tile. variant: 0 default, 1 = 128x128 with the promotion overlapped with the next K block's
// wgmma, 2 = 128x192, 3 = 128x128, 4 = 256x128 (2..4 without that overlap); 5..7 = 1, 2, 4 in 2-CTA
// clusters of M-adjacent tiles (B multicast), 8, 9 = 1, 2 in clusters of N-adjacent tiles (A
// multicast). No workspace.
// large_supported: TMA alignment (as tma_compatible) and the index ranges.
bool large_supported(const GemmNt& g);
int large_run(const GemmNt& g, int variant, int group, cudaStream_t s);

// ---- simple CUDA-core kernels for any shape (gemm_fp8_simple.cu) ----
int simple_dense_run(const GemmNt& g, cudaStream_t s);
int simple_grouped_run(const GemmNt& g, const int32_t* offsets, int64_t experts, cudaStream_t s);

}  // namespace dsx_cuda
