/* Weight-only GEMM: bf16 activations x INT8 / INT4 weights in Paddle's layout.
 *
 *   out[m, n] = bf16( sum_k x[m, k] * q[n, k] * s(n, k) )
 *
 * Layouts (N = out features, K = in features; "nt": out = x @ W^T):
 *   x       : bfloat16 [M, K] row-major (uint16_t bits)
 *   qweight : Paddle's `weight_quantize` bytes for arch 75..100 (80, 89 and 90 are
 *             identical): int8 [N, K] (bits 8) or [N/2, K] (bits 4), the sm80-style
 *             CUTLASS mixed-GEMM interleave (docs/format-weight-only.md, section 3);
 *             q[n, k] is the signed integer it encodes (-128..127 or -8..7)
 *   scale   : bfloat16 [N] (group_size -1) or [ceil(K/group_size), N] (group 64, 128);
 *             s(n, k) = scale[n] or scale[k / group_size, n]
 *   out     : bfloat16 [M, N] row-major
 * Requirements: bits 4|8, group_size -1|64|128, arch 75|80|86|89|90|100 (arch 70's
 * row-major bytes are refused), N % 64 == 0, K % 64 == 0, M >= 0 (M == 0 is a no-op).
 *
 * Accumulation order.
 *  CPU: each weight is dequantized once to fp32, w = float(q) * float(s) (exact: at most
 *  7 + 8 significant bits); every product w * x is then exact in fp32 (at most 23 bits)
 *  except for underflow, so only the sums round. For each (m, n), lane j (j = k mod 8)
 *  sums its products in increasing k, the 8 lanes are combined as
 *  ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then rounded once to bf16
 *  (nearest even). Error bound: |acc - exact| <= (K/8 + 3) * 2^-24 * sum_k |x w|, plus
 *  the bf16 rounding (<= 2^-8 |acc|). The result does not depend on the thread count.
 *  CUDA: tensor-core mma (m16n8k16, bf16 in, fp32 accumulate) on the integers q (exact in
 *  bf16) times x; the K range is cut into `splits` contiguous slices of whole steps
 *  (a step is 64 K for int8, 128 K for int4). Each step's partial P (a chain of at most
 *  8 mma started at 0, in the tensor cores' own order; one per 64-group for int4 g64)
 *  joins an fp32 accumulator in increasing k: per-channel scale acc = acc + P, and the
 *  slice's acc is multiplied by s(n) at the end; group scale acc = fma(P, s, acc).
 *  The slices' fp32 partials are summed in slice order (0, 1, ...) through distributed
 *  shared memory of a thread-block cluster, then rounded to bf16. No atomics: for fixed
 *  (M, N, K, algo) on one GPU model the output is bit-for-bit reproducible, and of
 *  the algo fields only splits changes it (it moves the slice boundaries); warps,
 *  x chunk, ring slots and steps per slot do not. The fold (int4 per channel, 9..16 rows,
 *  x through the warp-specialized kernel's ring where every block loops over two tile
 *  groups or more; dsx_wo_gemm_path_cuda says 3): the mma take q + 136 instead of q, and
 *  each slice's acc, before the scale, gets fma(-136, S, acc), S the fp32 sum of its x
 *  row over the slice (per 128-K step a chain of 8 mma of x against ones, the steps added
 *  in increasing k). Its partial sums are about 136 / |q| times larger, and so is their
 *  rounding: the same error bound form with sum_k |x| (|q| + 136) |s| in place of
 *  sum_k |x w|. Its bits differ from the other paths' at the same split; among fold
 *  launches only splits changes them.
 *
 * CUDA entry: device pointers (x, qweight 16-byte aligned; scale and out 2-byte aligned),
 * asynchronous on `stream` (a cudaStream_t as void*, NULL = legacy default stream), no
 * allocation, one launch per 64 rows of x, or per 32 where automatic launches of 32 rows take the
 * warp-specialized kernel (33..64 rows: one launch of two grid parts where both parts' blocks are
 * resident at once, the second part's rows with the first's configuration), unless an automatic launch of
 * all 33..64 rows takes it with eight token tiles (below; dsx_wo_gemm_launch_cuda says which) (so CUDA-graph
 * capturable; the weights' TMA
 * descriptor travels as a kernel parameter). `algo` 0 = automatic; otherwise a tuning word:
 * bits 0..3 warps per block (each warp owns 16 output channels: 1, 2, 4, 8), bits 4..7 K
 * splits = cluster size (1..8), bits 8..15 x chunk (steps of activations staged in
 * shared memory at once, 1..255), bits 16..19 ring slots of weights per warp (2..15; 1 for
 * M <= 8 only: one slot, refilled as soon as its steps are in registers, before their
 * arithmetic), bits 20..23 steps per slot (one tensor copy each, 1..8: stages x box steps of
 * weights are in flight per warp); a zero field keeps its automatic value. Bit 24 (with any word, 0 too):
 * programmatic dependent launch: the kernel fetches its first weights, then waits for the previous
 * kernel of the stream before it reads x, and lets the next kernel start launching once its own
 * main loop is done (so weights and scales must not be written by an earlier kernel still running).
 * Bits 25 (one K step at a time instead of two interleaved chains) and 26 (one tile group per block
 * instead of persistent blocks) are for measurements; neither changes the output bits, nor does
 * bit 24.
 * Bit 28 (launches of up to 32 rows; up to 64 with bits 29..30 = 1): the warp-specialized kernel
 * (gemm_weight_only_ws.cuh): one producer warp a block issues the weights' tensor copies into a
 * ring shared by the block's warps (bits 16..19: its slots, automatic 4; bits 20..23: steps
 * per slot, automatic 1; a slot holds those steps of all warps), and x is staged whole (an
 * automatic chunk becomes the slice; a given chunk must hold it, else DSX_EINVAL, but for a given
 * chunk equal to the steps a slot with int4 (any scales), 9..16 rows and two tiles a
 * warp: x through the ring, one tensor copy of x a step into an x ring beside the weights', the
 * same bits; and 3, 5, 6 or 7 warps are taken with bits 29..30 and a given split; where the
 * whole slice does not fit with chunk and ring fields automatic, and for launches of more
 * than 32 rows, the existing kernel runs, its ring automatic; 17..32 rows: one tile a warp, and bits
 * 29..30 pick how its consumers multiply: 0 = wgmma where the steps a block runs are at least 32
 * and x for whole token groups of 8 rows keeps the blocks an SM (ws_wgmma_pays), else mma.sync;
 * 1 = wgmma (4 or 8 warps, any layout (int4 group 64 since the forty-third session), x as its operand
 * fitting, else DSX_EINVAL); 2 = mma.sync. The wgmma chain runs the mma chain's k-steps in its
 * order: the same bits either way. 33..64 rows with bits 29..30 = 1: one launch of eight token tiles
 * (m64n64k16), the same conditions; with 0 or 2 the existing kernel as above).
 * Warps and splits resolve as without the bit (but for splits and chunk both automatic where
 * that would stage x in chunks: then 8 splits), and the arithmetic is the same: for equal splits
 * the output has the same bits as without it. Bits 29..30 (with bit 28; launches of up to 16 rows):
 * 1 or 2 = each consumer warp owns 2 or 4 tiles of 16 output channels (a block
 * 16 x tiles x warps channels), so that one x fragment load from shared memory feeds the mma of
 * all of them; each tile's arithmetic is unchanged (the same bits). DSX_EINVAL: bits 29..30
 * without bit 28, or equal to 3. Automatic (algo 0, or only bits 24..26) at
 * 9..16 rows, where x fits whole, with 2 slots of 2 steps: int4 per channel, int4 group 128 and
 * int8 per channel take bit 28 with two tiles a warp (8 warps) where that grid still has a block
 * for every SM and keeps at least as many tiles resident on an SM as one tile a warp; else int4 (per channel or group 128) takes bit 28
 * with one tile a warp and int8 the kernel without it (measured, H200, against the previous
 * choice, same run: int4 per channel and int8 4-22% faster on the three large DeepSeek-V3 shapes
 * at M = 9, 12, 16 and unchanged on the three small ones, int4 group 128 7-28% faster on all six;
 * gemm_weight_only_ws.cuh and docs/benchmarks.md have the figures). Int4 per channel, 1..16 rows, before
 * that: four tiles a warp (8 warps, 2 slots of 1 step) where that grid runs in one round (no more
 * blocks than the SMs hold at once), has a block for at least 2/3 of the SMs and keeps at least as
 * many tiles resident as two tiles a warp; at 1..8 rows (int4 per channel only) the two-tile rule
 * above (at 2..8 rows, where that grid takes more than one round of resident blocks: four tiles a
 * warp at twice its split, 2 slots of 1 step, if that split is at most 8 with slices of at least 4
 * steps and as many tiles resident; 36864 x 7168: 8 splits, 2-5% faster at M = 2..8, twelfth
 * session), else one tile a warp (2 x 2) where the plain grid would not be the balanced one (bit 27),
 * else the plain or balanced kernel as before (measured, H200, same run: 5-16% faster than the
 * previous choice on the three large DeepSeek-V3 shapes at M = 1, 4, 8, 1-5% on the three small ones,
 * four tiles 4-11% at 9..16 rows on 7168 x 18432 and 24576 x 1536). At 1..8 rows auto's bits are
 * then the plain kernel's at its split (not the balanced grid's). Int4 group 64 takes group 128's rules
 * (since the forty-second session; before, the kernel without bit 28 at any rows). Automatic at 17..32 rows
 * (every layout): bit 28, one tile a warp, the split without it, 2 slots of 2 steps,
 * wherever x fits whole (measured, H200: faster than the kernel without it at every DeepSeek-V3 tp
 * shape, 1.04-3.1x); so the same bits as the kernel without bit 28 at that split. Automatic at 33..64
 * rows (every layout; int4 group 64 since the forty-third session, before it the cut below): one launch of
 * all the rows with eight token tiles through wgmma (its split, 2 slots of 2 steps, or, per channel only, of
 * 1 step where only that holds two blocks an SM) where x fits whole and the cut at 32 rows would not run as two grid parts;
 * else the cut above (measured, H200: int4 36864 x 7168 M = 64 159 -> 131 us, M = 33..40 121 -> 104; the
 * same bits as the kernel without bit 28 at its split). Bits 27 and 28 together: DSX_EINVAL.
 * Returns 0, DSX_EINVAL
 * or DSX_ECUDA (launch failure, or no driver entry point for the TMA descriptor).
 *
 * Bit 27 (int4 per channel, M <= 8, persistent blocks; x staged whole, so an x chunk field below
 * the slice is refused): the balanced grid. G clusters are launched: as many as the GPU holds at
 * once with this configuration (its shared memory includes the partial tiles of ceil(N/16 / G)
 * tiles), at most N/16. Cluster c owns the 16-channel tiles [N/16 * c / G, N/16 * (c + 1) / G)
 * (T of them, floor division); each of its blocks (K slice r of L steps, as above) deals its
 * T * L (tile, step) units, tile-major with steps in increasing k, to its first W = min(warps,
 * T * L) warps in contiguous runs: warp w takes units [T L w / W, T L (w + 1) / W) (floor
 * division). Accumulation order: each run's part of a tile (a piece) is a chain of step partials
 * P joined in increasing k exactly as above (acc = acc + P from 0); a tile that run boundaries
 * cut gets its pieces added in k order, ((first + second) + third) ..., in fp32, and is then
 * multiplied by s(n); every other tile's slice partial is the one above, bit for bit. The slices'
 * partials are summed in slice order as above. Bits then depend on (M, N, K, the algo word) and
 * the GPU's resident cluster count (fixed for a GPU model): bits 24 and 25 do not move them; the
 * warps, splits, ring and box fields may (they move G or the runs). No atomics, no workspace;
 * reproducible run to run. The automatic choice (algo 0) takes bit 27 only where choose() in
 * gemm_weight_only.cu says (measured) and the warp-specialized rule above does not apply; its output
 * bits are then these.
 */
#ifndef DSX_GEMM_WEIGHT_ONLY_H_
#define DSX_GEMM_WEIGHT_ONLY_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CPU (libdsx_cpu, OpenMP over tiles of 16 output channels). num_threads 0 = OpenMP's
 * default. Returns 0, DSX_EINVAL or DSX_ENOMEM. */
int dsx_wo_gemm_bf16_nt_cpu(const uint16_t* x, const int8_t* qweight, const uint16_t* scale,
                            uint16_t* out, int64_t m, int64_t n, int64_t k, int bits,
                            int group_size, int arch, int num_threads);

/* CUDA (libdsx_cuda, sm_90a). Pointers are device memory. */
int dsx_wo_gemm_bf16_nt_cuda(const void* x, const void* qweight, const void* scale, void* out,
                             int64_t m, int64_t n, int64_t k, int bits, int group_size,
                             int arch, int algo, void* stream);

/* The launch configuration `algo` resolves to for this shape on the current device (its first launch):
 * warps per block, K splits, x chunk (steps), ring slots, steps per slot (for benchmarks
 * and logs). */
int dsx_wo_gemm_config_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size,
                            int algo, int* warps, int* splits, int* chunk, int* stages, int* box);

/* Which kernel `algo` resolves to for the first launch (min(M, 64) rows, or 32 as above): *ws = 1 for the
 * warp-specialized one (bit 28, or auto's choice), 2 for it with x through its ring (a given chunk equal to the
 * steps a slot, shorter than the K slice: int4, 9..16 rows, two tiles a warp), 3 for that
 * with the fold (int4 per channel, where every block loops over two tile groups or more: see the accumulation
 * order above), 4 for it with wgmma consumers (17..64 rows, bits 29..30 above), and its 16-channel tiles a
 * consumer warp (*tiles: 1, 2 or 4; 1 for the other kernels). */
int dsx_wo_gemm_path_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size, int algo, int* ws,
                          int* tiles);

/* The rows of M the first launch takes (*rows: min(M, 64), or 32 as above) and the grid parts it runs
 * them in (*parts: 1, or 2 where the rows past 32 run beside the first 32 with their configuration). */
int dsx_wo_gemm_launch_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size, int algo, int* rows,
                            int* parts);

#ifdef __cplusplus
}
#endif

#endif /* DSX_GEMM_WEIGHT_ONLY_H_ */
