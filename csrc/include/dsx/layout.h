#ifndef DSX_LAYOUT_H_
#define DSX_LAYOUT_H_
/* Layout changes of whole tensors (host memory). Python reference: ds_export/formats/_arrays.py.
 *
 * dsx_transpose_rowmajor: out[cols, rows] = in[rows, cols]^T for elements of elem_bytes = 1, 2, 4 or 8 bytes
 * (the bits are moved, never interpreted). dsx export writes a Linear's [out, in] weight as Paddle's [in, out];
 * numpy's copy of a transposed view walks memory a column apart. Copied here in square tiles that fit the L1 cache,
 * the tiles spread over the OpenMP threads. in and out must not overlap; DSX_EINVAL for another element size or a
 * negative extent.
 */
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int dsx_transpose_rowmajor(const void* in, int64_t rows, int64_t cols, int64_t elem_bytes, void* out);

#ifdef __cplusplus
}
#endif

#endif /* DSX_LAYOUT_H_ */
