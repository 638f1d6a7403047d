#ifndef DSX_QUANT_FP8_H_
#define DSX_QUANT_FP8_H_
/* Block-FP8 (float8_e4m3fn + float32 scale_inv) and bfloat16 conversions.
 * Spec: docs/format-fp8-block.md. Python reference: ds_export/formats/fp8_block.py.
 *
 * Layouts (all row-major):
 *   weight     w    uint8 (e4m3fn bits) [n, k]
 *   scale_inv  s    float32 [ceil(n/block_n), ceil(k/block_k)]; element (r, c) of w
 *                   belongs to s[r / block_n][c / block_k]; dequant = decode(w) * s
 *                   (a multiplier), the product in float32.
 *   activation x    [m, k] quantized per row in groups of `group` columns: scale
 *                   float32 [m, ceil(k/group)] (block (1, group)).
 *
 * Row ranges (chunking): inputs always point at row 0 of the full tensor; the
 * function processes rows [row_begin, row_end) only, and outputs receive just
 * that chunk: `out` points at the chunk's first row, a scale output at scale
 * row row_begin / block_n. Quantizers need row_begin % block_n == 0 and
 * (row_end % block_n == 0 or row_end == n); dequant accepts any range.
 *
 * Encoding float32 -> e4m3fn: round to nearest even on the exact value, finite
 * values beyond +-448 saturate to +-448 (0x7E/0xFE), +-inf saturate to +-448,
 * NaN -> 0x7F|sign (PTX "satfinite" semantics). Quantizers reject non-finite
 * input with DSX_EINVAL (outputs then unspecified).
 * Quant scale: scale_inv = amax / 448 (float32 division), value = x / scale_inv
 * (float32 division); a block whose scale_inv is 0 (all zeros, or amax so small
 * that amax/448 underflows) gets scale_inv = 1.0.
 */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DSX_FP8_OUT_F32 = 0, DSX_FP8_OUT_BF16 = 1 };

/* Elementwise: float32 -> e4m3fn bits (RNE, saturating), count elements. */
int dsx_f32_to_fp8_e4m3_sat(const float* x, int64_t count, uint8_t* out);
/* Elementwise: e4m3fn bits -> float32 via the 256-entry table (NaN = 0x7FC00000|sign). */
int dsx_fp8_e4m3_to_f32(const uint8_t* x, int64_t count, float* out);
/* NaN codes (0x7F, 0xFF: e4m3fn has no infinities) among count codes: *n_nan their number, *first the index of
 * the first (-1 if none). A source's weights are checked where they are copied or cast as they are. */
int dsx_fp8_e4m3_count_nan(const uint8_t* x, int64_t count, int64_t* n_nan, int64_t* first);
/* Elementwise: float32 -> bfloat16 bits, RNE; NaN -> 0x7FC0|sign. */
int dsx_f32_to_bf16(const float* x, int64_t count, uint16_t* out);

/* out: [row_end-row_begin, k], float32 (out_dtype DSX_FP8_OUT_F32) or bf16 bits. */
int dsx_fp8_block_dequant_rowmajor(const uint8_t* w, const float* scale_inv, int64_t n, int64_t k,
                                   int64_t block_n, int64_t block_k, int64_t row_begin,
                                   int64_t row_end, int out_dtype, void* out);

/* out: [row_end-row_begin, k] e4m3 bits; scale_inv_out: rows row_begin/block_n ..
 * ceil(row_end/block_n) of the [ceil(n/block_n), ceil(k/block_k)] scale. */
int dsx_fp8_block_quant_f32_rowmajor(const float* w, int64_t n, int64_t k, int64_t block_n,
                                     int64_t block_k, int64_t row_begin, int64_t row_end,
                                     uint8_t* out, float* scale_inv_out);
int dsx_fp8_block_quant_bf16_rowmajor(const uint16_t* w, int64_t n, int64_t k, int64_t block_n,
                                      int64_t block_k, int64_t row_begin, int64_t row_end,
                                      uint8_t* out, float* scale_inv_out);

/* Per-token activation quant: block (1, group). out [row_end-row_begin, k],
 * scale_out [row_end-row_begin, ceil(k/group)]. */
int dsx_fp8_act_quant_f32_rowmajor(const float* x, int64_t m, int64_t k, int64_t group,
                                   int64_t row_begin, int64_t row_end, uint8_t* out,
                                   float* scale_out);
int dsx_fp8_act_quant_bf16_rowmajor(const uint16_t* x, int64_t m, int64_t k, int64_t group,
                                    int64_t row_begin, int64_t row_end, uint8_t* out,
                                    float* scale_out);

#ifdef __cplusplus
}
#endif

#endif /* DSX_QUANT_FP8_H_ */
