// Weight-only GEMM for decode on sm_90a: out[M, N] bf16 = x[M, K] bf16 @ dequant(W)^T, W in
// Paddle's INT8 / INT4 bytes (contract and accumulation order: include/dsx/gemm_weight_only.h;
// how the bytes meet the tensor cores: gemm_weight_only.cuh). Files: this one (layout constants,
// Params, the host side), gemm_weight_only_kernels.cuh (the kernels described below), gemm_weight_only_ws.cuh and
// gemm_weight_only_ws_host.cuh (the warp-specialized path).
//
// Work split. A warp owns 16 output channels (one mma M tile) and walks K in steps (64 K
// for int8, 128 K for int4; 1 KB of weights a warp per step either way). The weights stream
// through a per-warp ring of `stages` shared-memory slots filled by the copy engine: one
// tensor copy (cp.async.bulk.tensor, completing on the slot's mbarrier) brings `box`
// consecutive steps of the warp's 4 (int4) or 8 (int8) channel-group rows straight from
// Paddle's bytes (plus, for group scales, each step's scale row). A slot is refilled as
// soon as its steps have been read, so stages x box steps of every warp are in flight and
// no register holds bytes that are still on the way. (With one slot, M <= 8 only, the slot is
// refilled as soon as its last steps are in registers, before their arithmetic: box steps a
// warp stay in flight, half of what two slots of the same box keep.) Each lane then reads its
// own 2 x 16 bytes of a step and unpacks them in registers; two steps of a slot are worked on
// at once (two independent mma chains; each step's partial joins the accumulator as if alone). A
// block holds `warps` warps side by side along N that share the same K range, so the x
// slice they need is staged once in shared memory (cp.async, `chunk` steps at a time,
// double-buffered when the slice is longer).
// Along K the problem is cut into `splits` slices, one block each, which form a thread-block
// cluster: each block leaves its fp32 partial tile in shared memory and the cluster sums them
// in slice order through distributed shared memory (deterministic; no workspace, no atomics).
// The grid holds only as many clusters as the GPU keeps resident (asked of the runtime); each
// loops over tile groups (blockIdx.y, + gridDim.y, ...), keeping its K slice (x staged whole
// stays) and its warps' rings running on into the next group, so that no block starts,
// drains or stages x again between groups. (A balanced grid, the fewest clusters that take the
// same rounds, was measured slower: 36864 x 7168 M = 1, 4 splits, 96 clusters 59.1 us against
// 48.2 us for all 124: the kernel's speed follows the SMs busy, not the bytes in flight.)
// Algo bit 27 (int4 per channel, M <= 8; auto takes it where the groups exceed the resident
// clusters) launches wo_gemm_bal_kernel instead: the balanced grid, which deals runs of
// 16-channel tiles to the clusters and equal runs of (tile, K step) units to the warps, so that
// every SM finishes together (its own order for tiles cut between warps: see there).
// Algo bit 26 gives one tile group a block instead
// (the same bits); bit 25 one step at a time (the same bits; for measurements).
// M is handled 8 tokens per mma N tile, up to 64 rows per launch; larger M is cut into
// launches of 64 rows (a simple path: weights are re-read for each), or of 32 where those take the
// warp-specialized path (plan_launch).
// With algo bit 24 the launch is a programmatic dependent launch: the kernel lets the next
// one start launching when its main loop is done, and itself fetches its first weights before
// it waits for the previous kernel (griddepcontrol.wait) and reads x, so its start overlaps
// that kernel's end.
// Only for weights and scales no earlier kernel of the stream is still writing.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "dsx.h"
#include "gemm_weight_only.cuh"
#include "launch_attrs.cuh"
#include "sm90_ptx.cuh"
#include "tuned_card.cuh"
#include "tuned_tables.cuh"

namespace cg = cooperative_groups;

namespace {

using dsx_wo::bf16_bits_to_f32;
using dsx_wo::Stage;

constexpr int kMaxWarps = 8;     // warps (16-channel tiles) per block
constexpr int kMaxSplits = 8;    // portable cluster size
constexpr int kMaxRows = 64;     // rows of x per launch
constexpr int kMaxStages = 15;   // weight ring slots per warp
constexpr int kMaxBox = 8;       // steps per tensor copy
constexpr int kXPadElems = 32;   // x row padding (64 bytes: rows alternate bank halves)
constexpr int kScaleSlot = 48;   // bytes of one scale row copy in a slot (32 + alignment lead)
constexpr int kSmemPerSm = 233472;     // 228 KB of shared memory per SM (sm_90)
constexpr int kSmemPerBlock = 232448;  // 227 KB usable by one block
constexpr int kSmemReserved = 1024;    // per block, by the runtime

// A slot: a warp's `box` steps of weights (1 KB a step), then (group scales) up to two scale
// rows a step.
constexpr int kWBytes = 1024;
__host__ __device__ constexpr int slot_bytes(int gmode, int box) {
  return (box * (kWBytes + (gmode ? 2 * kScaleSlot : 0)) + 127) / 128 * 128;
}
__host__ __device__ constexpr int barrier_bytes(int warps, int stages) { return (warps * stages * 8 + 127) / 128 * 128; }

// The weights as a 2D tensor of 8-byte elements for the copy engine: rows are Paddle's
// channel groups (4 channels for int4, 2 for int8; 2K contiguous bytes each). `wmap`'s box
// is `box` steps of one warp (4 rows x 256 box bytes for int4, 8 rows x 128 box bytes for
// int8), landing row by row in the slot; `wmap1`'s box is one step (for the last, shorter
// slot of a slice, whose steps then lie 1 KB apart, rows 256 / 128 bytes apart). Bytes past
// the end of a row (the int4 half step) arrive as zeros.
struct Params {
  CUtensorMap wmap, wmap1;
  const uint16_t* x;      // [m, k] bf16 bits, this launch's rows
  const uint16_t* scale;  // [n] or [ceil(k/group), n] bf16 bits
  uint16_t* out;          // [m, n] bf16 bits, this launch's rows
  int m, n, k, group;
  int chunk;              // steps of x staged at once
  int stages;             // weight ring slots per warp
  int box;                // steps per slot (per tensor copy)
  int pair;               // 1: two steps at a time where they can be (0: one at a time; same bits)
  int groups;             // tile groups of 16 * warps channels (the grid's y covers them in turn)
  int part_m;             // warp-specialized kernel: rows of each grid-z part (part z: rows z * part_m ..,
                          // at most m in all; = m where the grid has one part)
  CUtensorMap xmap;       // warp-specialized kernel with x through its ring: x as 32 k x K/32 x m (ws_encode_xmap)
  CUtensorMap smap;       // warp-specialized kernel, int4 groups (STMA): scales as [K/group, N], a slot's rows (ws_encode_smap)
};

}  // namespace

// The kernels (wo_gemm_kernel, wo_gemm_bal_kernel).
#include "gemm_weight_only_kernels.cuh"

namespace {

// ------------------------------------------------------------------ host side

struct Config {
  int warps, splits, chunk, stages, box, mt, smem, blocks_n;
  bool pdl;   // programmatic dependent launch (algo bit 24)
  bool pair;     // two steps at a time (algo bit 25 clear)
  bool persist;  // blocks loop over tile groups: only as many as are resident (algo bit 26 clear)
  bool bal = false;  // balanced grid (algo bit 27): wo_gemm_bal_kernel
  int grid_y = 0;    // its clusters (each owns a run of 16-channel tiles)
  int ct = 1;        // 16-channel tiles a warp (2, 4: algo bits 29..30, the warp-specialized kernel up to 16 rows)
  int parts = 1;     // warp-specialized kernel: launches of kWsMaxRows rows side by side in one grid (its z)
  bool xring = false;  // warp-specialized kernel: x through the ring (a given chunk = box < the slice; ws_xring_ok)
  bool fold = false;   // with it, the fold (int4 per channel, every block over two tile groups or more: ws_fold_pays)
  bool wg = false;     // warp-specialized kernel: wgmma consumers (four or eight token tiles, one tile a warp: ws_wgmma)
};

// Clusters (of cfg.splits blocks; blocks when splits == 1) of this kernel instance the
// current GPU holds at once (0 if the runtime cannot say); defined below.
int resident_clusters(int bits, int mt, int gmode, const Config& cfg);
// The balanced grid's clusters and shared memory for cfg (bit 27): false if none fits.
bool bal_plan(int rows, int64_t tiles, Config* cfg);

bool valid_args(int64_t m, int64_t n, int64_t k, int bits, int group, int arch) {
  if (bits != 4 && bits != 8) return false;
  if (group != -1 && group != 64 && group != 128) return false;
  if (arch != 75 && arch != 80 && arch != 86 && arch != 89 && arch != 90 && arch != 100) return false;
  if (m < 0 || n <= 0 || k <= 0 || n % 64 || k % 64) return false;
  return n < (int64_t(1) << 30) && k < (int64_t(1) << 30) && n * k < (int64_t(1) << 46);
}

bool pow2_upto8(int v) { return v == 1 || v == 2 || v == 4 || v == 8; }
bool in_1_8(int v) { return v >= 1 && v <= kMaxSplits; }

int gmode_of(int bits, int group) { return group == -1 ? 0 : (bits == 4 && group == 64 ? 2 : 1); }

// Shared memory of one block, and whether the x slice needs two buffers.
int64_t smem_bytes(int rows, int bits, int gmode, int warps, int stages, int box, int chunk, int per_split) {
  const int step_k = bits == 8 ? 64 : 128;
  const int nbuf = chunk >= per_split ? 1 : 2;
  const int64_t x_bytes = int64_t(nbuf) * rows * (int64_t(chunk) * step_k + kXPadElems) * 2;
  const int64_t part_bytes = int64_t(rows) * 16 * warps * 4;
  // x staged whole stays for all the block's tile groups: the partial tile gets its own room.
  return barrier_bytes(warps, stages) + int64_t(warps) * stages * slot_bytes(gmode, box) +
         (nbuf == 1 ? x_bytes + part_bytes : std::max(x_bytes, part_bytes));
}

// Blocks of `warps` warps that one SM holds with `smem` bytes each (registers: about what
// ptxas gives the kernels, 64 a thread for MT 1 up to 192 for MT 8).
int blocks_per_sm(int warps, int64_t smem, int mt) {
  const int by_smem = static_cast<int>(kSmemPerSm / (smem + kSmemReserved));
  const int regs = mt == 1 ? 64 : mt == 2 ? 80 : mt == 4 ? 128 : 192;
  const int warp_regs = (regs * 32 + 255) / 256 * 256;
  const int by_regs = (65536 / warp_regs) / warps;
  const int by_threads = 64 / warps;
  return std::max(0, std::min(std::min(by_smem, by_regs), std::min(by_threads, 32)));
}

// Automatic choice (measured on the H200 with bench/gpu_gemm_weight_only.py --sweep, int4
// per channel, M = 1 and 16, six DeepSeek-V3 shapes): 8 warps a block (4 for M <= 8 when N
// is too small for two 8-warp blocks per SM even at 8 splits; for int4 per channel, for one);
// for M <= 8, one ring slot of 4 steps a warp, refilled as soon as its steps are in registers
// (fewer, larger copies and fewer bytes in flight than 2 slots of 2 steps refilled after their
// arithmetic; measured, H200, int4 per channel, same run: 36864 x 7168 M = 1 47.65 against
// 48.66 us, M = 8 55.02 against 56.80; 7168 x 18432 M = 1 27.17 against 28.95 at 4 splits;
// auto against the previous rule, next run: int4 per channel 1.5-5% faster at M 1..8 on five
// of six shapes; int8, and int4 on 7168 x 2048 (where one slot holds the whole slice) and
// group 128 on 24576 x 1536: -4..+3%, no clear gain or loss);
// for 9..16 rows, 2 ring slots of
// 2 steps each a warp (more in flight per warp costs blocks per SM, which matter more; M > 16:
// 4 slots of 1 step); x staged whole when it fits in 48 KB, else in chunks of 24 KB
// double-buffered; K split so that the grid fills the GPU in whole waves, each block paying
// a fixed cost of about `kBlockCost` steps (pipeline fill, x staging, cluster reduction),
// and the fewer warps an SM holds below kFullWarps, the slower (the sweeps: resident warps
// per SM set the speed more than bytes in flight per warp do). (Re-measured with persistent
// blocks, 2026-11-30: the choice stayed within 2% of the best swept at M = 1 and 16 on the
// larger shapes, within 4-6% (the order of the best few changes from run to run) on 7168 x 2048
// and 24576 x 1536 at M = 1, but for the rules below.) Any split count 1..8 runs (clusters of
// 3, 5, 6, 7 too); the score weighs powers of two only, one rule below may take one fewer.
constexpr double kBlockCost = 4.0;
constexpr int kFullWarps = 32;

// K steps of a launch: 64 K a step for int8, 128 for int4 (K a multiple of 64; the last int4 step may be half).
int k_steps(int64_t k, int bits) { return static_cast<int>(bits == 8 ? k / 64 : (k / 64 + 1) / 2); }

int choose(int64_t m, int64_t n, int64_t k, int bits, int group, int algo, int sms, Config* cfg) {
  const int rows = static_cast<int>(std::min<int64_t>(std::max<int64_t>(m, 1), kMaxRows));
  const int mt = rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8;
  const int gmode = gmode_of(bits, group);
  const int step_k = bits == 8 ? 64 : 128;
  const int nsteps = k_steps(k, bits);
  if (algo < 0 || (algo >> 28) != 0) return DSX_EINVAL;
  const bool pdl = (algo >> 24) & 1, pair = !((algo >> 25) & 1), persist = !((algo >> 26) & 1);
  const bool bal = (algo >> 27) & 1;
  // (the balanced grid: int4 per channel, up to 8 rows, persistent)
  if (bal && (bits != 4 || gmode != 0 || mt != 1 || !persist)) return DSX_EINVAL;
  int warps = algo & 15, splits = (algo >> 4) & 15, chunk = (algo >> 8) & 255, stages = (algo >> 16) & 15,
      box = (algo >> 20) & 15;
  const int64_t tiles = n / 16;
  // (int4 per channel: 8 warps already where the 8-warp blocks at 8 splits fill every SM once.
  // Measured, H200, 4096 x 7168 M = 1: 8 warps 7 splits 10.80 us, 4 warps 7 splits 11.21 us.)
  const int sm_fill = bits == 4 && group == -1 ? 1 : 2;
  if (warps == 0) warps = rows > 8 || (tiles + 7) / 8 * kMaxSplits >= sm_fill * sms ? 8 : 4;
  if (!pow2_upto8(warps)) return DSX_EINVAL;
  if (splits != 0 && !in_1_8(splits)) return DSX_EINVAL;
  if ((stages == 1 && mt != 1) || box > kMaxBox) return DSX_EINVAL;  // (one slot: M <= 8 only)
  const int64_t blocks_n = (tiles + warps - 1) / warps;
  if (blocks_n > 65535) return DSX_EINVAL;
  const int row_bytes = step_k * 2;
  // x chunk, ring depth and box for a given split (fields left 0 are automatic).
  auto fill = [&](int sp, int* ch, int* st, int* bx) {
    const int per_split = (nsteps + sp - 1) / sp;
    int c = chunk, s = stages, b = box;
    if (c == 0) {
      const int whole = static_cast<int>(std::min<int64_t>(per_split, int64_t(1) << 20));
      if (int64_t(rows) * (int64_t(whole) * row_bytes + 2 * kXPadElems) <= 48 * 1024) {
        c = whole;
      } else {
        c = std::max(1, (24 * 1024 / rows - 2 * kXPadElems) / row_bytes);
        c = std::min(c, per_split);
      }
    }
    const bool auto_box = b == 0;
    if (b == 0) b = rows <= 8 ? std::min(4, per_split) : rows <= 16 ? 2 : 1;
    if (s == 0) s = rows <= 8 && auto_box ? 1 : std::max(1, std::min(rows <= 16 ? 2 : 4, (per_split + b - 1) / b));
    *ch = std::max(1, c), *st = s, *bx = b;
  };
  if (splits == 0) {
    double best = -1.0;
    for (int sp = 1; sp <= kMaxSplits; sp *= 2) {
      const int per_split = (nsteps + sp - 1) / sp;
      if (sp > 1 && per_split < 2) break;
      int c, s, b;
      fill(sp, &c, &s, &b);
      const int64_t sm = smem_bytes(rows, bits, gmode, warps, s, b, c, per_split);
      if (sm > kSmemPerBlock) continue;
      const int occ = blocks_per_sm(warps, sm, mt);
      if (occ == 0) continue;
      const double cap = double(occ) * sms;
      const double waves = double(blocks_n) * sp / cap;
      const double fill_eff = waves / std::ceil(waves);
      const double resident = std::min(1.0, occ * warps / double(kFullWarps));  // warps per SM matter most
      const double score = fill_eff * resident * per_split / (per_split + kBlockCost);
      if (score > best + 1e-9) best = score, splits = sp;
    }
    if (splits == 0) splits = 1;
    // Up to 8 rows, int4 per channel: where the score leaves slices of at most 2 steps (a block's
    // fixed costs then outweigh its stream), the most splits whose slices hold at least 8 steps,
    // if the grid still has a block for 3/4 of the SMs (measured, H200, same run: 7168 x 2048
    // M = 1, 8 splits 8.49 us, 2 splits 7.83; M = 8 9.46 against 9.28).
    if (rows <= 8 && bits == 4 && group == -1 && (nsteps + splits - 1) / splits <= 2) {
      for (int sp = splits / 2; sp >= 1; sp /= 2) {
        if (nsteps / sp >= 8) {
          if (4 * blocks_n * sp >= 3 * int64_t(sms)) splits = sp;
          break;
        }
      }
    }
    // 9..16 rows: where x would come in chunks but twice the splits hold it whole, and the
    // blocks then loop over at least 2 tile groups each, take twice the splits: a persistent
    // block stages whole x once, chunks again for every tile group (measured: 36864 x 7168,
    // M = 16, 86.6 us at 4 splits, 77.3 us at 8).
    // Up to 8 rows, int4 per channel: the same without the tile-group condition: chunked x
    // costs a block-wide barrier a chunk, and the one-slot rings wait on it (measured, H200,
    // same run as the previous rule: 7168 x 18432 M = 8, 4 splits with x in chunks of 11 steps
    // 35.4 us against 33.2 at 8 splits with x whole; wo5 saw 35.7 against 33.6 in two runs).
    const int sp2 = 2 * splits, per2 = (nsteps + sp2 - 1) / sp2;
    int c1, s1, b1, c2, s2, b2;
    fill(splits, &c1, &s1, &b1);
    fill(sp2, &c2, &s2, &b2);
    const bool low_rows = rows <= 8 && bits == 4 && group == -1;
    if ((low_rows || (rows > 8 && rows <= 16)) && sp2 <= kMaxSplits && per2 >= 2 &&
        c1 < (nsteps + splits - 1) / splits && c2 >= per2) {
      const int64_t sm2 = smem_bytes(rows, bits, gmode, warps, s2, b2, c2, per2);
      const int occ2 = sm2 <= kSmemPerBlock ? blocks_per_sm(warps, sm2, mt) : 0;
      if (occ2 > 0 && (low_rows || double(blocks_n) * sp2 >= 2.0 * occ2 * sms)) splits = sp2;
    }
    // Up to 16 rows, where the slices have an odd number of steps (each then ends in a slot
    // of one step, a copy of its own) or differ in length, one split fewer that cuts the steps
    // into equal slices of whole slots is taken if the grid still fits the GPU in one round
    // (resident clusters, as the runtime counts them) and still has a block for every SM
    // (measured, H200, K = 7168: 4096 x 7168 M = 1 11.8 -> 11.3 us, M = 16 17.4 -> 16.2 us;
    // 2048 x 7168 M = 1 8.6 -> 8.1 us; with fewer blocks than SMs it lost: 2048 x 7168 M = 16,
    // 16 clusters of 7, 12.7 us against 11.8 at 8 splits).
    const int sp1 = splits - 1;
    if (rows <= 16 && sp1 >= 2 && nsteps % sp1 == 0 && int64_t(blocks_n) * sp1 >= sms) {
      int c0, s0, b0, c1, s1, b1;
      fill(splits, &c0, &s0, &b0);
      fill(sp1, &c1, &s1, &b1);
      const int per0 = (nsteps + splits - 1) / splits, per1 = nsteps / sp1;
      const bool ragged0 = nsteps % splits != 0 || per0 % b0 != 0;
      const bool x_ok = c1 >= per1 || c0 < per0;  // (x stays whole if it was)
      const int64_t sm1 = smem_bytes(rows, bits, gmode, warps, s1, b1, c1, per1);
      if (ragged0 && per1 % b1 == 0 && x_ok && sm1 <= kSmemPerBlock && blocks_per_sm(warps, sm1, mt) > 0) {
        const Config probe{warps, sp1, c1, s1, b1, mt, static_cast<int>(sm1), static_cast<int>(blocks_n),
                           false, true, persist};
        if (resident_clusters(bits, mt, gmode, probe) >= blocks_n) splits = sp1;
      }
    }
  }
  // More than 16 rows, int4 per channel, splits automatic: where 8 splits make 8 non-empty slices
  // whose x fits whole in at most 128 KB and the blocks then loop over at least 4 tile groups each,
  // take 8 splits, x whole (staged once per block, not again per tile group), 2 slots of 2 steps
  // (fields given in `algo` are kept). Measured (H200, same run as HEAD's kernel, wo6):
  // 36864 x 7168 M = 32 140.1 -> 103.7 us, M = 64 294.2 -> 197.6 us; with about 1.7 groups a
  // block it lost (7168 x 2048 M = 64: 22.8 -> 24.6 us); 7168 x 18432 (x of 18 steps, not taken)
  // was no faster at 8 splits with chunked x (c7 90.5 against auto's 70.9).
  bool wide_x = false;
  if (rows > 16 && bits == 4 && group == -1 && (algo & 0xF0) == 0) {
    const int sp8 = kMaxSplits, per8 = (nsteps + sp8 - 1) / sp8;
    const int c8 = chunk ? chunk : per8, s8 = stages ? stages : 2, b8 = box ? box : 2;
    const int64_t x_whole = int64_t(rows) * (int64_t(per8) * step_k + kXPadElems) * 2;
    const int64_t sm8 = smem_bytes(rows, bits, gmode, warps, s8, b8, c8, per8);
    const int occ8 = sm8 <= kSmemPerBlock && s8 <= kMaxStages ? blocks_per_sm(warps, sm8, mt) : 0;
    if (per8 >= 2 && per8 * (sp8 - 1) < nsteps && x_whole <= 128 * 1024 && occ8 > 0 && double(blocks_n) * sp8 >= 4.0 * occ8 * sms) {
      splits = sp8, wide_x = true;
      if (chunk == 0) chunk = per8;
      if (stages == 0) stages = 2;
      if (box == 0) box = 2;
    }
  }
  const int per_split = (nsteps + splits - 1) / splits;
  const int chunk_given = chunk;
  if (!wide_x) fill(splits, &chunk, &stages, &box);
  if (bal && chunk < per_split) {  // the balanced grid stages the slice's x whole
    if (chunk_given != 0) return DSX_EINVAL;
    chunk = per_split;
  }
  if (stages > kMaxStages) return DSX_EINVAL;
  const int64_t smem = smem_bytes(rows, bits, gmode, warps, stages, box, chunk, per_split);
  if (smem > kSmemPerBlock) return DSX_EINVAL;
  *cfg = Config{warps, splits, chunk, stages, box, mt, static_cast<int>(smem), static_cast<int>(blocks_n),
                pdl, pair, persist};
  if (bal) {
    cfg->bal = true;
    if (!bal_plan(rows, tiles, cfg)) return DSX_EINVAL;
  }
  // Up to 8 rows, int4 per channel, every field automatic (bits 24, 25 aside), x whole: where the
  // persistent grid would loop over more tile groups than clusters are resident (rounds of whole
  // groups: the last one leaves clusters idle), the balanced grid (bit 27) instead. Measured, H200,
  // interleaved in one run: 36864 x 7168 (288 groups over 124 clusters) M = 1/4/8 47.88/51.94/55.39
  // -> 46.70/51.34/52.24 us (M = 1: 2.93x -> 3.01x torch); 7168 x 18432 M = 4/8 32.09/34.01 ->
  // 30.67/31.48 us, M = 1 (one round) 27.97 against 28.15. Where the groups fit in one round, the
  // balanced grid (spreading them over every resident cluster) lost: 24576 x 1536 M = 1/8
  // 13.32/16.72 -> 14.38/19.42 us, 4096 x 7168 M = 1 10.68 -> 11.99, 7168 x 2048 M = 1 7.87 -> 10.10.
  // With the rule, against HEAD's kernel in the same process (interleaved, next run): 36864 x 7168
  // M = 1/2/4/8 47.95/49.44/52.23/55.87 -> 47.31/49.50/52.22/53.15 us; 7168 x 18432 M = 8 33.54 ->
  // 31.32; the shapes it leaves alone within 0.5%. (Eleventh session, second round: for algo 0 the warp-specialized
  // rule, ws_auto_rule in gemm_weight_only_ws_host.cuh, is asked first and takes these two shapes; this
  // one still decides where that rule does not apply, and that rule leaves alone (one tile a warp)
  // the shapes where this one takes the balanced grid.)
  else if ((algo & 0xFFFFFF) == 0 && persist && rows <= 8 && bits == 4 && gmode == 0 && chunk >= per_split) {
    const int resident = resident_clusters(bits, mt, gmode, *cfg);
    if (resident > 0 && blocks_n > resident) {
      Config b = *cfg;
      b.bal = true;
      if (bal_plan(rows, tiles, &b)) *cfg = b;
    }
  }
#ifdef DSX_WO_DIAG_MIN_SMEM  // diagnostic builds: at least this much shared memory a block (fewer blocks an SM)
  cfg->smem = std::max(cfg->smem, DSX_WO_DIAG_MIN_SMEM);
#endif
  return DSX_OK;
}

constexpr int kMaxDevices = 64;

using dsx_cuda::tensor_map_encoder;  // (sm90_ptx.cuh)

// The weights' tensor maps (see Params): rows of 2K bytes (8-byte elements), N/4 (int4) or
// N/2 (int8) of them; a box of `steps` steps of one warp.
bool encode_weight_map(CUtensorMap* map, const void* q, int64_t n, int64_t k, int bits, int steps) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(2 * k / 8), static_cast<cuuint64_t>(bits == 8 ? n / 2 : n / 4)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(2 * k)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>((bits == 8 ? 16 : 32) * steps), bits == 8 ? 8u : 4u};
  const cuuint32_t elem[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, const_cast<void*>(q), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename Kernel>
cudaError_t ensure_smem(Kernel kernel, int bytes, std::atomic<int>* done) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (done[dev].load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) {
    int cur = done[dev].load(std::memory_order_relaxed);
    while (cur < bytes && !done[dev].compare_exchange_weak(cur, bytes)) {
    }
  }
  return e;
}

// cudaLaunchKernelEx of lc (grid, block, shared memory and stream set) with the splits of a tile
// as a cluster along x (when more than one) and programmatic dependent launch when cfg.pdl (the
// weights may then be read before the previous kernel in the stream ends).
template <typename Kernel>
cudaError_t launch_ex(cudaLaunchConfig_t& lc, const Config& cfg, Kernel kernel, const Params& p) {
  dsx_launch::Attrs attrs;
  attrs.set(lc, cfg.splits, cfg.pdl);
  return cudaLaunchKernelEx(&lc, kernel, p);
}

// Tile groups (clusters of `splits` blocks, or blocks) the GPU holds at once with this
// kernel and config: the persistent grid's height. Asked of the runtime once per (device,
// kernel, shared memory, warps, splits) and remembered (0 if it cannot say).
int resident_groups(const void* kernel, const Config& cfg, int dev) {
  struct Entry {
    std::atomic<const void*> kernel;
    std::atomic<uint64_t> kv;  // key << 32 | value
  };
  static Entry cache[64];  // zero-initialized (static storage)
  const uint64_t key = (uint64_t(dev & 63) << 26 | uint64_t(cfg.smem & 0x3FFFF) << 8 | cfg.warps << 4 | cfg.splits) + 1;
  const size_t h = (reinterpret_cast<uintptr_t>(kernel) / 16 + key * 0x9E3779B9u) % 64;
  for (int i = 0; i < 64; ++i) {
    Entry& e = cache[(h + i) % 64];
    const void* k = e.kernel.load(std::memory_order_acquire);
    if (k == nullptr) break;
    const uint64_t kv = e.kv.load(std::memory_order_acquire);
    if (k == kernel && (kv >> 32) == key) return static_cast<int>(kv & 0xFFFFFFFFu);
  }
  int n = 0;
  if (cfg.splits > 1) {
    dsx_launch::max_active_clusters(&n, kernel, cfg.splits, 32 * cfg.warps, cfg.smem);
  } else {
    int per_sm = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * cfg.warps, cfg.smem) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
      n = per_sm * sms;
  }
  if (n <= 0) {
    cudaGetLastError();  // (a refused query must not be blamed on a later launch)
    return 0;
  }
  // Remember it (a lost race only means asking again later).
  for (int i = 0; i < 64; ++i) {
    Entry& e = cache[(h + i) % 64];
    const void* expected = nullptr;
    if (e.kernel.compare_exchange_strong(expected, kernel, std::memory_order_acq_rel)) {
      e.kv.store(key << 32 | static_cast<uint32_t>(n), std::memory_order_release);
      break;
    }
  }
  return n;
}

// The shared-memory size each device has allowed the kernel instance so far.
template <int BITS, int MT, int GMODE, bool EARLY>
std::atomic<int>* smem_allowed() {
  static std::atomic<int> set[kMaxDevices];  // zero-initialized (static storage)
  return set;
}

template <int BITS, int MT, int GMODE, bool EARLY>
int resident_of(const Config& cfg) {
  auto kernel = wo_gemm_kernel<BITS, MT, GMODE, EARLY>;
  int dev = 0;
  if (ensure_smem(kernel, cfg.smem, smem_allowed<BITS, MT, GMODE, EARLY>()) != cudaSuccess ||
      cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();  // (a refused query must not be blamed on a later launch)
    return 0;
  }
  return resident_groups(reinterpret_cast<const void*>(kernel), cfg, dev);
}

// Calls f(Inst<BITS, MT, GMODE, EARLY>{}) for the compiled kernel instance of (bits, mt, gmode,
// one ring slot): the one place that maps run-time choices to template instances (launches and
// occupancy queries). One slot (stages 1: the early refill) exists for mt 1 only.
template <int B, int G>
struct Layout {
  static constexpr int kBits = B, kGmode = G;
};
template <int B, int T, int G, bool E = false>
struct Inst : Layout<B, G> {
  static constexpr int kMt = T;
  static constexpr bool kEarly = E;
};
template <typename F>
auto with_instance(int bits, int mt, int gmode, int stages, F&& f) {
  auto by_mt = [&](auto bg) {
    constexpr int B = decltype(bg)::kBits, G = decltype(bg)::kGmode;
    switch (mt) {
      case 1: return stages == 1 ? f(Inst<B, 1, G, true>{}) : f(Inst<B, 1, G>{});
      case 2: return f(Inst<B, 2, G>{});
      case 4: return f(Inst<B, 4, G>{});
      default: return f(Inst<B, 8, G>{});
    }
  };
  if (bits == 8) return gmode == 0 ? by_mt(Layout<8, 0>{}) : by_mt(Layout<8, 1>{});
  return gmode == 0 ? by_mt(Layout<4, 0>{}) : gmode == 1 ? by_mt(Layout<4, 1>{}) : by_mt(Layout<4, 2>{});
}

int resident_clusters(int bits, int mt, int gmode, const Config& cfg) {
  return with_instance(bits, mt, gmode, cfg.stages, [&](auto i) {
    using I = decltype(i);
    return resident_of<I::kBits, I::kMt, I::kGmode, I::kEarly>(cfg);
  });
}

// The balanced grid's instances (int4 per channel, MT 1: one ring slot, or more).
template <int T, bool E>
struct BalInst {
  static constexpr int kMt = T;
  static constexpr bool kEarly = E;
};
template <typename F>
auto with_bal_instance(int mt, int stages, F&& f) {
  (void)mt;  // (1: choose() refuses the others)
  return stages == 1 ? f(BalInst<1, true>{}) : f(BalInst<1, false>{});
}
template <int MT, bool EARLY>
std::atomic<int>* bal_smem_allowed() {
  static std::atomic<int> set[kMaxDevices];
  return set;
}

// Shared memory of a balanced-grid block (see wo_gemm_bal_kernel) whose cluster owns up to
// `tiles_max` tiles: barriers, rings, x whole, the upper pieces and the partial tiles.
int64_t bal_smem_bytes(int rows, const Config& cfg, int64_t tiles_max) {
  const int step_k = 128;
  return barrier_bytes(cfg.warps, cfg.stages) + int64_t(cfg.warps) * cfg.stages * slot_bytes(0, cfg.box) +
         int64_t(rows) * (int64_t(cfg.chunk) * step_k + kXPadElems) * 2 + int64_t(cfg.warps) * cfg.mt * 4 * 32 * 4 +
         int64_t(rows) * 16 * tiles_max * 4;
}

// The clusters G: as many as are resident with the shared memory that ceil(tiles / G) tiles a
// cluster need, at most one per tile.
bool bal_plan(int rows, int64_t tiles, Config* cfg) {
  const int64_t per_split = cfg->chunk;  // (x whole: chunk >= the longest slice)
  int64_t tmax = 1;
  for (int it = 0; it < 8; ++it) {
    const int64_t sm = bal_smem_bytes(rows, *cfg, tmax);
    if (sm > kSmemPerBlock || tmax * per_split >= (int64_t(1) << 31)) return false;
    Config probe = *cfg;
    probe.smem = static_cast<int>(sm);
    const int resident = with_bal_instance(cfg->mt, cfg->stages, [&](auto i) {
      using I = decltype(i);
      auto kernel = wo_gemm_bal_kernel<4, I::kMt, 0, I::kEarly>;
      int dev = 0;
      if (ensure_smem(kernel, probe.smem, bal_smem_allowed<I::kMt, I::kEarly>()) != cudaSuccess ||
          cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
      }
      return resident_groups(reinterpret_cast<const void*>(kernel), probe, dev);
    });
    if (resident <= 0) return false;
    const int64_t grid = std::min<int64_t>(resident, tiles);
    const int64_t need = (tiles + grid - 1) / grid;
    if (need <= tmax) {
      cfg->smem = static_cast<int>(sm), cfg->grid_y = static_cast<int>(grid);
      return grid <= 65535;
    }
    tmax = need;
  }
  return false;
}

template <int MT, bool EARLY>
cudaError_t launch_bal(const Params& p, const Config& cfg, cudaStream_t stream) {
  auto kernel = wo_gemm_bal_kernel<4, MT, 0, EARLY>;
  const cudaError_t se = ensure_smem(kernel, cfg.smem, bal_smem_allowed<MT, EARLY>());
  if (se != cudaSuccess) return se;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(cfg.splits, cfg.grid_y, 1);
  lc.blockDim = dim3(32 * cfg.warps, 1, 1);
  lc.dynamicSmemBytes = cfg.smem;
  lc.stream = stream;
  return launch_ex(lc, cfg, kernel, p);
}

template <int BITS, int MT, int GMODE, bool EARLY>
cudaError_t launch(const Params& p, const Config& cfg, cudaStream_t stream) {
  auto kernel = wo_gemm_kernel<BITS, MT, GMODE, EARLY>;
  const cudaError_t se = ensure_smem(kernel, cfg.smem, smem_allowed<BITS, MT, GMODE, EARLY>());
  if (se != cudaSuccess) return se;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(cfg.splits, cfg.blocks_n, 1);
  int dev = 0;
  if (cfg.persist && !(BITS == 4 && GMODE == 2 && MT == 2) && cudaGetDevice(&dev) == cudaSuccess) {
    const int resident = resident_groups(reinterpret_cast<const void*>(kernel), cfg, dev);
    if (resident > 0 && resident < cfg.blocks_n) lc.gridDim.y = resident;
  }
  lc.blockDim = dim3(32 * cfg.warps, 1, 1);
  lc.dynamicSmemBytes = cfg.smem;
  lc.stream = stream;
  return launch_ex(lc, cfg, kernel, p);
}

int device_sms(int* sms) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DSX_ECUDA;
  if (cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return DSX_ECUDA;
  return DSX_OK;
}

}  // namespace

// Algo bit 28: the warp-specialized path (one producer warp fills a ring shared by the block).
#include "gemm_weight_only_ws.cuh"
#include "gemm_weight_only_ws_host.cuh"

namespace {
// The first launch of an m-row call on this device (the query entries below): its rows, configuration, path.
struct FirstLaunch {
  int rows = 0;
  Config cfg;
  bool ws = false;  // algo bit 28: gemm_weight_only_ws.cuh
};
int first_launch(int64_t m, int64_t n, int64_t k, int bits, int group_size, int algo, FirstLaunch* f) {
  int sms = 0;
  if (device_sms(&sms) != DSX_OK) return DSX_ECUDA;
  return plan_launch(m, n, k, bits, group_size, algo, sms, &f->rows, &f->cfg, &f->ws);
}
}  // namespace

extern "C" int dsx_wo_gemm_config_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size,
                                       int algo, int* warps, int* splits, int* chunk, int* stages, int* box) {
  if (!valid_args(m, n, k, bits, group_size, 90) || !warps || !splits || !chunk || !stages || !box) return DSX_EINVAL;
  FirstLaunch f;
  if (const int rc = first_launch(m, n, k, bits, group_size, algo, &f)) return rc;
  *warps = f.cfg.warps, *splits = f.cfg.splits, *chunk = f.cfg.chunk, *stages = f.cfg.stages, *box = f.cfg.box;
  return DSX_OK;
}

extern "C" int dsx_wo_gemm_path_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size, int algo, int* ws,
                                     int* tiles) {
  if (!valid_args(m, n, k, bits, group_size, 90) || !ws || !tiles) return DSX_EINVAL;
  FirstLaunch f;
  if (const int rc = first_launch(m, n, k, bits, group_size, algo, &f)) return rc;
  *ws = f.ws ? (f.cfg.xring ? (f.cfg.fold ? 3 : 2) : f.cfg.wg ? 4 : 1) : 0, *tiles = f.ws ? f.cfg.ct : 1;
  return DSX_OK;
}

extern "C" int dsx_wo_gemm_launch_cuda(int64_t m, int64_t n, int64_t k, int bits, int group_size, int algo, int* rows,
                                       int* parts) {
  if (!valid_args(m, n, k, bits, group_size, 90) || !rows || !parts) return DSX_EINVAL;
  FirstLaunch f;
  if (const int rc = first_launch(m, n, k, bits, group_size, algo, &f)) return rc;
  *rows = f.rows, *parts = f.cfg.parts;
  return DSX_OK;
}

// (defined here, not in gemm_fp8_api.cu, so that the weight-only GEMM built alone has it too: the state
// is one per library either way)
extern "C" int dsx_tuned_tables_cuda(int on) {
  if (on < -1 || on > 1) return DSX_EINVAL;
  return dsx_cuda::tuned_tables_switch(on);
}

extern "C" int dsx_tuned_card_cuda(int card) {
  const int before = dsx_cuda::tuned_card_switch(card);
  return before < 0 ? DSX_EINVAL : before;
}

extern "C" int dsx_device_card_cuda(int* card) {
  int sms = 0;
  if (!card) return DSX_EINVAL;
  if (device_sms(&sms) != DSX_OK) return DSX_ECUDA;
  *card = dsx_cuda::tuned_card(sms);
  return DSX_OK;
}

extern "C" int dsx_wo_gemm_bf16_nt_cuda(const void* x, const void* qweight, const void* scale,
                                        void* out, int64_t m, int64_t n, int64_t k, int bits,
                                        int group_size, int arch, int algo, void* stream) {
  if (!valid_args(m, n, k, bits, group_size, arch)) return DSX_EINVAL;
  if (m == 0) return DSX_OK;
  if (!x || !qweight || !scale || !out) return DSX_EINVAL;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(qweight)) & 15) return DSX_EINVAL;
  if ((reinterpret_cast<uintptr_t>(scale) | reinterpret_cast<uintptr_t>(out)) & 1) return DSX_EINVAL;
  int sms = 0;
  if (device_sms(&sms) != DSX_OK) return DSX_ECUDA;
  const int gmode = gmode_of(bits, group_size);
  for (int64_t m0 = 0, step = 0; m0 < m; m0 += step) {
    Config cfg;
    bool ws = false;  // algo bit 28: gemm_weight_only_ws.cuh
    int rows = 0;
    const int rc = plan_launch(m - m0, n, k, bits, group_size, algo, sms, &rows, &cfg, &ws);
    if (rc != DSX_OK) return rc;
    step = rows;
    Params p;
    if (ws) {
      p.x = static_cast<const uint16_t*>(x) + m0 * k;
      p.scale = static_cast<const uint16_t*>(scale);
      p.out = static_cast<uint16_t*>(out) + m0 * n;
      p.m = rows, p.n = static_cast<int>(n), p.k = static_cast<int>(k), p.group = group_size;
      p.part_m = cfg.parts > 1 ? kWsMaxRows : rows;
      const int wrc = ws_launch(p, qweight, n, k, bits, gmode, cfg, static_cast<cudaStream_t>(stream));
      if (wrc != DSX_OK) return wrc;
      continue;
    }
    if (!encode_weight_map(&p.wmap, qweight, n, k, bits, cfg.box) || !encode_weight_map(&p.wmap1, qweight, n, k, bits, 1))
      return DSX_ECUDA;
    p.x = static_cast<const uint16_t*>(x) + m0 * k;
    p.scale = static_cast<const uint16_t*>(scale);
    p.out = static_cast<uint16_t*>(out) + m0 * n;
    p.m = rows, p.n = static_cast<int>(n), p.k = static_cast<int>(k), p.group = group_size;
    p.part_m = rows;  // (the warp-specialized kernel's; unused here)
    p.chunk = cfg.chunk, p.stages = cfg.stages, p.box = cfg.box, p.pair = cfg.pair ? 1 : 0;
    p.groups = cfg.blocks_n;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaError_t e;
    if (cfg.bal) {
      p.groups = static_cast<int>(n / 16);  // (the balanced grid deals 16-channel tiles)
      e = with_bal_instance(cfg.mt, cfg.stages, [&](auto i) {
        using I = decltype(i);
        return launch_bal<I::kMt, I::kEarly>(p, cfg, st);
      });
    } else {
      e = with_instance(bits, cfg.mt, gmode, cfg.stages, [&](auto i) {
        using I = decltype(i);
        return launch<I::kBits, I::kMt, I::kGmode, I::kEarly>(p, cfg, st);
      });
    }
    if (e != cudaSuccess) return DSX_ECUDA;
  }
  return DSX_OK;
}
