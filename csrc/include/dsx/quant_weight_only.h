#ifndef DSX_QUANT_WEIGHT_ONLY_H_
#define DSX_QUANT_WEIGHT_ONLY_H_
/* Weight-only INT8 / INT4 in Paddle's `weight_quantize` layout (CPU op, 3.3.1),
 * byte for byte. Layout spec: docs/format-weight-only.md.
 *
 * Shapes (N = out features, K = in features, HF weight layout [N, K]):
 *   qweight int8 [N, K] (bits 8) or [N/2, K] (bits 4), Paddle's byte order;
 *   scale   bf16 [N] (group_size -1) or [ceil(K/group_size), N].
 * bits 4|8, group_size -1|64|128, arch 70|75|80|86|89|90|100 (75..100 identical).
 * arch >= 75 needs N % 64 == 0 and K % 64 == 0; arch 70 needs N % 16 == 0.
 */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returned when the weight holds NaN or Inf (nothing sensible to quantize). */
#define DSX_WO_ENONFINITE (-10)

/* Output channels [row_begin, row_end) must be multiples of this. */
#define DSX_WO_ROW_ALIGN 8

/* Quantize output channels [row_begin, row_end) of a bf16 weight.
 *   w_rows   : bf16 rows row_begin..row_end-1 of the [N, K] weight, row-major
 *              (w_rows[0] is row row_begin);
 *   qweight  : the FULL qweight buffer (N*K*bits/8 bytes); only the bytes of
 *              these channels are written (contiguous for arch >= 75, a column
 *              slice of each of the K byte rows for arch 70);
 *   scale    : the FULL scale buffer; only columns row_begin..row_end-1;
 *   num_threads: OpenMP threads, 0 = OpenMP's default.
 * Chunks with disjoint row ranges may run concurrently on the same buffers.
 * Returns 0, DSX_EINVAL, DSX_ENOMEM or DSX_WO_ENONFINITE. */
int dsx_wo_quantize_bf16_rowmajor_nk(const uint16_t* w_rows, int64_t n_out, int64_t k_in,
                                     int64_t row_begin, int64_t row_end, int bits,
                                     int group_size, int arch, int8_t* qweight,
                                     uint16_t* scale, int num_threads);

/* The same, with chunk-local outputs (arch >= 75 only; arch 70 returns DSX_EINVAL):
 *   qweight_rows: the (row_end - row_begin) * K * bits / 8 bytes these channels own,
 *                 which are contiguous in Paddle's layout (they start at byte
 *                 row_begin * K * bits / 8 of the full qweight);
 *   scale_rows  : bf16 [row_end - row_begin] (group -1) or [ceil(K/group), row_end - row_begin].
 * Consecutive chunks' qweight_rows concatenate to the full qweight, so a tensor
 * streams to disk in bounded memory. */
int dsx_wo_quantize_bf16_rowmajor_nk_rows(const uint16_t* w_rows, int64_t n_out, int64_t k_in,
                                          int64_t row_begin, int64_t row_end, int bits,
                                          int group_size, int arch, int8_t* qweight_rows,
                                          uint16_t* scale_rows, int num_threads);

/* The same from a block-FP8 source, fused: rows are float8_e4m3fn codes (w_fp8_rows
 * points at row row_begin), scale_inv the full [ceil(N/block_n), ceil(K/block_k)]
 * float32 block scales. Each row is decoded to exactly the bf16 Paddle would be
 * given (float32 decode(code) * scale_inv, round to nearest even) and quantized,
 * without materializing the bf16 tensor. Bit-identical to dequantizing to bf16
 * and calling dsx_wo_quantize_bf16_rowmajor_nk_rows. */
int dsx_wo_quantize_fp8_rowmajor_nk_rows(const uint8_t* w_fp8_rows, const float* scale_inv,
                                         int64_t block_n, int64_t block_k, int64_t n_out,
                                         int64_t k_in, int64_t row_begin, int64_t row_end,
                                         int bits, int group_size, int arch, int8_t* qweight_rows,
                                         uint16_t* scale_rows, int num_threads);

/* Inverse: qweight + scale -> float32 [N, K] row-major (q * scale, exact
 * float32 product). Returns 0 or DSX_EINVAL. */
int dsx_wo_dequantize_rowmajor_nk(const int8_t* qweight, const uint16_t* scale,
                                  int64_t n_out, int64_t k_in, int bits, int group_size,
                                  int arch, float* w_out, int num_threads);

#ifdef __cplusplus
}
#endif
#endif /* DSX_QUANT_WEIGHT_ONLY_H_ */
