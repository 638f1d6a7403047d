/* MLA decode attention with absorbed weights over a paged latent cache (DeepSeek-V3).
 *
 * Layouts (row-major; bf16 as uint16_t bits):
 *   kv_cache   : [num_pages, 64, 576] bf16. A page holds 64 tokens; a token is 576 values:
 *                512 latent dims c (kv_lora_rank) followed by 64 rotated rope dims k_pe.
 *   page_table : int32 [B, max_pages]; token t of sequence b lives in page
 *                page_table[b, t / 64], slot t % 64. Only the first ceil(len_b / 64)
 *                entries of a row are read.
 *   cache_lens : int32 [B]; len_b = tokens in the cache of sequence b, including the S_q new
 *                ones (their keys must already be written). Requires S_q <= len_b <= 64 * max_pages.
 *   q          : [B, S_q, H, 576] bf16; dims 0..511 = q_nope @ W_UK (latent space),
 *                dims 512..575 = the rotated q_pe. S_q in 1..6 new tokens, H in 1..128 heads.
 * Outputs:
 *   out        : [B, S_q, H, 512] bf16, out = sum_t p_t * c_t (the value is the latent)
 *   lse        : float32 [B, S_q, H], natural log of sum_t exp(score_t) (needed to merge
 *                split-KV partials or with other attention pieces)
 * Math: score_t = (q . kv_t over all 576 dims) * softmax_scale, computed in fp32;
 * causal among the new tokens: query i (0-based, position len_b - S_q + i) sees cache
 * positions t <= len_b - S_q + i; p = softmax over the visible t, in fp32.
 *
 * CPU (_cpu): the reference. OpenMP over (b, h); fp32 dot products accumulated in dim order,
 * fp32 softmax, fp32 weighted sum in token order, one rounding to bf16 (nearest-even)
 * at the end. threads = 0 uses OpenMP's default; the result does not depend on it.
 * Returns DSX_EINVAL for bad sizes, a length outside [S_q, 64 * max_pages] or a used page
 * id outside [0, num_pages).
 *
 * CUDA (_cuda): device pointers (q, kv_cache, out and the workspace 16-byte aligned, else
 * DSX_EINVAL), asynchronous on `stream`, no allocation (graph capturable).
 * One CTA per SM streams the pages of one sequence (with num_splits > 1, split s of sequence b
 * takes the s-th of `splits` equal page-aligned chunks of its own ceil(len_b / 64) pages) for a
 * tile of up to 64 query rows (rows = (s, h) flattened; more rows take more tiles, whose CTAs
 * run side by side and share the pages through L2), with bf16 tensor-core mma (scores and
 * output accumulated in fp32 registers), fp32 online softmax (p rounded to bf16 for the P V
 * product) and a cp.async ring of 32-token stages 4-5 deep. With up to 32 rows per tile
 * (S_q * H <= 32) each score is the sum, in slice order, of four fp32 partial dot products over
 * the dims [0, 144), [144, 288), [288, 432), [432, 576); with more rows one warp accumulates
 * all 576 dims of a score. With more than 64 rows (S_q * H > 64: 128 heads per rank) a CTA of
 * three warpgroups takes 64 rows and whole 64-token pages through three page buffers: scores by
 * bf16 wgmma (fp32 accumulation) in one warpgroup with the fp32 online softmax (in log2 units:
 * scores times softmax_scale * log2(e), p = 2^(s - m), lse converted back to natural log), P
 * rounded to bf16, and P V by wgmma in the two others (256 output columns each); P V of page j
 * starts once the scores of page j+1 are done, so it fills the tensor cores while the softmax of
 * page j+1 runs. Pages arrive by TMA (whole pages; slots past the sequence's end are zeroed in
 * shared memory before P V); the two 64-row CTAs of one sequence form a cluster and each loads
 * half of every page into both (multicast); where the device cannot schedule such pairs (asked
 * once per device), each CTA loads its own pages by TMA, and without the driver's tensor-map entry
 * point the P V warpgroups load them by cp.async. The three give the same bits; the environment
 * variable DSX_MLA_LOADS=1 or 0 forces the latter two (diagnostics, tests). The output tile
 * leaves through shared memory, in whole 16-byte pieces of rows. Each row sum is accumulated
 * per lane in token order and combined over the lane quad in a fixed order. num_splits = 0
 * picks the split count from the SM count; with more than one split the partials (fp32 out and
 * lse per split) go to the caller's workspace and a second kernel merges them in split order.
 * Summation orders are fixed: the result is deterministic for given sizes and num_splits.
 * dsx_mla_decode_workspace_cuda gives the bytes needed and the split count chosen.
 * The kernel cannot report bad data: lengths are clamped to [0, 64 * max_pages] and
 * page ids are trusted (validate them on the host, as the Python entry does).
 */
#ifndef DSX_MLA_DECODE_H_
#define DSX_MLA_DECODE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSX_MLA_PAGE 64
#define DSX_MLA_LATENT 512
#define DSX_MLA_ROPE 64
#define DSX_MLA_DIM 576

int dsx_mla_decode_paged_bf16_cpu(const uint16_t* q, const uint16_t* kv_cache, const int32_t* page_table,
                                  const int32_t* cache_lens, uint16_t* out, float* lse, int64_t batch,
                                  int64_t s_q, int64_t heads, int64_t num_pages, int64_t max_pages,
                                  float softmax_scale, int threads);

/* *num_splits_out: the split count a call with these sizes and num_splits uses;
 * *bytes: the workspace it needs (0 when it uses a single split). */
int dsx_mla_decode_workspace_cuda(int64_t batch, int64_t s_q, int64_t heads, int64_t max_pages,
                                  int num_splits, int* num_splits_out, int64_t* bytes);

int dsx_mla_decode_paged_bf16_cuda(const void* q, const void* kv_cache, const void* page_table,
                                   const void* cache_lens, void* out, void* lse, int64_t batch, int64_t s_q,
                                   int64_t heads, int64_t num_pages, int64_t max_pages, float softmax_scale,
                                   int num_splits, void* workspace, int64_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DSX_MLA_DECODE_H_ */
