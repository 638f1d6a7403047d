// MLA decode, the wgmma path (more than 64 query rows: H = 128 and the like, compute-bound):
// mla_decode_wgmma_kernel and its warpgroup roles. Included by mla_decode.cu after the mma.sync path,
// inside namespace dsx_mla (it uses Params, SplitSpan and the helpers of mla_decode.cuh); the host side
// that launches it (launch_wgmma) is in mla_decode.cu.
#pragma once

namespace dsx_mla {


// ---- wgmma path: rows > 64 (H = 128 and the like, compute-bound) ----
// CTA = 64 query rows x one split of one sequence, three warpgroups (384 threads), one 64-token
// page per step through three page buffers (3 x 72 KB). Pages are stored k-block-major (see wswz).
//  - Warpgroup 0 (S and softmax; 184 registers): Q dims 0-495 as wgmma A fragments in registers
//    (31 k-steps, 124 registers), dims 496-575 in shared memory. At the start the P V warpgroups copy
//    the CTA's Q rows into page buffer 2 (idle until page 2, whose load waits until Q is read, in both
//    CTAs of a pair) and warpgroup 0 takes its fragments by 31 ldmatrix.x4 per thread (DSX_MLA_QSMEM;
//    0: 124 4-byte loads from global memory per thread). Page j: S = Q K^T (64 x 64: 31
//    wgmma m64n64k16 with A from registers, 5 with A from shared memory), the online softmax in
//    registers (a row's 64 scores sit in one lane quad), then bf16 P into the rope block of page
//    j's buffer (S no longer needs it) and alpha per row; then on to page j + 1. The softmax works
//    in log2 units (scale * log2 e folded into the scores, p = 2^(s - m) by ex2.approx) and masks
//    only pages that are not fully visible.
//  - Warpgroups 1 and 2 (P V and loads; 160 registers): O = alpha O + P V for latent columns
//    [256 (w - 1), 256 w) (64 x 256 fp32, 128 registers a thread); A = P, B = V (the first 512 dims
//    of the page buffer, MN-major). A warp skips O *= alpha when alpha is 1 for all its rows (the
//    running max did not move: the common case). P V of page j waits until the scores of page j + 1
//    are done (s_done), so it runs on the tensor cores while warpgroup 0 does the softmax of page
//    j + 1 instead of competing with its S (measured: the order matters only with the skip above).
//    After P V of page j the buffer is refilled with page j + 3 (DSX_MLA_WG_LOADS):
//      2 (default) TMA multicast in CTA pairs (clusters of 2 along the row tiles, which read the
//        same pages): every P V warp of both CTAs arrives on the buffer's `empty` mbarrier of both
//        CTAs; one thread per CTA then issues 5 (rank 0) or 4 (rank 1) 64-dim blocks of the page
//        into both CTAs' buffers. A page crosses from L2 once per pair, not once per CTA.
//      1 TMA per CTA (one thread, all 9 blocks); 0 cp.async by the P V warpgroups (the fallback
//        where the driver's tensor-map encoder is missing).
//    TMA copies whole pages: the V rows past the sequence's end (the last page) are zeroed in shared
//    memory before P V (unused slots may hold NaN; their scores are masked anyway).
// mbarriers per page buffer: full (page landed: expect_tx, or 256 cp.async arrivals), p_full (P
// and alpha written: 128 arrivals), empty (buffer free: 8 P V warps, x 2 CTAs with pairs), s_done
// (S of the page done: 128); once: q_full (Q staged: 256 cp.async arrivals), q_free (Q read from
// buffer 2: 4 warps, x 2 CTAs with pairs). Row sums and maxima stay in warpgroup 0's registers.
constexpr int kWThreads = 384;

// cp.async of chunks [C0, C0 + N) of each token of a page (whole 64-dim blocks).
template <int C0, int N>
__device__ __forceinline__ void wg_load_chunks(const __nv_bfloat16* kv, int page, int t, int t_end, uint32_t dst,
                                               int wtid) {
  const __nv_bfloat16* src = kv + (int64_t)page * kPage * kDim;
  const int valid = t_end - t;  // t is page-aligned; tokens at or past t_end are zero-filled (read nothing)
  static_assert(kPage * N % 128 == 0, "the copy must split evenly over the warpgroup");
#pragma unroll 1
  for (int k = 0; k < kPage * N / 128; ++k) {
    const int i = wtid + k * 128, row = i / N, c = C0 + i - row * N;
    const bool ok = row < valid;
    cp_async16(dst + wswz(row, c), ok ? src + row * kDim + c * 8 : src, ok ? 16 : 0);
  }
}

// How the page buffers are filled (LM): 0 cp.async by the P V warpgroups; 1 TMA, one thread of
// warpgroup 1 issues the 9 blocks of a page; 2 TMA multicast in CTA pairs (clusters of 2: the two
// row tiles x, x ^ 1 of one sequence and split, which read the same pages): each CTA issues 5 or 4
// of the 9 blocks into both CTAs' buffers, so each page crosses from L2 once per pair.
#ifndef DSX_MLA_SKIP1
#define DSX_MLA_SKIP1 1  // 1: a P V warp skips O *= alpha when alpha is 1 for all its rows
#endif
#ifndef DSX_MLA_SMX
#define DSX_MLA_SMX 1  // 1: softmax in log2 units (scale * log2 e folded), no masking on fully visible pages
#endif
#ifndef DSX_MLA_PVLAG
#define DSX_MLA_PVLAG 1  // P V of page j starts once the scores of page j + 1 are done (1) or issued (2)
#endif
#ifndef DSX_MLA_WG_LOADS
#define DSX_MLA_WG_LOADS 2  // the default; 0 and 1 stay buildable for same-run comparisons (alt builds)
#endif
#ifndef DSX_MLA_QSMEM
#define DSX_MLA_QSMEM 1  // 1: Q staged in page buffer 2, A fragments by ldmatrix; 0: 124 4-byte __ldg per thread
#endif

// The CTA's 64 Q rows into shared memory by the 256 P V threads (qt = 0..255; 18 16-byte cp.async each,
// padding rows zero-filled), in 9 blocks of 64 dims: thread qt copies chunk qt & 7 of rows qt / 8 and
// qt / 8 + 32 of every block (a warp: four whole 128-byte row pieces). Dims 0-495 go to sQ (a page buffer,
// layout wswz), dims 496-511 to sQ31 (32-byte swizzle), the rope to sQR (one block, layout wswz).
__device__ __forceinline__ void wg_stage_q(const Params& p, int b, int row0, uint32_t sQ, uint32_t sQ31,
                                           uint32_t sQR, int qt) {
  const __nv_bfloat16* qb = p.q + (int64_t)b * p.rows * kDim;  // q[b] is [rows, 576]
  const int c = qt & 7, ra = qt >> 3;
  const uint32_t so = ra * 128 + ((c ^ (ra & 7)) << 4);               // rows ra and ra + 32 share r & 7
  const uint32_t so31 = ra * 32 + (((c & 1) ^ ((ra >> 2) & 1)) << 4);  // c = 6, 7: chunk c - 6 of the two
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rg = row0 + ra + 32 * h;
    const bool ok = rg < p.rows;
    const __nv_bfloat16* src = qb + (ok ? (int64_t)rg * kDim : 0) + c * 8;
#pragma unroll
    for (int blk = 0; blk < kDim / 64; ++blk) {
      uint32_t dst = (blk < 8 ? sQ + blk * kKBBytes : sQR) + so + h * 32 * 128;
      if (blk == 7 && c >= 6) dst = sQ31 + so31 + h * 32 * 32;
      cp_async16(dst, src + blk * 64, ok ? 16 : 0);
    }
  }
}

template <int ROLE, int LM>
__device__ __forceinline__ void wg_role(const Params& p, const CUtensorMap* tmap);

template <int LM>
__global__ void __launch_bounds__(kWThreads, 1) mla_decode_wgmma_kernel(const Params p,
                                                                        const __grid_constant__ CUtensorMap tmap) {
  // Each warpgroup's role is one branch, its register budget set first (184 + 2 x 160 = 3 x 168).
  if (threadIdx.x < 128) {
    setmaxnreg_inc<184>();
    wg_role<0, LM>(p, &tmap);
  } else {
    setmaxnreg_dec<160>();
    wg_role<1, LM>(p, &tmap);
  }
  // A CTA pair exits together: no multicast write or remote arrive may reach a CTA that has left.
  if constexpr (LM == 2) dsx_cuda::sm90::cluster_sync();
}

template <int ROLE, int LM>
__device__ __forceinline__ void wg_role(const Params& p, const CUtensorMap* tmap) {
  using PL = PlanWG;
  extern __shared__ __align__(1024) unsigned char wsmem[];
  unsigned char* smem = wsmem;
  const uint32_t base = smem_u32(smem);
  if (base & 1023u) __trap();  // the 128-byte swizzle atoms need it; the plan has no slack to realign
  const uint32_t sK = base + PL::kOffK, bars = base + PL::kOffBar;  // full[k] at bars + 8k, p_full at + 24
  const uint32_t sAl = base + PL::kOffAlpha;

  const int tid = threadIdx.x, wtid = tid & 127, lane = tid & 31;
  const int g = lane >> 2, c4 = lane & 3;
  const int r0 = (wtid >> 5) * 16 + g, r1 = r0 + 8;  // the two accumulator rows of this thread
  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * kWRows;
  const SplitSpan span = split_tokens(p, b, split);
  const int len = span.len, t_begin = span.begin, t_end = span.end;

  if (tid == 128) {
    for (int k = 0; k < 3; ++k) {
      mbar_init(bars + 8 * k, LM == 0 ? 256 : 1);            // full: cp.async arrivals, or the expect_tx arrive
      mbar_init(bars + 24 + 8 * k, 128);                     // p_full
      mbar_init(bars + 48 + 8 * k, LM == 2 ? 16 : 8);        // empty: one arrive per P V warp (of both CTAs)
      mbar_init(bars + 72 + 8 * k, 128);                     // s_done (DSX_MLA_PVLAG)
    }
    if constexpr (DSX_MLA_QSMEM != 0) {
      mbar_init(bars + 96, 256);               // q_full: one cp.async arrival per P V thread
      mbar_init(bars + 104, LM == 2 ? 8 : 4);  // q_free: one arrive per warpgroup-0 warp (of both CTAs)
    }
    if constexpr (LM != 0) {
      dsx_cuda::sm90::mbar_init_fence();
      dsx_cuda::sm90::tma_prefetch_map(tmap);
    }
  }
  if constexpr (LM == 2) dsx_cuda::sm90::cluster_sync();  // both CTAs' mbarriers initialised
  else named_bar_sync(1, kWThreads);                     // mbarriers initialised

  const uint32_t sQR = base + PL::kOffQR, sQ31 = base + PL::kOffQ31;
  constexpr int kQReg = kLat / 16 - 1;  // k-steps whose Q A fragments sit in registers

  if constexpr (ROLE == 0) {
    const bool ok0 = row0 + r0 < p.rows, ok1 = row0 + r1 < p.rows;
    uint32_t qa[kQReg][4];
#if DSX_MLA_QSMEM
    // Q A fragments of k-step i < 31 (rows r0 / r1, dims 16 i + 2 c4 (+ 8)) by ldmatrix from buffer 2: matrix
    // m = lane / 8 holds rows + 8 (m & 1), dims + 8 (m >> 1), the mma.sync m16n8k16 A layout of the warp's rows.
    mbar_wait(bars + 96, 0);  // every thread's Q copies landed
    {
      const int lr = (wtid >> 5) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const uint32_t sQrow = sK + 2 * kTileBytes + lr * 128;
#pragma unroll
      for (int i = 0; i < kQReg; ++i)  // chunk 2 i + lane / 16 of row lr (wswz)
        ldsm_x4(sQrow + (i >> 2) * kKBBytes + (((2 * (i & 3) + (lane >> 4)) ^ (lr & 7)) << 4), qa[i][0], qa[i][1],
                qa[i][2], qa[i][3]);
    }
    __syncwarp();
    if (lane == 0) {  // buffer 2 may take page 2 once every warp of both CTAs has read its Q
      mbar_arrive(bars + 104);
      if constexpr (LM == 2) dsx_cuda::sm90::mbar_arrive_rank(bars + 104, (blockIdx.x & 1) ^ 1);
    }
    fence_async_smem();  // the cp.async writes of the Q blocks before wgmma reads them
#else
    const __nv_bfloat16* qb = p.q + (int64_t)b * p.rows * kDim;  // q[b] is [rows, 576]
    for (int i = wtid; i < kWRows * 10; i += 128) {  // chunks 62-71 of each row: dims 496-511 and the rope
      const int r = i / 10, x = i - r * 10, rg = row0 + r;
      const uint32_t dst = x < 2 ? sQ31 + r * 32 + ((x ^ ((r >> 2) & 1)) << 4)
                                 : sQR + r * 128 + (((x - 2) ^ (r & 7)) << 4);
      cp_async16(dst, rg < p.rows ? qb + (int64_t)rg * kDim + 496 + x * 8 : qb, rg < p.rows ? 16 : 0);
    }
    cp_async_commit();
    // Q A fragments of k-step i < 31: rows r0 / r1, dims 16 i + 2 c4 (+ 8), straight from global memory.
    {
      const uint32_t* q0 = reinterpret_cast<const uint32_t*>(qb + (int64_t)(ok0 ? row0 + r0 : 0) * kDim) + c4;
      const uint32_t* q1 = reinterpret_cast<const uint32_t*>(qb + (int64_t)(ok1 ? row0 + r1 : 0) * kDim) + c4;
#pragma unroll
      for (int i = 0; i < kQReg; ++i) {  // a padding row reads row 0 (its scores are masked anyway)
        qa[i][0] = __ldg(q0 + 8 * i);
        qa[i][1] = __ldg(q1 + 8 * i);
        qa[i][2] = __ldg(q0 + 8 * i + 4);
        qa[i][3] = __ldg(q1 + 8 * i + 4);
      }
    }
    cp_async_wait<0>();
    fence_async_smem();
    named_bar_sync(2, 128);  // the Q blocks in shared memory landed (warpgroup 0 only)
#endif
    // last visible cache position of rows r0, r1 (also below t_end; -1: padding row), minus 2 c4
    const int lim0 = (ok0 ? min(len - p.s_q + (row0 + r0) / p.heads, t_end - 1) : -1) - 2 * c4;
    const int lim1 = (ok1 ? min(len - p.s_q + (row0 + r1) / p.heads, t_end - 1) : -1) - 2 * c4;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const float sl2 = DSX_MLA_SMX ? p.scale * 1.4426950408889634f : p.scale;  // scores in log2 units with SMX
    // this thread's P word (row r0, tokens 2 c4, 2 c4 + 1) in a swizzled block: block i of 8 tokens at
    // pw ^ (i << 4); row r1 = r0 + 8 at + 1024 (same swizzle, r1 & 7 == r0 & 7)
    const uint32_t pw = r0 * 128 + (g << 4) + c4 * 4;
    int buf = 0;
    uint32_t par = 0;
#pragma unroll 1
    for (int t0 = t_begin; t0 < t_end; t0 += kPage) {
      const uint32_t sKj = sK + buf * kTileBytes, sRope = sKj + 8 * kKBBytes;
      mbar_wait(bars + 8 * buf, par);
      fence_async_smem();
      float s[32];
      const uint64_t dk = sw128_desc(sKj, 16, 1024), dq = sw128_desc(sQR, 16, 1024);  // + offset / 16 per k-step
      wgmma_fence();
#pragma unroll
      for (int i = 0; i < kQReg; ++i) wgmma_rs_n64(s, qa[i], dk + ((i >> 2) * kKBBytes + (i & 3) * 32) / 16, i > 0);
      wgmma_ss_n64(s, sw32_desc(sQ31, 256), dk + ((kQReg >> 2) * kKBBytes + (kQReg & 3) * 32) / 16, 1);
#pragma unroll
      for (int i = 0; i < 4; ++i) wgmma_ss_n64(s, dq + i * 2, dk + (8 * kKBBytes + i * 32) / 16, 1);
      wgmma_commit();
      if (DSX_MLA_PVLAG == 2) mbar_arrive(bars + 72 + 8 * buf);
      wgmma_wait<0>();
      fence_regs(s);
      if (DSX_MLA_PVLAG == 1) mbar_arrive(bars + 72 + 8 * buf);
      // s[4i + e]: row e < 2 ? r0 : r1, token t0 + 8i + 2 c4 + (e & 1)
      float mx[2] = {-INFINITY, -INFINITY};
#if DSX_MLA_SMX
      if (t0 + kPage - 7 <= min(lim0, lim1)) {  // every token of the page visible to both rows
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          s[i] *= sl2;
          mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
        }
      } else
#endif
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tp = t0 + 8 * i + (e & 1);
          const float v = (tp <= (e < 2 ? lim0 : lim1)) ? s[4 * i + e] * sl2 : -INFINITY;
          s[4 * i + e] = v;
          mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m_run[h], mx[h]);
        const float bse = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
        // alpha 1 while nothing is visible (O and l are still 0), so a P V warp may skip the rescale
        const float alpha = m_new == -INFINITY ? 1.f : DSX_MLA_SMX ? ex2_approx(m_run[h] - bse) : __expf(m_run[h] - bse);
        if (c4 == 0) st_shared_f32(sAl + (buf * kWRows + (h ? r1 : r0)) * 4, alpha);
        l_run[h] *= alpha;
        m_run[h] = m_new;
        mx[h] = bse;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // P into the rope block (K-major over tokens, swizzled): A of P V
#if DSX_MLA_SMX
        const float p0 = ex2_approx(s[4 * i] - mx[0]), p1 = ex2_approx(s[4 * i + 1] - mx[0]);
        const float p2 = ex2_approx(s[4 * i + 2] - mx[1]), p3 = ex2_approx(s[4 * i + 3] - mx[1]);
#else
        const float p0 = __expf(s[4 * i] - mx[0]), p1 = __expf(s[4 * i + 1] - mx[0]);
        const float p2 = __expf(s[4 * i + 2] - mx[1]), p3 = __expf(s[4 * i + 3] - mx[1]);
#endif
        l_run[0] += p0 + p1;
        l_run[1] += p2 + p3;
        st_shared_u32(sRope + (pw ^ (i << 4)), pack_bf16(p0, p1));
        st_shared_u32(sRope + (pw ^ (i << 4)) + 1024, pack_bf16(p2, p3));
      }
      fence_async_smem();
      mbar_arrive(bars + 24 + 8 * buf);
      if (++buf == 3) {
        buf = 0;
        par ^= 1u;
      }
    }
    float* sL = reinterpret_cast<float*>(smem + PL::kOffL);  // the Q rope block is free now
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // row sums over the lane quad (the same value in all four lanes)
      l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
      l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    }
    if (c4 == 0) {
      sL[r0] = l_run[0];
      sL[r1] = l_run[1];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rg = row0 + (h ? r1 : r0);
        if (rg >= p.rows) continue;
        const float m_nat = DSX_MLA_SMX ? m_run[h] * 0.69314718055994531f : m_run[h];  // log2 units -> natural
        const float v = l_run[h] > 0.f ? m_nat + logf(l_run[h]) : -INFINITY;
        if (p.splits > 1) p.ws_lse[((int64_t)b * p.splits + split) * p.rows + rg] = v;
        else p.lse[(int64_t)b * p.rows + rg] = v;
      }
    }
    named_bar_sync(1, kWThreads);  // sL published
  } else {
    const int part = (tid >> 7) - 1;
    const int n_pg = (t_end - t_begin + kPage - 1) / kPage;
    const int32_t* pages = p.pt + (int64_t)b * p.max_pages;
    // ids of the first two pages, read before the Q copies so that their latency overlaps them
    const int pid0 = n_pg > 0 ? pages[t_begin / kPage] : 0, pid1 = n_pg > 1 ? pages[t_begin / kPage + 1] : 0;
#if DSX_MLA_QSMEM
    // Q into page buffer 2 and its own blocks; this thread's arrival on q_full fires once its copies landed
    wg_stage_q(p, b, row0, sK + 2 * kTileBytes, sQ31, sQR, tid - 128);
    cp_async_arrive_noinc(bars + 96);
#endif
    auto load = [&](int pg, int buf, int page) {
      const int t = t_begin + pg * kPage;
      const uint32_t dst = sK + buf * kTileBytes;
      if constexpr (LM == 0) {
        if (part == 0) {
          wg_load_chunks<0, 32>(p.kv, page, t, t_end, dst, wtid);
          wg_load_chunks<64, 8>(p.kv, page, t, t_end, dst, wtid);
        } else {
          wg_load_chunks<32, 32>(p.kv, page, t, t_end, dst, wtid);
        }
        cp_async_arrive_noinc(bars + 8 * buf);
      } else if (tid == 128) {  // whole pages (the tail past t_end is zeroed after landing, see below)
        mbar_arrive_expect_tx(bars + 8 * buf, kTileBytes);
        if constexpr (LM == 1) {
#pragma unroll 1
          for (int k = 0; k < kDim / 64; ++k) tma_load_3d(dst + k * kKBBytes, tmap, bars + 8 * buf, 64 * k, 0, page);
        } else {
          const int k0 = (blockIdx.x & 1) ? 5 : 0, k1 = (blockIdx.x & 1) ? 9 : 5;
#pragma unroll 1
          for (int k = k0; k < k1; ++k)
            tma_load_3d_multicast(dst + k * kKBBytes, tmap, bars + 8 * buf, 64 * k, 0, page, (uint16_t)3);
        }
      }
    };
    if (n_pg > 0) load(0, 0, pid0);
    if (n_pg > 1) load(1, 1, pid1);
    if (n_pg > 2) {
      if (DSX_MLA_QSMEM && (LM == 0 || tid == 128)) mbar_wait(bars + 104, 0);  // Q read from buffer 2 (both CTAs)
      load(2, 2, pages[t_begin / kPage + 2]);
    }
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int j = 0; j < n_pg; ++j) {
      const int buf = j % 3;
      const uint32_t par = (j / 3) & 1, sKj = sK + buf * kTileBytes;
      mbar_wait(bars + 24 + 8 * buf, par);  // P and alpha of page j (so S of page j is done)
      mbar_wait(bars + 8 * buf, par);       // page j landed (V)
      if constexpr (LM != 0) {
        const int valid = t_end - (t_begin + j * kPage);
        if (valid < kPage) {  // the sequence's last page: zero this warpgroup's V rows past its end (may hold NaN)
          for (int i = wtid; i < (kPage - valid) * 32; i += 128) {
            const int r = valid + (i >> 5), blk = part * 4 + ((i >> 3) & 3);
            *reinterpret_cast<uint4*>(smem + PL::kOffK + buf * kTileBytes + blk * kKBBytes + r * 128 + (i & 7) * 16) =
                make_uint4(0u, 0u, 0u, 0u);
          }
          fence_async_smem();
          if (part == 0) named_bar_sync(4, 128);
          else named_bar_sync(5, 128);
        }
      }
      fence_async_smem();
      const float a0 = ld_shared_f32(sAl + (buf * kWRows + r0) * 4), a1 = ld_shared_f32(sAl + (buf * kWRows + r1) * 4);
      if (!DSX_MLA_SKIP1 || !__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) {  // x 1 changes no bit
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          acc[4 * i] *= a0; acc[4 * i + 1] *= a0; acc[4 * i + 2] *= a1; acc[4 * i + 3] *= a1;
        }
      }
      if (DSX_MLA_PVLAG && j + 1 < n_pg) mbar_wait(bars + 72 + 8 * ((j + 1) % 3), ((j + 1) / 3) & 1);
      const uint32_t sV = sKj + part * 4 * kKBBytes, sP = sKj + 8 * kKBBytes;  // columns [256 part, +256)
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss_n256_tb(acc, sw128_desc(sP + kk * 32, 16, 1024), sw128_desc(sV + kk * 2048, kKBBytes, 1024), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(acc);
      if (j + 3 < n_pg) {  // refill with page j + 3, once both P V warpgroups are done with P
        if constexpr (LM == 0) {
          named_bar_sync(3, 256);
          load(j + 3, buf, pages[t_begin / kPage + j + 3]);
        } else {  // each P V warp (of both CTAs of a pair) gives the buffer back; one thread refills it
          if (lane == 0) {
            mbar_arrive(bars + 48 + 8 * buf);
            if constexpr (LM == 2) dsx_cuda::sm90::mbar_arrive_rank(bars + 48 + 8 * buf, (blockIdx.x & 1) ^ 1);
          }
          if (tid == 128) {
            mbar_wait(bars + 48 + 8 * buf, par);
            load(j + 3, buf, pages[t_begin / kPage + j + 3]);
          }
        }
      }
    }
    named_bar_sync(1, kWThreads);  // sL published; every wgmma read of the page buffers has been waited for
    const float* sL = reinterpret_cast<const float*>(smem + PL::kOffL);
    const bool split_out = p.splits > 1;
    // O leaves through shared memory (the page buffers, free now; this warpgroup's 64 x 256 tile at part *
    // 64 KB): row r's 16-byte chunk x at x ^ (r & 7), then each warp stores whole row pieces (512 B of bf16,
    // 1 KB of fp32 partials) with 16-byte stores, instead of 4- or 8-byte pieces of 8 rows at once.
    const uint32_t sO = sK + part * (kWRows * 256 * 4);
    constexpr int kCh = 256 * 2 / 16;  // bf16 chunks per row piece (fp32: twice as many)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = h ? r1 : r0;
      const float l = sL[r], inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float v0 = acc[4 * i + 2 * h] * inv, v1 = acc[4 * i + 2 * h + 1] * inv;
        if (split_out) {  // columns 8 i + 2 c4 (+1): chunk 2 i + c4 / 2, bytes 8 (c4 & 1)
          st_shared_u32x2(sO + r * (2 * kCh * 16) + (((2 * i + (c4 >> 1)) ^ (r & 7)) << 4) + (c4 & 1) * 8,
                          __float_as_uint(v0), __float_as_uint(v1));
        } else {  // chunk i, bytes 4 c4
          st_shared_u32(sO + r * (kCh * 16) + ((i ^ (r & 7)) << 4) + c4 * 4, pack_bf16(v0, v1));
        }
      }
    }
    named_bar_sync(4 + part, 128);  // this warpgroup's tile is in shared memory
    if (split_out) {
      float* dst = p.ws_o + (((int64_t)b * p.splits + split) * p.rows + row0) * kLat + part * 256;
#pragma unroll 4
      for (int k = wtid; k < kWRows * 2 * kCh; k += 128) {  // a warp: half a row piece
        const int r = k / (2 * kCh), x = k % (2 * kCh);
        if (row0 + r >= p.rows) break;  // rows only grow with k
        *reinterpret_cast<uint4*>(dst + (int64_t)r * kLat + x * 4) =
            ld_shared_u32x4(sO + r * (2 * kCh * 16) + ((x ^ (r & 7)) << 4));
      }
    } else {
      __nv_bfloat16* dst = p.out + ((int64_t)b * p.rows + row0) * kLat + part * 256;
#pragma unroll 4
      for (int k = wtid; k < kWRows * kCh; k += 128) {  // a warp: one row piece
        const int r = k / kCh, x = k % kCh;
        if (row0 + r >= p.rows) break;
        *reinterpret_cast<uint4*>(dst + (int64_t)r * kLat + x * 8) = ld_shared_u32x4(sO + r * (kCh * 16) + ((x ^ (r & 7)) << 4));
      }
    }
  }
}

}  // namespace dsx_mla
