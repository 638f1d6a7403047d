// Weight-only GEMM, warp-specialized path, host side (algo bit 28): the configuration a word asks for
// (ws_choose), the automatic rules and the measured table that pick one (ws_auto_rule, ws_tuned_word,
// ws_resolve), the cut of a call into launches (plan_launch), and the launch of the kernel instance that
// gemm_weight_only_ws.cuh defines (ws_launch). Included by gemm_weight_only.cu right after that header,
// with the same reach into its anonymous namespace (Params, Config, choose, ensure_smem, resident_groups).
#pragma once

namespace {

constexpr int kWsAlgoBit = 1 << 28;
constexpr int kWsTilesBit = 3 << 29;  // (with bit 28, up to 16 rows: 2 (1) or 4 (2) 16-channel tiles a consumer warp)
constexpr int kWsNoFit = 1;  // (ws_choose: x whole does not fit, every field automatic)
// Rows a warp-specialized launch takes: up to 16 (one or two token tiles; one, two or four channel tiles
// a warp), and 17..32 (four token tiles, one channel tile a warp; ws_auto_rule has the measurements).
constexpr int kWsMaxRows = 32;
// Rows a launch with eight token tiles takes (33..64; wgmma consumers only, one tile a warp: bits 29..30 = 1 with bit 28,
// or the automatic cut in plan_launch): one launch of all the rows, where x for them fits whole (ws_choose).
constexpr int kWsWideRows = 64;
constexpr int kWsWgmma = 1 << 29;  // (bits 29..30 = 1 above 16 rows: wgmma consumers)

// Whether x may come through the ring (the kernel's XR instances, x by one tensor copy a step): int4 (per channel, group
// 128, group 64 since the forty-second session), two token tiles (9..16 rows), two tiles a warp.
bool ws_xring_ok(int rows, int bits, int ct) { return bits == 4 && rows > 8 && rows <= 16 && ct == 2; }

int ws_blocks_per_sm(const Config& c);
// The fold (the kernel's FOLD instances; x through the ring, int4 per channel): where the grid's blocks, as many as
// the SMs hold, each loop over two tile groups or more (tile groups x splits >= 2 x resident blocks). The producer
// sums x during the first group (the kernel's note); where a block has one group the sums' mma and the wait for them
// at its end are not paid back. Measured (thirty-first session, H200, bench/wo_ab.sh interleaved with main's build,
// us, main -> fold in every x-ring launch): 36864 x 7168 M = 12 / 16 47.30 / 49.18 -> 44.52 / 46.52 (the x-ring word
// at M = 9 / 10 44.54 / 44.42, main's x whole 47.13 / 47.75; the - 136 left out, wrong values: 43.6-45.5), but the
// one-group grids slower: 7168 x 18432 M = 9 / 16 27.91 / 28.11 -> 28.46 / 28.63, 7168 x 4608 11.2 -> 11.6, 3072 x
// 1536 5.6 -> 5.85. (Taking the sums from global memory before the first step instead, in every launch of up to 16
// rows, lost everywhere: 7168 x 18432 M = 16 27.73 -> 31.89, 24576 x 1536 13.65 -> 18.82.)
// Whether a launch runs wgmma consumers (the kernel's WG): four or eight token tiles (17..32 or 33..64 rows, one tile a
// warp), every layout (int4 group 64 since the forty-third session: step_g64_wgmma), 4 or 8 consumer warps (whole
// warpgroups). Measured first in bench/wo_loop_probe.cu
// (thirty-second session, H200: the step loop alone, operands resident in shared memory, the loop's floor on
// 36864 x 7168 in us, mma.sync -> wgmma): one tile a warp, four token tiles 46.32 -> 32.36, eight 85.53 -> 44.78;
// the same bits as the mma chain. Int4 group 64 (forty-third session; before, four token tiles through mma at 17..32
// rows and the cut at 32 above; H200, bench/wo_ab.sh against main's build, 3 rounds, rules, us): 36864 x 7168 M = 24 /
// 32 / 48 / 64 115.78 / 130.77 / 189.01 / 260.77 -> 85.94 / 89.57 / 131.89 / 141.68 (group 128 there 81.85 / 85.17 /
// - / 134.54), 7168 x 18432 M = 17 / 32 / 64 65.57 / 75.66 / 149.86 -> 52.33 / 57.92 / 115.31, 24576 x 1536 M = 64
// 67.44 -> 45.72; where the rules keep mma (36864 x 7168 at 17 rows, 7168 x 2048 and 2048 x 7168 at 17..32) unchanged.
bool ws_wgmma(const Config& c) { return (c.mt == 4 || c.mt == 8) && c.ct == 1 && (c.warps == 4 || c.warps == 8); }

// Where the wgmma consumers pay: the steps a block runs (its slice's, times the tile groups it loops over when the
// grid's blocks outnumber those the SMs hold) at least 32. Measured (thirty-second session, H200, bench/wo_ab.sh,
// main -> wgmma in every 17..32-row launch of 4 or 8 warps, x for 8 rows a token tile; us): int4 per channel
// 36864 x 7168 M = 32 / 48 / 64 88.96 / 132.54 / 174.18 -> 81.65 / 125.52 / 159.28 (7 steps a slice, ~9 rounds),
// 7168 x 18432 56.27 / 82.89 / 111.17 -> 53.64 / 80.81 / 105.81 (18 steps, ~2 rounds); but 7168 x 2048 (4 steps, one
// round) 11.38 / 22.35 -> 12.75 / 24.91 and 24576 x 1536 (6 steps, ~1.5 rounds) 19.86 / 39.23 -> 21.12 / 41.6 at
// M = 32 / 64: the wgmma path's fixed costs a block (x staged word by word, the first wgmma) are not paid back by
// its cheaper steps there. int8 per channel unchanged (36864 x 7168 M = 32 104.88 -> 104.02). At 17 rows x for 32
// rows cost blocks an SM (36864 x 7168 78.40 -> 84.46, 7168 x 18432 48.70 -> 57.75): x is now staged for whole
// token groups only (24 rows at 17), and the automatic choice also keeps the mma consumers where even that would hold
// fewer blocks an SM. The same call with the rule at 16 steps, on the other tensor-parallel shapes: 18432 x 7168 (35
// steps a block) M = 24 / 32 / 64 46.03 / 48.07 / 94.63 -> 42.99 / 45.75 / 91.04, but 9216 x 7168 (21) 26.38 / 27.55
// / 54.48 -> 25.61 / 28.07 / 54.97 and 7168 x 9216 (18) 27.32 / 30.47 / 60.18 -> 26.74 / 31.40 / 62.15; hence 32.
bool ws_wgmma_pays(const Config& c, int per_split, int sms) {
  const int64_t blocks = int64_t(c.blocks_n) * c.splits, resident = int64_t(ws_blocks_per_sm(c)) * sms;
  return resident > 0 && int64_t(per_split) * ((blocks + resident - 1) / resident) >= 32;
}

bool ws_fold_pays(const Config& c, int sms) {
#ifdef DSX_WO_FOLD_ALL  // (diagnostic builds: every x-ring launch folded; thirty-second session, docs/benchmarks.md)
  return true;
#endif
  return int64_t(c.blocks_n) * c.splits >= 2 * int64_t(ws_blocks_per_sm(c)) * sms;
}

// The warp-specialized configuration for a launch of `rows` (<= kWsMaxRows) rows: the split, chunk and
// warps that choose() gives the word without bit 28 and without its ring fields (so, at equal
// splits, the same slices: the same bits; with splits and chunk automatic, 8 splits where
// choose() would stage x in chunks), and the block ring's own slots / steps per slot (algo bits
// 16..19 / 20..23; automatic: 4 slots of 1 step). With bits 29..30 = t (1 or 2), each consumer warp
// owns 2^t 16-channel tiles (a block 16 * 2^t * warps channels; at 8 rows or fewer with one token
// tile, x fragments of 8 rows; t = 3 is refused in ws_resolve).
int ws_choose(int rows, int64_t n, int64_t k, int bits, int group, int algo, int sms, Config* cfg) {
  if (rows > kWsMaxRows && (rows > kWsWideRows || (algo & kWsTilesBit) != kWsWgmma)) return DSX_EINVAL;
  const int stages = (algo >> 16) & 15, box = (algo >> 20) & 15;
  // Warps other than a power of two (3, 5, 6, 7; twenty-eighth session): several tiles a warp with a given split only,
  // so that a block's tile groups can fill the resident clusters' rounds evenly (36864 x 7168 at 4 splits: 192 groups
  // of 6 warps for 66 clusters of 4, 2.9 rounds, where 8 warps' 144 take 2.18). choose() knows powers of two: it
  // sees 8, and the block's channels follow the warps asked for (blocks_n below).
  const int odd_warps = (algo & 15) != 0 && !pow2_upto8(algo & 15) ? algo & 15 : 0;
  if (odd_warps && (odd_warps > kMaxWarps || !(algo & kWsTilesBit) || ((algo >> 4) & 15) == 0)) return DSX_EINVAL;
  const int fields = (algo & ~(kWsAlgoBit | kWsTilesBit | 0xFF0000) & ~(odd_warps ? 15 : 0)) | (odd_warps ? 8 : 0);
  int rc = choose(rows, n, k, bits, group, fields, sms, cfg);
  if (rc != DSX_OK) return rc;
  const int nsteps = k_steps(k, bits);
  // Splits and chunk automatic: where choose() would stage x in chunks, 8 splits (x whole here).
  if ((fields & 0xFFF0) == 0 && cfg->splits < kMaxSplits && cfg->chunk < (nsteps + cfg->splits - 1) / cfg->splits &&
      (nsteps + kMaxSplits - 1) / kMaxSplits >= 2) {
    rc = choose(rows, n, k, bits, group, fields | kMaxSplits << 4, sms, cfg);
    if (rc != DSX_OK) return rc;
  }
  cfg->bal = false, cfg->grid_y = 0;  // (choose's automatic balanced grid at <= 8 rows: not this kernel)
  cfg->ct = rows > 16 ? 1 : 1 << ((algo & kWsTilesBit) >> 29);  // (17..32 rows: one tile a warp; bits 29..30 below)
  if (odd_warps) {
    if (cfg->ct == 1) return DSX_EINVAL;  // (17..32 rows: one tile a warp)
    cfg->warps = odd_warps;
  }
  if (cfg->ct > 1) {
    const int64_t blocks_n = (n / 16 + cfg->ct * cfg->warps - 1) / (cfg->ct * cfg->warps);
    cfg->blocks_n = static_cast<int>(blocks_n);
  }
  const int tiles = cfg->ct * cfg->warps;
  cfg->stages = stages ? stages : 4;
  cfg->box = box ? box : 1;
  if (cfg->box > kMaxBox) return DSX_EINVAL;
  const int gmode = gmode_of(bits, group);
  const int per_split = (nsteps + cfg->splits - 1) / cfg->splits;
  // x is staged whole (one buffer, no chunk loop): an automatic chunk becomes the slice, a given
  // one must hold it; or, a given chunk equal to the ring's steps a slot (ws_xring_ok), x comes through
  // the ring: x's rows of each slot's steps in an x ring beside the weights' (no x slice staged; ws_xring_bytes).
  const bool auto_chunk = ((algo >> 8) & 255) == 0;
  if (auto_chunk) cfg->chunk = per_split;
  cfg->xring = cfg->chunk < per_split;
  if (cfg->xring && (cfg->chunk != cfg->box || !ws_xring_ok(rows, bits, cfg->ct))) return DSX_EINVAL;
  // (smem_bytes with `tiles` warps and no ring: x whole and the partial tile of 16 * tiles channels)
  // (XR: the x ring and the partial tile instead)
  const int64_t smem = ws_barrier_bytes(cfg->stages) + int64_t(cfg->stages) * ws_slot_bytes(gmode, cfg->box, tiles, cfg->ct) +
                       (cfg->xring ? ws_xring_bytes(cfg->stages, cfg->box) + int64_t(rows) * 16 * tiles * 4
                                         + (gmode == 0 ? 128 : 0)  // (the fold's sums of x and their barrier)
                                   : smem_bytes(rows, bits, gmode, tiles, 0, cfg->box, cfg->chunk, per_split));
  if (smem > kSmemPerBlock) return auto_chunk && (algo & 0xFF0000) == 0 ? kWsNoFit : DSX_EINVAL;
  cfg->smem = static_cast<int>(smem);
  cfg->fold = cfg->xring && gmode == 0 && ws_fold_pays(*cfg, sms);
  // 17..32 rows: the consumers multiply through wgmma (WG) or mma.sync; bits 29..30 (the tiles a warp up to 16 rows)
  // choose: 0 where it pays (ws_wgmma_pays), 1 wgmma (refused where it cannot run), 2 mma.sync. 33..64 rows (eight
  // token tiles): wgmma only (bits 29..30 = 1, checked above).
  const int consumers = rows > 16 ? (algo & kWsTilesBit) >> 29 : 2;
  if (consumers != 2) {
    const int64_t more = int64_t(((rows + 7) & ~7) - rows) * (int64_t(cfg->chunk) * (bits == 8 ? 64 : 128) + kXPadElems) * 2;
    Config w = *cfg;
    w.smem = static_cast<int>(smem + more), w.wg = true;
    const bool can = ws_wgmma(*cfg) && smem + more <= kSmemPerBlock;  // (x as the wgmma operand: whole token groups)
    if (consumers == 1 && !can) return DSX_EINVAL;
    if (can && (consumers == 1 || (ws_wgmma_pays(w, per_split, sms) && ws_blocks_per_sm(w) >= ws_blocks_per_sm(*cfg))))
      *cfg = w;
  }
  return DSX_OK;
}

// Automatic choice, 9..16 rows, every tuning field automatic (bits 24..26 may be set): int4 per
// channel (tenth session; two tiles a warp, and int4 group 128 and int8 per channel: below) takes
// the warp-specialized path with 2 slots of 2 steps (its split as ws_choose's: choose()'s,
// or 8 where choose() would stage x in chunks), if that fits; else choose()'s own configuration.
// Measured (H200, 2026-12-01, bench/gpu_gemm_weight_only.py --ab, interleaved in one run, us,
// HEAD's kernel built alone (--alt-lib) -> this rule; torch bf16 matmul in the same run):
// 36864 x 7168 M = 9 / 12 / 16 64.98 / 71.34 / 74.04 -> 62.17 / 66.84 / 68.93 (torch 138.7 /
// 139.1 / 140.1: 2.23x / 2.08x / 2.03x, was 2.14x / 1.95x / 1.89x); 7168 x 18432 41.25 / 43.79 /
// 46.89 -> 36.25 / 38.03 / 45.97 (at 16 rows x whole is 74 KB: one block an SM, hence the small
// gain there); 2048 x 7168 10.87 / 11.24 / 11.68 -> 10.60 / 11.07 / 11.55. The ring of 4 slots of
// 1 step (bit 28's own default) was slower than 2 x 2 everywhere (36864 x 7168 M = 16 72.81).
// Next run, all six DeepSeek-V3 shapes: the same within 1% on those three, and 3-5% faster on
// 7168 x 2048, 24576 x 1536 and 4096 x 7168 (docs/benchmarks.md, tenth session).
//
// Eleventh session: two tiles a warp (bit 29). Where the warp-specialized kernel with two tiles a
// warp still has a block for every SM (tile groups of 256 channels x splits >= SMs) and keeps at
// least as many 16-channel tiles resident on an SM as with one (blocks an SM by shared memory and
// launch bounds: 3 of one tile a warp, 2 of two; times 8 or 16 tiles), it takes two tiles a warp
// (8 warps, 256 channels a block, the same split and ring); else the rule above. For
// int4 per channel, int4 group 128 (which had no warp-specialized rule: it takes the kernel with one
// tile a warp where two lose) and int8 per channel (two tiles only: one tile a warp lost to the
// existing path on 7168 x 18432 M = 16, 65.21 against 58.54 us). Measured, H200, 2026-12-01,
// bench/gpu_gemm_weight_only.py --ab, interleaved in one run, us, auto before -> this rule:
// int4 per channel M = 16 / 12 / 9: 36864 x 7168 67.84 / 66.32 / 61.28 -> 62.83 / 61.39 / 54.54,
// 7168 x 18432 45.91 / 37.64 / 35.95 -> 36.14 / 35.23 / 34.32, 2048 x 7168 11.54 / 11.03 / 10.65 ->
// 10.52 / 10.19 / 10.07, 7168 x 2048 11.13 / 10.41 / 10.03 -> 10.06 / 9.49 / 9.21, 24576 x 1536
// 20.92 / 19.16 / 18.08 -> 19.05 / 17.63 / 16.80. With fewer blocks than SMs two tiles a warp won
// on 2048 x 7168 (64 blocks: 10.52 / 10.19 / 10.07) and 7168 x 2048 (112: 10.06 / 9.49 / 9.21) but
// lost on 4096 x 7168 (112 blocks: 19.86 / 15.97 / 15.59 against 15.18 / 14.05 / 13.38), and why
// is not known (blocks doubled up on SMs?), so none of the three takes it. int4 group 128,
// M = 16 / 9: 36864 x 7168 86.07 / 78.36 -> 71.28 (one tile: two would be one block an SM, 88.23) /
// 56.74; 7168 x 18432 52.57 / 47.87 -> 38.14 / 36.58. int8 per channel M = 16 / 9: 36864 x 7168
// 90.21 / 86.31 -> 84.49 / 82.03; 7168 x 18432 58.54 / 52.56 -> 49.45 / 47.80.
// Whether a launch pushes its cluster sum (the kernel's PUSH): the block's tiles divide by the split,
// the split is at least 4, and the two barriers fit. Fourteenth session (H200, 2026-12-01,
// bench/gpu_gemm_weight_only.py --ab, auto interleaved with HEAD's kernel built alone (--alt-lib) and
// torch, us, pulled -> pushed): 36864 x 7168 M = 1 / 8 / 9 / 12 / 16 45.59 / 49.22 / 54.66 / 61.66 /
// 63.37 -> 43.91 / 45.22 / 52.66 / 57.33 / 58.47 (torch 132-134: M = 8 2.71x -> 2.95x, M = 16 2.11x ->
// 2.29x); 2048 x 7168 M = 9 / 12 / 16 (8 splits, one tile a warp) 10.76 / 11.11 / 11.61 -> 10.24 /
// 10.56 / 10.96; 7168 x 2048 M = 9 / 12 / 16 (4 splits) 9.88 / 10.32 / 11.09 -> 9.54 / 9.96 / 10.77;
// 7168 x 18432 (8 splits, one tile group a block) M = 1 / 8 26.68 / 29.15 -> 26.77 / 28.70, M = 9 /
// 12 / 16 31.66 / 32.75 / 33.91 -> 31.38 / 32.43 / 33.30. The pulled sum's cost was its first cluster
// barrier (a .release arrive: a GPU-scope fence behind the group's global stores) and the latency of
// the remote loads, once a tile group; the pushed one has neither (st.async and the remote arrive
// compile to STAS / SYNCS.ARRIVE.TRANS64.RED with no MEMBAR). At 2 splits pushing lost where pulling
// is one cheap barrier of two blocks (24576 x 1536, four tiles a warp, M = 1 / 16 12.14 / 16.12
// pulled -> 12.43 / 16.79 pushed, one build with both) and won a little on 7168 x 2048 (M = 1 7.99 ->
// 7.66): not taken. The int4-per-channel instance with two token tiles and one tile a warp spilled 16
// bytes (3 reloads a step: at its 72-register cap the pulled one has none) and still won (2048 x 7168
// above). Fifteenth session: the owner applies the per-channel scales (the senders hold none; same
// bits): that spill 16 -> 4 bytes; H200, bench --ab, this vs the sender-scaled build, interleaved, one
// run, us: 36864 x 7168 M = 1 / 8 / 9 / 16 42.83 / 44.07 / 50.17 / 56.97 against 43.09 / 45.00 / 50.35
// / 57.32, 7168 x 18432 M = 1 / 16 24.00 / 32.11 against 23.85 / 32.46, 2048 x 7168 M = 9 / 16 10.06 /
// 10.56 against 9.94 / 10.44, 7168 x 2048 within 0.7%: neutral, kept for the lighter senders.
constexpr int kWsPushMinSplits = 4;
bool ws_push(const Config& c) {
  return c.splits >= kWsPushMinSplits && (c.ct * c.warps) % c.splits == 0 &&
         ws_spare_barriers(c.stages) >= 2;  // (its two barriers in the padding)
}

// Blocks of the warp-specialized kernel one SM holds by its registers (ptxas, no spills: one token
// tile (MT 1) 60-68 / 72 / 77-91 registers a thread with 1 / 2 / 4 tiles a warp; two token tiles
// (MT 2) 60-96 / 93-95 / 117-138) and by shared memory.
int ws_blocks_per_sm(const Config& c) {
  const int by_regs = c.mt == 1 ? (c.ct == 4 ? 2 : 3) : (c.ct == 1 ? (c.mt == 8 ? 2 : 3) : c.ct == 2 ? 2 : 1);
  return std::min(by_regs, kSmemPerSm / (c.smem + kSmemReserved));
}
int ws_resident_tiles(const Config& c) { return c.ct * c.warps * ws_blocks_per_sm(c); }

// Eleventh session, second round: up to 8 rows (int4 per channel only) and four tiles a warp. Up to 8 rows the
// same two-tile rule as above (its grid has a block for every SM, at least as many tiles resident);
// where it does not hold, one tile a warp (2 x 2 ring) where choose() would not take the balanced
// grid (the plain grid runs in one round), else choose()'s own choice (the balanced grid included).
// Before both, int4 per channel, 1..16 rows: four tiles a warp (8 warps, 2 slots of 1 step) where
// that grid runs in one round (at most the blocks the SMs hold at once), has a block for at least
// 2/3 of the SMs, and keeps at least as many tiles resident on an SM as two tiles a warp. Measured,
// H200, 2026-12-01, bench/gpu_gemm_weight_only.py --ab, interleaved in one run, us, auto before /
// two tiles (2 x 2) / four tiles (2 x 1) / one tile (2 x 2):
// M = 1, 4, 8: 36864 x 7168 47.29 / 45.08 / 49.24 / 47.94, 51.69 / 47.92 / 51.96 / 50.63, 53.56 /
// 50.41 / 55.03 / 54.66 (torch 141-142: 2.99x -> 3.13x at M = 1); 7168 x 18432 27.37 / 25.18 / 25.81
// / 26.78, 31.61 / 26.58 / 27.01 / 28.94, 31.14 / 28.38 / 28.03 / 32.28; 24576 x 1536 13.22 / 12.99 /
// 11.79 / 13.08, 15.10 / 13.97 / 12.99 / 14.11, 16.40 / 14.88 / 14.48 / 15.69; one tile (two tiles'
// grids have fewer blocks than SMs there): 4096 x 7168 10.58 -> 10.24, 11.30 -> 10.71, 12.48 ->
// 11.82; 2048 x 7168 7.74 -> 7.50, 8.56 -> 8.26, 9.54 -> 9.24; 7168 x 2048 7.91 -> 7.85, 8.50 -> 8.32,
// 9.35 -> 9.20. M = 9, 12, 16 (auto: two tiles there), four tiles: 7168 x 18432 34.79 / 35.34 / 36.42
// -> 30.94 / 31.66 / 32.87, 24576 x 1536 16.96 / 17.81 / 19.32 -> 15.96 / 17.07 / 18.62 (the
// eleventh session's two calls: the same); it lost on the other four shapes (36864 x 7168: 288 or
// 576 blocks, more than one round; 4096 x 7168, 2048 x 7168, 7168 x 2048: 28-56 blocks).
// Next run, this rule against HEAD's kernel built alone (--alt-lib), same run, M = 1 / 4 / 8 (/ 9 /
// 12 / 16 where four tiles): 36864 x 7168 47.47 / 52.10 / 52.92 -> 45.90 / 48.27 / 50.69 (torch 141:
// 3.08x at M = 1); 7168 x 18432 28.49 / 31.87 / 31.73 (/ 35.55 / 36.01 / 37.26) -> 26.72 / 27.89 /
// 29.16 (/ 32.11 / 32.76 / 33.80; two tiles were 1.5-2.3% faster than four at M = 1, 4 in both
// runs, four 1% faster at M = 8); 24576 x 1536 13.48 / 15.36 / 16.69 (/ 17.17 / 18.01 / 19.58) ->
// 12.03 / 13.28 / 14.77 (/ 16.18 / 17.36 / 18.86); 4096 x 7168 10.75 / 11.48 / 12.69 -> 10.47 /
// 10.90 / 12.07; 2048 x 7168 7.73 / 8.57 / 9.55 -> 7.52 / 8.26 / 9.26; 7168 x 2048 7.94 / 8.53 / 9.35
// -> 7.90 / 8.32 / 9.23; the rows it leaves alone within 0.9%.
// The rules in the order they are tried (int4 per channel, int4 group 128, int8 with any scales; each
// comment below has its measurements): (1) four tiles a warp (int4 per channel) where that grid runs in one
// round on at least 2/3 of the SMs; (2) two tiles a warp where that grid gives every SM a block, refined at
// 2..8 rows to four tiles at twice the split (int4 per channel, more than one round) or to half the split
// where the slices keep <= 4 steps (int8, int4 group 128); (3) two tiles a warp at 8 splits where one tile
// at 8 splits leaves SMs idle (group scales at 2..16 rows, int4 per channel at 9..16); (4) the existing path
// at <= 8 rows except int4 per channel; (5) int8 one tile a warp at 8 splits; (6) int4 per channel one tile
// a warp (twice the split where SMs idle, one-step slots for slices of <= 4 steps); (7) one tile a warp at
// choose()'s split.
// An automatic launch: every tuning field 0 (bits 24..26, launch options, may be set), not bits 27..30.
bool ws_automatic(int algo) { return (algo & 0xFFFFFF) == 0 && (algo & (1 << 27 | kWsAlgoBit | kWsTilesBit)) == 0; }

// The layouts the automatic rules take to this kernel: every one. int8's groups of 128 and 64 take int8 per channel's
// rules (sixteenth session); int4 group 64 takes group 128's since the forty-second (its step runs several tiles a warp
// since then; before, one tile a warp, and the rules left it on the existing path).
bool ws_auto_layout(int bits, int group) {
  return bits == 8 || (bits == 4 && (group == -1 || group == 128 || group == 64));
}

bool ws_auto_rule(int rows, int64_t n, int64_t k, int bits, int group, int algo, int sms, Config* cfg) {
  if (rows > kWsMaxRows || !ws_automatic(algo) || !ws_auto_layout(bits, group)) return false;
  const bool int4pc = bits == 4 && group == -1, int4g = bits == 4 && group != -1, int8 = bits == 8;  // (int4g: 128, 64)
  const int ring = algo | kWsAlgoBit | 2 << 16 | 2 << 20;
  // Twenty-second session: 17..32 rows (four token tiles, one channel tile a warp), choose()'s split, x
  // whole, 2 slots of 2 steps, wherever that fits. Before, the existing path (its MT = 4 kernel, x in chunks
  // where the slice did not fit 48 KB). H200, bench/tune_auto.py --ms 17,20,24,28,32 --rows-from 17, every
  // tp shape of DeepSeek-V3 and the four tuned layouts (640 rows, interleaved in one process): faster than
  // the existing path on every one, 1.04-3.1x, geometric mean 1.41x, and within 2.4% (geometric mean) of
  // the best of 14 words there; e.g. int4 per channel 36864 x 7168 M = 32 105.5 -> 88.3 us (torch 143.5),
  // int4 group 128 the same 227.0 -> 89.7, 7168 x 18432 111.2 -> 57.6. (Words faster still: the table.)
  if (rows > 16) {
    Config c;
    if (ws_choose(rows, n, k, bits, group, ring, sms, &c) != DSX_OK) return false;
    *cfg = c;
    return true;
  }
  const int64_t steps = k / (bits == 8 ? 64 : 128);  // whole steps of K (the slice-length thresholds below)
  Config one, two, four;
  const bool ok1 = ws_choose(rows, n, k, bits, group, ring, sms, &one) == DSX_OK;
  const bool ok2 = ws_choose(rows, n, k, bits, group, ring | 1 << 29, sms, &two) == DSX_OK;
  const bool ok4 = int4pc && ws_choose(rows, n, k, bits, group, algo | kWsAlgoBit | 2 << 16 | 1 << 20 | 2 << 29, sms,
                                       &four) == DSX_OK;
  if (ok4 && ok2) {
    const int64_t blocks4 = int64_t(four.blocks_n) * four.splits;
    // Fourteenth session: up to 6 rows, where four tiles leave SMs without a block and two tiles at a
    // pushed split (ws_push) give every SM one, two tiles. H200, bench --ab, interleaved, one run, us,
    // 7168 x 18432 (four: 112 blocks; two: 224 at 8 splits) M = 1 / 2 / 3 / 4 / 6 / 8 / 9, four -> two:
    // 26.50 / 26.48 / 26.99 / 27.15 / 27.87 / 28.25 / 30.58 -> 24.57 / 25.39 / 25.83 / 26.28 / 27.54 /
    // 28.43 / 33.06. (24576 x 1536, two tiles at 2 splits, pulled: four stayed faster, 11.79 against
    // 13.28 at M = 1.)
    const bool two_fills = rows <= 6 && blocks4 < sms && int64_t(two.blocks_n) * two.splits >= sms && ws_push(two);
    if (!two_fills && blocks4 <= int64_t(ws_blocks_per_sm(four)) * sms && 3 * blocks4 >= 2 * int64_t(sms) &&
        ws_resident_tiles(four) >= ws_resident_tiles(two)) {
      *cfg = four;
      return true;
    }
  }
  if (ok2 && int64_t(two.blocks_n) * two.splits >= sms && (!ok1 || ws_resident_tiles(two) >= ws_resident_tiles(one))) {
    // Twelfth session: at 2..8 rows, four tiles a warp at twice that split instead (2 slots of 1
    // step; the same number of blocks, each with twice the channels and half the K slice, one x
    // fragment load feeding four tiles' mma), where the two-tile grid takes more than one round of
    // resident blocks (persistent blocks looping over tile groups) and twice the split is at most 8,
    // leaves slices of at least 4 steps and keeps at least as many tiles resident (one-round grids:
    // not measured, left alone). Measured (H200, 36864 x 7168, the only DeepSeek-V3 shape the two-tile
    // rule takes at <= 8 rows; bench/gpu_gemm_weight_only.py --ab, interleaved, us, two tiles at 4
    // splits -> four at 8): M = 2 / 3 / 4 / 5 / 6 / 7 / 8 45.95 / 46.38 / 47.66 / 48.42 / 49.08 / 49.86
    // / 50.58 -> 44.88 / 45.06 / 45.22 / 47.18 / 47.92 / 48.57 / 49.23; M = 4 / 8 in two more calls
    // 47.98 / 50.76 -> 45.38 / 49.07 and 47.27 / 49.64 -> 44.91 / 48.50; at M = 1 a tie (45.75 / 44.66
    // / 45.69 -> 45.29 / 44.72 / 45.33), not taken. (At 9..16 rows four tiles at 8 splits run one
    // block an SM: 63.7-66.2 against 55.4-64.5, not taken.)
    const int sp4 = 2 * two.splits;
    const int nsteps = k_steps(k, 4);
    Config four2;
    const int64_t blocks2 = int64_t(two.blocks_n) * two.splits;
    if (int4pc && rows >= 2 && rows <= 8 && blocks2 > int64_t(ws_blocks_per_sm(two)) * sms && sp4 <= kMaxSplits &&
        nsteps / sp4 >= 4 &&
        ws_choose(rows, n, k, bits, group, algo | kWsAlgoBit | sp4 << 4 | 2 << 16 | 1 << 20 | 2 << 29, sms, &four2) ==
            DSX_OK &&
        ws_resident_tiles(four2) >= ws_resident_tiles(two)) {
      *cfg = four2;
      return true;
    }
    // Sixteenth session: int8 up to 8 rows where the two-tile slices keep at most 4 steps (7168 x 2048 at
    // 8 splits): half the split, the same blocks of 128 channels (twice the K slice) where that grid still
    // gives every SM a block: two tiles a warp and 4 warps with group scales, and per channel up to 4
    // rows; else (per channel at 5..8 rows) one tile a warp and 8 warps. H200, bench --ab, interleaved,
    // us, 7168 x 2048, auto before (two tiles, 8 warps, 8 splits) -> half the split; per channel,
    // one tile 8 warps (build A/B) M = 1 / 2 / 4 / 6 / 8 8.77 / 8.84 / 8.84 / 8.86 / 8.92 -> 8.42 / 8.46 /
    // 8.43 / 8.44 / 8.56 (torch 10.7-10.9); two tiles 4 warps (forced, two runs) M = 1 / 2 / 4 8.28 / 8.23,
    // 8.31 / 8.23, 8.25 / 8.20 but M = 6 / 8 9.15 / 9.54 and 9.59 at 8 in a third; group 128 two tiles 4
    // warps (three runs) M = 1 8.23 / 8.26 / 8.19, M = 4 8.07 / 8.30 / 8.30, M = 8 8.49 / 8.69 / 8.56 against
    // 8.80-8.96, 8.83-9.00, 8.94-9.12 (one tile 8 warps: 8.70 / 8.78 / 8.82); group 64 M = 1 / 8 8.26 / 8.63
    // against 8.84 / 9.05. Int4 group 128 too (7168 x 2048: 8 splits of 2 steps; two tiles 4 warps at 4
    // splits, forced, two passes, M = 1 / 8 7.01 / 7.28 and 6.95 / 7.34 against 7.73 / 7.85 and 7.73 / 7.89;
    // build A/B M = 1 / 4 / 8 7.80 / 7.79 / 7.95 -> 7.06 / 7.13 / 7.43, torch 10.9-11.2).
    Config half;
    const bool half_two = group != -1 || rows <= 4;
    if ((int8 || int4g) && rows <= 8 && two.chunk <= 4 && two.splits >= 2 &&
        ws_choose(rows, n, k, bits, group, ring | (half_two ? 1 << 29 | 4 : 8) | (two.splits / 2) << 4, sms, &half) ==
            DSX_OK &&
        int64_t(half.blocks_n) * half.splits >= sms) {
      *cfg = half;
      return true;
    }
    *cfg = two;
    return true;
  }
  // Fourteenth session: int4 group 128 and int8 per channel up to 8 rows take the warp-specialized
  // kernel only through the two-tile rule just above (its grid a block for every SM); before, they
  // never took it up to 8 rows. H200, bench --ab --ab-layout, interleaved, one run, us, auto before ->
  // two tiles at the rule's split (M = 1 / 4 / 8): int4 g128 36864 x 7168 60.13 / 65.36 / 67.77 -> 43.80
  // / 45.98 / 46.39 (4 splits; torch 141-142: 3.05x at M = 8), 7168 x 18432 33.88 / 38.22 / 43.32 ->
  // 25.92 / 26.69 / 29.22 (8 splits); int8 36864 x 7168 80.02 / 80.50 / 82.25 -> 72.03 / 71.54 / 71.94,
  // 7168 x 18432 42.62 / 49.60 / 50.60 -> 39.56 / 39.99 / 41.70. The rule keeps choose()'s warps: 4 on
  // 4096 x 7168 (224 blocks of 128 channels at 7 splits), where the next run gave int4 g128 11.88 /
  // 13.73 / 16.56 -> 9.53 / 9.76 / 11.07 and int8 13.96 / 16.27 / 18.66 -> 12.83 / 13.71 / 14.43; on
  // 2048 x 7168 (fewer blocks than SMs) the rule does not fire (two tiles at 8 splits, forced, won at
  // M = 4 and 8 and lost or tied at M = 1; left alone).
  // Sixteenth session: int8 with group scales and int4 group 128 at 2..16 rows where the rules above did
  // not fire and one tile a warp at 8 warps and 8 splits leaves SMs without a block (2048 x 7168 of the
  // DeepSeek-V3 shapes): two tiles a warp, 8 warps, at 8 splits, where the slices keep at least 4 steps;
  // before, the kernel without bit 28 up to 8 rows, one tile a warp above. H200, bench --ab --ab-layout,
  // interleaved with the build before, one run each, us, before -> after (torch 12.5-13.6): int8 group 128
  // M = 2 / 4 / 8 11.06 / 11.48 / 12.56 -> 10.27 / 10.28 / 10.42, M = 9 / 12 / 16 12.20 / 12.76 / 13.21 ->
  // 11.26 / 11.68 / 12.26; group 64 M = 2 / 8 / 9 / 16 11.11 / 12.90 / 12.22 / 13.19 -> 10.41 / 10.62 / 11.25 /
  // 12.26; int4 group 128 M = 2 / 4 / 8 8.62 / 9.17 / 10.19 -> 8.49 / 8.55 / 8.46, M = 9 / 12 / 16 9.69 /
  // 10.25 / 10.60 -> 9.20 / 9.97 / 10.27. Left alone: int8 per channel (M = 2 10.05 -> 10.41 forced, M = 8
  // 11.50 -> 10.89; at 9..16 1-2%), one row (int8 group 128 10.64 -> 10.30 forced, int4 group 128 8.24 ->
  // 8.43), and 4 warps for int4 group 128 (M = 2 / 4 / 8 8.13 / 8.22 / 9.10 forced). Int4 per channel at
  // 9..16 rows too (before, one tile a warp): M = 9 / 12 / 16 10.02 / 10.16 / 10.53 -> 9.71 / 9.85 / 10.27.
  if (((int8 && group != -1) || int4g || (int4pc && rows > 8)) && rows >= 2) {
    Config one8, two8;
    if (steps / kMaxSplits >= 4 &&
        ws_choose(rows, n, k, bits, group, ring | kMaxSplits << 4 | 8, sms, &one8) == DSX_OK &&
        int64_t(one8.blocks_n) * one8.splits <= sms &&
        ws_choose(rows, n, k, bits, group, ring | 1 << 29 | kMaxSplits << 4 | 8, sms, &two8) == DSX_OK) {
      *cfg = two8;
      return true;
    }
  }
  if (rows <= 8 && !int4pc) return false;
  if (ok1 && rows <= 8) {
    Config plain;
    if (choose(rows, n, k, bits, group, algo, sms, &plain) != DSX_OK || plain.bal) return false;
  }
  // Fifteenth session: int8 per channel (here always 9..16 rows) where two tiles a warp do not fill the SMs (the
  // two-tile rule above did not fire): one tile a warp (2 x 2 ring) at 8 splits where the slices keep at
  // least 4 steps, else at choose()'s split; before, the kernel without bit 28, slower than torch's bf16
  // matmul on 7168 x 2048 and 2048 x 7168. H200, bench --ab --ab-layout 8,-1, interleaved, one run, us,
  // auto before / one tile at 8 splits / at choose()'s split (M = 9 / 12 / 16): 7168 x 2048 12.09 / 12.37
  // / 13.41 -> 9.50 / 9.59 / 9.87 (4 splits: 9.58 / 9.82 / 10.30; torch 11.1: 0.83x -> 1.12x at M = 16);
  // 2048 x 7168 13.02 / 13.36 / 13.86 -> 11.40 / 11.62 / 11.94 (torch 13.5); 4096 x 7168 18.92 / 19.60 /
  // 20.69 -> 15.84 / 16.21 / 16.66 (torch 20.4-21.7). (One tile a warp lost to the existing path where
  // two tiles fill the SMs: 7168 x 18432 M = 16, above.)
  // Sixteenth session: int8 groups of 128 and 64 take these int8 rules too (the two-tile rule where it fills
  // the SMs, at any rows up to 16; else this one at 9..16 rows); before, they never took bit 28's kernel and
  // were slower than torch at 9..16 rows on every DeepSeek-V3 shape but 36864 x 7168. H200, bench --ab
  // --ab-layout 8,128 / 8,64, interleaved with the build before, one run, us, before -> after (M = 1 / 8 / 9 /
  // 16), group 128: 36864 x 7168 95.17 / 98.70 / 119.39 / 123.60 -> 74.53 / 74.37 / 77.04 / 86.10 (torch 140-142;
  // at M = 16 one tile a warp: two tiles at 8 splits 91.49); 7168 x 18432 48.19 / 58.05 / 70.05 / 74.43 ->
  // 40.96 / 43.38 / 48.53 / 50.70 (torch 73-76); 4096 x 7168 15.95 / 21.01 / 22.64 / 24.54 -> 13.08 / 14.61 /
  // 16.72 / 18.26 (torch 21-22); 7168 x 2048 11.14 / 12.30 / 13.20 / 14.04 -> 9.00 / 9.07 / 9.84 / 10.07 (torch
  // 11.2-11.4); 24576 x 1536 17.98 / 22.66 / 25.32 / 27.85 -> 15.71 / 16.61 / 18.16 / 19.80 (torch 23.7-24.9);
  // 2048 x 7168 at 9 / 16 15.83 / 16.68 -> 12.27 / 13.23 (torch 13.6-13.9; at <= 8 rows unchanged). Group 64
  // within 2% of group 128 on every point (36864 x 7168 94.11 / 99.33 / 119.39 / 122.35 -> 74.90 / 74.43 / 76.30
  // / 84.46).
  Config one8;
  if (int8 && steps / kMaxSplits >= 4 &&
      ws_choose(rows, n, k, bits, group, ring | kMaxSplits << 4, sms, &one8) == DSX_OK) {
    *cfg = one8;
    return true;
  }
  // Sixteenth session: int4 per channel, one tile a warp: where its grid leaves SMs without a block (up to
  // 8 rows; 7168 x 2048 at 2 splits, 112 blocks), twice the split if the slices keep at least 4 steps;
  // then, with slices of at most 4 steps, slots of one step (2 x 1 ring; before, 2 x 2: the slice in one
  // fill). H200, bench --ab, us, 7168 x 2048: M = 9 / 12 / 16 (4 splits) 8.85 / 9.09 / 9.37 -> 8.33 / 8.59
  // / 8.79 (build A/B; torch 11.2; the session before, two tiles with one-step slots, forced, 8.24 / - /
  // 8.69 against 8.80 / - / 9.37); M = 1 / 4 / 8 (2 -> 4 splits, one-step slots; forced, two passes)
  // 7.52 / 7.54 / 8.18 and 7.46 / 7.53 / 8.21 -> 7.14 / 7.09 / 7.38 and 7.09 / 7.08 / 7.36 (2-step slots:
  // 7.16 / 7.15 / 7.52; torch 10.6-10.9); build A/B 7.54 / 7.63 / 8.29 -> 7.22 / 7.21 / 7.47.
  if (ok1 && int4pc) {
    Config adj = one, c;
    if (int64_t(one.blocks_n) * one.splits < sms && 2 * one.splits <= kMaxSplits && steps / (2 * one.splits) >= 4 &&
        ws_choose(rows, n, k, bits, group, ring | 2 * one.splits << 4 | one.warps, sms, &c) == DSX_OK)
      adj = c;
    if (adj.chunk <= 4 && ws_choose(rows, n, k, bits, group,
                                    algo | kWsAlgoBit | 2 << 16 | 1 << 20 | adj.splits << 4 | adj.warps, sms, &c) == DSX_OK)
      adj = c;
    *cfg = adj;
    return true;
  }
  if (ok1) *cfg = one;
  return ok1;
}

// Seventeenth session: the rules above were tuned on six DeepSeek-V3 shapes; a tensor-parallel rank
// multiplies by others (N or K divided by tp), where they chose up to 29% slower configurations than
// the best of a few explicit words (H200, bench/tune_auto.py's sweep: 18432 x 7168 int4 per channel M = 1
// auto 32.17 us, one tile a warp at 4 splits 25.00). So the automatic choice first looks the launch up
// in a table measured by bench/tune_auto.py (every weight GEMM shape of DeepSeek-V3 at tp 1, 2, 4, 8;
// each word confirmed faster than the rules at both ends of its row range, interleaved in one process),
// in the table of the card the launch runs on (tuned_card.cuh; unless DSX_TUNED_TABLES=0: tuned_tables.cuh);
// on other cards, and for every launch it does not list, the rules decide. Rows 1..16 measured at every row
// (twenty-second session), 17..32 at 17, 20, 24, 28, 32 against the four-token-tile rule (twenty-third:
// e.g. int4 per channel 24576 x 1536 M = 17 / 32 25.18 / 27.34 -> 17.77 / 19.63 us, torch 22.0-22.4). Rows
// 33..64 may be listed since the forty-fifth session (plan_launch consults the table for one launch of all of them).
struct WsTuned {
  int bits, group;
  int64_t n, k;
  int rows_lo, rows_hi, word;
  constexpr std::tuple<int, int, int64_t, int64_t> key() const { return {bits, group, n, k}; }
  constexpr int lo() const { return rows_lo; }
  constexpr int hi() const { return rows_hi; }
};
constexpr WsTuned kWsTuned[] = {
#include "gemm_weight_only_tuned.inc"
    {0, 0, 0, 0, 0, 0, 0},  // (end)
};
// The H100 SXM's: the H200's table re-swept on an H100 (bench/wo_retune.sh CARD=h100) for int4 group 64 at rows 1..8
// (fifty-second session: 79 rows changed, -3.3% summed there; on an H200 the same words were +3.3%), then int4 per
// channel, group 128 and group 64 and int8 per channel at rows 1..16 (fifty-ninth: 300 rows, -3.1% summed in their
// A/Bs), int8 group 128 at rows 1..16 (sixtieth: 96 rows, -1.2%) and int4 per channel, group 128 and group 64 at
// rows 17..32 (sixtieth: 237 rows, -4.2 to -4.7% a layout), int4 at rows 33..64 and int8 at rows 17..64
// (sixty-first: 216 rows, -4.0% summed; int8 group 128 at 33..64 kept the H200's words, which its A/B timed faster):
// every band of every layout swept on an H100. tuned_card.cuh's cards.
constexpr WsTuned kWsTunedH100[] = {
#include "gemm_weight_only_tuned_h100.inc"
    {0, 0, 0, 0, 0, 0, 0},  // (end)
};
constexpr size_t kWsTunedLen = sizeof(kWsTuned) / sizeof(kWsTuned[0]) - 1;  // (without the end)
constexpr size_t kWsTunedH100Len = sizeof(kWsTunedH100) / sizeof(kWsTunedH100[0]) - 1;
static_assert(dsx_cuda::tuned_sorted(kWsTuned, kWsTunedLen),
              "gemm_weight_only_tuned.inc must be sorted by (bits, group, N, K, first row), each range of rows "
              "non-empty and apart from the next of its key: write it with bench/tune_auto.py --emit");
static_assert(dsx_cuda::tuned_sorted(kWsTunedH100, kWsTunedH100Len),
              "gemm_weight_only_tuned_h100.inc must be sorted by (bits, group, N, K, first row), each range of rows "
              "non-empty and apart from the next of its key: write it with bench/tune_auto.py --emit --card h100");
constexpr int kWsTunedSms = 132;  // the SM count of the tables' cards (tuned_card.cuh: H200, H100 SXM)

// The table's word for this launch, or 0 (a binary search: tuned_tables.cuh), from the table of the card the
// launch runs on (none on a card of another SM count).
int ws_tuned_word(int rows, int64_t n, int64_t k, int bits, int group, int sms) {
  if (!dsx_cuda::tuned_tables_on()) return 0;
  const int card = dsx_cuda::tuned_card(sms);
  if (card != dsx_cuda::kCardH200 && card != dsx_cuda::kCardH100) return 0;
  const bool h100 = card == dsx_cuda::kCardH100;
  const WsTuned* t = dsx_cuda::tuned_find(h100 ? kWsTunedH100 : kWsTuned, h100 ? kWsTunedH100Len : kWsTunedLen,
                                          std::make_tuple(bits, group, n, k), rows);
  return t ? t->word : 0;
}

// The configuration of one launch of `rows` rows, and whether it takes the warp-specialized
// path: bit 28 up to kWsMaxRows rows, unless x staged whole does not fit with every ring field and the
// chunk automatic (then, as above 16 rows, the existing path with its own automatic ring); or
// the measured table (kWsTuned), then the automatic rule above.
int ws_resolve(int rows, int64_t n, int64_t k, int bits, int group, int algo, int sms, Config* cfg, bool* ws) {
  *ws = false;
  if ((algo & kWsAlgoBit) && (algo & (1 << 27))) return DSX_EINVAL;  // (bit 27's grid is another kernel)
  // (bits 24..26, launch options, are kept; a table word has tuning fields: no second lookup)
  if (ws_automatic(algo))
    if (const int word = ws_tuned_word(rows, n, k, bits, group, sms)) {
      if (ws_resolve(rows, n, k, bits, group, word | algo, sms, cfg, ws) == DSX_OK) return DSX_OK;
      *ws = false;  // (a word that does not fit this launch: the rules; tests/gpu check every entry fits)
    }
  // Bits 29..30 only with bit 28, and not 3.
  if ((algo & kWsTilesBit) && (!(algo & kWsAlgoBit) || (algo & kWsTilesBit) == kWsTilesBit)) return DSX_EINVAL;
  if ((*ws = ws_auto_rule(rows, n, k, bits, group, algo, sms, cfg))) return DSX_OK;
  *ws = (algo & kWsAlgoBit) && (rows <= kWsMaxRows || (rows <= kWsWideRows && (algo & kWsTilesBit) == kWsWgmma));
  if (*ws) {
    const int rc = ws_choose(rows, n, k, bits, group, algo, sms, cfg);
    if (rc != kWsNoFit) return rc;
    *ws = false;
  }
  return choose(rows, n, k, bits, group, algo & ~(kWsAlgoBit | kWsTilesBit | ((algo & kWsAlgoBit) ? 0xFF0000 : 0)), sms,
                cfg);
}

// Whether the two launches a cut of 33..64 rows makes (kWsMaxRows rows, then the rest) run side by side as
// one grid of two parts (the rest with the first launch's configuration: its rows the bits of that split):
// where both parts' blocks are resident at once (a launch of four token tiles holds 2 blocks an SM by its
// launch bounds), so that the second launch's latency overlaps the first instead of following it. The
// weights are read by both parts, as by the two launches. The kernel's PARTS instances (four token tiles)
// take the part's rows; the others compile as before (the same PTX). Measured (twenty-third session, H200,
// bench/wo_ab.sh, int4 per channel, interleaved with main's build, us two launches -> two parts, M = 33 /
// 48 / 64): 7168 x 256 10.20 / 10.98 / 11.01 -> 6.44 / 6.62 / 6.96 (torch 4.3-4.7); 3072 x 1536 12.45 / 13.40 /
// 14.26 -> 8.52 / 8.97 / 9.83 (6.2-6.3); 1536 x 7168 18.27 / 19.58 / 22.32 -> 13.76 / 14.52 / 15.99 (11.8-12.0);
// 2048 x 7168 21.84 / 24.56 / 29.53 -> 20.51 / 21.26 / 23.31 (13.8-14.2). (4096 x 512, 7168 x 2304, 7168 x 2048:
// more blocks than one wave holds, two launches as before.)
bool ws_parts_fit(const Config& c, int sms) {
  const int per_sm = std::min(2, kSmemPerSm / (c.smem + kSmemReserved));
  return c.mt == 4 && c.ct == 1 && 2 * int64_t(c.blocks_n) * c.splits <= int64_t(per_sm) * sms;
}

// Automatic, 33..64 rows: one launch of eight token tiles (wgmma consumers, x for all the rows staged whole; the
// layouts of ws_auto_rule) where that fits, with 2 slots of 2 steps, or (per channel) of 1 step where only that holds
// two blocks an SM (x for up to 40 rows of a 7-step slice). plan_launch keeps the two grid parts where they fit
// instead. Measured (thirty-third session, H200, bench/wo_ab.sh, int4 per channel, 3 rounds interleaved with main's
// build, us, main's cut at 32 rows -> one launch): 36864 x 7168 M = 33 / 40 / 48 / 64 121.44 / 120.88 / 124.96 / 159.41 -> 118.02 / 118.69 /
// 122.72 / 130.96 (torch 137.5-142.3: 0.86x -> 1.05x at 64); at M = 40 with 2 slots of 1 step (two blocks an SM)
// 104.70 (9216 x 7168: 35.97 -> 34.26), at 64 that ring lost (144.83: one block an SM still). 18432 x 7168 M = 33 / 64
// 68.94 / 89.60 -> 63.38 / 71.39; 9216 x 7168 41.44 / 55.19 -> 35.21 / 41.66; 7168 x 9216 44.69 / 59.82 -> 35.43 /
// 42.06; 7168 x 2048 18.13 / 22.17 -> 14.29 / 17.72; 4096 x 7168 29.07 / 39.12 -> 23.77 / 28.92; 7168 x 2304 21.25 /
// 26.34 -> 16.91 / 21.72; 4096 x 512 10.98 / 11.69 -> 7.82 / 9.45; int4 group 128 36864 x 7168 M = 64 168.40 -> 136.06;
// int8 per channel 208.91 -> 166.90. But where main ran two grid parts side by side: 7168 x 256 6.45 / 6.59 / 6.99 ->
// 7.76 / 8.93 / 10.28 at M = 33 / 48 / 64, 3072 x 1536 8.56 / 8.99 / 9.90 -> 8.53 / 9.62 / 11.84, 1536 x 7168 13.65 /
// 14.38 / 15.94 -> 12.77 / 14.77 / 17.21. And 24576 x 1536 (2-step slices) 29.99 / 31.33 / 33.15 / 38.86 -> 30.96 /
// 31.11 / 32.94 / 37.78 (noticed, left: 3% slower at 33 rows).
// The slots of 1 step per channel only (forty-third session, H200, bench/wo_ab.sh, 3 rounds, the words w0s0d2b1 /
// w0s0d2b2 with bits 28..29, us at M = 33 / 40): with group scales the 1-step ring lost everywhere it was taken (a scale
// row copy a step in a ring of two steps): int4 group 128 36864 x 7168 145.7 / 146.7 against 122.5 / 121.8, 18432 x 7168
// 76.8 / 77.8 against 65.1 / 65.9, 9216 x 7168 42.0 / 43.1 against 36.2 / 37.2; int4 group 64 148.4 / 148.2 against
// 128.9 / 128.4; int8 group 128 220.0 / 220.7 against 168.1 / 168.6. Per channel it still won (int4 36864 x 7168
// 103.1 / 105.9 against 117.4 / 119.7, int8 137.4 / 139.1 against 152.5 / 153.2), except on 4096 x 7168 (one round of
// blocks: int4 24.53 / 26.07 against 24.12 / 24.98, int8 30.3 / 31.7 against 29.3 / 30.1; noticed, left).
bool ws_wide_rule(int rows, int64_t n, int64_t k, int bits, int group, int algo, int sms, Config* cfg) {
  if (rows <= kWsMaxRows || rows > kWsWideRows || !ws_automatic(algo) || !ws_auto_layout(bits, group)) return false;
  const int word = algo | kWsAlgoBit | kWsWgmma | 2 << 16;
  Config c, one;
  if (ws_choose(rows, n, k, bits, group, word | 2 << 20, sms, &c) != DSX_OK || !c.wg) return false;
  if (group == -1 && ws_blocks_per_sm(c) < 2 && ws_choose(rows, n, k, bits, group, word | 1 << 20, sms, &one) == DSX_OK &&
      one.wg && ws_blocks_per_sm(one) >= 2)
    c = one;
  *cfg = c;
  return true;
}

// The next launch when `left` rows remain: its rows, configuration and path. Up to kMaxRows rows, but an
// automatic launch of more than kWsMaxRows rows is cut at kWsMaxRows where that takes the warp-specialized
// path (two launches of it beat one of the existing path's eight token tiles: 36864 x 7168 int4 per channel,
// M = 32 88.3 us on it against 198.6 for M = 64 on the existing path; weights are read again by the second
// launch), unless one launch of all of them with eight token tiles runs (ws_wide_rule; not where the cut's two launches
// run side by side as two grid parts). Each launch's configuration is resolved once.
// The measured table comes first at 33..64 rows too (forty-fifth session): an entry there is a word of eight token tiles
// through wgmma (bits 28..29) for one launch of all the rows, confirmed by bench/tune_auto.py against whatever the rules
// below do (the cut, the two grid parts or the one launch); a word that does not fit leaves it to the rules.
int plan_launch(int64_t left, int64_t n, int64_t k, int bits, int group, int algo, int sms, int* rows, Config* cfg,
                bool* ws) {
  const int all = static_cast<int>(std::min<int64_t>(std::max<int64_t>(left, 1), kMaxRows));
  if (all > kWsMaxRows && all <= kWsWideRows && ws_automatic(algo))
    if (const int word = ws_tuned_word(all, n, k, bits, group, sms)) {
      if (ws_resolve(all, n, k, bits, group, word | algo, sms, cfg, ws) == DSX_OK && *ws) {
        *rows = all;
        return DSX_OK;
      }
      *ws = false;
    }
  if (all > kWsMaxRows && ws_automatic(algo)) {
    Config cut;
    bool cut_ws = false;
    const bool cut_ok = ws_resolve(kWsMaxRows, n, k, bits, group, algo, sms, &cut, &cut_ws) == DSX_OK && cut_ws;
    const bool parts = cut_ok && ws_parts_fit(cut, sms);
    if (!parts && ws_wide_rule(all, n, k, bits, group, algo, sms, cfg)) {  // (one launch of eight token tiles)
      *rows = all, *ws = true;
      return DSX_OK;
    }
    if (cut_ok) {
      *cfg = cut, *ws = true, *rows = kWsMaxRows;
      if (parts) cfg->parts = 2, *rows = all;
      return DSX_OK;
    }
  }
  *rows = all;
  return ws_resolve(all, n, k, bits, group, algo, sms, cfg, ws);
}

// The block's weight tensor maps: rows of 2K bytes (8-byte elements); a box of `steps` steps of
// all `tiles` 16-channel tiles' channel-group rows.
bool ws_encode_map(CUtensorMap* map, const void* q, int64_t n, int64_t k, int bits, int steps, int tiles) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(2 * k / 8), static_cast<cuuint64_t>(bits == 8 ? n / 2 : n / 4)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(2 * k)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>((bits == 8 ? 16 : 32) * steps),
                             static_cast<cuuint32_t>((bits == 8 ? 8 : 4) * tiles)};
  const cuuint32_t elem[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, const_cast<void*>(q), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// x for the x ring (XR): bf16 [rows, k] as 3-D (32 k, k / 32 segments, rows), a box of 4 segments (a step) x 16 rows
// (rows past `rows` and segments past K filled with zeros), 64-byte swizzle (kXrStepBytes' layout).
bool ws_encode_xmap(CUtensorMap* map, const void* x, int64_t rows, int64_t k) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[3] = {32, static_cast<cuuint64_t>(k / 32), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {64, static_cast<cuuint64_t>(2 * k)};
  const cuuint32_t box[3] = {32, 4, 16};
  const cuuint32_t elem[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(x), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// int4 group 128's scales for the scale rows of a ring slot in one tensor copy (Params::smap; the kernel's STMA
// instances, x through the ring only): bf16 [ceil(k / 128), n] as 2-D, a box of `steps` rows x 16 * tiles channels (rows
// and channels past the ends filled with zeros, counted in the slot's bytes), rows packed 32 * tiles bytes apart. Only
// where the copy engine takes it: the scales' address 16-byte aligned, at most 256 channels a block; otherwise the
// kernel copies a row a step (bulk_g2s from the address's 16-byte boundary below, `lead`). The same scale values either
// way: the same bits.
// Thirty-ninth session (H200, bench/wo_ab.sh, interleaved, us): group 128's scale copies cost 36864 x 7168 at M = 12 /
// 16 2.7-3.0 us of 51.5-52.4 (a diagnostic build without them, wrong values: 48.8 / 49.4), about twice their bytes'
// share; the same bytes in one copy a slot instead of one a step (a diagnostic, wrong values) took 0.9-1.0 us of that.
// Issuing the scale copies before the weights' (slower: 51.3 -> 51.9 at M = 12), prefetching a tile group's scale rows
// into L2 at its first fill, or copying them without the evict-first hint did not (within 0.3 us). This, as STMA
// instances beside main's (whose code it leaves as it was), against main's build: 7168 x 18432 M = 9 / 12 / 16 30.49 /
// 30.89 / 30.60 -> 29.29 / 29.35 / 29.08, 36864 x 7168 M = 12 / 16 51.75 / 52.50 -> 50.80 / 50.85; 2048 x 7168 (not
// taken: 4 slots) within 0.15.
// Where it is taken (ws_smap_pays): slots of two steps or more and at least 6 a tile group. Measured with a first build
// that switched at run time in every group-128 launch (the switch alone cost 0.2-0.3 us on the launches it left as
// before): one-step slots lost (a tensor copy where one bulk copy was: 36864 x 7168 M = 8 44.22 -> 44.83, 2048 x 7168
// M = 8 8.57 -> 9.16), and 2048 x 7168 at 12 / 16 rows, 4 slots of 2 steps, one tile group a block, 9.30 / 9.43 ->
// 9.74 / 9.88.
bool ws_smap_pays(int box, int per_split) { return box >= 2 && (per_split + box - 1) / box >= 6; }

// Group 64 (forty-third session): [ceil(k / 64), n], two rows a step, a box of 2 * steps rows (a half step's second
// row past K comes as zeros). Against main's build (bench/wo_ab.sh, LAYOUT=4,64, 3 rounds, the table's words, us):
// 36864 x 7168 M = 16 61.20 -> 59.18, 7168 x 18432 M = 16 34.45 -> 32.95; 1..12 rows and 24576 x 1536 within 1%.
// Group 64's staged x rows 32 bytes apart (a pad of 16 elements: a half-warp's 8-byte x loads without 2-way bank
// conflicts) on top of it gained nothing (within 1.5% either way at 1..16 rows): not taken.
bool ws_encode_smap(CUtensorMap* map, const void* scale, int64_t n, int64_t k, int group, int steps, int tiles) {
  if ((reinterpret_cast<uintptr_t>(scale) & 15) != 0 || 16 * tiles > 256 || (2 * n) % 16 != 0) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(n), static_cast<cuuint64_t>((k + group - 1) / group)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(2 * n)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(16 * tiles), static_cast<cuuint32_t>(steps * (128 / group))};
  const cuuint32_t elem[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(scale), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int BITS, int MT, int GMODE, int CT, bool PUSH, bool PARTS, bool RED, bool XR, bool FOLD, bool WG, bool STMA>
std::atomic<int>* ws_smem_allowed() {
  static std::atomic<int> set[kMaxDevices];
  return set;
}

// One launch of instance <BITS, MT, GMODE, CT, PUSH, PARTS>, with the reducer warp (ws_red_warp) where the instance
// has one and the grid's blocks loop over two tile groups or more (persistent: more tile groups than stay resident;
// with one group a block the reducer warp would have nothing to do, and its kernel lost 1-2.5% there: 2048 x 7168 and
// 7168 x 18432 at 8..16 rows, twenty-fifth session).
template <int BITS, int MT, int GMODE, int CT = 1, bool PUSH = false, bool PARTS = false, bool RED = ws_red_warp(CT, MT, PUSH),
          bool XR = false, bool FOLD = false, bool WG = false, bool STMA = false>
cudaError_t ws_launch_inst(const Params& p, const Config& cfg, cudaStream_t stream) {
  auto kernel = wo_gemm_ws_kernel<BITS, MT, GMODE, CT, PUSH, PARTS, RED, XR, FOLD, WG, STMA>;
  const cudaError_t se = ensure_smem(kernel, cfg.smem, ws_smem_allowed<BITS, MT, GMODE, CT, PUSH, PARTS, RED, XR, FOLD, WG, STMA>());
  if (se != cudaSuccess) return se;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(cfg.splits, cfg.blocks_n, cfg.parts);
  constexpr int kExtra = RED ? 2 : 1;  // (the producer warp, and the reducer warp)
  lc.blockDim = dim3(32 * (cfg.warps + kExtra), 1, 1);
  int dev = 0;
  int resident = 0;
  if (cfg.persist && cudaGetDevice(&dev) == cudaSuccess) {
    Config q = cfg;
    q.warps = cfg.warps + kExtra;  // (the occupancy query's block size; the cache keys on the kernel too)
    resident = resident_groups(reinterpret_cast<const void*>(kernel), q, dev) / cfg.parts;
  }
  if constexpr (RED) {
    if (!(resident > 0 && resident < cfg.blocks_n))
      return ws_launch_inst<BITS, MT, GMODE, CT, PUSH, PARTS, false, XR, FOLD, WG, STMA>(p, cfg, stream);
  }
  if (resident > 0 && resident < cfg.blocks_n) lc.gridDim.y = resident;
  lc.dynamicSmemBytes = cfg.smem;
  lc.stream = stream;
  return launch_ex(lc, cfg, kernel, p);
}

// One launch of <= kWsMaxRows rows on the warp-specialized path (p's pointers and sizes already set).
int ws_launch(Params& p, const void* qweight, int64_t n, int64_t k, int bits, int gmode, const Config& cfg,
              cudaStream_t stream) {
  if (!ws_encode_map(&p.wmap, qweight, n, k, bits, cfg.box, cfg.ct * cfg.warps) ||
      !ws_encode_map(&p.wmap1, qweight, n, k, bits, 1, cfg.ct * cfg.warps))
    return DSX_ECUDA;
  if (cfg.xring && !ws_encode_xmap(&p.xmap, p.x, p.m, k)) return DSX_ECUDA;
  const int per_split = (k_steps(k, 4) + cfg.splits - 1) / cfg.splits;
  const bool stma = bits == 4 && (p.group == 128 || p.group == 64) && cfg.xring && ws_smap_pays(cfg.box, per_split) &&
                    ws_encode_smap(&p.smap, p.scale, n, k, p.group, cfg.box, cfg.ct * cfg.warps);  // (else a bulk copy a step)
  p.chunk = cfg.chunk, p.stages = cfg.stages, p.box = cfg.box, p.pair = cfg.pair ? 1 : 0;
  p.groups = cfg.blocks_n;
  auto by_ct = [&](auto bg, auto pg) {
    constexpr int B = decltype(bg)::kBits, G = decltype(bg)::kGmode;
    constexpr bool P = decltype(pg)::value;
    if constexpr (B == 4) {  // (x through the ring, ws_xring_ok)
      if constexpr (G == 0) {
        if (cfg.xring && cfg.fold)
          return ws_launch_inst<B, 2, G, 2, P, false, ws_red_warp(2, 2, P), true, true>(p, cfg, stream);
      }
      if constexpr (G != 0) {  // (int4 groups: the scale rows by one tensor copy a slot where it pays)
        if (cfg.xring && stma)
          return ws_launch_inst<B, 2, G, 2, P, false, ws_red_warp(2, 2, P), true, false, false, true>(p, cfg, stream);
      }
      if (cfg.xring) return ws_launch_inst<B, 2, G, 2, P, false, ws_red_warp(2, 2, P), true>(p, cfg, stream);
    }
    if (cfg.ct == 2)
      return cfg.mt == 1 ? ws_launch_inst<B, 1, G, 2, P>(p, cfg, stream) : ws_launch_inst<B, 2, G, 2, P>(p, cfg, stream);
    if (cfg.ct == 4)
      return cfg.mt == 1 ? ws_launch_inst<B, 1, G, 4, P>(p, cfg, stream) : ws_launch_inst<B, 2, G, 4, P>(p, cfg, stream);
    if (cfg.mt == 8)  // (33..64 rows: wgmma consumers only)
      return ws_launch_inst<B, 8, G, 1, P, false, false, false, false, true>(p, cfg, stream);
    if (cfg.mt == 4) {
      constexpr bool R = ws_red_warp(1, 4, P);
      if (cfg.wg)
        return cfg.parts > 1 ? ws_launch_inst<B, 4, G, 1, P, true, R, false, false, true>(p, cfg, stream)
                             : ws_launch_inst<B, 4, G, 1, P, false, R, false, false, true>(p, cfg, stream);
      return cfg.parts > 1 ? ws_launch_inst<B, 4, G, 1, P, true>(p, cfg, stream) : ws_launch_inst<B, 4, G, 1, P>(p, cfg, stream);
    }
    return cfg.mt == 1 ? ws_launch_inst<B, 1, G, 1, P>(p, cfg, stream) : ws_launch_inst<B, 2, G, 1, P>(p, cfg, stream);
  };
  auto by_mt = [&](auto bg) {
    return ws_push(cfg) ? by_ct(bg, std::true_type{}) : by_ct(bg, std::false_type{});
  };
  cudaError_t e;
  if (bits == 8)
    e = gmode == 0 ? by_mt(Layout<8, 0>{}) : by_mt(Layout<8, 1>{});
  else
    e = gmode == 0 ? by_mt(Layout<4, 0>{}) : gmode == 1 ? by_mt(Layout<4, 1>{}) : by_mt(Layout<4, 2>{});
  return e == cudaSuccess ? DSX_OK : DSX_ECUDA;
}

}  // namespace
