// Greedy MTP draft acceptance on the CPU (semantics in include/dsx/mtp_accept.h).
#include <cstdint>

#include "dsx.h"

namespace {

template <typename T>
int accept_greedy(const T* draft, const T* target, const int32_t* num_draft, T* accepted,
                  int32_t* count, int64_t batch, int64_t k) {
  if (batch < 0 || k < 0) return DSX_EINVAL;
  if (batch == 0) return DSX_OK;
  if (!target || !num_draft || !accepted || !count || (k > 0 && !draft)) return DSX_EINVAL;
  for (int64_t b = 0; b < batch; ++b) {
    if (num_draft[b] < 0 || num_draft[b] > k) return DSX_EINVAL;
  }
  for (int64_t b = 0; b < batch; ++b) {
    const T* d = draft + b * k;
    const T* t = target + b * (k + 1);
    T* out = accepted + b * (k + 1);
    const int64_t n = num_draft[b];
    int64_t i = 0;
    while (i < n && d[i] == t[i]) {
      out[i] = d[i];
      ++i;
    }
    out[i] = t[i];  // bonus token from the base model
    for (int64_t j = i + 1; j <= k; ++j) out[j] = static_cast<T>(-1);
    count[b] = static_cast<int32_t>(i + 1);
  }
  return DSX_OK;
}

}  // namespace

extern "C" int dsx_mtp_accept_greedy_i32_cpu(const int32_t* draft, const int32_t* target,
                                             const int32_t* num_draft, int32_t* accepted,
                                             int32_t* count, int64_t batch, int64_t k) {
  return accept_greedy(draft, target, num_draft, accepted, count, batch, k);
}

extern "C" int dsx_mtp_accept_greedy_i64_cpu(const int64_t* draft, const int64_t* target,
                                             const int32_t* num_draft, int64_t* accepted,
                                             int32_t* count, int64_t batch, int64_t k) {
  return accept_greedy(draft, target, num_draft, accepted, count, batch, k);
}
