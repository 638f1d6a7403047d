// MLA decode attention (absorbed weights, paged latent cache): the CPU reference.
// Contract and layouts: include/dsx/mla_decode.h.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dsx.h"
#include "numeric.h"

namespace {

using dsx_num::bf16_to_f32;

constexpr int kPage = DSX_MLA_PAGE, kLat = DSX_MLA_LATENT, kDim = DSX_MLA_DIM;

struct Args {
  const uint16_t* q;
  const uint16_t* kv;
  const int32_t* pt;
  const int32_t* lens;
  uint16_t* out;
  float* lse;
  int64_t s_q, heads, max_pages;
  float scale;
};

// One (b, h): all S_q queries of that head. `score` is scratch of len_b floats.
void one_head(const Args& a, int64_t b, int64_t h, std::vector<float>& score) {
  const int64_t len = a.lens[b];
  const int32_t* pages = a.pt + b * a.max_pages;
  float qf[kDim], acc[kLat];
  for (int64_t s = 0; s < a.s_q; ++s) {
    const int64_t row = (b * a.s_q + s) * a.heads + h;
    const uint16_t* qrow = a.q + row * kDim;
    for (int d = 0; d < kDim; ++d) qf[d] = bf16_to_f32(qrow[d]);
    const int64_t visible = len - a.s_q + s + 1;  // positions 0 .. len - S_q + s
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < visible; ++t) {
      const uint16_t* k = a.kv + (static_cast<int64_t>(pages[t / kPage]) * kPage + t % kPage) * kDim;
      float dot = 0.f;
      for (int d = 0; d < kDim; ++d) dot += qf[d] * bf16_to_f32(k[d]);
      score[t] = dot * a.scale;
      if (score[t] > m) m = score[t];
    }
    float l = 0.f;
    for (int d = 0; d < kLat; ++d) acc[d] = 0.f;
    for (int64_t t = 0; t < visible; ++t) {
      const float p = std::exp(score[t] - m);
      l += p;
      const uint16_t* c = a.kv + (static_cast<int64_t>(pages[t / kPage]) * kPage + t % kPage) * kDim;
      for (int d = 0; d < kLat; ++d) acc[d] += p * bf16_to_f32(c[d]);
    }
    uint16_t* o = a.out + row * kLat;
    const float inv = 1.f / l;
    for (int d = 0; d < kLat; ++d) o[d] = dsx_num::f32_to_bf16_rne(acc[d] * inv);
    a.lse[row] = m + std::log(l);
  }
}

}  // namespace

extern "C" int dsx_mla_decode_paged_bf16_cpu(const uint16_t* q, const uint16_t* kv_cache,
                                             const int32_t* page_table, const int32_t* cache_lens,
                                             uint16_t* out, float* lse, int64_t batch, int64_t s_q,
                                             int64_t heads, int64_t num_pages, int64_t max_pages,
                                             float softmax_scale, int threads) {
  if (batch < 0 || s_q < 1 || s_q > 6 || heads < 1 || heads > 128 || num_pages < 1 || max_pages < 1 ||
      threads < 0 || !std::isfinite(softmax_scale))
    return DSX_EINVAL;
  if (batch == 0) return DSX_OK;
  if (!q || !kv_cache || !page_table || !cache_lens || !out || !lse) return DSX_EINVAL;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = cache_lens[b];
    if (len < s_q || len > max_pages * kPage) return DSX_EINVAL;
    for (int64_t p = 0; p < (len + kPage - 1) / kPage; ++p) {
      const int32_t id = page_table[b * max_pages + p];
      if (id < 0 || id >= num_pages) return DSX_EINVAL;
    }
    if (len > longest) longest = len;
  }
  const Args a{q, kv_cache, page_table, cache_lens, out, lse, s_q, heads, max_pages, softmax_scale};
  const int nthr = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel num_threads(nthr)
  {
    std::vector<float> score(static_cast<size_t>(longest));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) one_head(a, b, h, score);
  }
  return DSX_OK;
}
