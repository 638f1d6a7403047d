// MLA decode attention (absorbed weights, paged latent cache) for sm_90a.
// Contract: include/dsx/mla_decode.h; helpers and shared-memory plans: mla_decode.cuh.
//
// Grid (row_tiles, splits, B), one CTA per SM. A CTA takes up to 64 query rows of one sequence
// (row = s*H + h, rows of q[b] are contiguous) and one split of that sequence's pages (each
// sequence's own pages cut into `splits` equal page-aligned chunks).
// Up to 64 rows (16*MT rows, MT <= 4; 256 threads, mma.sync): 32 tokens (half a page, 36 KB
// contiguous in the cache) per stage through a cp.async ring. Two CTA bodies share the ring, the
// P V step and the online softmax:
//  - ksplit_body (16 or 32 rows, the memory-bound shapes): Q in registers. Warp w holds the
//    Q fragments of the 144-dim slice w & 3 for all rows and computes that slice's partial
//    scores for 16 tokens of the stage; the four fp32 partials meet in shared memory and the
//    softmax lanes (8 or 16 per row) sum them in slice order. Each K element is read from
//    shared memory once per stage and no Q fragment is re-read. One barrier per stage: phase
//    j runs the scores of stage j + 2, the softmax of stage j + 1 and P V of stage j, which use
//    disjoint buffers (partials, P and alpha double-buffered by stage parity), so the softmax
//    latency hides behind the mma; three stages are read while two more are in flight.
//  - tile_body (48 or 64 rows): Q in shared memory, score warps own a 16-row tile and 8-32
//    tokens over all 576 dims; row maxima are exchanged through shared memory. Two barriers per
//    stage: iteration j runs the scores of stage j + 1 with the mma of P V of stage j
//    interleaved into it, a barrier, then the softmax of stage j + 1; two stages are read while
//    kStages - 2 more are in flight.
// Per stage: (1) scores S = Q K^T in fp32 registers; (2) the online softmax: new running max per
// row, p = exp(s - m) to shared bf16, partial row sums in registers, the rescale factor alpha
// per row to shared memory; (3) O = alpha * O + P V, warp w owning latent columns [64w, 64w + 64)
// of all rows, fp32 accumulators in registers.
// More than 64 rows (H = 128, the compute-bound shapes): mla_decode_wgmma_kernel, 64-row tiles,
// three warpgroups with wgmma, one page per step through three page buffers (mla_decode_wgmma.cuh).
// Measured (bench/gpu_mla_decode.py, H200, B 64-128, T 4096-8192): 16 rows 0.92-1.05 of copy
// bandwidth (cache bytes over the read + write copy rate), 32 rows 0.84-0.97; 128 and 256 rows
// 583-653 TFLOP/s (0.78-0.87 of the bf16 matmul rate measured in the same run; 397-472 with the
// cp.async wgmma version before, 1.30-1.58x; 237-246 with the mma.sync tiles before that).
// The end sums the partial row sums in a fixed order (deterministic). One split: normalised bf16
// out + lse. Several: fp32 partials + lse to the workspace, then mla_combine merges them in
// split order.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "dsx.h"
#include "launch_attrs.cuh"
#include "mla_decode.cuh"

namespace dsx_mla {

struct Params {
  const __nv_bfloat16* q;
  const __nv_bfloat16* kv;
  const int32_t* pt;
  const int32_t* lens;
  __nv_bfloat16* out;
  float* lse;
  float* ws_o;    // [B, splits, rows, 512] when splits > 1
  float* ws_lse;  // [B, splits, rows]
  int s_q, heads, rows, max_pages, splits;
  float scale;
};

// Issue the copies of the stage starting at token t (a multiple of 32 inside page `page`)
// into buffer `dst`: 36 KB contiguous in the cache, 9 x 16 bytes per thread. Tokens at or
// past t_end are zero-filled (nothing is read for them: unused slots may hold NaN).
// Sequence b's clamped length, and the tokens [begin, end) its split `split` attends to: the
// split-th of p.splits equal page-aligned chunks of its ceil(len / 64) pages (empty past its end).
struct SplitSpan {
  int len, begin, end;
};
__device__ __forceinline__ SplitSpan split_tokens(const Params& p, int b, int split) {
  const int len = min(max(p.lens[b], 0), p.max_pages * kPage);
  const int pages_b = (len + kPage - 1) / kPage, pps = (pages_b + p.splits - 1) / p.splits;
  const int begin = min(split * pps * kPage, len);
  return SplitSpan{len, begin, min(len, begin + pps * kPage)};
}

// The tile's kRows query rows of sequence b (rows row0.., zero past p.rows) into shared memory at
// sq, 16-byte chunks swizzled (swz), by cp.async (the caller commits and waits).
template <int kRows>
__device__ __forceinline__ void load_q_tile(const Params& p, int b, int row0, uint32_t sq) {
  const __nv_bfloat16* qb = p.q + (int64_t)b * p.rows * kDim;  // q[b] is [rows, 576]
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i - r * kChunks, rg = row0 + r;
    cp_async16(sq + swz(r, c) * 16, rg < p.rows ? qb + (int64_t)rg * kDim + c * 8 : qb, rg < p.rows ? 16 : 0);
  }
}

__device__ __forceinline__ void load_stage(const __nv_bfloat16* kv, int page, int t, int t_end, uint32_t dst) {
  const __nv_bfloat16* src = kv + ((int64_t)page * kPage + (t & (kPage - 1))) * kDim;
  const int valid = t_end - t;
#pragma unroll
  for (int k = 0; k < kStageT * kChunks / kThreads; ++k) {
    const int i = threadIdx.x + k * kThreads, row = i / kChunks, c = i - row * kChunks;
    const bool ok = row < valid;
    cp_async16(dst + swz(row, c) * 16, ok ? src + i * 8 : src, ok ? 16 : 0);
  }
}
static_assert(kStageT * kChunks % kThreads == 0, "stage copy must split evenly over the threads");

// P V, in pieces that interleave with the score mma of the next stage. Warp w owns latent
// columns [64w, 64w + 64) of all 16*MT rows. First O *= alpha (the stage's rescale per row).
template <int MT>
__device__ __forceinline__ void pv_rescale(float (&acc)[MT][8][4], const float* sA) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int rt = 0; rt < MT; ++rt) {
    const float a0 = sA[rt * 16 + g], a1 = sA[rt * 16 + g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[rt][nt][0] *= a0; acc[rt][nt][1] *= a0; acc[rt][nt][2] *= a1; acc[rt][nt][3] *= a1;
    }
  }
}

// O += P[:, 16kk .. 16kk + 16) V[16kk .. 16kk + 16, cols of this warp). vbase: this lane's token
// row (+ its warp's 128-byte column block) in the stage buffer; v_off: its swizzled chunk per
// pair of 8-column tiles; pbase: this lane's ldmatrix row of P.
template <int MT>
__device__ __forceinline__ void pv_step(float (&acc)[MT][8][4], uint32_t pbase, uint32_t vbase,
                                        const uint32_t (&v_off)[4], int kk) {
  uint32_t b[4][4];
#pragma unroll
  for (int np = 0; np < 4; ++np)
    ldsm_x4_t(vbase + kk * 16 * kRowBytes + v_off[np], b[np][0], b[np][1], b[np][2], b[np][3]);
#pragma unroll
  for (int rt = 0; rt < MT; ++rt) {
    uint32_t a[4];
    ldsm_x4(pbase + (rt * 16 * kPStride + kk * 16) * 2, a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      mma_bf16(acc[rt][2 * np], a, b[np][0], b[np][1]);
      mma_bf16(acc[rt][2 * np + 1], a, b[np][2], b[np][3]);
    }
  }
}

// Scores of one pair kp of 16-dim k-steps (dims [32kp, 32kp + 32)) for the warp's row tile and
// kNPW 8-token tiles; with kChains = 2 even and odd k-steps accumulate separately.
template <int kNPW, int kChains>
__device__ __forceinline__ void s_step(float (&s2)[kNPW][kChains][4], uint32_t abase, uint32_t bbase,
                                       const uint32_t (&a_off)[2][2], const uint32_t (&b_off)[2], int kp) {
  uint32_t a0[4], a1[4];
  ldsm_x4(abase + (kp >> 1) * 128 + a_off[kp & 1][0], a0[0], a0[1], a0[2], a0[3]);
  ldsm_x4(abase + (kp >> 1) * 128 + a_off[kp & 1][1], a1[0], a1[1], a1[2], a1[3]);
#pragma unroll
  for (int n = 0; n < kNPW; ++n) {
    uint32_t bf[4];
    ldsm_x4(bbase + n * 8 * kRowBytes + (kp >> 1) * 128 + b_off[kp & 1], bf[0], bf[1], bf[2], bf[3]);
    mma_bf16(s2[n][0], a0, bf[0], bf[1]);
    mma_bf16(s2[n][kChains - 1], a1, bf[2], bf[3]);
  }
}

// Scaled, masked scores of stage tokens [t, t + 32) to sc; the warp's row maxima to sRed.
template <int kNPW, int kChains, int kRows>
__device__ __forceinline__ void s_finish(const float (&s2)[kNPW][kChains][4], float (&sc)[kNPW][4], float* sRed,
                                         const int (&limit)[2], int t, int t_end, float scale, int rt, int grp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kNPW; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1, tpos = t + (grp * kNPW + n) * 8 + 2 * c4 + (e & 1);
      const float v = (kChains == 2 ? s2[n][0][e] + s2[n][kChains - 1][e] : s2[n][0][e]) * scale;
      sc[n][e] = (tpos <= limit[half] && tpos < t_end) ? v : -INFINITY;
      mx[half] = fmaxf(mx[half], sc[n][e]);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
    mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
    if (c4 == 0) sRed[grp * kRows + rt * 16 + g + half * 8] = mx[half];
  }
}

// Online softmax step of a stage (after the barrier that publishes all group maxima): new
// running max per row (the same value in every warp of the row tile), p = exp(s - m) to shared
// bf16, the lane's partial row sums, and alpha = exp(m_old - m_new) to sAlpha (group 0 writes).
template <int kNPW, int kRows, int kGroups>
__device__ __forceinline__ void softmax_step(const float (&sc)[kNPW][4], const float* sRed, __nv_bfloat16* sP,
                                             float* sAlpha, float (&m_run)[2], float (&l_run)[2], int rt, int grp) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = rt * 16 + g + half * 8;
    float ms = sRed[r];
#pragma unroll
    for (int gi = 1; gi < kGroups; ++gi) ms = fmaxf(ms, sRed[gi * kRows + r]);
    const float m_new = fmaxf(m_run[half], ms);
    const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
    const float alpha = __expf(m_run[half] - base);
    m_run[half] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kNPW; ++n) {
      const float p0 = __expf(sc[n][2 * half] - base), p1 = __expf(sc[n][2 * half + 1] - base);
      sum += p0 + p1;
      *reinterpret_cast<uint32_t*>(sP + r * kPStride + (grp * kNPW + n) * 8 + 2 * c4) = pack_bf16(p0, p1);
    }
    l_run[half] = l_run[half] * alpha + sum;
    if (grp == 0 && c4 == 0) sAlpha[r] = alpha;
  }
}

// Normalised output of a CTA's 16*MT rows (after the barrier that publishes the row sums):
// row r's sum is sL[r] + sL[kRows + r] + ... over kGroups partial sums, in that order, sM[r] its
// max. One split: bf16 out and lse; several: fp32 partials and lse to the workspace.
template <int MT, int kGroups>
__device__ __forceinline__ void store_output(const Params& p, const float (&acc)[MT][8][4], const float* sL,
                                             const float* sM, int b, int split, int row0) {
  constexpr int kRows = 16 * MT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const bool split_out = p.splits > 1;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = i * 16 + g + half * 8, rg = row0 + r;
      if (rg >= p.rows) continue;
      float l = sL[r];
#pragma unroll
      for (int gi = 1; gi < kGroups; ++gi) l += sL[gi * kRows + r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t orow = split_out ? ((int64_t)b * p.splits + split) * p.rows + rg : (int64_t)b * p.rows + rg;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = warp * 64 + nt * 8 + 2 * c;
        const float v0 = acc[i][nt][half * 2] * inv, v1 = acc[i][nt][half * 2 + 1] * inv;
        if (split_out) {
          *reinterpret_cast<float2*>(p.ws_o + orow * kLat + col) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<uint32_t*>(p.out + orow * kLat + col) = pack_bf16(v0, v1);
        }
      }
    }
  }
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int rg = row0 + r;
    if (rg >= p.rows) continue;
    float l = sL[r];
#pragma unroll
    for (int gi = 1; gi < kGroups; ++gi) l += sL[gi * kRows + r];
    const float v = l > 0.f ? sM[r] + logf(l) : -INFINITY;
    if (split_out) p.ws_lse[((int64_t)b * p.splits + split) * p.rows + rg] = v;
    else p.lse[(int64_t)b * p.rows + rg] = v;
  }
}

template <int MT>
__device__ __forceinline__ void tile_body(const Params& p) {
  using PL = Plan<MT>;
  constexpr int kRows = PL::kRows, kStages = PL::kStages, kNPW = PL::kNPW, kGroups = PL::kGroups;
  constexpr int kChains = PL::kChains;
  static_assert(kStages >= 3, "the loop reads two stages while the ring refills a third");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_u32(smem), sk0 = sq + PL::kOffK, sp = sq + PL::kOffP;
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + PL::kOffP);
  float* sRed = reinterpret_cast<float*>(smem + PL::kOffRed);  // [kGroups][kRows]
  float* sAlpha = reinterpret_cast<float*>(smem + PL::kOffAlpha);
  float* sM = reinterpret_cast<float*>(smem + PL::kOffM);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * kRows;
  const SplitSpan span = split_tokens(p, b, split);
  const int len = span.len, t_begin = span.begin, t_end = span.end;
  const int n_st = (t_end - t_begin + kStageT - 1) / kStageT;
  const int32_t* pages = p.pt + (int64_t)b * p.max_pages;

  load_q_tile<kRows>(p, b, row0, sq);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_st) {
      const int t = t_begin + s * kStageT;
      load_stage(p.kv, pages[t / kPage], t, t_end, sk0 + s * kStageBytes);
    }
    cp_async_commit();
  }
  // page id of the next stage to issue, read one stage ahead so its latency hides behind compute
  int pg_next = kStages - 1 < n_st ? pages[(t_begin + (kStages - 1) * kStageT) / kPage] : 0;

  // S phase role: row tile rt, score tiles [grp * kNPW, grp * kNPW + kNPW) of 8 tokens.
  const int rt = warp / kGroups, grp = warp % kGroups;
  const bool s_warp = PL::kAllScore || rt < MT;  // warp-uniform
  const int arow = rt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;  // arow & 7 == lane & 7
  // Q / K chunk 8j + x of 16-dim k-step pair kp: j = kp / 2, x = 4 (kp & 1) + lane part; swizzled
  uint32_t a_off[2][2], b_off[2], v_off[4];
#pragma unroll
  for (int par = 0; par < 2; ++par) {
#pragma unroll
    for (int h = 0; h < 2; ++h) a_off[par][h] = ((4 * par + 2 * h + (lane >> 4)) ^ (lane & 7)) * 16;
    b_off[par] = ((4 * par + (lane >> 3)) ^ (lane & 7)) * 16;
  }
#pragma unroll
  for (int np = 0; np < 4; ++np) v_off[np] = ((np * 2 + (lane >> 4)) ^ (lane & 7)) * 16;  // chunk 8w + 2np + .
  const uint32_t abase = sq + arow * kRowBytes;
  const int bro = (grp * kNPW * 8 + (lane & 7)) * kRowBytes;
  const int vro = ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes + warp * 128;
  const uint32_t pbase = sp + (((lane & 7) + ((lane >> 3) & 1) * 8) * kPStride + (lane >> 4) * 8) * 2;
  int limit[2];  // last visible cache position of rows rt*16 + g (+8); -1: padding row
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rg = row0 + rt * 16 + g + half * 8;
    limit[half] = (s_warp && rg < p.rows) ? len - p.s_q + rg / p.heads : -1;
  }

  float acc[MT][8][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.f;

  // Software pipeline: iteration j computes the scores of stage j + 1 interleaved with P V of
  // stage j, then (after one barrier) the softmax of stage j + 1; two barriers per stage.
  float sc[kNPW][4];
  float s2[kNPW][kChains][4];
  if (n_st > 0) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // Q and stage 0 landed
    if (s_warp) {
#pragma unroll
      for (int n = 0; n < kNPW; ++n)
#pragma unroll
        for (int ch = 0; ch < kChains; ++ch)
#pragma unroll
          for (int e = 0; e < 4; ++e) s2[n][ch][e] = 0.f;
#pragma unroll
      for (int kp = 0; kp < kDim / 32; ++kp) s_step<kNPW, kChains>(s2, abase, sk0 + bro, a_off, b_off, kp);
      s_finish<kNPW, kChains, kRows>(s2, sc, sRed, limit, t_begin, t_end, p.scale, rt, grp);
    }
    __syncthreads();  // group maxima of stage 0 visible
    if (s_warp) softmax_step<kNPW, kRows, kGroups>(sc, sRed, sP, sAlpha, m_run, l_run, rt, grp);
  }
  for (int j = 0; j < n_st; ++j) {
    cp_async_wait<kStages - 3>();
    __syncthreads();  // stage j + 1 landed; P, alpha of stage j visible; the buffer of stage j - 1 is free
    const int nxt = j + kStages - 1;
    if (nxt < n_st) load_stage(p.kv, pg_next, t_begin + nxt * kStageT, t_end, sk0 + (nxt % kStages) * kStageBytes);
    cp_async_commit();
    if (nxt + 1 < n_st) pg_next = pages[(t_begin + (nxt + 1) * kStageT) / kPage];
    const uint32_t sk = sk0 + (j % kStages) * kStageBytes, sk_next = sk0 + ((j + 1) % kStages) * kStageBytes;
    const bool scores_next = s_warp && j + 1 < n_st;  // warp-uniform
    pv_rescale<MT>(acc, sAlpha);
    if (scores_next) {
#pragma unroll
      for (int n = 0; n < kNPW; ++n)
#pragma unroll
        for (int ch = 0; ch < kChains; ++ch)
#pragma unroll
          for (int e = 0; e < 4; ++e) s2[n][ch][e] = 0.f;
#pragma unroll
      for (int kp = 0; kp < kDim / 32; ++kp) {
        s_step<kNPW, kChains>(s2, abase, sk_next + bro, a_off, b_off, kp);
        if (kp == 5) pv_step<MT>(acc, pbase, sk + vro, v_off, 0);
        if (kp == 11) pv_step<MT>(acc, pbase, sk + vro, v_off, 1);
      }
      s_finish<kNPW, kChains, kRows>(s2, sc, sRed, limit, t_begin + (j + 1) * kStageT, t_end, p.scale, rt, grp);
    } else {
      pv_step<MT>(acc, pbase, sk + vro, v_off, 0);
      pv_step<MT>(acc, pbase, sk + vro, v_off, 1);
    }
    __syncthreads();  // group maxima of stage j + 1 visible; P of stage j fully read
    if (scores_next) softmax_step<kNPW, kRows, kGroups>(sc, sRed, sP, sAlpha, m_run, l_run, rt, grp);
  }
  cp_async_wait<0>();
  __syncthreads();  // the loop's last softmax read sRed

  // Row sums: lanes of a row, then groups in order.
  if (s_warp) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_run[half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = rt * 16 + g + half * 8;
      if (c4 == 0) {
        sRed[grp * kRows + r] = l;
        if (grp == 0) sM[r] = m_run[half];
      }
    }
  }
  __syncthreads();

  store_output<MT, kGroups>(p, acc, sRed, sM, b, split, row0);
}

// ---- k-split CTA (16 or 32 rows: S_q * H <= 32, the memory-bound shapes) ----
// Q stays in registers: warp w holds the A fragments of dims [144 (w & 3), 144 (w & 3) + 144) (9
// k-steps) for all 16*MT rows, and computes the partial scores of that slice for tokens
// [16 (w >> 2), 16 (w >> 2) + 16) of the stage. Every K element is read from shared memory once per
// stage and no Q fragment is re-read; the four fp32 partials of a score meet in shared memory and
// are summed in slice order by the softmax lanes. P V is the same as in tile_body.

// Partial scores of the warp's slice: k-step i of 9 for its 16 tokens (two 8-token tiles).
// krow: this lane's ldmatrix token row in the stage; kcol: its unswizzled byte column of k-step 0.
template <int MT>
__device__ __forceinline__ void ks_step(float (&s)[MT][2][4], const uint32_t (&qa)[MT][9][4], uint32_t krow,
                                        uint32_t kcol, uint32_t xr, int i) {
  uint32_t bf[4];  // {tile 0 dims 0-7, tile 0 dims 8-15, tile 1 dims 0-7, tile 1 dims 8-15} of the k-step
  ldsm_x4(krow + ((kcol + i * 32) ^ xr), bf[0], bf[1], bf[2], bf[3]);
#pragma unroll
  for (int rt = 0; rt < MT; ++rt) {
    mma_bf16(s[rt][0], qa[rt][i], bf[0], bf[1]);
    mma_bf16(s[rt][1], qa[rt][i], bf[2], bf[3]);
  }
}

// The warp's partial scores to its slice's block of sPart ([slice][row][kSStride] fp32).
template <int MT>
__device__ __forceinline__ void ks_store_partial(const float (&s)[MT][2][4], float* sPart, int slice, int th) {
  constexpr int kRows = 16 * MT, kSS = PlanKS<MT>::kSStride;
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
  float* part = sPart + slice * kRows * kSS + th * 16 + 2 * c4;
#pragma unroll
  for (int rt = 0; rt < MT; ++rt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      *reinterpret_cast<float2*>(part + (rt * 16 + g) * kSS + nt * 8) = make_float2(s[rt][nt][0], s[rt][nt][1]);
      *reinterpret_cast<float2*>(part + (rt * 16 + g + 8) * kSS + nt * 8) = make_float2(s[rt][nt][2], s[rt][nt][3]);
    }
}

// Online softmax of a stage (after the barrier that publishes the partials): this lane owns row sr,
// tokens [st0, st0 + kTPL) of the stage starting at cache position t. Score = (slice 0 + 1 + 2 + 3)
// * scale, masked; the row max over the row's kLPR lanes by shuffles; p = exp(s - m) to shared bf16;
// the lane's partial row sum; alpha = exp(m_old - m_new) to sAlpha.
template <int MT>
__device__ __forceinline__ void ks_softmax(const float* sPart, __nv_bfloat16* sP, float* sAlpha, int sr, int st0,
                                           int limit, int t, int t_end, float scale, float& m_run, float& l_run) {
  using PL = PlanKS<MT>;
  constexpr int kRows = PL::kRows, kSS = PL::kSStride, kTPL = PL::kTPL, kLPR = PL::kLPR;
  float s[kTPL];
#pragma unroll
  for (int sl = 0; sl < PL::kSlices; ++sl) {
    const float* src = sPart + (sl * kRows + sr) * kSS + st0;
    float v[kTPL];
    if constexpr (kTPL == 4) {
      const float4 x = *reinterpret_cast<const float4*>(src);
      v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
    } else {
      static_assert(kTPL == 2, "2 or 4 tokens per lane");
      const float2 x = *reinterpret_cast<const float2*>(src);
      v[0] = x.x; v[1] = x.y;
    }
#pragma unroll
    for (int e = 0; e < kTPL; ++e) s[e] = sl == 0 ? v[e] : s[e] + v[e];
  }
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < kTPL; ++e) {
    const int tpos = t + st0 + e;
    s[e] = (tpos <= limit && tpos < t_end) ? s[e] * scale : -INFINITY;
    mx = fmaxf(mx, s[e]);
  }
#pragma unroll
  for (int off = kLPR / 2; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float m_new = fmaxf(m_run, mx);
  const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
  const float alpha = __expf(m_run - base);
  m_run = m_new;
  float sum = 0.f;
  uint32_t pk[kTPL / 2];
#pragma unroll
  for (int e = 0; e < kTPL; e += 2) {
    const float p0 = __expf(s[e] - base), p1 = __expf(s[e + 1] - base);
    sum += p0 + p1;
    pk[e / 2] = pack_bf16(p0, p1);
  }
  if constexpr (kTPL == 4) {
    *reinterpret_cast<uint2*>(sP + sr * kPStride + st0) = make_uint2(pk[0], pk[1]);
  } else {
    *reinterpret_cast<uint32_t*>(sP + sr * kPStride + st0) = pk[0];
  }
  l_run = l_run * alpha + sum;
  if ((threadIdx.x & (kLPR - 1)) == 0) sAlpha[sr] = alpha;
}

template <bool B>
struct BoolC {
  static constexpr bool value = B;
};

template <int MT>
__device__ __forceinline__ void ksplit_body(const Params& p) {
  using PL = PlanKS<MT>;
  constexpr int kRows = PL::kRows, kStages = PL::kStages, kLPR = PL::kLPR, kSteps = PL::kStepsPerSlice;
  static_assert(kSteps == 9, "ks_step's fragment arrays hold 9 k-steps");
  static_assert(kStages >= 5, "three stages are read per phase while two more are in flight");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_u32(smem), sk0 = sq + PL::kOffK, sp = sq + PL::kOffP;
  float* sPart = reinterpret_cast<float*>(smem);  // aliases the Q tile once Q is in registers
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + PL::kOffP);
  float* sAlpha = reinterpret_cast<float*>(smem + PL::kOffAlpha);
  float* sL = reinterpret_cast<float*>(smem + PL::kOffL);
  float* sM = reinterpret_cast<float*>(smem + PL::kOffM);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * kRows;
  const SplitSpan span = split_tokens(p, b, split);
  const int len = span.len, t_begin = span.begin, t_end = span.end;
  const int n_st = (t_end - t_begin + kStageT - 1) / kStageT;
  const int32_t* pages = p.pt + (int64_t)b * p.max_pages;

  load_q_tile<kRows>(p, b, row0, sq);
#pragma unroll
  for (int s = 0; s < kStages - 3; ++s) {  // phase j issues stage j + kStages - 1, from phase -2 on
    if (s < n_st) {
      const int t = t_begin + s * kStageT;
      load_stage(p.kv, pages[t / kPage], t, t_end, sk0 + s * kStageBytes);
    }
    cp_async_commit();
  }
  int pg_next = kStages - 3 < n_st ? pages[(t_begin + (kStages - 3) * kStageT) / kPage] : 0;

  // Score role: dims slice (9 k-steps from k-step 9 * slice), tokens [16 th, 16 th + 16) of a stage.
  // Swizzle (mla_decode.cuh): 16-byte chunk c of row r sits at slot c ^ (r & 7); every ldmatrix row
  // used here has r & 7 == lane & 7, so the byte column is (unswizzled column) ^ xr.
  const int slice = warp & 3, th = warp >> 2;
  const uint32_t xr = (lane & 7) * 16;
  const uint32_t kcol = slice * kSteps * 32 + ((lane >> 3) & 1) * 16;  // K: dims 0-7 / 8-15 of a k-step
  const uint32_t krow = (th * 16 + (lane & 7) + (lane >> 4) * 8) * kRowBytes;  // K: tile 0 / tile 1 rows
  // P V role (as tile_body): V rows of a 16-token k-step, 128-byte column block of the warp.
  uint32_t v_off[4];
#pragma unroll
  for (int np = 0; np < 4; ++np) v_off[np] = ((np * 2 + (lane >> 4)) ^ (lane & 7)) * 16;
  const int vro = ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes + warp * 128;
  const uint32_t pbase = sp + (((lane & 7) + ((lane >> 3) & 1) * 8) * kPStride + (lane >> 4) * 8) * 2;
  // Softmax role: row sr, tokens [st0, st0 + kTPL).
  const int sr = warp * PL::kRPW + lane / kLPR, st0 = (lane & (kLPR - 1)) * PL::kTPL;
  const int limit = row0 + sr < p.rows ? len - p.s_q + (row0 + sr) / p.heads : -1;  // -1: padding row
  float m_run = -INFINITY, l_run = 0.f;

  float acc[MT][8][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.f;

  uint32_t qa[MT][kSteps][4];
  float s[MT][2][4];
  // Phase j (between two barriers): the softmax of stage j + 1 (doSM), the partial scores of stage
  // j + 2 (doS) and P V of stage j (doPV). They touch disjoint buffers (partials, P and alpha by
  // stage parity), so one barrier per stage orders everything and the softmax latency hides
  // behind the mma of the other two. kAll: all three (the steady state, no branches).
  auto phase = [&](auto all, int j) {
    constexpr bool kAll = decltype(all)::value;
    const bool doS = kAll || j + 2 < n_st, doSM = kAll || (j + 1 >= 0 && j + 1 < n_st), doPV = kAll || j >= 0;
    cp_async_wait<kStages - 4>();
    __syncthreads();  // stage j + 2 landed; partials of j + 1, P and alpha of j visible; stage j - 1 free
    const int nxt = j + kStages - 1;
    if (nxt < n_st) load_stage(p.kv, pg_next, t_begin + nxt * kStageT, t_end, sk0 + (nxt % kStages) * kStageBytes);
    cp_async_commit();
    if (nxt + 1 < n_st) pg_next = pages[(t_begin + (nxt + 1) * kStageT) / kPage];
    const uint32_t skv = sk0 + ((j + kStages) % kStages) * kStageBytes + vro;
    const uint32_t skk = sk0 + ((j + 2) % kStages) * kStageBytes + krow;
    const uint32_t pb = pbase + (j & 1) * PL::kPElems * 2;
    if (doPV) pv_rescale<MT>(acc, sAlpha + (j & 1) * kRows);
    if (doS) {
#pragma unroll
      for (int rt = 0; rt < MT; ++rt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) s[rt][nt][0] = s[rt][nt][1] = s[rt][nt][2] = s[rt][nt][3] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (doS) ks_step<MT>(s, qa, skk, kcol, xr, i);
      if (i == 1 && doPV) pv_step<MT>(acc, pb, skv, v_off, 0);
      if (i == 3 && doSM) {
        const int o = (j + 1) & 1;
        ks_softmax<MT>(sPart + o * PL::kPartFloats, sP + o * PL::kPElems, sAlpha + o * kRows, sr, st0, limit,
                       t_begin + (j + 1) * kStageT, t_end, p.scale, m_run, l_run);
      }
      if (i == 5 && doPV) pv_step<MT>(acc, pb, skv, v_off, 1);
    }
    if (doS) ks_store_partial<MT>(s, sPart + ((j + 2) & 1) * PL::kPartFloats, slice, th);
  };
  if (n_st > 0) {
    cp_async_wait<kStages - 4>();
    __syncthreads();  // Q and stage 0 landed
    {
      const uint32_t qrow = sq + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRowBytes;
      const uint32_t qcol = slice * kSteps * 32 + (lane >> 4) * 16;  // Q: dims 0-7 / 8-15 of a k-step
#pragma unroll
      for (int rt = 0; rt < MT; ++rt)
#pragma unroll
        for (int i = 0; i < kSteps; ++i)
          ldsm_x4(qrow + rt * 16 * kRowBytes + ((qcol + i * 32) ^ xr), qa[rt][i][0], qa[rt][i][1], qa[rt][i][2],
                  qa[rt][i][3]);
    }
    // The barrier that opens phase -2 also ends the Q reads before the first partials overwrite Q.
    phase(BoolC<false>{}, -2);
    phase(BoolC<false>{}, -1);
    int j = 0;
    for (; j + 2 < n_st; ++j) phase(BoolC<true>{}, j);
    for (; j < n_st; ++j) phase(BoolC<false>{}, j);
  }
  cp_async_wait<0>();

  // Row sums: the kLPR lanes of a row by a butterfly (every lane gets the same value).
#pragma unroll
  for (int off = 1; off < kLPR; off <<= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, off);
  if ((lane & (kLPR - 1)) == 0) {
    sL[sr] = l_run;
    sM[sr] = m_run;
  }
  __syncthreads();
  store_output<MT, 1>(p, acc, sL, sM, b, split, row0);
}

// 16 and 32 rows take the k-split CTA (Q in registers); 48 and 64 rows the row-tile CTA.
template <int MT>
constexpr bool kKSplit = MT <= 2;

template <int MT>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(Params p) {
  if constexpr (kKSplit<MT>) ksplit_body<MT>(p);
  else tile_body<MT>(p);
}

template <int MT>
constexpr int smem_bytes() {
  if constexpr (kKSplit<MT>) return PlanKS<MT>::kBytes;
  else return Plan<MT>::kBytes;
}

}  // namespace dsx_mla

#include "mla_decode_wgmma.cuh"

namespace dsx_mla {

// Merge the split partials of one (b, row), splits in order: out = sum_s w_s o_s / sum_s w_s,
// w_s = exp(lse_s - max lse). 128 threads x 4 columns.
__global__ void __launch_bounds__(128) mla_combine_kernel(Params p) {
  const int rg = blockIdx.x, b = blockIdx.y;
  const int64_t base = (int64_t)b * p.splits * p.rows + rg;
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, p.ws_lse[base + (int64_t)s * p.rows]);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.splits; ++s) {
      const float w = __expf(p.ws_lse[base + (int64_t)s * p.rows] - m);
      if (w == 0.f) continue;  // an empty split's partial is never read
      const float4 v = reinterpret_cast<const float4*>(p.ws_o + (base + (int64_t)s * p.rows) * kLat)[threadIdx.x];
      wsum += w;
      o.x += w * v.x; o.y += w * v.y; o.z += w * v.z; o.w += w * v.w;
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const int64_t orow = (int64_t)b * p.rows + rg;
  uint2 packed = make_uint2(pack_bf16(o.x * inv, o.y * inv), pack_bf16(o.z * inv, o.w * inv));
  reinterpret_cast<uint2*>(p.out + orow * kLat)[threadIdx.x] = packed;
  if (threadIdx.x == 0) p.lse[orow] = wsum > 0.f ? m + logf(wsum) : -INFINITY;
}

template <int MT>
cudaError_t launch(const Params& p, int row_tiles, int batch, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      mla_decode_kernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<MT>());
  if (attr != cudaSuccess) return attr;
  mla_decode_kernel<MT><<<dim3(row_tiles, p.splits, batch), kThreads, smem_bytes<MT>(), stream>>>(p);
  return cudaGetLastError();
}

using dsx_cuda::tensor_map_encoder;  // (sm90_ptx.cuh)

// The cache as a 3-D tensor (576 dims, 64 tokens, num_pages); a box is one 64-dim block of a page,
// [64 tokens][128 B] with the 128-byte swizzle: the k-block-major layout of wswz.
static bool encode_kv_map(CUtensorMap* map, const void* kv, int64_t num_pages) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode || num_pages < 1 || num_pages > ((int64_t)1 << 31) - 1) return false;
  const cuuint64_t dims[3] = {(cuuint64_t)kDim, (cuuint64_t)kPage, (cuuint64_t)num_pages};
  const cuuint64_t strides[2] = {(cuuint64_t)kRowBytes, (cuuint64_t)kPage * kRowBytes};
  const cuuint32_t box[3] = {64, (cuuint32_t)kPage, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(kv), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int LM>
cudaError_t launch_wgmma_lm(const Params& p, const CUtensorMap& map, int row_tiles, int batch, cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(mla_decode_wgmma_kernel<LM>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, PlanWG::kAlloc);
  if (attr != cudaSuccess) return attr;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(LM == 2 ? (row_tiles + 1) & ~1 : row_tiles, p.splits, batch);  // pairs: an odd count gets a
  cfg.blockDim = dim3(kWThreads);                                                    // padding tile (no rows)
  cfg.dynamicSmemBytes = PlanWG::kAlloc;
  cfg.stream = stream;
  dsx_launch::Attrs attrs;
  attrs.set(cfg, LM == 2 ? 2 : 1);
  return cudaLaunchKernelEx(&cfg, mla_decode_wgmma_kernel<LM>, p, map);
}

// Can this device co-schedule the 2-CTA clusters of load mode 2 at this kernel's shared memory? (A
// partitioned GPU or a context limited to a few SMs may not.) Asked once per device, before any launch,
// so that a refusal never reaches a stream that is being captured into a graph.
static bool pairs_schedulable() {
  static std::atomic<int> known[64];  // per device: 0 not asked yet, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int k = known[dev].load(std::memory_order_relaxed);
  if (k == 0) {
    int clusters = 0;
    const bool ok = cudaFuncSetAttribute(mla_decode_wgmma_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         PlanWG::kAlloc) == cudaSuccess &&
                    dsx_launch::max_active_clusters(&clusters, mla_decode_wgmma_kernel<2>, 2, kWThreads,
                                                    PlanWG::kAlloc) == cudaSuccess &&
                    clusters > 0;
    if (!ok) (void)cudaGetLastError();  // the query's error is not the caller's
    k = ok ? 1 : 2;
    known[dev].store(k, std::memory_order_relaxed);
  }
  return k == 1;
}

// The load mode of a call: DSX_MLA_WG_LOADS (compile time, default 2), lowered to 1 when pairs cannot be
// scheduled and to 0 when there is no tensor-map encoder. The environment variable DSX_MLA_LOADS=0|1|2
// (diagnostics and tests) caps it further; every mode gives the same bits.
static int load_mode(bool have_map) {
  int lm = DSX_MLA_WG_LOADS;
  if (const char* e = std::getenv("DSX_MLA_LOADS"))
    if (e[0] >= '0' && e[0] <= '2' && e[1] == 0) lm = std::min(lm, e[0] - '0');
  if (!have_map) return 0;
  if (lm == 2 && !pairs_schedulable()) lm = 1;
  return lm;
}

cudaError_t launch_wgmma(const Params& p, int64_t num_pages, int row_tiles, int batch, cudaStream_t stream) {
  CUtensorMap map{};
  const bool have_map = DSX_MLA_WG_LOADS != 0 && encode_kv_map(&map, p.kv, num_pages);  // no driver entry: cp.async
  switch (load_mode(have_map)) {
    case 0: return launch_wgmma_lm<0>(p, map, row_tiles, batch, stream);
    case 1: return launch_wgmma_lm<1>(p, map, row_tiles, batch, stream);
    default: return launch_wgmma_lm<2>(p, map, row_tiles, batch, stream);
  }
}

int row_tile_mt(int rows) { return rows >= 64 ? 4 : (rows + 15) / 16; }

// Split count (one CTA per SM): the smallest count whose CTAs fill their waves to >= 90%,
// else the most efficient one up to kMaxSplits; never more splits than pages.
int choose_splits(int64_t ctas, int64_t max_pages, int requested) {
  int n = requested;
  if (n <= 0) {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                  cudaSuccess)
      sms = 132;
    n = 1;
    double best = 0.0;
    for (int s = 1; s <= kMaxSplits && s <= max_pages; ++s) {
      const int64_t c = ctas * s, waves = (c + sms - 1) / sms;
      const double eff = double(c) / double(waves * sms);
      if (eff >= 0.9) { n = s; break; }
      if (eff > best + 1e-9) { best = eff; n = s; }
    }
  }
  n = (int)std::min<int64_t>(std::min<int64_t>(n, kMaxSplits), max_pages);
  const int64_t pages_per = (max_pages + n - 1) / n;  // drop splits that would be empty for every b
  return (int)((max_pages + pages_per - 1) / pages_per);
}

bool bad_sizes(int64_t batch, int64_t s_q, int64_t heads, int64_t max_pages) {
  return batch < 0 || batch > 65535 || s_q < 1 || s_q > 6 || heads < 1 || heads > 128 || max_pages < 1 ||
         max_pages * kPage > (int64_t)1 << 30;
}

}  // namespace dsx_mla

using namespace dsx_mla;

extern "C" int dsx_mla_decode_workspace_cuda(int64_t batch, int64_t s_q, int64_t heads, int64_t max_pages,
                                             int num_splits, int* num_splits_out, int64_t* bytes) {
  if (bad_sizes(batch, s_q, heads, max_pages) || num_splits < 0 || !num_splits_out || !bytes) return DSX_EINVAL;
  const int rows = (int)(s_q * heads), mt = row_tile_mt(rows), row_tiles = (rows + 16 * mt - 1) / (16 * mt);
  const int splits = choose_splits(batch * row_tiles, max_pages, num_splits);
  *num_splits_out = splits;
  *bytes = splits > 1 ? batch * splits * rows * (int64_t)(kLat + 1) * 4 : 0;
  return DSX_OK;
}

extern "C" int dsx_mla_decode_paged_bf16_cuda(const void* q, const void* kv_cache, const void* page_table,
                                              const void* cache_lens, void* out, void* lse, int64_t batch,
                                              int64_t s_q, int64_t heads, int64_t num_pages, int64_t max_pages,
                                              float softmax_scale, int num_splits, void* workspace,
                                              int64_t workspace_bytes, void* stream) {
  int splits = 0;
  int64_t need = 0;
  if (num_pages < 1 || !std::isfinite(softmax_scale)) return DSX_EINVAL;
  if (dsx_mla_decode_workspace_cuda(batch, s_q, heads, max_pages, num_splits, &splits, &need) != DSX_OK)
    return DSX_EINVAL;
  if (batch == 0) return DSX_OK;
  if (!q || !kv_cache || !page_table || !cache_lens || !out || !lse) return DSX_EINVAL;
  const auto misaligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0; };
  if (misaligned(q) || misaligned(kv_cache) || misaligned(out) || (need > 0 && misaligned(workspace)))
    return DSX_EINVAL;  // 16-byte copies and stores
  if (need > 0 && (!workspace || workspace_bytes < need)) return DSX_EINVAL;
  Params p{};
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.kv = static_cast<const __nv_bfloat16*>(kv_cache);
  p.pt = static_cast<const int32_t*>(page_table);
  p.lens = static_cast<const int32_t*>(cache_lens);
  p.out = static_cast<__nv_bfloat16*>(out);
  p.lse = static_cast<float*>(lse);
  p.s_q = (int)s_q;
  p.heads = (int)heads;
  p.rows = (int)(s_q * heads);
  p.max_pages = (int)max_pages;
  p.splits = splits;
  p.scale = softmax_scale;
  if (splits > 1) {
    p.ws_o = static_cast<float*>(workspace);
    p.ws_lse = p.ws_o + batch * splits * p.rows * (int64_t)kLat;
  }
  const int mt = row_tile_mt(p.rows), row_tiles = (p.rows + 16 * mt - 1) / (16 * mt);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err;
  if (p.rows > kWRows) err = launch_wgmma(p, num_pages, row_tiles, (int)batch, s);  // 64-row tiles, as mt = 4
  else switch (mt) {
    case 1: err = launch<1>(p, row_tiles, (int)batch, s); break;
    case 2: err = launch<2>(p, row_tiles, (int)batch, s); break;
    case 3: err = launch<3>(p, row_tiles, (int)batch, s); break;
    default: err = launch<4>(p, row_tiles, (int)batch, s); break;
  }
  if (err == cudaSuccess && splits > 1) {
    mla_combine_kernel<<<dim3(p.rows, (unsigned)batch), 128, 0, s>>>(p);
    err = cudaGetLastError();
  }
  return err == cudaSuccess ? DSX_OK : DSX_ECUDA;
}
