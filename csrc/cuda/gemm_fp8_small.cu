// Block FP8 GEMM for decode-sized M (algo 6, "small"): a hand-written sm_90a kernel with the
// operands swapped (out^T = W . A^T), so that the weights fill the 64-row side of each wgmma and
// the M <= 128 tokens its N side (16, 32, 64 or 128 wide).
//
// One CTA: BM weight rows (BM = 128: one 128x128 scale block row, one CTA a SM; BM = 64: half of
// one, two (M > 64) or three CTAs a SM) x all tokens x one K range; the K range of a weight tile is
// split over the S CTAs of a thread-block cluster (S = 1..8), which reduce their fp32 partial tiles
// through distributed shared memory in the fixed order 0..S-1 (bitwise reproducible, no workspace,
// no counters). Warp roles (BM * 2 + 64 threads):
//   warpgroups 0 (and 1): consumers, 64 weight rows each: per stage 4 wgmma m64nMNk32 into a
//                  temporary, then acc = fma(tmp, sa*sb, acc) (the order of gemm_fp8.h: one
//                  fp32 block sum per K block, its scale product rounded to fp32, added in
//                  increasing K; split-K adds the S partial sums in split order at the end).
//                  A weight row sits at the same place of its wgmma for either BM, so BM = 64 and
//                  128 give the same bits under the same S.
//   next warp    : TMA producer (weight tile BMx128 and token tile MNx128 per stage, 128B swizzle)
//   last warp    : scale producer: cp.async of the stage's token scales sa[:, kb] and sb[row block, kb],
//                  completing on the same full barrier (cp.async.mbarrier.arrive.noinc)
// Programmatic dependent launch (optional, bit 28 of algo): the kernel lets the next launch
// start right away, issues its first two stages' weight tiles and then waits for the previous grid
// before it reads tokens or scales (gemm_fp8_small_kernel.cuh, kPdlEarly).
//
// Measured (H200, bench/gpu_kernels.py --small): the K loop is latency-bound per CTA (about
// 50-65 GB/s per CTA when few CTAs run), so the split count that fills the SMs in one wave
// matters most; more CTAs than one wave (192 128-row tiles at N = 24576, or forced larger splits)
// lose to the CUTLASS kernels; 64-row tiles at three CTAs a SM put N = 24576 in one wave (M = 16:
// 13.9 us against 16.8). A launch of a one-K-block problem takes 2.6-2.8 us in a CUDA graph (1.8-2.0
// with PDL): the fixed cost every shape pays. algo 0 takes this kernel where it measured faster than
// the CUTLASS ones (small_auto). Tried and dropped: up to 4 wgmma batches in flight per warpgroup
// (a ring of temporaries) with setmaxnreg: 5-7% slower at M = 64/128 and it hung at M = 16.
// Knobs that keep the bits (small_run): two alternating wgmma temporaries (the K step i+1 wgmma runs
// while step i is promoted; automatic where the registers fit: 1-4% at M = 16), the L2 promotion of
// the TMA loads (128 bytes automatic: 1-6% faster than 256 on every bench --small shape), M split
// over 16/32/64-token tiles along the grid (automatic 64 above 64 tokens where two K splits
// still fit one wave: 128x2048x7168 13.6 us against 13.9 at 128 tokens), the stage count (2..12),
// the point where a K step's scale products are read from shared memory (automatic: before its
// wgmma wait, the latency under the tensor-core work; H200, same run, against after the wait:
// 128x2048x7168 12.9 us against 13.7, 128x4096x7168 17.0 against 17.7 (32 tokens a CTA 20.5 against
// 22.7), 64x4096x7168 14.5 against 15.1, 64-row tiles at 64 tokens (one temporary) 1-4% faster;
// only a forced one-temporary loop at 128 rows was 0.5-3% slower).
// Tried and dropped: TMA multicast of the token tile over 2 or 4 weight tiles of one cluster (L2
// reads halved; 2-15% slower on every shape: the L2 is not the limit), all split-K partial loads of
// the reduction in flight at once (no gain seen; one run, together with other changes), one
// empty-barrier arrival per consumer warp instead of per thread (within 1% on all 15 shapes).
// The grid puts the token tiles of one weight tile side by side (knob: the other order): the same
// time, but L2 hit and fabric sectors down to CUTLASS swap-AB's (ncu, 128x4096x7168, 32 tokens a
// CTA). With those equal, 32 tokens a CTA (CUTLASS swap-AB's tiles and grid) still took 22 us
// against CUTLASS's 16.4: the L2 traffic was not the cause. The consumer loop was: the stage and
// parity came from divisions by the runtime stage count, the wgmma descriptors were rebuilt per
// thread from the thread index and moved to uniform registers (R2UR) before every wgmma, and the
// scales were read through a generic pointer (LD.E). The uniform form (loop-form knob, automatic)
// counts the stage along, keeps the descriptors in uniform registers and reads the scales with
// ld.shared: H200, bench --small, same run, 128x4096x7168 at 32 tokens a CTA 16.3 us against 20.4
// before (CUTLASS swap-AB 16.3), at 64 tokens 16.0 against 16.6 (--focus, 4 rounds: 15.9-16.1 against
// 16.6-16.9); all 15 --small shapes 1.5-15% faster (ncu, 64 tokens: the loop's stalls are then
// mostly the full-barrier waits, i.e. the data; the first one, the pipeline fill, about 12%).
// Tried and dropped: an L2 prefetch (cp.async.bulk.prefetch.tensor) of the CTA's weight tiles past
// the ring's first fill, issued once that fill is: 7-24% slower on 128x4096x7168, 16x4096x7168 and
// 16x7168x2048 (three rounds each).
// Scales one step ahead (loop form 3, automatic where two temporaries run): in the uniform loop ptxas
// placed the scale loads of the step being promoted right after the wgmma wait, so the products'
// FMULs waited on them (short scoreboard, ~10% of the loop's samples) before the promotion could give
// the stage back; reading a step's scales right after its barrier wait, into its temporary's own
// register set, and forming the products at its promotion leaves no load to wait for (ncu,
// 128x4096x7168: short-scoreboard samples 544 -> 230, cycles per issued instruction 7.78 -> 7.05).
// H200, bench --focus, 4 rounds, same run, against the uniform form: 128x4096x7168 16.06-16.29 us
// against 16.75-17.12, 64x7168x2048 8.02-8.07 against 8.50-8.51, 16x7168x2048 7.08-7.18 against
// 7.19-7.32, 16x4096x7168 11.32-11.65 against 11.45-11.72.
// The output from the registers (bits 29..30, automatic at S <= 2): at S = 1 the consumers round and
// store their own sums (no shared-memory tile, no CTA barrier); at S = 2 each CTA sends the other the
// half of its partial sums that the other stores (distributed shared-memory stores, not loads) and adds
// what it received. Measured (same call, S = 1, against the shared-memory tile, with the fill below):
// 16x7168x2048 0.42 us less, 64x7168x2048 0.27 us less in 4 of 4 rounds.
// l2x_note: at S >= 3 and 16 or 32 tokens a tile the split sums through L2 (bits 29..30 = 0 or 2; where the
// caller's workspace holds them). The fp32 tile's reduction reads S - 1 slices of the other CTAs' tiles
// over distributed shared memory, which moved about 20 GB/s a SM: bench/fp8_timeline.cu at 128x4608x7168 (S = 3,
// 128 tokens) spent 0.70 us writing the tile, 0.58 at the cluster barrier, 2.37 in that loop, 0.51 at the last
// barrier. Instead each consumer thread writes the accumulator groups other CTAs store to the workspace (16-byte
// stores, coalesced), and after the cluster barrier each owner reads them (ld.global.cg) and adds the S sums in
// split order (the same bits). H200, the probe, 3 rounds interleaved, same output hashes (thirty-seventh session),
// fp32 tile -> through L2: 16x2048x7168 (S = 8) 8.13 -> 7.56 us, 64x2048x7168 (S = 8) 10.39 -> 9.57,
// 128x2048x7168 (S = 8) 13.44 -> 12.70, 16x7168x2048 (S = 4, 128 rows) 11.58 -> 10.28, 5x3000x1024 (S = 3) 4.90 ->
// 4.44, 7x520x1024 (S = 8) 4.55 -> 4.01; not at 64 or 128 tokens with S = 3..5 (128x4608x7168 18.25 -> 18.23,
// 100x4608x7168 17.76 -> 18.09, 40x1000x2048 S = 5 5.96 -> 6.13). The library built with it at 16 or 32 tokens a tile
// or S = 8, against main's build (bench/gemm_fp8_ab_libs.py, 3 rounds, bits equal, auto / PDL): 16x2048x7168
// 7.98-8.07 / 7.06-7.18 -> 7.76-7.92 / 6.86-6.94 us, 32x2048x7168 8.58-8.65 / 7.71-7.83 -> 8.32-8.36 / 7.25-7.34,
// 16x1024x7168 6.35-6.40 / 5.70-5.83 -> 6.08-6.15 / 5.09-5.12, 64 / 128x2048x7168 (S = 8) ties; but with the path
// compiled into every form, forms that never run it slowed: 128x7168x2048 (K halves) 9.07-9.21 -> 9.58-9.73,
// 128x4608x7168 (S = 3, 128 tokens) 18.47-18.51 -> 18.69-18.80. So it is compiled only at 16 and 32 tokens a tile
// without the K halves, and taken there at every S >= 3. Tried there first and dropped
// (the probe, same hashes): the own slice read locally (no change: a CTA's own reads were not the cost), all S loads
// of two items in flight (no change), the slices pushed to their owner by bulk copies (128x4608x7168 21.2 us), the
// groups sent to their owner's shared memory (distributed shared-memory stores; 19.8), a TMA store of the output
// staged by stmatrix (see the thirty-seventh session in docs/benchmarks.md).
// Tried and dropped: the TMA thread setting up the barriers and issuing the ring's first fill before
// the CTA barrier (the others waiting there): 0.6-1.1 us slower on all four focus shapes, 4 of 4 rounds.
// Kept (thirty-eighth session): the same with only the first 1, 2 or 4 loads (by the stage's bytes, none at 32 KB;
// not in the K halves nor in 64-row tiles of 16 tokens, where they lost) and only without PDL: 64x4096x7168 13.08 ->
// 12.4 us, 128x4096x7168 15.4 -> 14.9 (kEarlyLoads in gemm_fp8_small_kernel.cuh has the figures).
// The K halves (rows knob 3, KS = 2 below; automatic on N = 7168 with 1024 <= K < 4096, halves_auto): 64
// weight rows and all tokens a CTA, one CTA a SM, two consumer warpgroups on the two halves of the CTA's K
// blocks (the bits of a 2-CTA cluster split, no cluster). At M = 64 / 128 the layouts before split M into two
// token tiles, so that two CTAs read every weight tile: their loads alone took 6.94-7.06 us on 7168x2048
// against 5.40 for one CTA a 64-row tile (bench/fp8_read_probe.cu); one warpgroup on a 64-row tile with all
// tokens was slower still (one wgmma stream: 8.3 us at 64x7168x2048). The halves keep one read of every weight
// tile and two wgmma streams a SM: see halves_auto for the figures.
// Tried and dropped (fp8s10, thirteenth session; the code, knobs and bit tests are in history, merge e48eb3a,
// taken out of the tree after it): four consumer warpgroups on the halves' 64-row tile, each stage still read
// once, for more wgmma / promotion streams a SM: the K halves with the two token halves of all of M on two
// warpgroups each (m64n(M/2) wgmma, the bits of S = 2), and the K quarters (the bits of S = 4 when the four
// partials add as ((p0 + p1) + p2) + p3, at most 64 tokens a tile). 576 threads leave ptxas 96 registers a
// thread, so two temporaries fit only at 32 tokens a warpgroup (no spills). H200, bench --small, three rounds,
// all with PDL, against auto (the K halves) in the same run: 64x7168x2048 token halves 6.91-6.94 us, quarters
// 6.85-6.88, against 6.42-6.45; 128x7168x2048 token halves 9.22-9.24 against 8.20-8.24; 16x7168x2048 quarters
// 5.73-5.75 against 5.57. ncu (M = 128): 11.07 against 9.95 us, SM active cycles 13.6k against 12.1k with
// higher IPC: more streams add instructions, not data; the loop waits on its loads. The token halves also
// read each weight K step from shared memory twice (two m64n64k32 read 8 KB where one m64n128k32 reads 6 KB).
#include "gemm_fp8_internal.cuh"
#include "launch_attrs.cuh"
#include "sm90_ptx.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <atomic>

namespace dsx_cuda {
namespace {

constexpr int kRows = 128;          // weight rows per scale block (and per CTA in the 128-row variant)
constexpr int kBK = 128;            // K per stage (one scale block)
constexpr int kMaxStages = 12;   // most stages shared memory may hold (stage-count knob)
constexpr int kAutoStages = 8;   // stages when not forced
constexpr int kMaxSplits = 8;       // portable cluster size
constexpr int kSmemPerSm = 228 * 1024;  // shared memory of one SM, 1 KB of it reserved per resident CTA
constexpr int kSmemLimit = 227 * 1024;  // most one CTA may take

// Tile configurations: BM weight rows per CTA (BM / 64 consumer warpgroups, then the TMA warp and the
// scale warp), sized so that kBlocks CTAs share an SM (shared memory and the register cap). KS = 2 (64 rows
// only): two consumer warpgroups on the same 64 weight rows, warpgroup w taking the K blocks [w nk / 2,
// (w + 1) nk / 2) of the CTA's nk with its own half of the stage ring, their two partial sums added at the
// end, p0 + p1: the bits of a 2-CTA cluster split (S = 2), with one CTA a SM and no cluster.
template <int MN, int BM, int KS = 1>
struct Config {
  static constexpr int kConsumerWarpgroups = BM / 64 * KS;
  static constexpr int kThreads = 128 * kConsumerWarpgroups + 64;
  static constexpr int kBlocks = KS == 2 || BM == 128 ? 1 : MN <= 64 ? 3 : 2;
  static constexpr int kSmemCap = kBlocks == 1 ? kSmemLimit : kSmemPerSm / kBlocks - 1024;
  static_assert(BM == 64 || BM == 128, "one or two consumer warpgroups");
  static_assert(KS == 1 || (KS == 2 && BM == 64), "K halves over two warpgroups: 64 rows");
};

struct Params {
  const float* sa;  // [m, kbt]
  const float* sb;  // [ceil(n/128), kbt]
  uint16_t* out;    // [m, n]
  int m, n, kbt;
  int splits, stages;
  int pdl;
  int token_major;  // grid (S, token tiles, weight tiles): the CTAs that share a weight tile are adjacent
  int scale_point;  // a K step's scale products read 0: before its wgmma wait, 1: after it (the order
                    // before), 2: before the next step's issue (two temporaries; else 0); same bits
  int reg_out;      // the output rounded and stored from the accumulator registers (S = 2: each CTA sends the
                    // half of its partial tile that the other stores through distributed shared memory; S >= 3:
                    // through the workspace, ws); 0: through the fp32 partial tile in shared memory (the form
                    // before); same bits
  float4* ws;       // S >= 3 with reg_out: [clusters][S][MN / 8][consumer threads] partial-sum groups
};

// The caller's workspace (gemm_fp8.h), and the workspace query: with `query` set, Launcher::run stores the bytes
// the launch it would make needs there and launches nothing.
struct Workspace {
  void* ptr;
  int64_t bytes;
  int64_t* query;
};

// ---------------------------------------------------------------- PTX helpers
// (mbarrier, TMA, cp.async, wgmma fences and descriptors: sm90_ptx.cuh)
using namespace sm90;

}  // namespace
}  // namespace dsx_cuda

#include "gemm_fp8_small_kernel.cuh"

namespace dsx_cuda {
namespace {

// ---------------------------------------------------------------- host side
// e4m3 [rows, k] row-major, boxes of box_rows x 128 bytes, 128B swizzle, zero fill outside.
// promo: the L2 promotion of TMA misses (0 or 1: 256 bytes, 2: 128, 3: none)
bool encode_kmajor(CUtensorMap* map, const uint8_t* ptr, int64_t rows, int64_t k, int box_rows, int promo) {
  const CUtensorMapL2promotion l2 = promo == 2   ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                    : promo == 3 ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                                 : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  return encode_2d_sw128_promo(map, ptr, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, k, box_rows, kBK, l2);
}

constexpr int kMaxDevices = 64;

// Automatic K split count with 64-row tiles (`tiles` CTAs a split, kbt K blocks): at most 2. With K
// >= 4096 the most that keep at most two CTAs a SM on average: 7168x18432 at M = 16 37.2 us at S = 2
// against 40.1 at S = 1 (H200, bench --small, same run); 4096x7168 11.9 at 2 against 12.7 at 4 (it
// was 4 before: 2 * SMs / 64 tiles; 2 was ahead in four runs). With K < 4096 the S whose CTA count
// is nearest one a SM: 7168x2048 (112 tiles) 7.3 us at S = 1 against 7.6 at 2 (the cluster
// reduction's fixed cost outweighs 20 idle SMs on a short K).
int auto_splits64(int tiles, int kbt) {
  const int sms = sm_count();
  const int s = kbt * kBK < 4096 ? (sms + tiles / 2) / tiles : 2 * sms / tiles;
  return s < 1 ? 1 : s > 2 ? 2 : s;
}

template <int MN, int BM, bool kOverlap, bool kUni, bool kAhead, int KS>
struct Launcher {
  using L = Layout<MN, BM, KS>;
  static constexpr int kThreads = Config<MN, BM, KS>::kThreads;
  static constexpr int kStages = L::max_stages();  // at kBlocks CTAs a SM
  static constexpr int kSmem = L::bytes(kStages);
  static constexpr int kForcedStages = L::max_stages(kSmemLimit);  // a forced count: fewer CTAs a SM
  static constexpr int kSmemMax = L::bytes(kForcedStages);
  // the fp32 partial tile reuses the stage buffers: at least this many stages
  static constexpr int kMinStages = (L::kRed + L::kStage - 1) / L::kStage > 2 ? (L::kRed + L::kStage - 1) / L::kStage : 2;
  static_assert(kMinStages <= kStages, "the partial tile fits the stage buffers");
  static_assert(kSmem <= Config<MN, BM, KS>::kSmemCap, "kBlocks CTAs fit one SM");
  static_assert(KS == 1 || (256 * MN <= 2 * L::kStage && kForcedStages >= 4), "K halves: partial sums, four stages");

  // Once per device: the shared-memory limit, then how many CTAs fit at once (max_clusters[1]) and
  // for each cluster size how many clusters (the automatic split count keeps the grid in one wave).
  static int prepare(int dev, int* max_clusters) {
    static std::atomic<int> state[kMaxDevices];  // 0 new, 1 ready, 2 failed
    static int clusters[kMaxDevices][kMaxSplits + 1];
    if (dev < 0 || dev >= kMaxDevices) return DSX_ECUDA;
    if (state[dev].load(std::memory_order_acquire) == 0) {
      auto kernel = small_gemm_kernel<MN, BM, kOverlap, kUni, kAhead, KS>;
      bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemMax) == cudaSuccess;
      int per_sm = 0;
      ok = ok && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmem) == cudaSuccess;
      clusters[dev][1] = per_sm * sm_count();
      for (int s = 2; ok && s <= kMaxSplits; ++s)
        ok = dsx_launch::max_active_clusters(&clusters[dev][s], kernel, s, kThreads, kSmem) == cudaSuccess;
      ok = ok && clusters[dev][1] > 0;
      state[dev].store(ok ? 1 : 2, std::memory_order_release);
      if (!ok) cudaGetLastError();
    }
    if (state[dev].load(std::memory_order_acquire) != 1) return DSX_ECUDA;
    for (int s = 0; s <= kMaxSplits; ++s) max_clusters[s] = clusters[dev][s];
    return DSX_OK;
  }

  // stages: 0 automatic (kAutoStages, clamped to kStages: kBlocks CTAs a SM), else clamped to
  // [kMinStages, kForcedStages] (more than kStages: fewer CTAs a SM)
  // reg_mode: the output path (0 automatic, 1 the fp32 tile, 2 the registers where they can be used)
  static int run(const GemmNt& g, int splits, int stages, int promo, bool token_major, int scale_point, int reg_mode,
                 const Workspace& ws, bool pdl, cudaStream_t stream) {
    // (KS = 2: automatic the deepest ring one CTA a SM holds, an even count: half a warpgroup)
    if (stages == 0) stages = KS == 2 ? kStages : kAutoStages < kStages ? kAutoStages : kStages;
    if (stages > kForcedStages) stages = kForcedStages;
    if (stages < kMinStages) stages = kMinStages;
    // K halves: an even count, at least two stages a warpgroup (with two temporaries a warpgroup waits for its
    // next stage before it gives the current one back: one stage a warpgroup would never be refilled)
    if (KS == 2) stages = stages < 4 ? 4 : stages & ~1;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return DSX_ECUDA;
    if (sm_count() <= 0) return DSX_ECUDA;
    int max_clusters[kMaxSplits + 1];
    const int rc = prepare(dev, max_clusters);
    if (rc != DSX_OK) return rc;
    const int mtiles = static_cast<int>((g.m + MN - 1) / MN);  // token tiles (M split) of the grid
    const int tiles = static_cast<int>((g.n + BM - 1) / BM) * mtiles;  // CTAs of one split
    const int kbt = static_cast<int>((g.k + kBK - 1) / kBK);
    if (KS == 2 && splits <= 0) splits = 1;  // K halves: one CTA a weight tile
    if (KS == 2 && (splits != 1 || kbt < 2)) return DSX_EINVAL;
    if (splits <= 0) {
      // Automatic: as many K splits as keep every weight tile's cluster resident in one wave; with
      // 64-row tiles auto_splits64 (at most 2).
      splits = BM == 64 ? auto_splits64(tiles, kbt) : max_clusters[1] / tiles;
      if (splits > kMaxSplits) splits = kMaxSplits;
      if (splits > kbt) splits = kbt;
      while (splits > 1 && max_clusters[splits] < tiles) --splits;
      if (splits < 1) splits = 1;
    }
    if (splits > kMaxSplits || splits > kbt) return DSX_EINVAL;
    // The output from the registers: at S <= 2 unless the fp32 tile is asked for; at S >= 3 through the workspace
    // (l2x_note) at 16 or 32 tokens a tile (one consumer warpgroup pair or one, no K halves) unless the fp32 tile is
    // asked for, where the caller gave enough of it (else the fp32 tile).
    bool l2x = KS == 1 && MN <= 32 && splits >= 3 && reg_mode != 1;
    constexpr int kConsumerThreads = 128 * Config<MN, BM, KS>::kConsumerWarpgroups;
    const int64_t need = l2x ? int64_t{16} * splits * tiles * (MN / 8) * kConsumerThreads : 0;  // [S tiles][G][threads]
    if (ws.query) {
      *ws.query = need;
      return DSX_OK;
    }
    l2x = l2x && ws.ptr && ws.bytes >= need && reinterpret_cast<uintptr_t>(ws.ptr) % 16 == 0;
    const bool reg_out = splits <= 2 ? reg_mode != 1 : l2x;
    CUtensorMap tw, tx;
    if (!encode_kmajor(&tw, g.b, g.n, g.k, BM, promo) || !encode_kmajor(&tx, g.a, g.m, g.k, MN, promo)) {
      return DSX_EINVAL;
    }
    Params p{g.sa, g.sb, g.out, static_cast<int>(g.m), static_cast<int>(g.n), kbt, splits, stages, pdl ? 1 : 0,
             token_major ? 1 : 0, scale_point, reg_out ? 1 : 0, l2x ? static_cast<float4*>(ws.ptr) : nullptr};
    cudaLaunchConfig_t lc = {};
    lc.gridDim = token_major ? dim3(splits, mtiles, tiles / mtiles) : dim3(splits, tiles / mtiles, mtiles);
    lc.blockDim = dim3(kThreads, 1, 1);
    lc.dynamicSmemBytes = L::bytes(stages);  // the automatic 8 stages take what they took before
    lc.stream = stream;
    dsx_launch::Attrs attrs;
    attrs.set(lc, splits, pdl);
    return cuda_rc(cudaLaunchKernelEx(&lc, small_gemm_kernel<MN, BM, kOverlap, kUni, kAhead, KS>, tw, tx, p));
  }
};

// Two temporaries (kOverlap) where their registers fit under the CTAs-per-SM cap: M <= 64 at 128
// rows, M <= 32 at 64 rows, M <= 64 with the K halves (KS = 2, one CTA a SM); elsewhere the
// one-temporary loop (the same bits).
template <int MN, int BM, int KS>
constexpr bool kCanOverlap = MN <= (BM == 128 || KS == 2 ? 64 : 32);

struct Knobs {
  int splits, stages, promo, width;
  int scale_point;
  bool overlap, token_major, uni, ahead;
  int reg_mode;  // 0 automatic, 1 the fp32 tile, 2 the registers
  Workspace ws;
};

template <int MN, int BM, bool kOverlap, int KS>
int run_form(const GemmNt& g, const Knobs& k, bool pdl, cudaStream_t s) {
  if constexpr (kOverlap) {  // the scales one step ahead: two temporaries only (else the uniform form)
    if (k.uni && k.ahead) {
      return Launcher<MN, BM, true, true, true, KS>::run(g, k.splits, k.stages, k.promo, k.token_major,
                                                         k.scale_point, k.reg_mode, k.ws, pdl, s);
    }
  }
  if (k.uni) {
    return Launcher<MN, BM, kOverlap, true, false, KS>::run(g, k.splits, k.stages, k.promo, k.token_major,
                                                            k.scale_point, k.reg_mode, k.ws, pdl, s);
  }
  if constexpr (KS == 1) {
    return Launcher<MN, BM, kOverlap, false, false, 1>::run(g, k.splits, k.stages, k.promo, k.token_major,
                                                            k.scale_point, k.reg_mode, k.ws, pdl, s);
  }
  return DSX_EINVAL;  // K halves: the uniform form only (small_run refuses the form before)
}

template <int MN, int BM, int KS>
int run_width(const GemmNt& g, const Knobs& k, bool pdl, cudaStream_t s) {
  if constexpr (kCanOverlap<MN, BM, KS>) {
    if (k.overlap) return run_form<MN, BM, true, KS>(g, k, pdl, s);
  }
  return run_form<MN, BM, false, KS>(g, k, pdl, s);
}

// width: tokens per CTA (0: M rounded up to 16, 32, 64 or 128, one token tile; else M is split
// over ceil(M / width) token tiles)
template <int BM, int KS = 1>
int run_rows(const GemmNt& g, const Knobs& k, bool pdl, cudaStream_t s) {
  const int64_t w = k.width > 0 && k.width < g.m ? k.width : g.m;
  if (w <= 16) return run_width<16, BM, KS>(g, k, pdl, s);
  if (w <= 32) return run_width<32, BM, KS>(g, k, pdl, s);
  if (w <= 64) return run_width<64, BM, KS>(g, k, pdl, s);
  return run_width<128, BM, KS>(g, k, pdl, s);
}

// Weight rows per CTA when not forced: 64 (two or three CTAs a SM, each with its own pipeline) when
// that grid can give every SM two CTAs within 8 K splits, else 128 (one CTA a SM, up to 8 stages).
// H200, M = 16 / 64 (bench/gpu_kernels.py --small, the same run): 64 rows 24576x1536 13.9 / 15.1 us
// against 16.8 / 20.2 (192 128-row tiles: two waves), 4096x7168 13.3 / 15.4 against 13.6 / 15.8,
// 7168x18432 39.1 against 40.4, 7168x2048 8.3 against 8.3; 2048x7168 (32 tiles: at most 256 CTAs)
// 9.3 / 11.7 against 9.0 / 11.3 at 128 rows.
// Tokens per CTA when not forced: above 64 tokens, two 64-token tiles along the grid (two
// alternating wgmma temporaries then fit) when the two token tiles of every 128-row weight tile
// leave room for two K splits in one wave, else all of M. H200 (same run), M = 128 at 64 tokens
// against 128: 4096x7168 17.7 / 19.6 us, 2048x7168 13.6 / 13.9, 7168x2048 11.3 / 11.8; slower where
// one K split is left (7168x18432 67.6 / 56.2; that was before the consumer loop's uniform form and
// the register output: now faster there too, see auto_width) or two waves (24576x1536 28.7 / 25.7).
// At 32 < M <= 64 with K < 4096, two 32-token tiles (two temporaries) where that grid of 128-row
// tiles fills between half and all of the SMs (w32_auto; swap-AB data-parallel's tiles and grid):
// H200, same run, 64x7168x2048 7.73 us against swap-AB data-parallel's 8.55 and the one 64-token
// tile's 8.88; the next call, 4 rounds, 7.59-7.66 against 8.50-8.53 (64x7168x18432, K >= 4096: 40.8
// against 39.4, not taken).
bool w32_auto(const GemmNt& g) {
  const int64_t tiles = (g.n + kRows - 1) / kRows * ((g.m + 31) / 32), sms = sm_count();
  return g.m > 32 && g.m <= 64 && g.k < 4096 && 2 * tiles >= sms && tiles <= sms;
}

// Above 64 tokens, two 64-token tiles wherever the two token tiles of every 128-row weight tile fit one
// wave (2 ceil(N/128) <= SMs): with 4 ceil(N/128) <= SMs (two K splits or more) as before; at 2 ceil(N/128)
// <= SMs < 4 ceil(N/128) with one K split (S = 1, the output straight from the registers). H200, bench
// --small, same run, against all 128 tokens in one tile (S = 2) and CUTLASS pingpong (what algo 0 ran):
// 128x7168x2048 9.11 us against 10.73 and 9.78 (auto 10.46), 128x7168x18432 50.12 against 51.94 and 51.02.
int auto_width(const GemmNt& g) {
  const int64_t tiles128 = (g.n + kRows - 1) / kRows;
  if (w32_auto(g)) return 32;
  return g.m > 64 && 2 * tiles128 <= sm_count() ? 64 : 0;
}

int auto_rows(const GemmNt& g) {
  const int64_t tiles64 = (g.n + 63) / 64, tiles128 = (g.n + kRows - 1) / kRows, kbt = (g.k + kBK - 1) / kBK;
  const int64_t sms = sm_count();
  if (g.m > 32 && tiles128 <= sms) return 128;  // 64 tokens: four stages a CTA at 64 rows
  return tiles64 * (kbt < kMaxSplits ? kbt : kMaxSplits) >= 2 * sms ? 64 : 128;
}

}  // namespace

// The K halves (rows 3: 64 weight rows, one CTA a tile with all of M, two consumer warpgroups on the two
// halves of K; the bits of S = 2) where those CTAs fill more than half of the SMs and at most all of them in
// one wave (ceil(N/64) <= SMs < 2 ceil(N/64): N = 7168 on 132 SMs) with 1024 <= K < 4096. H200, bench
// --small, one call, two rounds each, against what algo 0 ran before (us): 16x7168x2048 6.31 / 6.27 against
// 6.67 / 6.63 (64 rows, S = 1, 7 stages), 64x7168x2048 7.09 / 7.08 against 7.61 / 7.59 (two 32-token tiles
// of 128 rows), 128x7168x2048 9.10 / 9.11 against 9.66 / 9.73 (two 64-token tiles); the next call (auto
// against the forms before forced) 6.38 / 6.43 against 6.74 / 6.70, 7.22 / 7.19 against 7.60 / 7.68, 9.21 /
// 9.12 against 9.74 / 9.61 (cuBLAS 9.73-10.29: 1.52-1.53x, 1.37-1.39x, 1.11-1.12x). The loads alone
// (bench/fp8_read_probe.cu) take 5.40 us in the halves' layout and 6.94-7.06 us with two token tiles, whose
// CTAs each read the weight tile. With K = 18432 mixed (64x7168x18432 39.55 against swap-AB's 39.36,
// 128x7168x18432 56.2 against 52.4): not taken there; K < 1024 not measured.
static bool halves_auto(const GemmNt& g) {
  const int64_t tiles64 = (g.n + 63) / 64, sms = sm_count();
  return g.m >= 1 && g.m <= kSmallMaxRows && g.k >= 1024 && g.k < 4096 && tiles64 <= sms && 2 * tiles64 > sms;
}

bool small_auto(const GemmNt& g) {
  // H200, against the CUTLASS kernels algo 0 ran before (pingpong, swap-AB split-K): faster at
  // M <= 32 on every DeepSeek-V3 shape whose 128-row weight tiles fit one wave (7168x2048,
  // 2048x7168, 4096x7168, 7168x18432: 1.09-1.76x), and at M <= 64 with K >= 4096 (2048x7168,
  // 4096x7168, 7168x18432: 1.03-1.30x); slower at M = 64 on 7168x2048 (0.93x) and at M = 128.
  // With 64-row tiles (two or three CTAs a SM) also where the 128-row tiles take two waves but the
  // 64-row ones fit one: 24576x1536 at M = 16 / 64 13.9 / 15.1 us against pingpong 16.2 / 15.6.
  // M > 64 (split into two 64-token tiles, auto_width) with K >= 4096 where two token tiles and at
  // least two K splits fit one wave: 128x2048x7168 13.6 us against swap-AB split-K 14.8 (H200, same
  // run); 128x4096x7168 too since the consumer loop's uniform form (15.3-15.5 us against swap-AB
  // data-parallel's 16.3-16.8; gemm_fp8_api.cu takes this kernel before it at M > 64). And at M > 64, any K,
  // where the two token tiles fit one wave only with one K split (2 ceil(N/128) <= SMs < 4 ceil(N/128)):
  // 7168x2048 and 7168x18432 (see auto_width). With K < 4096 and 4 ceil(N/128) <= SMs (not measured) swap-AB
  // data-parallel stays.
  if (!small_supported(g)) return false;
  const int64_t sms = sm_count(), tiles128 = (g.n + kRows - 1) / kRows;
  if (halves_auto(g) || w32_auto(g)) return true;
  if (g.m > 64) return auto_width(g) == 64 && (g.k >= 4096 || 4 * tiles128 > sms);
  if (tiles128 <= sms) return g.m <= 32 || g.k >= 4096;
  constexpr int kBlocks64 = Config<64, 64>::kBlocks;  // CTAs a SM at M <= 64 with 64-row tiles
  return auto_rows(g) == 64 && (g.n + 63) / 64 <= kBlocks64 * sms;
}

bool small_before_swap_dp(const GemmNt& g) { return g.m > 64 || w32_auto(g) || halves_auto(g); }

bool small_supported(const GemmNt& g) {
  return g.m >= 1 && g.m <= kSmallMaxRows && g.n >= 1 && tma_compatible(g) && g.n <= (int64_t{1} << 30) &&
         g.k <= (int64_t{1} << 30) && (g.m * ((g.k + kBK - 1) / kBK)) < (int64_t{1} << 31);
}

// knobs (the algo bits of gemm_fp8.h in parentheses): bits 0..3 the K split count S (16..19: cluster
// size, 0 automatic), bits 4..7 the stage count (20..23: 0 automatic = 8, else 2..12, clamped to what
// shared memory holds and to what the partial tile needs), bits 8..9 the weight rows per CTA (8..9:
// 0 automatic, 1: 128, one CTA per SM; 2: 64, two or three CTAs per SM; 3: 64 with the K halves over two
// consumer warpgroups, one CTA per SM, the bits of S = 2: S 0 or 1 only, K > 128), bits 10..11 the consumer
// loop's form (10..11: 0 automatic = 3, or 2 with bits 14..15 non-zero; 1: the form before; 2: stage
// counters, wgmma descriptors in uniform registers, scales by ld.shared (kUni); 3: 2 with the scales one
// step ahead (kAhead) where two temporaries run, else 2; with bits 14..15 non-zero refused), bits 28..29 the output path (29..30: 0 automatic = 2; 1: through the fp32
// tile in shared memory, the form before; 2: from the registers at S <= 2; 3 refused), bits 12..13 the wgmma
// temporaries (12..13: 0 automatic = two where they fit, 1: one, 2: two), bits 14..15 when a K
// step's scale products are read from shared memory (14..15: 0 automatic = 2; 1: after its wgmma
// wait, the order before; 2: before it, under the tensor-core work; 3: with two temporaries before
// the next K step's issue (its barrier wait), else 2; at 128 tokens with one temporary always
// after: held across the wait they spilled), bits 16..17 the L2
// promotion of the TMA loads (4..5: 0 automatic = 128 bytes, 1: 256 bytes, 2: 128 bytes, 3: none),
// bits 18..19 the grid order (6..7: 0 automatic = 2; 1: weight tiles adjacent, grid (S, weight
// tiles, token tiles); 2: the token tiles of one weight tile adjacent, grid (S, token tiles, weight
// tiles)), bits 24..27 the tokens per CTA (24..27: 0 automatic (auto_width), 1: 16, 2: 32, 3: 64, M split
// over the grid; 4: all of M).
int small_run(const GemmNt& g, int knobs, bool pdl, cudaStream_t s, void* ws, int64_t ws_bytes, int64_t* query) {
  if (!small_supported(g)) return DSX_EINVAL;
  const int splits = knobs & 15, stages = (knobs >> 4) & 15;  // algo bits 16..19 and 20..23
  const int rows_knob = (knobs >> 8) & 3, form_knob = (knobs >> 10) & 3, temps_knob = (knobs >> 12) & 3, scales_knob = (knobs >> 14) & 3;
  const int width_knob = (knobs >> 24) & 15, promo = (knobs >> 16) & 3, order = (knobs >> 18) & 3;
  const int out_knob = (knobs >> 28) & 3;
  // (form 3 reads the scales at its own point: with a scale-read point named, refused)
  if (out_knob > 2 || temps_knob > 2 || width_knob > 4 || order > 2 || stages == 1 ||
      stages > kMaxStages || (form_knob == 3 && scales_knob != 0)) {
    return DSX_EINVAL;
  }
  // rows 3: 64 weight rows, the two consumer warpgroups on its K halves (KS = 2; the bits of S = 2): one CTA
  // split, at least two K blocks, the uniform loop form (2 or 3) and the output from the registers
  // (automatic where halves_auto holds and the split count, the token width, the loop form and the output
  // path are automatic too)
  const bool halves = rows_knob == 3 || (rows_knob == 0 && splits == 0 && width_knob == 0 && form_knob != 1 &&
                                         out_knob != 1 && halves_auto(g));
  if (halves && (splits > 1 || g.k <= kBK || form_knob == 1 || out_knob == 1)) return DSX_EINVAL;
  const int rows = rows_knob == 1 ? 128 : rows_knob >= 2 ? 64 : auto_rows(g);
  // automatic: two temporaries where they fit (H200, same run, M = 16: 1-4% faster on the five
  // DeepSeek-V3 shapes; M = 64 at 128 rows: 4096x7168 and 7168x18432 2% faster, 7168x2048 2% slower),
  // 128-byte L2 promotion (1-6% faster than 256 on all 15 shapes of bench --small; none: within 1%
  // of 128), token tiles adjacent in the grid (the CTAs that read one weight tile run side by side:
  // ncu, 128x4096x7168 at 32 tokens a CTA, L2 hit sectors 2.51M -> 0.53M and L2 fabric sectors 0.97M
  // -> 0.52M, CUTLASS swap-AB's counts; time the same or up to 1.5% less on the M = 128 shapes)
  const bool overlap = temps_knob != 1;
  // (K halves: automatic all of M, one token tile)
  const int width = width_knob == 0 ? (halves ? 0 : auto_width(g)) : width_knob == 4 ? 0 : 8 << width_knob;
  const int l2 = promo == 0 ? 2 : promo;
  // scale products: automatic = 2, before the wgmma wait. 3 (before the next K step's issue) measured
  // within noise of it (H200, 128x4096x7168, 16x4096x7168, 16x7168x2048: one call 0.3-2% faster in 3
  // rounds each, the next call 4 rounds each -0.8..+1%: 128x4096x7168 0.1-0.6% slower; bench --small
  // within +-0.7% on the other shapes), so not automatic
  const int scale_point = scales_knob == 1 ? 1 : scales_knob == 3 ? 2 : 0;
  // the loop's form: automatic = 3 (2 with each K step's scales read one step ahead where two temporaries
  // run, else 2), or 2 where bits 14..15 name a scale-read point (which form 3 has no use for); the
  // output: automatic = 2 (from the registers at S <= 2). H200, bench --small --only (2026-12-01, one call,
  // interleaved), auto (both) against the two forms before (2 and the shared-memory tile) on the 11 shapes
  // where algo 0 runs this kernel: 0.3-5.7% faster on all 11 (128x4096x7168 15.25 against 16.07 us,
  // 64x7168x2048 7.34 / 7.78, 16x7168x2048 6.65 / 7.03, 16x4096x7168 10.92 / 11.19), each alone
  // within +0.5% of the forms before where it does not help
  const bool ahead = form_knob == 3 || (form_knob == 0 && scales_knob == 0);
  const Knobs k{splits, stages, l2, width, scale_point, overlap, order != 1, form_knob != 1, ahead, out_knob,
                Workspace{ws, ws_bytes, query}};
  if (halves) return run_rows<64, 2>(g, k, pdl, s);
  return rows == 64 ? run_rows<64>(g, k, pdl, s) : run_rows<128>(g, k, pdl, s);
}

}  // namespace dsx_cuda
