// MTP draft acceptance on the GPU, greedy and top-p (semantics in include/dsx/mtp_accept.h).
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
    accept_topp_kernel(const T* __restrict__ draft, const T* __restrict__ cand,
                       const int32_t* __restrict__ ncand, const T* __restrict__ sampled,
                       const int32_t* __restrict__ num_draft, T* __restrict__ accepted,
                       int32_t* __restrict__ count, int64_t batch, int64_t k, int64_t c) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= batch) return;
  const T* d = draft + b * k;
  T* out = accepted + b * (k + 1);
  int64_t n = num_draft[b];  // clamped: a kernel has no error path
  n = n < 0 ? 0 : (n > k ? k : n);
  int64_t i = 0;
  for (; i < n; ++i) {
    const T* row = cand + (b * (k + 1) + i) * c;
    int64_t m = ncand[b * (k + 1) + i];
    m = m < 1 ? 1 : (m > c ? c : m);
    bool in_set = false;
    for (int64_t j = 0; j < m && !in_set; ++j) in_set = row[j] == d[i];
    if (!in_set) break;
    out[i] = d[i];
  }
  out[i] = sampled[b * (k + 1) + i];
  for (int64_t j = i + 1; j <= k; ++j) out[j] = static_cast<T>(-1);
  count[b] = static_cast<int32_t>(i + 1);
}

template <typename T>
int launch_topp(const T* draft, const T* cand, const int32_t* ncand, const T* sampled,
                const int32_t* num_draft, T* accepted, int32_t* count, int64_t batch, int64_t k,
                int64_t c, void* stream) {
  if (batch < 0 || k < 0 || c < 1) return DSX_EINVAL;
  if (batch == 0) return DSX_OK;
  if (!cand || !ncand || !sampled || !num_draft || !accepted || !count || (k > 0 && !draft)) {
    return DSX_EINVAL;
  }
  const int64_t blocks = (batch + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return DSX_EINVAL;
  accept_topp_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      draft, cand, ncand, sampled, num_draft, accepted, count, batch, k, c);
  return cudaGetLastError() == cudaSuccess ? DSX_OK : DSX_ECUDA;
}

}  // namespace

extern "C" int dsx_mtp_accept_topp_i32_cuda(const int32_t* draft, const int32_t* candidates,
                                            const int32_t* num_candidates, const int32_t* sampled,
                                            const int32_t* num_draft, int32_t* accepted,
                                            int32_t* count, int64_t batch, int64_t k, int64_t c,
                                            void* stream) {
  return launch_topp(draft, candidates, num_candidates, sampled, num_draft, accepted, count, batch,
                     k, c, stream);
}

extern "C" int dsx_mtp_accept_topp_i64_cuda(const int64_t* draft, const int64_t* candidates,
                                            const int32_t* num_candidates, const int64_t* sampled,
                                            const int32_t* num_draft, int64_t* accepted,
                                            int32_t* count, int64_t batch, int64_t k, int64_t c,
                                            void* stream) {
  return launch_topp(draft, candidates, num_candidates, sampled, num_draft, accepted, count, batch,
                     k, c, stream);
}

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
