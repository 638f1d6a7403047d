// Device helpers of the MLA decode kernel (mla_decode.cu): its own PTX wrappers (the shared ones
// come from sm90_ptx.cuh) and the shared memory plan. Layout contract: include/dsx/mla_decode.h.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "sm90_ptx.cuh"

namespace dsx_mla {

using dsx_cuda::sm90::cp_async_arrive_noinc;
using dsx_cuda::sm90::fence_async_smem;
using dsx_cuda::sm90::ld_shared_f32;
using dsx_cuda::sm90::ld_shared_u32x4;
using dsx_cuda::sm90::mbar_arrive;
using dsx_cuda::sm90::mbar_arrive_expect_tx;
using dsx_cuda::sm90::mbar_init;
using dsx_cuda::sm90::mbar_wait;
using dsx_cuda::sm90::named_bar_sync;
using dsx_cuda::sm90::setmaxnreg_dec;
using dsx_cuda::sm90::setmaxnreg_inc;
using dsx_cuda::sm90::smem_u32;
using dsx_cuda::sm90::st_shared_f32;
using dsx_cuda::sm90::st_shared_u32;
using dsx_cuda::sm90::st_shared_u32x2;
using dsx_cuda::sm90::tma_load_3d;
using dsx_cuda::sm90::tma_load_3d_multicast;
using dsx_cuda::sm90::wgmma_commit;
using dsx_cuda::sm90::wgmma_fence;
using dsx_cuda::sm90::wgmma_wait;

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


// ---- wgmma path (rows > 64: 64-row CTAs of three warpgroups, see wg_role in mla_decode.cu) ----
// A cache page (64 tokens x 576 dims) is stored k-block-major: 9 blocks of 64 dims, each
// [64 tokens][128 B] with the 128-byte swizzle (16-byte chunk x of row r at x ^ (r & 7)), so that
// one block is a canonical wgmma operand: K-major (K for the scores) or MN-major (V = the first
// 512 dims, 4 blocks per 256 output columns). The Q rope block and P use the same block layout.
constexpr int kWRows = 64;                   // query rows per CTA
constexpr int kKBBytes = kPage * 128;        // one 64-dim block of a tile: 8192 B
constexpr int kTileBytes = kDim / 64 * kKBBytes;  // 73728: one page

struct PlanWG {
  static constexpr int kOffK = 0;                               // three page buffers
  static constexpr int kOffQR = kOffK + 3 * kTileBytes;         // Q rope dims 512-575 (128-byte swizzle)
  static constexpr int kOffQ31 = kOffQR + kKBBytes;             // Q dims 496-511 (32-byte swizzle, 2 KB)
  static constexpr int kOffAlpha = kOffQ31 + kWRows * 32;       // per-row rescale, one set per page buffer
  // mbarriers: full[3], p_full[3], empty[3], s_done[3], then q_full and q_free (Q staged in page buffer 2)
  static constexpr int kOffBar = kOffAlpha + 3 * kWRows * 4;
  static constexpr int kOffL = kOffQR;                          // final row sums (the Q rope block, at the end)
  static constexpr int kBytes = kOffBar + 14 * 8;
  // No alignment slack fits: the kernel requires (and checks) a 1024-byte aligned dynamic shared base.
  static constexpr int kAlloc = kBytes;
  static_assert(kAlloc <= kMaxSmem, "wgmma plan exceeds 227 KB");
  static_assert(kOffQR % 1024 == 0 && kOffQ31 % 256 == 0 && kOffBar % 8 == 0, "operand alignment");
};

// Byte offset of 16-byte chunk c (0..71) of row r (0..63) in a k-block-major tile.
__device__ __forceinline__ uint32_t wswz(int r, int c) {
  return (c >> 3) * kKBBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// Shared-memory matrix descriptor, 128-byte swizzle; lbo / sbo in bytes.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
         (1ull << 62);
}
// The same with the 32-byte swizzle (rows of 32 B, 8-row atoms of 256 B; chunk x of row r at x ^ ((r >> 2) & 1)).
__device__ __forceinline__ uint64_t sw32_desc(uint32_t addr, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(sbo >> 4) << 32) | (3ull << 62);
}

// Keeps the compiler from moving accesses of r across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// d (64x64) += A (64x16, K-major, smem) * B (64x16 tokens, K-major, smem)^T
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      :"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}

// d (64x256) += A (64x16, K-major smem) * B (16x256, MN-major smem)
__device__ __forceinline__ void wgmma_ss_n256_tb(float (&d)[128], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      :"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
      "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
      "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
      "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d)
      : "memory");
}




__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}


// d (64x64) += A (64x16 from registers) * B (64x16 tokens, K-major, smem)^T
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      :"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d)
      : "memory");
}

}  // namespace dsx_mla
