// MLA decode attention (absorbed weights, paged latent cache) for sm_90a.
// Contract: include/dsx/mla_decode.h; helpers and shared-memory plan: mla_decode.cuh.
//
// Grid (row_tiles, splits, B). A CTA takes 16*MT query rows of one sequence (row = s*H + h,
// rows of q[b] are contiguous) and the tokens of one split, 32 per stage through a 3-deep
// cp.async ring. Per stage: (1) S = Q K^T * scale, masked, to shared fp32 (tiles of 16 rows
// x 8 tokens spread over the 8 warps); (2) online softmax, 4 threads per row, P to shared
// bf16; (3) O = alpha * O + P V, warp w owning latent columns [64w, 64w + 64) of all rows.
// One split: normalised bf16 out + lse. Several: fp32 partials + lse to the workspace, then
// mla_combine merges them in split order.
#include <cuda_runtime.h>

#include <cmath>

#include "dsx.h"
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
  int s_q, heads, rows, max_pages, split_tokens, splits;
  float scale;
};

// Issue the copies of stage `st` (tokens t .. t + 32 of the sequence) into buffer `dst`;
// tokens at or past `t_end` are zero-filled (never read).
__device__ __forceinline__ void load_stage(const Params& p, const int32_t* pages, int t, int t_end,
                                           uint32_t dst) {
  for (int i = threadIdx.x; i < kStageT * kChunks; i += kThreads) {
    const int row = i / kChunks, c = i - row * kChunks, tok = t + row;
    const bool ok = tok < t_end;
    const __nv_bfloat16* src = p.kv;
    if (ok) src += ((int64_t)pages[tok / kPage] * kPage + (tok % kPage)) * kDim + c * 8;
    cp_async16(dst + swz(row, c) * 16, src, ok ? 16 : 0);
  }
}

template <int MT>
__device__ __forceinline__ void scores(const Params& p, uint32_t sq, uint32_t sk, float* sS, int row0, int t,
                                       int len, int t_end) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp; i < MT * 4; i += 8) {
    const int rt = i >> 2, nt = i & 3;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int brow = nt * 8 + (lane & 7), arow = rt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll 6
    for (int ks = 0; ks < kDim / 16; ks += 2) {  // two 16-dim k-steps per B load
      uint32_t b[4], a0[4], a1[4];
      ldsm_x4(sk + swz(brow, ks * 2 + (lane >> 3)) * 16, b[0], b[1], b[2], b[3]);
      ldsm_x4(sq + swz(arow, ks * 2 + (lane >> 4)) * 16, a0[0], a0[1], a0[2], a0[3]);
      ldsm_x4(sq + swz(arow, ks * 2 + 2 + (lane >> 4)) * 16, a1[0], a1[1], a1[2], a1[3]);
      mma_bf16(acc, a0, b[0], b[1]);
      mma_bf16(acc, a1, b[2], b[3]);
    }
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = rt * 16 + g + half * 8, rg = row0 + r;
      const int limit = rg < p.rows ? len - p.s_q + rg / p.heads : -1;  // last visible position
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = nt * 8 + 2 * c + e;
        sS[r * kSStride + tok] = (t + tok <= limit && t + tok < t_end) ? acc[half * 2 + e] * p.scale : -INFINITY;
      }
    }
  }
}

// Online softmax over one stage: 4 threads per row, 8 tokens each.
template <int MT>
__device__ __forceinline__ void softmax_stage(const float* sS, __nv_bfloat16* sP, float* sM, float* sL,
                                              float* sA) {
  const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
  if (row >= 16 * MT) return;  // warp-uniform: 8 rows per warp, 16 * MT rows
  float v[8], mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = sS[row * kSStride + part * 8 + j];
    mx = fmaxf(mx, v[j]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_old = sM[row], m_new = fmaxf(m_old, mx);
  const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at 0
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const float p0 = __expf(v[j] - base), p1 = __expf(v[j + 1] - base);
    sum += p0 + p1;
    *reinterpret_cast<uint32_t*>(sP + row * kPStride + part * 8 + j) = pack_bf16(p0, p1);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (part == 0) {
    const float alpha = __expf(m_old - base);
    sA[row] = alpha;
    sL[row] = sL[row] * alpha + sum;
    sM[row] = m_new;
  }
}

template <int MT>
__device__ __forceinline__ void accumulate_pv(float (&acc)[MT][8][4], uint32_t sp, uint32_t sk, const float* sA) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
  for (int rt = 0; rt < MT; ++rt) {
    const float a0 = sA[rt * 16 + g], a1 = sA[rt * 16 + g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      acc[rt][nt][0] *= a0; acc[rt][nt][1] *= a0; acc[rt][nt][2] *= a1; acc[rt][nt][3] *= a1;
    }
  }
#pragma unroll
  for (int kk = 0; kk < kStageT / 16; ++kk) {
    uint32_t b[4][4];
    const int vrow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < 4; ++np)
      ldsm_x4_t(sk + swz(vrow, warp * 8 + np * 2 + (lane >> 4)) * 16, b[np][0], b[np][1], b[np][2], b[np][3]);
#pragma unroll
    for (int rt = 0; rt < MT; ++rt) {
      uint32_t a[4];
      const int prow = rt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldsm_x4(sp + (prow * kPStride + kk * 16 + (lane >> 4) * 8) * 2, a[0], a[1], a[2], a[3]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        mma_bf16(acc[rt][2 * np], a, b[np][0], b[np][1]);
        mma_bf16(acc[rt][2 * np + 1], a, b[np][2], b[np][3]);
      }
    }
  }
}

template <int MT>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(Params p) {
  using SM = Smem<MT>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_u32(smem), sk0 = sq + SM::kOffK;
  float* sS = reinterpret_cast<float*>(smem + SM::kOffS);
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + SM::kOffP);
  float* sM = reinterpret_cast<float*>(smem + SM::kOffStat);
  float *sL = sM + SM::kRows, *sA = sL + SM::kRows;

  const int b = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * SM::kRows;
  const int len = min(max(p.lens[b], 0), p.max_pages * kPage);
  const int t_begin = split * p.split_tokens, t_end = min(len, t_begin + p.split_tokens);
  const int n_st = t_end > t_begin ? (t_end - t_begin + kStageT - 1) / kStageT : 0;
  const int32_t* pages = p.pt + (int64_t)b * p.max_pages;

  const __nv_bfloat16* qb = p.q + (int64_t)b * p.rows * kDim;  // q[b] is [rows, 576]
  for (int i = threadIdx.x; i < SM::kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i - r * kChunks, rg = row0 + r;
    cp_async16(sq + swz(r, c) * 16, rg < p.rows ? qb + (int64_t)rg * kDim + c * 8 : qb, rg < p.rows ? 16 : 0);
  }
  for (int r = threadIdx.x; r < SM::kRows; r += kThreads) { sM[r] = -INFINITY; sL[r] = 0.f; }
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_st) load_stage(p, pages, t_begin + s * kStageT, t_end, sk0 + s * SM::kK);
    cp_async_commit();
  }

  float acc[MT][8][4];
#pragma unroll
  for (int rt = 0; rt < MT; ++rt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[rt][nt][0] = acc[rt][nt][1] = acc[rt][nt][2] = acc[rt][nt][3] = 0.f;

  for (int st = 0; st < n_st; ++st) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage st landed for all threads; buffer (st - 1) % 3 is free again
    const int nxt = st + kStages - 1;
    if (nxt < n_st) load_stage(p, pages, t_begin + nxt * kStageT, t_end, sk0 + (nxt % kStages) * SM::kK);
    cp_async_commit();
    const uint32_t sk = sk0 + (st % kStages) * SM::kK;
    scores<MT>(p, sq, sk, sS, row0, t_begin + st * kStageT, len, t_end);
    __syncthreads();
    softmax_stage<MT>(sS, sP, sM, sL, sA);
    __syncthreads();
    accumulate_pv<MT>(acc, smem_u32(sP), sk, sA);
  }
  cp_async_wait<0>();
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const bool split_out = p.splits > 1;
#pragma unroll
  for (int rt = 0; rt < MT; ++rt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = rt * 16 + g + half * 8, rg = row0 + r;
      if (rg >= p.rows) continue;
      const float l = sL[r], inv = l > 0.f ? 1.f / l : 0.f;
      const int64_t orow = split_out ? ((int64_t)b * p.splits + split) * p.rows + rg : (int64_t)b * p.rows + rg;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = warp * 64 + nt * 8 + 2 * c;
        const float v0 = acc[rt][nt][half * 2] * inv, v1 = acc[rt][nt][half * 2 + 1] * inv;
        if (split_out) {
          *reinterpret_cast<float2*>(p.ws_o + orow * kLat + col) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<uint32_t*>(p.out + orow * kLat + col) = pack_bf16(v0, v1);
        }
      }
    }
  }
  for (int r = threadIdx.x; r < SM::kRows; r += kThreads) {
    const int rg = row0 + r;
    if (rg >= p.rows) continue;
    const float l = sL[r], v = l > 0.f ? sM[r] + logf(l) : -INFINITY;
    if (split_out) p.ws_lse[((int64_t)b * p.splits + split) * p.rows + rg] = v;
    else p.lse[(int64_t)b * p.rows + rg] = v;
  }
}

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
      mla_decode_kernel<MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<MT>::kBytes);
  if (attr != cudaSuccess) return attr;
  mla_decode_kernel<MT><<<dim3(row_tiles, p.splits, batch), kThreads, Smem<MT>::kBytes, stream>>>(p);
  return cudaGetLastError();
}

int row_tile_mt(int rows) { return rows >= 64 ? 4 : (rows + 15) / 16; }

// Split count: 1 when the (b, row tile) CTAs fill the GPU; otherwise the smallest count that
// gives at least one full wave at >= 85% wave efficiency (else the most efficient), and
// never more splits than pages.
int choose_splits(int64_t ctas, int64_t max_pages, int requested) {
  int n = requested;
  if (n <= 0) {
    int dev = 0, sms = 132;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
                                                  cudaSuccess)
      sms = 132;
    n = 1;
    if (ctas < sms) {
      double best = 0.0;
      for (int s = 1; s <= kMaxSplits && s <= max_pages; ++s) {
        const int64_t c = ctas * s, waves = (c + sms - 1) / sms;
        const double eff = double(c) / double(waves * sms);
        if (c >= sms && eff >= 0.85) { n = s; break; }
        if (eff > best + 1e-9) { best = eff; n = s; }
      }
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
  p.split_tokens = (int)((max_pages + splits - 1) / splits) * kPage;
  p.scale = softmax_scale;
  if (splits > 1) {
    p.ws_o = static_cast<float*>(workspace);
    p.ws_lse = p.ws_o + batch * splits * p.rows * (int64_t)kLat;
  }
  const int mt = row_tile_mt(p.rows), row_tiles = (p.rows + 16 * mt - 1) / (16 * mt);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err;
  switch (mt) {
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
