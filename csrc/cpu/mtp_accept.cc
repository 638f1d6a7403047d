// MTP draft acceptance on the CPU, greedy and top-p (semantics in include/dsx/mtp_accept.h).
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

template <typename T>
int accept_topp(const T* draft, const T* cand, const int32_t* ncand, const T* sampled,
                const int32_t* num_draft, T* accepted, int32_t* count, int64_t batch, int64_t k,
                int64_t c) {
  if (batch < 0 || k < 0 || c < 1) return DSX_EINVAL;
  if (batch == 0) return DSX_OK;
  if (!cand || !ncand || !sampled || !num_draft || !accepted || !count || (k > 0 && !draft)) {
    return DSX_EINVAL;
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (num_draft[b] < 0 || num_draft[b] > k) return DSX_EINVAL;
    for (int64_t i = 0; i <= k; ++i) {
      const int32_t n = ncand[b * (k + 1) + i];
      if (n < 1 || n > c) return DSX_EINVAL;
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const T* d = draft + b * k;
    T* out = accepted + b * (k + 1);
    const int64_t n = num_draft[b];
    int64_t i = 0;
    for (; i < n; ++i) {
      const T* row = cand + (b * (k + 1) + i) * c;
      const int32_t m = ncand[b * (k + 1) + i];
      bool in_set = false;
      for (int32_t j = 0; j < m && !in_set; ++j) in_set = row[j] == d[i];
      if (!in_set) break;
      out[i] = d[i];
    }
    out[i] = sampled[b * (k + 1) + i];  // bonus token: what the base model sampled there
    for (int64_t j = i + 1; j <= k; ++j) out[j] = static_cast<T>(-1);
    count[b] = static_cast<int32_t>(i + 1);
  }
  return DSX_OK;
}

}  // namespace

extern "C" int dsx_mtp_accept_topp_i32_cpu(const int32_t* draft, const int32_t* candidates,
                                           const int32_t* num_candidates, const int32_t* sampled,
                                           const int32_t* num_draft, int32_t* accepted,
                                           int32_t* count, int64_t batch, int64_t k, int64_t c) {
  return accept_topp(draft, candidates, num_candidates, sampled, num_draft, accepted, count, batch,
                     k, c);
}

extern "C" int dsx_mtp_accept_topp_i64_cpu(const int64_t* draft, const int64_t* candidates,
                                           const int32_t* num_candidates, const int64_t* sampled,
                                           const int32_t* num_draft, int64_t* accepted,
                                           int32_t* count, int64_t batch, int64_t k, int64_t c) {
  return accept_topp(draft, candidates, num_candidates, sampled, num_draft, accepted, count, batch,
                     k, c);
}

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
