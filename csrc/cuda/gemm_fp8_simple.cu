// Simple CUDA-core block FP8 GEMM for any shape: the fallback where the CUTLASS TMA kernels
// cannot go (K % 16 != 0, N % 8 != 0, unaligned pointers) and a second GPU reference.
//
// One block computes a kBM x kBN output tile with 256 threads (8 outputs each). For each
// 128-wide K block the fp8 tiles are decoded to fp32 in shared memory; every output forms
// its block partial sum P sequentially in k (fp32 FMA), then acc = fma(P, sa*sb, acc).
// Grouped mode: blockIdx.y enumerates (expert, row tile) pairs, found by scanning offsets,
// so a tile never mixes experts and no host sync is needed.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "gemm_fp8_internal.cuh"

namespace dsx_cuda {
namespace {

constexpr int kBM = 16, kBN = 128, kBK = 128, kThreads = 256;
constexpr int kRowsPerThread = 2, kColsPerThread = 4;  // 8 x 32 thread grid: rows tr+8i, cols tc+32j

__device__ __forceinline__ int64_t imin(int64_t x, int64_t y) { return x < y ? x : y; }
__device__ __forceinline__ int64_t imax(int64_t x, int64_t y) { return x > y ? x : y; }

__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
  __nv_fp8_e4m3 x;
  x.__x = v;
  return static_cast<float>(x);
}

// Computes rows [row0, row0+rows) of out against weights b_e / scales sb_e. Each 128-wide
// K block is staged through shared memory in two 64-wide halves (P carries across them).
__device__ void tile_gemm(const GemmNt& g, const uint8_t* b_e, const float* sb_e, int64_t row0,
                          int64_t rows, int64_t col0) {
  constexpr int kHalf = kBK / 2;
  __shared__ float as[kBM][kHalf + 1];
  __shared__ float bs[kBN][kHalf + 1];
  const int tid = threadIdx.x, tr = tid / 32, tc = tid % 32;
  const int64_t kb_count = (g.k + kBK - 1) / kBK;
  float acc[kRowsPerThread][kColsPerThread] = {};
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    float p[kRowsPerThread][kColsPerThread] = {};
    for (int h = 0; h < 2; ++h) {
      const int64_t k0 = kb * kBK + h * kHalf;
      const int len = static_cast<int>(imax(0, imin(kHalf, g.k - k0)));
      for (int i = tid; i < kBM * kHalf; i += kThreads) {
        const int r = i / kHalf, c = i % kHalf;
        as[r][c] = (r < rows && c < len) ? e4m3_to_f32(g.a[(row0 + r) * g.k + k0 + c]) : 0.f;
      }
      for (int i = tid; i < kBN * kHalf; i += kThreads) {
        const int r = i / kHalf, c = i % kHalf;
        bs[r][c] = (col0 + r < g.n && c < len) ? e4m3_to_f32(b_e[(col0 + r) * g.k + k0 + c]) : 0.f;
      }
      __syncthreads();
      for (int i = 0; i < kRowsPerThread; ++i) {
        for (int j = 0; j < kColsPerThread; ++j) {
          const int r = tr + 8 * i, c = tc + 32 * j;
          for (int t = 0; t < len; ++t) p[i][j] = fmaf(as[r][t], bs[c][t], p[i][j]);
        }
      }
      __syncthreads();
    }
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = tr + 8 * i;
      const float s_a = r < rows ? g.sa[(row0 + r) * kb_count + kb] : 0.f;
      for (int j = 0; j < kColsPerThread; ++j) {
        const int64_t c = col0 + tc + 32 * j;
        if (c >= g.n) continue;
        const float s = s_a * sb_e[(c / kBK) * kb_count + kb];
        acc[i][j] = fmaf(p[i][j], s, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = tr + 8 * i;
    if (r >= rows) continue;
    for (int j = 0; j < kColsPerThread; ++j) {
      const int64_t c = col0 + tc + 32 * j;
      if (c < g.n) {
        __nv_bfloat16 v = __float2bfloat16_rn(acc[i][j]);
        g.out[(row0 + r) * g.n + c] = *reinterpret_cast<uint16_t*>(&v);
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) dense_kernel(GemmNt g) {
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBN;
  tile_gemm(g, g.b, g.sb, row0, imin(kBM, g.m - row0), col0);
}

__global__ void __launch_bounds__(kThreads) grouped_kernel(GemmNt g, const int32_t* offsets,
                                                           int experts) {
  int64_t t = blockIdx.y;
  for (int e = 0; e < experts; ++e) {
    const int64_t r0 = offsets[e], rows = offsets[e + 1] - r0;
    const int64_t tiles = (rows + kBM - 1) / kBM;
    if (t < tiles) {
      const int64_t nb = (g.n + kBK - 1) / kBK, kb = (g.k + kBK - 1) / kBK;
      const int64_t row0 = r0 + t * kBM;
      tile_gemm(g, g.b + e * g.n * g.k, g.sb + e * nb * kb, row0, imin(kBM, r0 + rows - row0),
                static_cast<int64_t>(blockIdx.x) * kBN);
      return;
    }
    t -= tiles;
  }
}

}  // namespace

int simple_dense_run(const GemmNt& g, cudaStream_t s) {
  if (g.m == 0) return DSX_OK;
  const dim3 grid(static_cast<unsigned>((g.n + kBN - 1) / kBN), static_cast<unsigned>((g.m + kBM - 1) / kBM));
  if (grid.y > 65535u) return DSX_EINVAL;
  dense_kernel<<<grid, kThreads, 0, s>>>(g);
  return cuda_rc(cudaGetLastError());
}

int simple_grouped_run(const GemmNt& g, const int32_t* offsets, int64_t experts, cudaStream_t s) {
  if (g.m == 0) return DSX_OK;
  // sum_e ceil(M_e / kBM) <= ceil(M / kBM) + E: blocks past the last tile return at once.
  const int64_t tiles = (g.m + kBM - 1) / kBM + experts;
  const dim3 grid(static_cast<unsigned>((g.n + kBN - 1) / kBN), static_cast<unsigned>(tiles));
  if (tiles > 65535) return DSX_EINVAL;
  grouped_kernel<<<grid, kThreads, 0, s>>>(g, offsets, static_cast<int>(experts));
  return cuda_rc(cudaGetLastError());
}

}  // namespace dsx_cuda
