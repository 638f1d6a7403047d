// Where a launch of algo 6 (the block FP8 GEMM for M <= 128, csrc/cuda/gemm_fp8_small.cu) spends its time, per CTA:
// the kernel built with its timeline stamps (DSX_FP8_TIMELINE: the global timer at entry, after set-up, at the producer's
// first and last TMA issue, at each consumer warpgroup's first and last full-barrier pass and loop end, after the
// stores; the time the producer waited on empty stages and warpgroup 0 on full ones), timed as bench/gpu_timing.py
// times (graph of rotated input sets past L2, median of replays), then the stamps of the graph's last launch read
// back and summarized over the CTAs (median, 10th and 90th percentile, us; thread 0 stamps the end after its
// stores, or, where the CTAs of a cluster reduce their split sums, after the last cluster barrier).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include -Icsrc/cuda bench/fp8_timeline.cu \
//        -o tl && ./tl [MxNxK[:KNOBS],...]
//
// Built with -DDSX_FP8_DIAG_NORED=1 as well, the kernel leaves out its split and K-halves sums (wrong values: each CTA
// stores its own partial sums from the registers): run both builds alternately for the epilogue's lower bound. Where
// the K range is split over a cluster, a last row says how far apart the cluster's CTAs end their loops.
//
// KNOBS: small_run's knob word (gemm_fp8_small.cu; 0 = what small_run picks by itself, which need not be algo 0's
// table word: a table word's knobs are its splits | swizzle << 8 | decomposition << 12 | raster << 16 | reduction << 24
// | bits 29..30 << 28, gemm_fp8_api.cu's small_knobs, e.g. 0x4000106 -> 0x4000100). The
// stamps' timer reads cost (about 0.3 us a launch at 16 and 64 tokens, H200): a change is judged by the library's
// own A/B (bench/gemm_fp8_ab_libs.py), the probe says where the time goes.
#define DSX_FP8_TIMELINE 1
#include "gemm_fp8_small.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_common.cuh"

namespace dsx_cuda {
int sm_count() {
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
  return n;
}
}  // namespace dsx_cuda

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = static_cast<uint8_t>((h >> 8) % 120);  // e4m3 codes 0..119: no NaN
  }
}
__global__ void fill_scales(float* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    p[i] = 5e-3f + 1e-2f * static_cast<float>((i * 7919) % 1000) / 1000.f;
  }
}

struct Stat {
  double p10, med, p90;
};
static Stat stat(std::vector<double> v) {
  if (v.empty()) return {NAN, NAN, NAN};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)]; };
  return {at(0.1), at(0.5), at(0.9)};
}

int main(int argc, char** argv) {
  using namespace dsx_cuda;
  std::string spec = argc > 1 ? argv[1] : "16x7168x2048,64x7168x2048,128x7168x2048,16x24576x1536,128x4608x7168";
  cudaStream_t st;
  cudaEvent_t e0, e1;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // the workspace algo 6 sums its K splits through at S >= 3 (small_run's query is at most this on these shapes)
  constexpr int64_t kWsBytes = int64_t{64} << 20;
  void* ws = nullptr;
  CK(cudaMalloc(&ws, kWsBytes));
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    long long m, n, k;
    int knobs = 0;
    if (std::sscanf(item.c_str(), "%lldx%lldx%lld:%i", &m, &n, &k, &knobs) < 3) {
      std::printf("bad shape %s (MxNxK[:KNOBS])\n", item.c_str());
      return 2;
    }
    const long long kb = (k + 127) / 128, nb = (n + 127) / 128;
    const size_t bytes = m * k + n * k + 4 * (m * kb + nb * kb);
    const int sets = static_cast<int>(std::max<size_t>(2, (200u << 20) / bytes + 1));
    struct Set {
      uint8_t *a, *b;
      float *sa, *sb;
      uint16_t* out;
    };
    std::vector<Set> v(sets);
    for (int i = 0; i < sets; ++i) {
      CK(cudaMalloc(&v[i].a, m * k));
      CK(cudaMalloc(&v[i].b, n * k));
      CK(cudaMalloc(&v[i].sa, 4 * m * kb));
      CK(cudaMalloc(&v[i].sb, 4 * nb * kb));
      CK(cudaMalloc(&v[i].out, 2 * m * n));
      fill_bytes<<<264, 256>>>(v[i].a, m * k, 1 + i);
      fill_bytes<<<264, 256>>>(v[i].b, n * k, 1000 + i);
      fill_scales<<<64, 256>>>(v[i].sa, m * kb);
      fill_scales<<<64, 256>>>(v[i].sb, nb * kb);
    }
    CK(cudaDeviceSynchronize());
    auto launch = [&](int i) {
      const GemmNt g{v[i].a, v[i].sa, v[i].b, v[i].sb, v[i].out, m, n, k};
      const int rc = small_run(g, knobs, false, st, ws, kWsBytes);
      if (rc != 0) {
        std::printf("small_run refused %s (rc %d)\n", item.c_str(), rc);
        std::exit(1);
      }
    };
    int64_t need = 0;  // (the launch's workspace: more than the probe holds runs the distributed shared-memory sum)
    {
      const GemmNt g{v[0].a, v[0].sa, v[0].b, v[0].sb, v[0].out, m, n, k};
      if (small_run(g, knobs, false, st, nullptr, 0, &need) == 0 && need > kWsBytes) {
        std::printf("%s: needs %lld bytes of workspace, the probe has %lld: not through L2\n", item.c_str(),
                    static_cast<long long>(need), static_cast<long long>(kWsBytes));
      }
    }
    std::vector<unsigned long long> zero(kTlMaxCtas * TL_SLOTS, 0);
    CK(cudaMemcpyToSymbol(dsx_fp8_tl, zero.data(), zero.size() * 8));
    const float us = graph_median_us(st, e0, e1, sets, 4, 30, launch);
    std::vector<unsigned long long> tl(kTlMaxCtas * TL_SLOTS);
    CK(cudaMemcpyFromSymbol(tl.data(), dsx_fp8_tl, tl.size() * 8));
    // the CTAs of the last launch: those with an end stamp (every launch of a shape has the same grid)
    std::vector<const unsigned long long*> ctas;
    for (int c = 0; c < kTlMaxCtas; ++c)
      if (tl[c * TL_SLOTS + TL_END]) ctas.push_back(&tl[c * TL_SLOTS]);
    auto span = [&](int from, int to) {
      std::vector<double> d;
      for (auto* c : ctas)
        if (c[from] && c[to]) d.push_back(static_cast<double>(static_cast<long long>(c[to] - c[from])) / 1e3);
      return stat(d);
    };
    auto count = [&](int slot) {
      std::vector<double> d;
      for (auto* c : ctas) d.push_back(static_cast<double>(c[slot]) / 1e3);
      return stat(d);
    };
    unsigned long long g0 = ~0ull, g0max = 0, g1min = ~0ull, g1 = 0;
    std::vector<int> per_sm(1024, 0);
    for (auto* c : ctas) {
      g0 = std::min(g0, c[TL_ENTRY]);
      g0max = std::max(g0max, c[TL_ENTRY]);
      g1min = std::min(g1min, c[TL_END]);
      g1 = std::max(g1, c[TL_END]);
      per_sm[c[TL_SMID] % 1024]++;
    }
    const int sms_used = static_cast<int>(std::count_if(per_sm.begin(), per_sm.end(), [](int x) { return x > 0; }));
    const int most = *std::max_element(per_sm.begin(), per_sm.end());
    // the last set's output hashed (FNV-1a over its bf16 bits): builds of the same bits print the same hash
    std::vector<uint16_t> o(static_cast<size_t>(m * n));
    CK(cudaMemcpy(o.data(), v[sets - 1].out, o.size() * 2, cudaMemcpyDeviceToHost));
    unsigned long long h = 1469598103934665603ull;
    for (uint16_t x : o) h = (h ^ x) * 1099511628211ull;
    std::printf("\n%s: %.2f us a launch (graph of %d sets x 4); %zu CTAs on %d SMs (at most %d a SM); workspace %lld B;"
                " output hash %016llx\n",
                item.c_str(), us, sets, ctas.size(), sms_used, most, static_cast<long long>(need), h);
    if (ctas.size() >= static_cast<size_t>(kTlMaxCtas)) {
      std::printf("  (only the first %d CTAs of the grid are stamped: kTlMaxCtas)\n", kTlMaxCtas);
    }
    std::printf("  CTA entries spread %.2f us, ends spread %.2f us, first entry to last end %.2f us\n",
                (g0max - g0) / 1e3, (g1 - g1min) / 1e3, (g1 - g0) / 1e3);
    auto row = [&](const char* what, Stat s) {
      std::printf("  %-46s p10 %6.2f  median %6.2f  p90 %6.2f us\n", what, s.p10, s.med, s.p90);
    };
    // (label, from, to): the span between two stamps; from = -1: a summed duration in slot `to`
    static const struct {
      const char* what;
      int from, to;
    } kRows[] = {
        {"entry -> set-up done", TL_ENTRY, TL_READY},
        {"entry -> producer's first step", TL_ENTRY, TL_P_IN},
        {"  first step: stage free, bytes expected", TL_P_IN, TL_P_TX},
        {"  first step: weight tile's TMA issued", TL_P_TX, TL_P_W},
        {"  first step: token tile's TMA issued", TL_P_W, TL_P_FIRST},
        {"entry -> producer's first TMA issued", TL_ENTRY, TL_P_FIRST},
        {"entry -> wg0's first stage landed", TL_ENTRY, TL_C0_FIRST},
        {"entry -> wg1's first stage landed", TL_ENTRY, TL_C1_FIRST},
        {"entry -> producer's last TMA issued", TL_ENTRY, TL_P_LAST},
        {"producer waiting on empty stages (sum)", -1, TL_P_BLOCKED},
        {"wg0 first -> last stage landed", TL_C0_FIRST, TL_C0_LAST},
        {"wg1 first -> last stage landed", TL_C1_FIRST, TL_C1_LAST},
        {"wg0 waiting on full stages (sum)", -1, TL_C0_WAITED},
        {"wg0 last stage landed -> loop done", TL_C0_LAST, TL_C0_LOOP},
        {"wg1 last stage landed -> loop done", TL_C1_LAST, TL_C1_LOOP},
        {"wg0 loop done -> wg1 loop done", TL_C0_LOOP, TL_C1_LOOP},
        {"wg0 loop done -> epilogue's first barrier", TL_C0_LOOP, TL_EPI_BAR1},
        {"epilogue's first -> second barrier", TL_EPI_BAR1, TL_EPI_BAR2},
        {"epilogue's second barrier -> stores issued", TL_EPI_BAR2, TL_END},
        {"wg0 loop done -> stores issued", TL_C0_LOOP, TL_END},
        {"entry -> stores issued", TL_ENTRY, TL_END},
    };
    for (const auto& r : kRows) row(r.what, r.from < 0 ? count(r.to) : span(r.from, r.to));
    // the same by how many CTAs shared the SM (where the grid puts more than one CTA on some SMs)
    for (int share = 1; share <= most && most > 1; ++share) {
      std::vector<double> d;
      for (auto* c : ctas)
        if (per_sm[c[TL_SMID] % 1024] == share) d.push_back(static_cast<double>(c[TL_END] - c[TL_ENTRY]) / 1e3);
      if (d.empty()) continue;
      char what[64];
      std::snprintf(what, sizeof what, "entry -> stores issued, %d CTAs an SM (%zu)", share, d.size());
      row(what, stat(d));
    }
    // K splits: how far apart the CTAs of one cluster finish their loops (the last warpgroup's loop end; the split
    // sums wait for the cluster's slowest CTA), median and 90th percentile over the clusters
    {
      std::vector<std::pair<unsigned long long, unsigned long long>> by(kTlMaxCtas + 1, {~0ull, 0ull});
      std::vector<int> members(kTlMaxCtas + 1, 0);
      for (auto* c : ctas) {
        const unsigned long long id = c[TL_CLUSTER], done = std::max(c[TL_C0_LOOP], c[TL_C1_LOOP]);
        if (!id || id > static_cast<unsigned long long>(kTlMaxCtas) || !done) continue;
        by[id].first = std::min(by[id].first, done);
        by[id].second = std::max(by[id].second, done);
        members[id]++;
      }
      std::vector<double> skew;
      int size = 0;
      for (int id = 1; id <= kTlMaxCtas; ++id) {
        if (members[id] > 1) skew.push_back(static_cast<double>(by[id].second - by[id].first) / 1e3);
        size = std::max(size, members[id]);
      }
      if (!skew.empty()) {
        char what[64];
        std::snprintf(what, sizeof what, "cluster's loop ends apart (%d CTAs, %zu)", size, skew.size());
        row(what, stat(skew));
      }
    }
    for (auto& s : v) {
      CK(cudaFree(s.a));
      CK(cudaFree(s.b));
      CK(cudaFree(s.sa));
      CK(cudaFree(s.sb));
      CK(cudaFree(s.out));
    }
  }
  return 0;
}
