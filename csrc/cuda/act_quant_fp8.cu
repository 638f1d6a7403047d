// Fused per-token FP8 activation quantization (semantics in include/dsx/gemm_fp8.h):
// bf16 [M, K] -> e4m3 [M, K] + float32 scales [M, ceil(K/128)], scale = amax / 448.
// Each 128-wide group: amax by a shuffle max-reduction, scale = amax / 448 and
// q = x / scale with IEEE fp32 division, then e4m3 with round-to-nearest-even and
// saturation to +-448. One launch, no allocation. Two kernels, same arithmetic:
//  - wide (K % 8 == 0, 16-byte aligned x, 8-byte aligned q): a half-warp per group, each
//    lane one 16-byte load (8 values) and one 8-byte store; a warp does kSlots x 2 groups
//    with all its loads issued before the first reduction (more bytes in flight);
//  - general (any K, any alignment): a warp per group, 4 values per lane.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "gemm_fp8_internal.cuh"

namespace {

constexpr int kGroup = 128, kWarps = 8, kSlots = 2;

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t bits) {
  return __uint_as_float(bits << 16);  // bf16 is the top half of an fp32
}

__device__ __forceinline__ uint32_t to_e4m3(float v, float scale) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3));
}

// scale = amax / 448; a group whose scale is 0 (all zero, or amax / 448 underflows) gets 1.0, as on the
// CPU (csrc/cpu/quant_fp8.cc) and in the numpy reference: its codes are then +-0 either way.
__device__ __forceinline__ float group_scale(float amax) {
  const float s = __fdiv_rn(amax, 448.0f);
  return s == 0.f ? 1.0f : s;
}

__global__ void __launch_bounds__(kWarps * 32)
    act_quant_wide(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                   float* __restrict__ s, int64_t total_groups, int64_t groups, int64_t k) {
  const int lane = threadIdx.x % 32, half = lane / 16, l16 = lane % 16;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  uint4 raw[kSlots];
  int64_t gid[kSlots], col[kSlots];
  bool live[kSlots];
#pragma unroll
  for (int t = 0; t < kSlots; ++t) {  // issue every load first
    gid[t] = (warp * kSlots + t) * 2 + half;
    col[t] = (gid[t] % groups) * kGroup + l16 * 8;
    live[t] = gid[t] < total_groups && col[t] < k;
    const int64_t row = gid[t] / groups;
    raw[t] = live[t] ? *reinterpret_cast<const uint4*>(x + row * k + col[t]) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int t = 0; t < kSlots; ++t) {
    const uint32_t w[4] = {raw[t].x, raw[t].y, raw[t].z, raw[t].w};
    float v[8];
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = bf16_bits_to_f32(w[j] & 0xffffu);
      v[2 * j + 1] = bf16_bits_to_f32(w[j] >> 16);
      amax = fmaxf(amax, fmaxf(fabsf(v[2 * j]), fabsf(v[2 * j + 1])));
    }
#pragma unroll
    for (int off = 8; off > 0; off /= 2) {  // stays inside the half-warp
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    const float scale = group_scale(amax);
    if (gid[t] >= total_groups) continue;
    if (l16 == 0) s[gid[t]] = scale;
    if (!live[t]) continue;
    uint2 packed = make_uint2(0, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      packed.x |= to_e4m3(v[j], scale) << (8 * j);
      packed.y |= to_e4m3(v[4 + j], scale) << (8 * j);
    }
    *reinterpret_cast<uint2*>(q + (gid[t] / groups) * k + col[t]) = packed;
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    act_quant_general(const uint16_t* __restrict__ x, uint8_t* __restrict__ q,
                      float* __restrict__ s, int64_t total_groups, int64_t groups, int64_t k) {
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (gid >= total_groups) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const int64_t row = gid / groups, col0 = (gid % groups) * kGroup + lane * 4;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = col0 + j < k ? bf16_bits_to_f32(x[row * k + col0 + j]) : 0.f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float scale = group_scale(amax);
  if (lane == 0) s[gid] = scale;  // gid == row * groups + group
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (col0 + j < k) q[row * k + col0 + j] = static_cast<uint8_t>(to_e4m3(v[j], scale));
  }
}

}  // namespace

extern "C" int dsx_act_quant_fp8_cuda(const uint16_t* x, uint8_t* q, float* s, int64_t m,
                                      int64_t k, void* stream) {
  if (m < 0 || k <= 0) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!x || !q || !s) return DSX_EINVAL;
  const int64_t groups = (k + kGroup - 1) / kGroup, total = m * groups;
  const bool wide = k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 &&
                    (reinterpret_cast<uintptr_t>(q) & 7u) == 0;
  const int64_t per_block = wide ? kWarps * kSlots * 2 : kWarps;  // groups per block
  const int64_t blocks = (total + per_block - 1) / per_block;
  if (blocks > INT32_MAX) return DSX_EINVAL;
  const auto st = static_cast<cudaStream_t>(stream);
  if (wide) {
    act_quant_wide<<<static_cast<unsigned>(blocks), kWarps * 32, 0, st>>>(x, q, s, total, groups, k);
  } else {
    act_quant_general<<<static_cast<unsigned>(blocks), kWarps * 32, 0, st>>>(x, q, s, total, groups, k);
  }
  return dsx_cuda::cuda_rc(cudaGetLastError());
}
