// Greedy MTP draft acceptance on the GPU (semantics in include/dsx/mtp_accept.h).
// One thread per sequence, one launch, no allocation: safe to capture in a CUDA graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "dsx.h"

namespace {

constexpr int kThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    accept_greedy_kernel(const T* __restrict__ draft, const T* __restrict__ target,
                         const int32_t* __restrict__ num_draft, T* __restrict__ accepted,
                         int32_t* __restrict__ count, int64_t batch, int64_t k) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= batch) return;
  const T* d = draft + b * k;
  const T* t = target + b * (k + 1);
  T* out = accepted + b * (k + 1);
  int64_t n = num_draft[b];  // clamped to [0, k]: a kernel has no error path
  n = n < 0 ? 0 : (n > k ? k : n);
  int64_t i = 0;
  while (i < n && d[i] == t[i]) {
    out[i] = d[i];
    ++i;
  }
  out[i] = t[i];
  for (int64_t j = i + 1; j <= k; ++j) out[j] = static_cast<T>(-1);
  count[b] = static_cast<int32_t>(i + 1);
}

template <typename T>
int launch(const T* draft, const T* target, const int32_t* num_draft, T* accepted,
           int32_t* count, int64_t batch, int64_t k, void* stream) {
  if (batch < 0 || k < 0) return DSX_EINVAL;
  if (batch == 0) return DSX_OK;
  if (!target || !num_draft || !accepted || !count || (k > 0 && !draft)) return DSX_EINVAL;
  const int64_t blocks = (batch + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return DSX_EINVAL;
  accept_greedy_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(draft, target, num_draft,
                                                                 accepted, count, batch, k);
  return cudaGetLastError() == cudaSuccess ? DSX_OK : DSX_ECUDA;
}

}  // namespace

extern "C" int dsx_mtp_accept_greedy_i32_cuda(const int32_t* draft, const int32_t* target,
                                              const int32_t* num_draft, int32_t* accepted,
                                              int32_t* count, int64_t batch, int64_t k,
                                              void* stream) {
  return launch(draft, target, num_draft, accepted, count, batch, k, stream);
}

extern "C" int dsx_mtp_accept_greedy_i64_cuda(const int64_t* draft, const int64_t* target,
                                              const int32_t* num_draft, int64_t* accepted,
                                              int32_t* count, int64_t batch, int64_t k,
                                              void* stream) {
  return launch(draft, target, num_draft, accepted, count, batch, k, stream);
}
