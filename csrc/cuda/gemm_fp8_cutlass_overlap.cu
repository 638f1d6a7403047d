// Dense block-scaled FP8 GEMM, CUTLASS cooperative stream-K configuration with the scale
// promotion overlapped: cfg::DenseOverlap (gemm_fp8_cutlass.cuh). One configuration per
// translation unit.
#include "gemm_fp8_internal.cuh"

#if defined(DSX_HAVE_CUTLASS)
#include "gemm_fp8_cutlass.cuh"

namespace dsx_cuda {

int cutlass_overlap_workspace(int64_t m, int64_t n, int64_t k, Tuning t, size_t* bytes) {
  return cfg::dense_workspace<cfg::DenseOverlap>(m, n, k, t, bytes);
}

int cutlass_overlap_run(const GemmNt& g, void* ws, size_t ws_bytes, Tuning t, cudaStream_t s) {
  return cfg::dense_run<cfg::DenseOverlap>(g, ws, ws_bytes, t, s);
}

}  // namespace dsx_cuda

#else

namespace dsx_cuda {
int cutlass_overlap_workspace(int64_t, int64_t, int64_t, Tuning, size_t* bytes) {
  *bytes = 0;
  return DSX_OK;
}
int cutlass_overlap_run(const GemmNt&, void*, size_t, Tuning, cudaStream_t) { return DSX_EINVAL; }
}  // namespace dsx_cuda

#endif
