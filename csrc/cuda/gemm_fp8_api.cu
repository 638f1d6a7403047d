// C ABI of the CUDA block FP8 GEMMs (include/dsx/gemm_fp8.h): argument checks and the
// choice between the CUTLASS sm90a kernels and the simple any-shape kernel.
#include "gemm_fp8_internal.cuh"
#include "gemm_fp8_tuned_table.cuh"
#include "tuned_tables.cuh"

#include <algorithm>
#include <atomic>

namespace {

using dsx_cuda::GemmNt;
using dsx_cuda::Tuning;

enum {
  kAuto = 0,
  kCutlass = 1,
  kSimple = 2,
  kPingpong = 3,
  kSwapAB = 4,
  kOverlap = 5,
  kSmall = 6,
  kLarge = 7,
  kLastAlgo = kLarge
};

constexpr int kPdlBit = 28;  // algo bit: launch the small-M kernel with programmatic dependent launch

struct Algo {
  int base;
  Tuning tuning;
  bool pdl;
};

bool decode(int algo, Algo* out) {
  if (algo < 0) return false;
  out->base = algo & 15;
  out->pdl = ((algo >> kPdlBit) & 1) != 0;
  out->tuning = Tuning{(algo >> 4) & 15, (algo >> 8) & 15, (algo >> 12) & 15, (algo >> 16) & 255,
                       (algo >> 24) & 15};
  return out->base <= kLastAlgo && (out->tuning.raster <= 2 || out->base == kSmall) &&
         (out->tuning.decomposition <= 3 || out->base == kLarge || out->base == kSmall) &&  // kLarge: its variant, 0..10
         (out->tuning.reduction <= 1 || out->base == kSmall) &&
         ((algo >> (kPdlBit + 1)) == 0 || out->base == kSmall) &&  // algo 6: bits 29..30 its output path
         (!out->pdl || out->base == kSmall || out->base == kAuto) &&
         // algo 6: bits 4..5 L2 promotion, 6..7 grid order, 8..9 weight rows per CTA (0..3), 10..11 the consumer
         // loop's form (0..3), 12..13 wgmma temporaries, 14..15 when the scales are read, 24..27 tokens per CTA
         (out->base != kSmall ||
          ((out->tuning.decomposition & 3) <= 2 &&
           (out->tuning.raster >> 2) <= 2 && out->tuning.reduction <= 4));
}

bool shape_ok(int64_t m, int64_t n, int64_t k) { return m >= 0 && n > 0 && k > 0; }

// Automatic choice between the dense CUTLASS kernels, from H200 measurements (bench/
// gpu_kernels.py): pingpong 64x128 tiles up to this many rows (1.07-1.19x cuBLAS at M = 64
// and 128 on DeepSeek shapes, where cooperative stream-K was 1.3-1.6x slower), cooperative
// 128x128 stream-K above (pingpong was 1.3-1.6x slower at M = 4096).
constexpr int64_t kPingpongMaxRows = 128;
// Small M with few output tiles and a long K leaves most SMs idle in pingpong: swap-AB (out^T =
// W A^T, 128x32 tiles) with 2-way deterministic split-K measured 1.56-1.58x cuBLAS at M = 64/128
// on 2048x7168 (pingpong: 1.16-1.18x), 1.04x at M = 16 (pingpong: 0.82x).
constexpr int64_t kSwapMaxPingpongTiles = 64;
constexpr int64_t kSwapMinK = 4096;
// From this many rows on, the cooperative kernel with the scale promotion overlapped (kOverlap:
// bitwise the output of kCutlass): 1.05-1.09x kCutlass at M = 4096 on the three DeepSeek-V3 shapes
// (H200, variants and cuBLAS timed interleaved; 0.94-0.99x cuBLAS block-wise, kCutlass 0.86-0.94x).
constexpr int64_t kOverlapMinRows = 1024;

// Swap-AB without K splits (data-parallel 128x32 tiles) when its tiles fill between half and all
// of the SMs in one wave: H200, against what algo 0 ran before (pingpong or the small-M kernel),
// 128x4096x7168 16.3 vs 20.1 us (the small-M kernel takes it back since: use_small), 64x7168x2048 8.5 vs 9.0, 64x7168x18432 38.8 vs 41.7; with more
// tiles than SMs it was slower (128x7168x2048 12.5 vs 9.6, 128x7168x18432 66.6 vs 49.8), with
// fewer than half the SMs the small-M kernel or split-K won (64x2048x7168, 64x4096x7168).
bool swap_dp_auto(const GemmNt& g) {
  if (g.m < 1 || g.m > kPingpongMaxRows || !dsx_cuda::cutlass_built() || !dsx_cuda::tma_compatible(g)) return false;
  const int sms = dsx_cuda::sm_count();
  const int64_t tiles = ((g.n + 127) / 128) * ((g.m + 31) / 32);
  return 2 * tiles >= sms && tiles <= sms;
}

// True when the hand-written small-M kernel runs: forced, or chosen by algo 0 (decode-sized M,
// see dsx_cuda::small_auto: the K halves where one CTA a 64-row weight tile fills more than half of the SMs
// in one wave with 1024 <= K < 4096, taken before swap-AB data-parallel; at most one 128-row weight tile per
// SM, and M <= 32, or M <= 64 with
// K >= 4096; or M <= 64 with more 128-row tiles than SMs but 64-row tiles that fit one wave), unless
// swap-AB data-parallel fills the SMs better (swap_dp_auto); at 64 < M <= 128 (two 64-token tiles,
// K >= 4096, or any K where they fit one wave only with one K split: N = 7168) and at 32 < M <= 64 with K < 4096 where two 32-token tiles fill half to all of the SMs
// (dsx_cuda::small_before_swap_dp) before swap-AB data-parallel: H200, same run, three rounds,
// 128x4096x7168 15.54 / 15.41 / 15.31 us against 16.81 / 16.55 / 16.30 (since the consumer loop's
// uniform form; 17.0-17.3 before); 64x7168x2048 see w32_auto in gemm_fp8_small.cu.
bool use_small(const GemmNt& g, const Algo& a) {
  if (a.base == kSmall) return true;
  return a.base == kAuto && (dsx_cuda::small_before_swap_dp(g) || !swap_dp_auto(g)) && dsx_cuda::small_auto(g);
}

// True when a CUTLASS kernel should run; resolves kAuto to the CUTLASS kernel it picks in
// a->base. *err is set when algo forces CUTLASS but the shape cannot take it.
bool use_cutlass(const GemmNt& g, Algo* a, int* err) {
  *err = DSX_OK;
  if (a->base == kSimple) return false;
  const bool ok = dsx_cuda::cutlass_built() && dsx_cuda::tma_compatible(g);
  if (a->base != kAuto && !ok) *err = DSX_EINVAL;  // a CUTLASS kernel was forced
  if (ok && a->base == kAuto) {
    const int64_t pingpong_tiles = ((g.m + 63) / 64) * ((g.n + 127) / 128);
    if (swap_dp_auto(g)) {
      a->base = kSwapAB;
      a->tuning.decomposition = 1;  // data-parallel: one tile per CTA, no reduction
    } else if (g.m <= kPingpongMaxRows && pingpong_tiles < kSwapMaxPingpongTiles && g.k >= kSwapMinK) {
      a->base = kSwapAB;
      a->tuning.decomposition = 2;  // split-K
      a->tuning.splits = 2;
      a->tuning.reduction = 0;  // deterministic
    } else {
      a->base = g.m <= kPingpongMaxRows ? kPingpong : g.m >= kOverlapMinRows ? kOverlap : kCutlass;
    }
  }
  return ok;
}

// The hand-written persistent kernel for large M (gemm_fp8_large.cu): forced (algo 7; knobs:
// bits 8..11 = v, tile order in groups of 4v M tiles, 0 = default; bits 12..15 the variant, see
// dsx_cuda::large_run), or by algo 0 from kLargeMinRows rows on, where TMA alignment allows:
// 128x192 tiles when N % 192 == 0, else 128x128 with two temporaries (variant 10), one CTA each. H200, M = 4096
// and 1024 on the three DeepSeek-V3 shapes, every variant, kOverlap and cuBLAS timed interleaved
// (bench/gpu_kernels.py --large, 4 runs in 2 device calls) since the wgmma descriptors are advanced by
// adding to their low word in uniform registers (mainloop about 23% fewer SASS instructions; the
// ratios before it are in git history), time ratios:
//   24576x1536: 128x192, 0.80x kOverlap's time at M = 4096, 0.78-0.85x at 1024; its 2-CTA forms
//   (B multicast 1.007-1.021x, A multicast 0.99-1.005x at 4096; 1.01-1.04x at 1024) no faster;
//   7168x2048: 128x128, 0.87x kOverlap at 4096 (128x192 0.99-1.01x of it, 256x128 1.00-1.02x, 128x192
//   pairs, the rule before, 1.01-1.02x), 0.76-0.78x at 1024 (128x192 1.05-1.06x, its pairs 1.07-1.10x);
//   2048x7168: 128x128, 0.94-0.98x kOverlap at 4096 (kOverlap, the rule before for K >= 4096 over two
//   waves, was 0.94-0.95x ours before the descriptor change; the 2-CTA forms and 128x192 0.94-1.03x
//   of ours, no steady order: noise), 0.87-0.89x at 1024 (pairs 1.02-1.05x).
constexpr int64_t kLargeMinRows = 1024;
bool use_large(const GemmNt& g, Algo* a) {
  if (a->base == kLarge) return true;
  if (a->base != kAuto || g.m < kLargeMinRows || !dsx_cuda::large_supported(g)) return false;
  a->base = kLarge;
  // 128x192, or 128x128 with two temporaries and each K block's scale products formed one block
  // ahead (variant 10, bitwise variant 1's output). H200, one device call, variant 1 and 10 timed
  // interleaved (bench/gpu_kernels.py --focus 3, then --large): 4096x2048x7168 0.972, 0.979, 0.969,
  // 0.967x variant 1's time; 4096x7168x2048 0.990x, 1024x7168x2048 0.993x, 1024x2048x7168 0.972x.
  a->tuning = Tuning{0, 0, g.n % 192 == 0 ? 2 : 10, 0, 0};
  return true;
}

// Eighteenth session: the rules above were tuned on DeepSeek-V3's tp = 1 shapes, mostly before the
// large-M kernel existed; at the shapes a tensor-parallel rank runs, and at 65..128 rows of the goal
// shapes, they chose up to 35% slower kernels than the best variant (H200, bench/tune_auto.py --kernel
// fp8: 16x9216x7168 27.75 us against 19.95 for the small-M kernel at 128 rows; 128x18432x7168 60.96
// against 41.63 for the large-M kernel's 128x192 tiles). So algo 0 (alone or with the PDL bit) first
// looks the launch up in a table measured by bench/tune_auto.py --kernel fp8 (every weight GEMM shape of
// DeepSeek-V3 at tp 1, 2, 4, 8 and M ranges up to 128; each word confirmed faster than the rules at both
// ends of its range, interleaved in one process), in the table of the card the launch runs on (tuned_card.cuh:
// the H200's or the H100 SXM's; unless DSX_TUNED_TABLES=0: tuned_tables.cuh); on cards of another SM count,
// for launches it does not list, and where its word cannot take the launch, the rules decide (the tables:
// gemm_fp8_tuned_table.cuh).

// The table's word for an automatic launch (the PDL bit kept where the word is the small-M kernel, the
// only one that takes it), else algo itself.
int tuned(int64_t m, int64_t n, int64_t k, int algo) {
  if ((algo & ~(1 << kPdlBit)) != 0 || m < 1 || !dsx_cuda::tuned_tables_on()) return algo;
  const dsx_cuda::Fp8Tuned* t = dsx_cuda::fp8_tuned_find(dsx_cuda::tuned_card(dsx_cuda::sm_count()), n, k, m);
  if (!t) return algo;
  return (t->algo & 15) == kSmall ? t->algo | (algo & (1 << kPdlBit)) : t->algo;
}

}  // namespace

namespace dsx_cuda {

int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not asked yet
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < kMaxDevices && (sms = cached[dev].load(std::memory_order_relaxed)) > 0) return sms;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < kMaxDevices) cached[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace dsx_cuda

namespace {

// kSmall's knobs from its algo word (the bit layout at run below; 0 for what algo 0 runs there)
int small_knobs(const Algo& al, int algo) {
  return al.base == kSmall ? al.tuning.splits | al.tuning.swizzle << 8 | al.tuning.decomposition << 12 |
                                 al.tuning.raster << 16 | al.tuning.reduction << 24 |
                                 ((algo >> (kPdlBit + 1)) & 3) << 28
                           : 0;
}

int workspace_of(int64_t m, int64_t n, int64_t k, int algo, int64_t* bytes) {
  Algo a;
  if (!bytes || !decode(algo, &a) || !shape_ok(m, n, k)) return DSX_EINVAL;
  *bytes = 0;
  // Pointers are not known yet: assume 16-byte aligned ones (cudaMalloc gives 256).
  const auto al = reinterpret_cast<const uint8_t*>(uintptr_t{256});
  GemmNt g{al, nullptr, al, nullptr, reinterpret_cast<uint16_t*>(uintptr_t{256}), m, n, k};
  if (use_small(g, a)) {  // M = 0 is a no-op for every algo; S >= 3: the split sums through L2
    if (m == 0) return DSX_OK;
    if (!dsx_cuda::small_supported(g)) return DSX_EINVAL;
    return dsx_cuda::small_run(g, small_knobs(a, algo), a.pdl, nullptr, nullptr, 0, bytes);
  }
  if (use_large(g, &a)) {  // no workspace
    GemmNt g1 = g;
    g1.m = m > 0 ? m : 1;
    return dsx_cuda::large_supported(g1) ? DSX_OK : DSX_EINVAL;
  }
  int err;
  if (!use_cutlass(g, &a, &err)) return err;
  size_t ws = 0;
  int rc;
  if (a.base == kPingpong) {
    rc = dsx_cuda::cutlass_pingpong_workspace(m, n, k, a.tuning, &ws);
  } else if (a.base == kSwapAB) {
    rc = dsx_cuda::cutlass_swapab_workspace(m, n, k, a.tuning, &ws);
  } else if (a.base == kOverlap) {
    rc = dsx_cuda::cutlass_overlap_workspace(m, n, k, a.tuning, &ws);
  } else {
    rc = dsx_cuda::cutlass_dense_workspace(m, n, k, a.tuning, &ws);
  }
  *bytes = static_cast<int64_t>(ws);
  return rc;
}

int run(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, uint16_t* out, int64_t m, int64_t n,
        int64_t k, void* workspace, int64_t workspace_bytes, int algo, void* stream);

}  // namespace

// (algo 0 from the table: its word's workspace, and at least the rules' choice's, which runs where the
// word cannot take the launch's pointers)
extern "C" int dsx_gemm_fp8_nt_workspace_cuda(int64_t m, int64_t n, int64_t k, int algo,
                                              int64_t* bytes) {
  if (!bytes) return DSX_EINVAL;
  const int rc = workspace_of(m, n, k, algo, bytes);
  const int t = rc == DSX_OK ? tuned(m, n, k, algo) : algo;
  int64_t word = 0;
  if (t != algo && workspace_of(m, n, k, t, &word) == DSX_OK) *bytes = std::max(*bytes, word);
  return rc;
}

extern "C" int dsx_gemm_fp8_nt_resolve_cuda(int64_t m, int64_t n, int64_t k, int algo, int* resolved) {
  Algo a;
  if (!resolved || !decode(algo, &a) || !shape_ok(m, n, k)) return DSX_EINVAL;
  *resolved = tuned(m, n, k, algo);
  return DSX_OK;
}

extern "C" int dsx_gemm_fp8_nt_cuda(const uint8_t* a, const float* sa, const uint8_t* b,
                                    const float* sb, uint16_t* out, int64_t m, int64_t n,
                                    int64_t k, void* workspace, int64_t workspace_bytes,
                                    int algo, void* stream) {
  const int t = tuned(m, n, k, algo);
  if (t != algo) {
    const int rc = run(a, sa, b, sb, out, m, n, k, workspace, workspace_bytes, t, stream);
    if (rc != DSX_EINVAL) return rc;  // (refused before any launch: the rules' choice instead)
  }
  return run(a, sa, b, sb, out, m, n, k, workspace, workspace_bytes, algo, stream);
}

namespace {

int run(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, uint16_t* out, int64_t m, int64_t n,
        int64_t k, void* workspace, int64_t workspace_bytes, int algo, void* stream) {
  Algo al;
  if (!decode(algo, &al) || !shape_ok(m, n, k) || workspace_bytes < 0) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!a || !sa || !b || !sb || !out) return DSX_EINVAL;
  const GemmNt g{a, sa, b, sb, out, m, n, k};
  const auto s = static_cast<cudaStream_t>(stream);
  // kSmall's knobs: bits 16..23 K splits (cluster size, 0 automatic), bits 8..9 weight rows per CTA
  // (0 automatic, 1: 128, 2: 64, 3: 64 with the K halves over two consumer warpgroups), bits 10..11 the consumer loop's form (0 automatic, 1: the form before,
  // 2: stage counters, uniform descriptors, ld.shared scales, 3: 2 with the scales one step ahead), bits 12..13 wgmma temporaries (0 automatic, 1, 2), bits 14..15 scale reads
  // (0 automatic = 2, 1: after the wgmma wait, 2: before it, 3: before the next K step's issue), bits 24..27
  // tokens per CTA (0 automatic, 1: 16, 2: 32, 3: 64, 4: all), bits 4..5 L2 promotion (0 automatic, 1: 256 B, 2: 128 B,
  // 3: none), bits 6..7 grid order (0 automatic, 1: weight tiles adjacent, 2: token tiles adjacent), bit 28 PDL,
  // bits 29..30 the output path (0 automatic = 2, 1: through the fp32 tile in shared memory, the form before, 2: from
  // the registers at S <= 2, at S >= 3 with 16 or 32 tokens a tile through the workspace; 3 refused by small_run)
  if (use_small(g, al)) return dsx_cuda::small_run(g, small_knobs(al, algo), al.pdl, s, workspace, workspace_bytes);
  if (use_large(g, &al)) return dsx_cuda::large_run(g, al.tuning.decomposition, 4 * al.tuning.swizzle, s);
  int err;
  if (use_cutlass(g, &al, &err)) {
    const auto ws_bytes = static_cast<size_t>(workspace_bytes);
    if (al.base == kPingpong) {
      return dsx_cuda::cutlass_pingpong_run(g, workspace, ws_bytes, al.tuning, s);
    }
    if (al.base == kSwapAB) return dsx_cuda::cutlass_swapab_run(g, workspace, ws_bytes, al.tuning, s);
    if (al.base == kOverlap) {
      return dsx_cuda::cutlass_overlap_run(g, workspace, ws_bytes, al.tuning, s);
    }
    return dsx_cuda::cutlass_dense_run(g, workspace, ws_bytes, al.tuning, s);
  }
  if (err != DSX_OK) return err;
  return dsx_cuda::simple_dense_run(g, s);
}

}  // namespace

extern "C" int dsx_gemm_fp8_grouped_nt_contiguous_workspace_cuda(int64_t num_experts, int64_t m,
                                                                 int64_t n, int64_t k, int algo,
                                                                 int64_t* bytes) {
  Algo a;
  if (!bytes || !decode(algo, &a) || !shape_ok(m, n, k) || num_experts <= 0) return DSX_EINVAL;
  if (num_experts > INT32_MAX) return DSX_EINVAL;
  *bytes = 0;
  const auto al = reinterpret_cast<const uint8_t*>(uintptr_t{256});
  GemmNt g{al, nullptr, al, nullptr, reinterpret_cast<uint16_t*>(uintptr_t{256}), m, n, k};
  int err;
  if (!use_cutlass(g, &a, &err)) return err;
  size_t ws = 0;
  const int rc = dsx_cuda::cutlass_grouped_workspace(num_experts, m, n, k, &ws);
  *bytes = static_cast<int64_t>(ws);
  return rc;
}

extern "C" int dsx_gemm_fp8_grouped_nt_contiguous_cuda(
    const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, const int32_t* offsets,
    int64_t num_experts, uint16_t* out, int64_t m, int64_t n, int64_t k, void* workspace,
    int64_t workspace_bytes, int algo, void* stream) {
  Algo al;
  if (!decode(algo, &al) || !shape_ok(m, n, k) || workspace_bytes < 0) return DSX_EINVAL;
  if (num_experts <= 0 || num_experts > INT32_MAX || !offsets) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!a || !sa || !b || !sb || !out) return DSX_EINVAL;
  const GemmNt g{a, sa, b, sb, out, m, n, k};
  const auto s = static_cast<cudaStream_t>(stream);
  int err;
  if (use_cutlass(g, &al, &err)) {
    return dsx_cuda::cutlass_grouped_run(g, offsets, num_experts, workspace,
                                         static_cast<size_t>(workspace_bytes), al.tuning, s);
  }
  if (err != DSX_OK) return err;
  return dsx_cuda::simple_grouped_run(g, offsets, num_experts, s);
}
