/* Block-scaled FP8 GEMM (DeepSeek-V3 layout) and FP8 activation quantization.
 *
 * Layout ("nt": A is [M, K] row-major, B is [N, K] row-major, i.e. out = A @ B^T):
 *   a   : float8_e4m3fn [M, K] row-major (activations)
 *   sa  : float32 [M, ceil(K/128)] row-major: one scale per token per 128-wide K group
 *   b   : float8_e4m3fn [N, K] row-major (HF Linear weight, [out, in])
 *   sb  : float32 [ceil(N/128), ceil(K/128)] row-major: one scale per 128x128 block
 *   out : bfloat16 [M, N] row-major
 *
 *   out[m, n] = bf16( sum_kb  P(m, n, kb) * (sa[m, kb] * sb[n/128, kb]) )
 *   P(m, n, kb) = sum_{k in block kb} a[m, k] * b[n, k]        (fp32, exact fp8 products)
 *
 * Accumulation order (both back ends): for each K block kb in increasing order an fp32
 * partial sum P over that block's (up to) 128 products is formed, the scale product
 * s = sa*sb is rounded to fp32, and acc = acc + P * s; out = round-to-nearest-even bf16 of
 * acc. Inside a block the CPU kernel sums 16 interleaved lanes (lane j takes k = j mod 16,
 * in increasing k) and combines the lanes by a pairwise tree; the CUDA kernels use the
 * tensor cores' own order (CUTLASS wgmma) or a sequential loop (fallback kernel). The CPU
 * kernel does not contract a*b+c into FMA; the CUDA kernels may. Ragged N and K (not
 * multiples of 128) are handled: the last block holds fewer elements.
 *
 * Grouped "contiguous" variant (MoE): the rows of A (and of out) are grouped per expert:
 * expert e owns rows [offsets[e], offsets[e+1]) (offsets: int32 [E+1], offsets[0] = 0,
 * non-decreasing, offsets[E] = M); b is [E, N, K], sb is [E, ceil(N/128), ceil(K/128)].
 *
 * CUDA entry points take device pointers, run asynchronously on `stream` (a cudaStream_t
 * passed as void*, NULL = legacy default stream), allocate nothing, and are CUDA-graph
 * capturable when given their workspace. Query the workspace size first (it may be 0).
 * `algo`: 0 = automatic: the hand-written small-M kernel (6) with the K halves (R = 3 below) when M <= 128
 * and 1024 <= K < 4096 while ceil(N/64) <= the SM count < 2 * ceil(N/64); else 6 when 64 < M <= 128 and K >= 4096 while
 * 4 * ceil(N/128) <= the SM count, or with any K while 2 * ceil(N/128) <= the SM count < 4 * ceil(N/128)
 * (two 64-token tiles, T = 3 below; one K split in the second case), or when 32 < M <= 64 and K < 4096
 * while its two 32-token tiles of 128 rows, 2 * ceil(N/128) CTAs, fill between half and all of the
 * SMs (T = 2); else swapped operands without K splits (4, data-parallel) when M <= 128 and
 * its 128x32 tiles fill between half and all of the SMs in one wave; else the hand-written small-M
 * kernel (6) when M <= 32, or M <= 64 with K >= 4096, while its 128-row weight tiles fit in one
 * wave (ceil(N/128) <= the SM count), or when M <= 64 and its 64-row tiles fit one wave of three
 * CTAs a SM where the 128-row ones do not (6's automatic R: 64 rows when ceil(N/64) * min(8,
 * ceil(K/128)) >= 2 * the SM count and either M <= 32 or ceil(N/128) > the SM count, else 128;
 * automatic S at 64 rows: at most 2; with K >= 4096 the most that keep at most two CTAs a SM on
 * average, with K < 4096 the one whose CTA count is nearest the SM count); else a
 * CUTLASS sm90a block-wise kernel where its TMA alignment allows
 * (K % 16 == 0, N % 8 == 0, 16-byte aligned pointers): pingpong 64x128 tiles for M <= 128
 * (swapped operands with 2-way split-K when that leaves few tiles and K is long), cooperative
 * 128x128 stream-K above; from M >= 1024 the large-M kernel (7): 128x192 tiles when N % 192 == 0,
 * else 128x128 (variants 2 and 10, one CTA each); else the simple kernel. Forcing one (DSX_EINVAL
 * if the shape cannot take it): 1 = cooperative stream-K, 2 = simple, 3 = pingpong, 4 = swapped operands
 * (out^T = W . A^T, 128x32 tiles, stream-K),
 * 5 = 1 with each K block's promotion (acc += P * s) run under the next block's tensor-core work
 * (two temporary accumulators; same arithmetic, bitwise the output of 1 under the same
 * scheduling knobs), 6 = the small-M kernel (M <= 128, no CUTLASS): swapped operands
 * (out^T = W . A^T), one CTA per R weight rows x all tokens x a K range, TMA loads, wgmma, the
 * same per-block promotion order; K split over a thread-block cluster of S CTAs whose fp32 partials
 * are summed in split order 0..S-1 (no atomics: reproducible), through distributed shared memory, or
 * at S >= 3 through the workspace where the output path below takes it (query it with the same algo;
 * with less given, distributed shared memory: the same bits); bits 16..19 = S (0 automatic: the most
 * that keep the grid resident in one wave, at most 8 and at most ceil(K/128); at 64 rows see above);
 * bits 20..23 = the stage count (0 automatic = 8, at most what shared memory holds at the CTAs a SM
 * of R; else 2..12, at most what one CTA's shared memory holds (a count above the automatic one's
 * limit runs fewer CTAs a SM), at least what the fp32 partial tile needs); bits 8..9 = R (0 automatic,
 * 1 = 128 rows, one CTA per SM,
 * 2 = 64 rows, two (M > 64) or three CTAs per SM; under the same S both give the same bits; 3 = the K
 * halves: 64 rows, one CTA per SM, its two consumer warpgroups each on one half of the CTA's K blocks
 * (the first floor(n/2) and the rest, each with half of the stage ring), their fp32 partial sums added at
 * the end: bitwise the output of S = 2; only with S = 0 or 1 (one CTA a weight tile), K > 128, the loop
 * form 0, 2 or 3 and the output path 0 or 2, else DSX_EINVAL; automatic T = all of M; the stage count
 * rounded down to even, at least 4, automatic the most one CTA's shared memory holds (8 or 12); R = 0
 * takes it where algo 0 does (above) when S, T, the loop form and the output path are automatic too);
 * bits 10..11 = the consumer loop's form (0 automatic = 3, or 2 where bits 14..15 name a scale-read
 * point; 1 = the form before: stage and parity by division, wgmma descriptors built per thread, scales
 * read through a generic pointer; 2 = stage counters, descriptors in uniform registers, scales by
 * ld.shared; 3 = 2 with two temporaries and each K block's scales read one block ahead: right after
 * its stage's barrier wait, into the register set of its temporary, their products formed at its
 * promotion (with one temporary 2; with bits 14..15 non-zero DSX_EINVAL); the same arithmetic);
 * bits 24..27 = T, tokens per CTA (0 automatic: 64 when M > 64 and 2 * ceil(N/128) <= the SM
 * count, 32 where algo 0 takes 6 with T = 2 (see above), else all of M; 1 = 16, 2 = 32, 3 = 64: M split over ceil(M / T) token tiles of the grid;
 * 4 = all of M);
 * bits 12..13 = the wgmma temporaries (0 automatic = 2, 1 = one: wgmma, wait, promote per K block;
 * 2 = two alternating, K block i+1's wgmma issued before block i is promoted, where the registers
 * allow: T <= 64 with 128 rows, T <= 32 with 64 rows, else one); bits 14..15 = when a K block's
 * scale products are read (0 automatic = 2, 1 = after its wgmma wait, 2 = before it, except at
 * T = 128 with one temporary; 3 = with two temporaries before the next K block's issue, else 2); bits 4..5 = the L2 promotion of
 * the TMA loads (0 automatic = 2, 1 = 256 bytes, 2 = 128 bytes, 3 = none); bits 6..7 = the grid
 * order (0 automatic = 2, 1 = the weight tiles of one token tile adjacent, 2 = the token tiles of
 * one weight tile adjacent); under the same S every R, T, stage count, loop form, temporaries,
 * scale-read point, promotion and order give the same bits;
 * bit 28 = programmatic dependent launch (with 6 or 0 only: a GEMM starts under the previous kernel's tail; before
 * it waits for the previous grid it reads only weight tiles (b, its first two stages), never a, sa, sb or out,
 * so the weights must not be an output of the kernel launched before it on the stream);
 * bits 29..30 (with 6 only) = the output path (0 automatic = 2; 1 = the form before: the fp32 partial
 * tile through shared memory, the S splits summed by one pass over distributed shared memory; 2 = with
 * S <= 2 from the accumulator registers: each consumer thread rounds its own sums to bf16 (two adjacent
 * weight rows exchanged between neighbouring lanes into one 4-byte store); at S = 2 each CTA first
 * sends the half of its partial tile that the other CTA stores into that CTA's shared memory and adds
 * what it received, p0 + p1; at S > 2 with 16 or 32 tokens a tile (not R = 3), where the workspace holds
 * the S partial tiles, CTA r stores the groups of 8 tokens [ceil(r G / S), ceil((r + 1) G / S)) of the
 * G = tokens / 8 a tile: each CTA writes the groups others store to the workspace, and after the cluster
 * barrier their owner reads them and adds the S sums in split order; else the form before; 3 refused);
 * the same bits.
 * 7 = the large-M kernel (no CUTLASS; same TMA alignment rules as the CUTLASS kernels, no
 * workspace): persistent, one CTA per SM walking the BM x BN output tiles in a grouped order (bits
 * 8..11 = v: groups of 4v 128-row M tiles, 0 = 16), TMA loads into a ring of stages, two consumer
 * warpgroups (BM/2 rows each, in 64-row wgmma blocks) issuing wgmma per K block into a temporary,
 * the same per-block promotion order as above, a bf16 TMA-store epilogue that overlaps the next
 * tile; every tile computed by one CTA in a fixed order (bitwise reproducible, independent of the
 * tile order knob). Bits 12..15 the variant: 0 = 10 (the default), 1 = 128x128 with two alternating
 * temporaries (block k promoted while block k+1's wgmma runs), 3 = 128x128 with one, 4 = 256x128 with one
 * (3 and 4 bitwise the output of 1), 2 = 128x192 with one (a tile may straddle two 128-column
 * scale blocks: each column takes its own block's scale); 5, 6, 7 = the tiles of 1, 2, 4 computed
 * by 2-CTA clusters (two M-adjacent tiles of one N tile; each CTA loads half of the shared B tile
 * and multicasts it into both CTAs' stages, halving B's L2 reads; a stage is refilled once the
 * consumers of both CTAs released it; the grid is the number of clusters that are resident at
 * once): bitwise the output of 1, 2, 4; 8, 9 = the tiles of 1, 2 computed by 2-CTA clusters of
 * two N-adjacent tiles of one M tile (A shared the same way): bitwise the output of 1, 2;
 * 10 = 1 with each K block's scale products formed right after its stage's full-barrier wait, one
 * block ahead of its promotion (bitwise the output of 1).
 * The grouped GEMM has one CUTLASS kernel (1, 3, 4, 5, 7 all select it).
 * Benchmarking knobs of the CUTLASS tile scheduler
 * (0 = its default): bits 4..7 raster order (1 along M, 2 along N), bits 8..11 swizzle
 * (1, 2, 4, 8); stream-K kernels only: bits 12..15 decomposition (1 data-parallel,
 * 2 split-K, 3 stream-K), bits 16..23 the split-K factor, bits 24..27 reduction (1 = atomic
 * order, not bit-reproducible). Query the workspace with the algo value you run with.
 */
#ifndef DSX_GEMM_FP8_H_
#define DSX_GEMM_FP8_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU (libdsx_cpu; OpenMP) ---- */
int dsx_gemm_fp8_nt_cpu(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                        uint16_t* out, int64_t m, int64_t n, int64_t k);

int dsx_gemm_fp8_grouped_nt_contiguous_cpu(const uint8_t* a, const float* sa, const uint8_t* b,
                                           const float* sb, const int32_t* offsets,
                                           int64_t num_experts, uint16_t* out, int64_t m,
                                           int64_t n, int64_t k);

/* ---- CUDA (libdsx_cuda; sm_90a) ---- */
int dsx_gemm_fp8_nt_workspace_cuda(int64_t m, int64_t n, int64_t k, int algo, int64_t* bytes);

int dsx_gemm_fp8_nt_cuda(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb,
                         uint16_t* out, int64_t m, int64_t n, int64_t k, void* workspace,
                         int64_t workspace_bytes, int algo, void* stream);

/* The algo word an automatic launch (algo 0, or 0 with bit 28) runs as on this GPU: the word of the
 * measured table (csrc/cuda/gemm_fp8_tuned.inc: DeepSeek-V3's tensor-parallel shapes, on GPUs with the
 * table's SM count) where it lists (m, n, k), else algo itself (the rules above decide). Any other algo
 * is returned as it is. If the table's word cannot take a launch's pointers, that launch runs the
 * rules' choice (and the workspace query for algo 0 covers both). */
int dsx_gemm_fp8_nt_resolve_cuda(int64_t m, int64_t n, int64_t k, int algo, int* resolved);

/* Workspace of the grouped GEMM: per-expert argument arrays + CUTLASS scratch. `m` is the
 * total row count (offsets[E]); it must be known on the host, the split need not be. */
int dsx_gemm_fp8_grouped_nt_contiguous_workspace_cuda(int64_t num_experts, int64_t m, int64_t n,
                                                      int64_t k, int algo, int64_t* bytes);

/* offsets is a DEVICE int32 array [E+1]; it is read only by kernels (no host sync). */
int dsx_gemm_fp8_grouped_nt_contiguous_cuda(const uint8_t* a, const float* sa, const uint8_t* b,
                                            const float* sb, const int32_t* offsets,
                                            int64_t num_experts, uint16_t* out, int64_t m,
                                            int64_t n, int64_t k, void* workspace,
                                            int64_t workspace_bytes, int algo, void* stream);

/* Per-token activation quantization, fused, one launch:
 *   x : bfloat16 [M, K] row-major -> q : float8_e4m3fn [M, K], s : float32 [M, ceil(K/128)]
 *   s[m, g] = amax(|x[m, 128g : 128g+128]|) / 448 (fp32 division);
 *   q[m, k] = e4m3(x[m, k] / s[m, g]) rounded to nearest even, saturated to +-448.
 *   A group whose s would be 0 (all zeros, or amax / 448 underflows) gets s = 1.0 and codes +-0,
 *   as the CPU quantizer (quant_fp8.h). The amax ignores NaN inputs; a NaN input gives a NaN code. */
int dsx_act_quant_fp8_cuda(const uint16_t* x, uint8_t* q, float* s, int64_t m, int64_t k,
                           void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DSX_GEMM_FP8_H_ */
