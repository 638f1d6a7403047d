#ifndef DSX_QUANT_CUDA_H_
#define DSX_QUANT_CUDA_H_
/* GPU conversion kernels for `dsx quantize --device cuda` (libdsx_cuda, sm_90a):
 * csrc/cuda/quant_convert.cu. Each is bit-identical with the CPU path on the same
 * input (csrc/cpu/quant_fp8.cc, csrc/cpu/quant_weight_only.cc; specs in
 * docs/format-fp8-block.md and docs/format-weight-only.md).
 *
 * Conventions (plain C, so that the CPU build may include this header):
 *  - every pointer argument is DEVICE memory, passed as void*; `stream` is a
 *    cudaStream_t as void* (NULL = the legacy default stream); calls only enqueue
 *    work (asynchronous), allocate nothing, and are CUDA-graph capturable;
 *  - everything is CHUNK-LOCAL: a call processes rows [row_begin, row_end) of an
 *    [n, k] row-major tensor, `w_rows` points at row row_begin (the chunk's rows
 *    only), a block-scale input points at scale row row_begin / block_n, and the
 *    outputs receive just that chunk (layouts below);
 *  - data pointers must be 16-byte aligned (cudaMalloc'ed buffers are);
 *  - the return value reports argument errors (DSX_EINVAL) and launch failures
 *    (DSX_ECUDA); input-dependent failures (NaN / Inf in a weight) are found on
 *    the device: the kernel then stores a nonzero code into the int32 at `status`
 *    (DSX_WO_ENONFINITE or DSX_EINVAL, as the CPU kernel returns), which the caller
 *    zeroes before the launch and reads back after it; outputs are then unspecified.
 */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Input element types of the converters. */
enum { DSX_QC_F32 = 0, DSX_QC_BF16 = 1, DSX_QC_FP8 = 2 };

/* FP8 block dequant (== dsx_fp8_block_dequant_rowmajor on the chunk):
 *   w_rows     e4m3 bytes [row_end - row_begin, k];
 *   scale_rows float32 rows row_begin/block_n .. ceil(row_end/block_n)-1 of the
 *              [ceil(n/block_n), ceil(k/block_k)] scale_inv (row stride ceil(k/block_k));
 *   out        [row_end - row_begin, k], float32 (DSX_FP8_OUT_F32) or bf16 bits
 *              (DSX_FP8_OUT_BF16), value = decode(w) * scale in float32 (x86's NaN
 *              results reproduced), bf16 = RNE. Any row range. */
int dsx_fp8_block_dequant_rowmajor_rows_cuda(const void* w_rows, const void* scale_rows, int64_t n,
                                             int64_t k, int64_t block_n, int64_t block_k,
                                             int64_t row_begin, int64_t row_end, int out_dtype,
                                             void* out, void* stream);

/* Weight-only INT8 / INT4 in Paddle's layout, chunk-local outputs
 * (== dsx_wo_quantize_bf16_rowmajor_nk_rows of the bf16 rows the CPU path feeds it):
 *   in_dtype DSX_QC_FP8 : w_rows e4m3 [rows, k_in] with scale_rows (block_n, block_k)
 *                         as above; each value is dequantized and rounded to bf16
 *                         first (what dequant_native(..., 'bfloat16') gives);
 *            DSX_QC_BF16: w_rows bf16 bits [rows, k_in] (scale_rows unused);
 *            DSX_QC_F32 : w_rows float32 [rows, k_in], rounded to bf16 (RNE) first;
 *   qweight_rows: the (row_end - row_begin) * k_in * bits / 8 bytes these output
 *                 channels own in Paddle's layout (arch 75..100: identical bytes);
 *   scale_out   : bf16 [rows] (group_size -1) or [ceil(k_in/group_size), rows].
 * n_out % 64 == 0, k_in % 64 == 0, row_begin and row_end multiples of 8;
 * bits 4|8, group_size -1|64|128. status: DSX_WO_ENONFINITE on NaN / Inf. */
int dsx_wo_quantize_rowmajor_nk_rows_cuda(const void* w_rows, int in_dtype, const void* scale_rows,
                                          int64_t block_n, int64_t block_k, int64_t n_out,
                                          int64_t k_in, int64_t row_begin, int64_t row_end,
                                          int bits, int group_size, int arch, void* qweight_rows,
                                          void* scale_out, void* status, void* stream);

/* Block FP8 quantization (== dsx_fp8_block_quant_{f32,bf16}_rowmajor on the chunk;
 * for DSX_QC_FP8 input == quantize of dsx_fp8_block_dequant_rowmajor's float32):
 *   w_rows: float32 / bf16 bits / e4m3 bytes [rows, k]; for e4m3, src_scale_rows are
 *           its float32 scale rows (block src_block_n x src_block_k) as above;
 *   out   : e4m3 bytes [rows, k]; scale_inv_out: float32 [ceil(row_end/block_n) -
 *           row_begin/block_n, ceil(k/block_k)]; scale_inv = amax/448, 0 -> 1.0.
 * row_begin % block_n == 0, row_end % block_n == 0 or row_end == n.
 * status: DSX_EINVAL on NaN / Inf input. */
int dsx_fp8_block_quant_rowmajor_rows_cuda(const void* w_rows, int in_dtype,
                                           const void* src_scale_rows, int64_t src_block_n,
                                           int64_t src_block_k, int64_t n, int64_t k,
                                           int64_t block_n, int64_t block_k, int64_t row_begin,
                                           int64_t row_end, void* out, void* scale_inv_out,
                                           void* status, void* stream);

#ifdef __cplusplus
}
#endif
#endif /* DSX_QUANT_CUDA_H_ */
