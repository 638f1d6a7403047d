// Device helpers of the MLA decode kernel (mla_decode.cu): PTX wrappers and the shared
// memory plan. Layout contract: include/dsx/mla_decode.h.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace dsx_mla {

constexpr int kPage = 64, kLat = 512, kDim = 576;
constexpr int kChunks = kDim / 8;                  // 16-byte chunks per token row (72)
constexpr int kRowBytes = kDim * 2;                // 1152
constexpr int kStageT = 32;                        // tokens per pipeline stage (half a page)
constexpr int kStageBytes = kStageT * kRowBytes;   // 36864, contiguous in the cache
constexpr int kThreads = 256;                      // 8 warps; in P V warp w owns columns [64w, 64w + 64)
constexpr int kPStride = kStageT + 8;              // bf16 probabilities row stride (80 B: ldmatrix conflict-free)
constexpr int kMaxSplits = 64;
constexpr int kMaxSmem = 232448;                   // sm_90 opt-in dynamic shared memory per block

// Token-major tiles of 576 bf16 per row (Q rows and cache tokens): chunk c of row r sits at
// 16-byte slot r * 72 + (c ^ (r & 7)), so the 8 rows of one ldmatrix hit 8 distinct banks.
__device__ __forceinline__ int swz(int row, int chunk) { return row * kChunks + (chunk ^ (row & 7)); }

// Shared memory of tile_body (used for MT 3 and 4; the MT 1 and 2 roles below are unused since
// those row counts take the k-split CTA, PlanKS): the Q tile, a ring of kStages
// cache stages (32 tokens each), bf16 P of one stage, per-group row maxima (then row sums),
// the per-row rescale factor of the stage and the final row max. One CTA per SM: the ring is
// as deep as the 227 KB allow; the loop reads two stages while the other kStages - 2 (3 x 36 KB
// for MT <= 2, 2 x 36 KB for MT >= 3) are in flight.
template <int MT>
struct Plan {
  static constexpr int kRows = 16 * MT;
  static constexpr int kStages = MT <= 2 ? 5 : 4;
  // S phase: warp -> (row tile rt = warp / kGroups, kNPW consecutive 8-token score tiles). MT 1:
  // warps 0-3 one tile each; MT 2: warps 0-3 two tiles; MT 3: warps 0-5 two tiles; MT 4: warps
  // 0-3 all four tiles. Warps 0-3 sit on the four SM sub-partitions, and wider tiles reuse each
  // Q fragment read from shared memory for more mma (shared-memory traffic limits MT >= 2).
  static constexpr int kNPW = MT == 1 ? 1 : MT == 4 ? 4 : 2;
  static constexpr int kGroups = 4 / kNPW;
  static constexpr int kChains = kNPW >= 4 ? 1 : 2;  // accumulators per score tile (even / odd k-steps)
  static constexpr bool kAllScore = kRows / 16 * kGroups >= 8;  // every warp has a row tile
  static constexpr int kOffK = kRows * kRowBytes;
  static constexpr int kOffP = kOffK + kStages * kStageBytes;
  static constexpr int kOffRed = kOffP + kRows * kPStride * 2;
  static constexpr int kOffAlpha = kOffRed + kGroups * kRows * 4;
  static constexpr int kOffM = kOffAlpha + kRows * 4;
  static constexpr int kBytes = kOffM + kRows * 4;
  static_assert(kBytes <= kMaxSmem, "shared memory plan exceeds 227 KB");
};

// Shared memory of the k-split CTA (16*MT rows, MT <= 2, see ksplit_body in mla_decode.cu). Q lives
// in registers: each warp holds the fragments of one 144-dim slice (9 k-steps) of all rows. The Q
// tile is staged once at the start; that region then holds the fp32 partial scores of two stages
// (by stage parity), one [kRows][kSStride] block per slice. Then the ring of kStages cache stages,
// bf16 P of two stages, alpha of two stages, final row sums and maxima. Softmax role: kLPR
// consecutive lanes own one row, kTPL tokens each.
template <int MT>
struct PlanKS {
  static constexpr int kRows = 16 * MT;
  static constexpr int kStages = 5;
  static constexpr int kSlices = 4, kStepsPerSlice = kDim / 16 / kSlices;  // 4 x 9 k-steps of 16 dims
  static constexpr int kSStride = kStageT + 8;  // fp32 partial row stride (160 B: float2 stores conflict-free)
  static constexpr int kLPR = kThreads / kRows, kTPL = kStageT / kLPR, kRPW = 32 / kLPR;
  static constexpr int kQBytes = kRows * kRowBytes;
  static constexpr int kPartFloats = kSlices * kRows * kSStride;  // one stage's partials
  static constexpr int kPElems = kRows * kPStride;                // one stage's P
  static constexpr int kOffK = kQBytes > 2 * kPartFloats * 4 ? kQBytes : 2 * kPartFloats * 4;
  static constexpr int kOffP = kOffK + kStages * kStageBytes;
  static constexpr int kOffAlpha = kOffP + 2 * kPElems * 2;
  static constexpr int kOffL = kOffAlpha + 2 * kRows * 4;
  static constexpr int kOffM = kOffL + kRows * 4;
  static constexpr int kBytes = kOffM + kRows * 4;
  static_assert(MT == 1 || MT == 2, "the k-split CTA holds 16 or 32 rows");
  static_assert(kSlices * kStepsPerSlice * 16 == kDim && kOffK % 128 == 0, "slices must tile the 576 dims");
  static_assert(kLPR * kRows == kThreads && kTPL * kLPR == kStageT && kTPL % 2 == 0, "softmax lanes");
  static_assert(kBytes <= kMaxSmem, "shared memory plan exceeds 227 KB");
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 fills the destination with zeros (reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// d += a (16x16 row) * b (16x8 col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm(  // no side effects: a pure function of registers, free to schedule
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace dsx_mla
