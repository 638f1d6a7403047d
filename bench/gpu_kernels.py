"""GPU benchmark of dsx's CUDA kernels, with torch._scaled_mm (cuBLAS) as the anchor.

Run on the GPU machine (tests/gpu/run_all.sh does): ``python bench/gpu_kernels.py --out DIR``.
Method: bench/gpu_timing.py (CUDA-graph replays, inputs rotated past L2, variants and the anchor
timed interleaved); random non-NaN fp8 bytes (never zeros); the anchor's output is checked against
ours first, so a mis-laid-out anchor is reported rather than timed. torch is used for anchors only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.native import cuda  # noqa: E402
from ds_export.native import kernels as K  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import copy_gbs, interleaved, n_sets, ours_sampler, time_ours, time_torch, torch_sampler  # noqa: E402,F401

DENSE = [(m, n, k) for m in (4096, 128, 64, 16) for (n, k) in ((7168, 2048), (2048, 7168), (24576, 1536))]
# CUTLASS scheduler knobs swept in the same run (algo bits, see include/dsx/gemm_fp8.h)
# (coop = 1: cooperative 128x128 stream-K, clusters 1x2; ovl = 5: the same with the scale promotion
# overlapped (auto chose it for long K over two waves before algo 7 overtook it); large = 7: the hand-written persistent kernel,
# 128x128 tiles, promotion overlapped, tile order in groups of 16 M tiles (default; groups of 8 were
# within noise), large_n192: 128x192 tiles, large_m256: 256x128 tiles; *_mc: the same tiles in 2-CTA
# clusters, the B tile shared by TMA multicast: variants 5, 6, 7; *_mcA: 128x128 / 128x192 in 2-CTA clusters
# of N-adjacent tiles, the A tile shared: variants 8, 9)
TUNE_LARGE = {"auto": 0, "coop": 1, "ovl": 5, "large": 7, "large_n192": 7 | 2 << 12, "large_m256": 7 | 4 << 12,
              "large_mc": 7 | 5 << 12, "large_n192_mc": 7 | 6 << 12, "large_m256_mc": 7 | 7 << 12,
              "large_mcA": 7 | 8 << 12, "large_n192_mcA": 7 | 9 << 12, "large_v1": 7 | 1 << 12}
# large: variant 0 = 10, 128x128 with each K block's scale products formed one block ahead (auto's 128x128);
# large_v1: variant 1, the order before (the same tiles and bits)
# small M: the CUTLASS kernels auto chose before (pingpong 3, swap-AB split-K 2) and the hand-written
# kernel 6 (swap-AB, K split over a cluster of `s` CTAs; auto split count), with programmatic dependent
# launch (bit 28: each launch of the graph may start while the previous one finishes) or without
SMALL_SHAPES = ((7168, 2048), (2048, 7168), (24576, 1536), (4096, 7168), (7168, 18432))
PDL = 1 << 28
# kernel 6's weight rows per CTA (algo bits 8..9): 1 = 128 rows, one CTA per SM; 2 = 64 rows, 2-3 CTAs per SM
R128, R64 = 1 << 8, 2 << 8
# kernel 6's other knobs (their automatic values: two alternating wgmma temporaries where they fit, 64 tokens
# per CTA at M > 64 when 2 ceil(N/128) <= SMs, 128-byte L2 promotion, token tiles adjacent in the grid): T1 = one
# temporary (bits 12..15 = 1), L256 = 256-byte L2 promotion (bits 4..5 = 1), W32 / WALL = 32 tokens per CTA / all
# of M (bits 24..27 = 2 / 4), WMAJ = weight tiles adjacent in the grid (bits 6..7 = 1, the order before), STn = n
# stages instead of 8 (bits 20..23; at 64 rows a forced count above what three CTAs a SM hold runs fewer a SM)
T1, L256, W32, WALL, WMAJ = 1 << 12, 1 << 4, 2 << 24, 4 << 24, 1 << 6
LATE = 1 << 14  # a K step's scale products read after its wgmma wait (the order before; now before the wait)
OLD = 1 << 10  # the consumer loop's form before (bits 10..11 = 1: stage by division, per-thread descriptors)
SBI = 3 << 14  # a K step's scale products read before the next step's issue (two temporaries; automatic: before the wait)
UNI = 2 << 10  # the uniform form without the scales one step ahead (automatic: ahead, where two temporaries run)
# the output through the fp32 tile in shared memory (the form before; automatic: from the registers at S <= 2)
SMEMOUT = 1 << 29
ST10, ST12 = 10 << 20, 12 << 20
KS = 3 << 8  # kernel 6's rows 3: 64 weight rows, the two consumer warpgroups on the two halves of K (the bits of S = 2)
TUNE_SMALL = {"auto": 0, "auto_pdl": PDL, "pingpong": 3, "swapAB_dp": 4 | 1 << 12, "swapAB_splitK2": 4 | 2 << 12 | 2 << 16,
              "small": 6 | R128, "small_pdl": 6 | R128 | PDL, "small_s1": 6 | R128 | 1 << 16,
              "small_s2": 6 | R128 | 2 << 16, "small_s4": 6 | R128 | 4 << 16,
              "small64": 6 | R64, "small64_pdl": 6 | R64 | PDL, "small64_s1": 6 | R64 | 1 << 16,
              "small64_s2": 6 | R64 | 2 << 16, "small64_s4": 6 | R64 | 4 << 16,
              "small_wall": 6 | R128 | WALL, "small_w32": 6 | R128 | W32, "small_st12": 6 | R128 | ST12,
              "small_wmaj": 6 | R128 | WMAJ, "small_t1": 6 | R128 | T1, "small_w32_t1": 6 | R128 | W32 | T1, "small6": 6,
              "small6_old": 6 | OLD, "small_old": 6 | R128 | OLD, "small64_old": 6 | R64 | OLD,
              "small_w32_old": 6 | R128 | W32 | OLD, "small_t1_old": 6 | R128 | T1 | OLD,
              "small6_sbi": 6 | SBI, "small_w32_sbi": 6 | R128 | W32 | SBI,
              "small6_prev": 6 | UNI | SMEMOUT, "small6_ahead": 6 | SMEMOUT, "small6_regout": 6 | UNI,
              "small64_wall": 6 | R64 | WALL,
              # kernel 6's own automatic tiles with n stages instead of the automatic 8 (at most what the CTAs a
              # SM hold: 7 at 16 tokens and 4 at 64 with 64 rows), 3 K splits, 64-token tiles at M = 128
              "small6_st2": 6 | 2 << 20, "small6_st3": 6 | 3 << 20, "small6_st4": 6 | 4 << 20,
              "small6_st5": 6 | 5 << 20, "small6_s3": 6 | 3 << 16, "small64_s3": 6 | R64 | 3 << 16,
              "small_w64": 6 | R128 | 3 << 24, "small64_w64": 6 | R64 | 3 << 24,
              # deeper rings than the automatic 8 (at most 7 at three CTAs a SM) where the grid has at most one CTA
              # a SM anyway (the count is clamped to what one CTA's shared memory holds)
              "small6_st10": 6 | 10 << 20, "small6_st12": 6 | ST12, "small64_wall_st12": 6 | R64 | WALL | ST12,
              # one 64-token tile of 128 rows with two K splits (a 2-CTA cluster): the bits of the K halves below
              "small_wall_s2": 6 | R128 | WALL | 2 << 16,
              # the K halves (rows 3): 64 weight rows, all tokens, two consumer warpgroups on the two halves of K
              # (one CTA a weight tile; automatic stages: the deepest even ring one CTA a SM holds), 8 stages, one
              # wgmma temporary
              "ks": 6 | KS, "ks_st8": 6 | KS | 8 << 20, "ks_t1": 6 | KS | T1}
# --focus: the shapes and variants of one question, each shape several times (they move +-5% within a run)
# (the three M <= 128 shapes at or short of 1.5x cuBLAS, and 64x7168x2048: auto (algo 6, uniform loop form), the
# scales one step ahead and the output from the registers (both automatic now), the form before (prev: neither),
# each alone, PDL)
_FOCUS_V = ("small6_prev", "small6_ahead", "small6_regout", "auto_pdl")
# (at 128x4096x7168 also one 128-token tile a CTA of 64 rows: 2% faster than the 64-token tiles before the scales
# ahead, one call)
FOCUS = {(128, 4096, 7168): _FOCUS_V + ("small64_wall",), (16, 4096, 7168): _FOCUS_V,
         (16, 7168, 2048): _FOCUS_V,
         (64, 7168, 2048): _FOCUS_V}
# the fixed cost of one launch in a graph: one K block, two weight tiles (kernel 6: one CTA per tile)
LAUNCH_PROBE = (16, 256, 128)

try:
    import torch
except ImportError:  # the anchor is optional; our figures still print
    torch = None


def fp8_bytes(rng, shape):
    u = rng.integers(0, 256, shape, dtype=np.uint8)
    u[(u & 0x7F) == 0x7F] = 0x38  # no NaN codes
    return u


def torch_blockwise_call(a, sa, b, sb):
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales; the layout variant
    whose output matches a float64 emulation is returned (None if none does)."""
    bf16 = torch.bfloat16
    variants = [
        lambda: (sa.t().contiguous().t(), sb.t()),
        lambda: (sa.t().contiguous().t(), sb.t().contiguous()),
        lambda: (sa, sb.t()),
    ]
    kb = sa.shape[1]
    ref = None
    for make in variants:
        try:
            s_a, s_b = make()
            out = torch._scaled_mm(a, b.t(), scale_a=s_a, scale_b=s_b, out_dtype=bf16)
        except Exception:
            continue
        if ref is None:
            af, bf = a[:64].float(), b.float()
            ref = sum(
                (af[:, i * 128:(i + 1) * 128] @ bf[:, i * 128:(i + 1) * 128].t())
                * sa[:64, i:i + 1] * sb[:, i].repeat_interleave(128)[: b.shape[0]][None]
                for i in range(kb)
            )
        rel = ((out[:64].float() - ref).norm() / ref.norm()).item()
        if rel < 1e-2:
            return lambda s_a=s_a, s_b=s_b: torch._scaled_mm(a, b.t(), scale_a=s_a, scale_b=s_b, out_dtype=bf16)
    return None


def fp8_samplers(dev, out, variants, k, skip_refused=False):
    """A sampler per variant word over the operand sets `dev` (each [a, sa, b, sb] on the device, K = k), each word
    with its own workspace, all writing `out`; with skip_refused a word that does not take the shape is left
    out (else its error propagates). Returns (samplers, launch modes)."""
    samplers, modes = {}, {}
    m, n = out.shape
    for name, algo in variants.items():
        try:
            ws = cuda.empty((max(1, cuda.gemm_workspace_bytes(m, n, k, algo)),), np.uint8)
            calls = [lambda s, d=d, algo=algo, ws=ws: cuda.gemm_fp8_nt_device(*d, out, workspace=ws, algo=algo,
                                                                               stream=s) for d in dev]
            samplers[name], modes[name] = ours_sampler(calls)
        except Exception:  # noqa: BLE001 - re-raised unless asked to skip
            if not skip_refused:
                raise
    return samplers, modes


def anchor_calls(host_sets):
    """torch._scaled_mm (cuBLAS block-wise) calls over the same operand sets given as host arrays (a, sa, b,
    sb; fp8 as uint8): one per set, or None when torch is absent or refuses the layout."""
    if torch is None:
        return None
    tsets = [[torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in s] for s in host_sets]
    calls = [torch_blockwise_call(a.view(torch.float8_e4m3fn), sa, b.view(torch.float8_e4m3fn), sb)
             for a, sa, b, sb in tsets]
    return calls if all(calls) else None


def bench_dense(m, n, k, rng, only=None):
    kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
    per_set = m * k + n * k + 4 * (m * kb + nb * kb)
    sets = [(fp8_bytes(rng, (m, k)), rng.uniform(5e-3, 2e-2, (m, kb)).astype(np.float32),
             fp8_bytes(rng, (n, k)), rng.uniform(5e-3, 2e-2, (nb, kb)).astype(np.float32)) for _ in range(n_sets(per_set))]
    dev = [[cuda.to_device(x) for x in s] for s in sets]
    out = cuda.empty((m, n), np.uint16)
    flop = 2.0 * m * n * k
    row = {"kernel": "gemm_fp8_nt", "shape": f"{m}x{n}x{k}", "sets": len(sets)}
    variants = TUNE_LARGE if m >= 1024 else {
        name: algo for name, algo in TUNE_SMALL.items()
        if not (algo & 15) == 6 or (algo >> 16 & 15) <= min(8, kb)}
    if only is not None:  # (auto always: the headline figure)
        variants = {name: algo for name, algo in variants.items() if name == "auto" or name in only}
    samplers, modes = fp8_samplers(dev, out, variants, k)
    if torch is not None:
        calls = anchor_calls(sets)
        if calls:
            # our output on set 0 against the anchor's (a full-size cross-check)
            cuda.gemm_fp8_nt_device(*dev[0], out, workspace=cuda.empty((max(1, cuda.gemm_workspace_bytes(m, n, k)),), np.uint8))
            ours = torch.from_numpy(out.numpy().view(np.int16)).cuda().view(torch.bfloat16).float()
            theirs = calls[0]().float()
            row["rel_diff_vs_anchor"] = float(((ours - theirs).norm() / theirs.norm()).item())
            if "large" in variants:  # the hand-written large-M kernel: against the anchor, bits against algo 5
                cuda.gemm_fp8_nt_device(*dev[0], out, algo=7)
                big = out.numpy().copy()
                mine = torch.from_numpy(big.view(np.int16)).cuda().view(torch.bfloat16).float()
                row["large_rel_diff_vs_anchor"] = float(((mine - theirs).norm() / theirs.norm()).item())
                ws5 = cuda.empty((max(1, cuda.gemm_workspace_bytes(m, n, k, 5)),), np.uint8)
                cuda.gemm_fp8_nt_device(*dev[0], out, workspace=ws5, algo=5)
                row["large_bits_equal_ovl"] = float((out.numpy() == big).mean())
                cuda.gemm_fp8_nt_device(*dev[0], out, algo=7 | 2 << 12)
                wide = torch.from_numpy(out.numpy().view(np.int16)).cuda().view(torch.bfloat16).float()
                row["large_n192_rel_diff_vs_anchor"] = float(((wide - theirs).norm() / theirs.norm()).item())
            for name in ("small", "small64"):  # the hand-written kernel's output too
                if name in variants:
                    cuda.gemm_fp8_nt_device(*dev[0], out, algo=variants[name])
                    mine = torch.from_numpy(out.numpy().view(np.int16)).cuda().view(torch.bfloat16).float()
                    row[f"{name}_rel_diff_vs_anchor"] = float(((mine - theirs).norm() / theirs.norm()).item())
            samplers["anchor"] = torch_sampler(calls)
        else:
            row["anchor"] = "torch._scaled_mm block-wise layout not accepted"
    med = interleaved(samplers)
    best = min((us, name) for name, us in med.items() if name != "anchor")
    for name in variants:
        row[f"us_{name}"] = round(med[name], 2)
    auto_us = med["auto"]  # what algo=0 (the product's choice) gives: the headline figure
    row.update(us=round(auto_us, 2), mode=modes[best[1]], tflops=round(flop / auto_us / 1e6, 1), best_variant=best[1],
               best_us=round(best[0], 2))
    if "anchor" in med:
        t_us = med["anchor"]
        row.update(anchor_us=round(t_us, 2), anchor_tflops=round(flop / t_us / 1e6, 1), ratio=round(t_us / auto_us, 3),
                   best_ratio=round(t_us / best[0], 3))
    return row


def bench_grouped(experts, tokens, n, k, rng):
    kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
    m = experts * tokens
    off = (np.arange(experts + 1) * tokens).astype(np.int32)
    a, sa = fp8_bytes(rng, (m, k)), rng.uniform(5e-3, 2e-2, (m, kb)).astype(np.float32)
    b, sb = fp8_bytes(rng, (experts, n, k)), rng.uniform(5e-3, 2e-2, (experts, nb, kb)).astype(np.float32)
    dev = [cuda.to_device(x) for x in (a, sa, b, sb, off)]
    out = cuda.empty((m, n), np.uint16)
    ws = cuda.empty((max(1, cuda.gemm_workspace_bytes(m, n, k, experts=experts)),), np.uint8)
    us, mode = time_ours([lambda s: cuda.gemm_fp8_grouped_device(*dev, out, workspace=ws, stream=s)])
    flop = 2.0 * m * n * k
    row = {"kernel": "gemm_fp8_grouped", "shape": f"E{experts}x{tokens} {n}x{k}", "us": round(us, 2), "mode": mode,
           "tflops": round(flop / us / 1e6, 1), "weight_TBps": round(b.nbytes / us / 1e6, 2)}
    if torch is not None:
        ta, tb = torch.from_numpy(a).cuda().view(torch.float8_e4m3fn), torch.from_numpy(b).cuda().view(torch.float8_e4m3fn)
        tsa, tsb = torch.from_numpy(sa).cuda(), torch.from_numpy(sb).cuda()
        calls = [torch_blockwise_call(ta[off[e]:off[e + 1]], tsa[off[e]:off[e + 1]], tb[e], tsb[e]) for e in range(experts)]
        if all(calls):
            t_us = time_torch([lambda: [c() for c in calls]], reps=10)
            row.update(anchor="torch loop over experts", anchor_us=round(t_us, 2), ratio=round(t_us / us, 3))
    return row


def bench_act_quant(m, k, rng):
    x = [cuda.to_device(rng.standard_normal((m, k)).astype(np.float32).astype(K.BF16).view(np.uint16))
         for _ in range(n_sets(2 * m * k))]
    q, s = cuda.empty((m, k), np.uint8), cuda.empty((m, K.cdiv(k, 128)), np.float32)
    us, mode = time_ours([lambda st, xd=xd: cuda.act_quant_fp8_device(xd, q, s, stream=st) for xd in x])
    moved = 3 * m * k + 4 * m * K.cdiv(k, 128)
    return {"kernel": "act_quant_fp8", "shape": f"{m}x{k}", "us": round(us, 2), "mode": mode,
            "TBps": round(moved / us / 1e6, 2), "sets": len(x)}


def bench_mtp(bsz, k, rng):
    tgt = rng.integers(0, 4, (bsz, k + 1)).astype(np.int64)
    draft = np.where(rng.random((bsz, k)) < 0.7, tgt[:, :k], 0).astype(np.int64)
    nd = rng.integers(0, k + 1, bsz).astype(np.int32)
    dev = [cuda.to_device(x) for x in (draft, tgt, nd)]
    acc, cnt = cuda.empty((bsz, k + 1), np.int64), cuda.empty((bsz,), np.int32)
    call = lambda s: cuda.mtp_accept_greedy_device(*dev, acc, cnt, stream=s)  # noqa: E731
    us, mode = time_ours([call] * 100)
    stream, single = cuda.Stream(), []
    e0, e1 = cuda.Event(), cuda.Event()
    for _ in range(50):  # one launch between events (includes the host launch latency)
        e0.record(stream)
        call(stream)
        e1.record(stream)
        single.append(e0.elapsed_ms(e1) * 1e3)
    return {"kernel": "mtp_accept_greedy_i64", "shape": f"B{bsz} K{k}", "us": round(us, 2), "mode": mode,
            "us_single_launch_with_host_call": round(statistics.median(single), 2)}


def table(rows):
    lines = [f"{'kernel':<22}{'shape':<22}{'ours us':>10}{'TFLOP/s':>10}{'anchor us':>11}{'anchor TF':>11}{'ratio':>8}  notes"]
    for r in rows:
        notes = f"best {r['best_variant']} x{r.get('best_ratio', '?')}" if "best_variant" in r else ""
        notes += f" {r['mode']}" if r.get("mode", "graph") != "graph" else ""
        sweep = [f"{key[3:]} {val}" for key, val in r.items() if key.startswith("us_") and "single" not in key]
        if sweep:
            notes += " [" + ", ".join(sweep) + "]"
        if "copy_GBps" in r:
            notes += f" device copy {r['copy_GBps']} GB/s (read + write)"
        if "TBps" in r:
            notes += f" {r['TBps']} TB/s moved"
        if "weight_TBps" in r:
            notes += f" weights {r['weight_TBps']} TB/s; anchor={r.get('anchor', '-')}"
        if "us_single_launch_with_host_call" in r:
            notes += f" one un-graphed launch incl. Python call {r['us_single_launch_with_host_call']} us"
        if "rel_diff_vs_anchor" in r:
            notes += f" diff {r['rel_diff_vs_anchor']:.1e}"
        if "large_rel_diff_vs_anchor" in r:
            notes += (f" large diff {r['large_rel_diff_vs_anchor']:.1e} bits==ovl {r['large_bits_equal_ovl']:.4f}"
                      f" n192 diff {r['large_n192_rel_diff_vs_anchor']:.1e}")
        for name in ("small", "small64"):
            if f"{name}_rel_diff_vs_anchor" in r:
                notes += f" {name} diff {r[f'{name}_rel_diff_vs_anchor']:.1e}"
        if isinstance(r.get("anchor"), str) and "layout" in r["anchor"]:
            notes += " " + r["anchor"]
        if "error" in r:
            notes += " " + r["error"]
        lines.append(f"{r['kernel']:<22}{r['shape']:<22}{r['us']:>10}{r.get('tflops', ''):>10}{r.get('anchor_us', ''):>11}"
                     f"{r.get('anchor_tflops', ''):>11}{r.get('ratio', ''):>8}  {notes.strip()}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write bench.json and bench.txt here")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--small", action="store_true", help="only the dense GEMM at M = 128, 64, 16 (5 shapes each)")
    ap.add_argument("--large", action="store_true", help="only the dense GEMM at M = 4096 and 1024 (3 shapes each)")
    ap.add_argument("--focus", type=int, default=0, metavar="R",
                    help="only FOCUS's shapes and variants, each shape R times")
    ap.add_argument("--shapes", default=None, metavar="MxNxK,...",
                    help="with --small: only these shapes (e.g. 16x24576x1536,64x7168x18432)")
    ap.add_argument("--only", default=None, metavar="NAMES",
                    help="with --small or --focus: time only these comma-separated variants (and auto, the anchor)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if only is not None and not only <= set(TUNE_SMALL):
        ap.error(f"--only: unknown variants {sorted(only - set(TUNE_SMALL))}")
    if not cuda.available():
        print("no CUDA device: nothing to benchmark")
        return 1
    rng = np.random.default_rng(0)
    if args.focus:
        jobs = [(lambda m, n, k, rng, names=names: bench_dense(m, n, k, rng, names if only is None else only), shape)
                for _ in range(args.focus) for shape, names in FOCUS.items()]
    elif args.large:  # M = 4096, then M = 1024 (where algo 0 may switch kernels)
        jobs = [(bench_dense, spec) for spec in DENSE[:3] + [(1024, n, k) for _, n, k in DENSE[:3]]]
    elif args.small:
        shapes = [(m, n, k) for m in (128, 64, 16) for n, k in SMALL_SHAPES] + [LAUNCH_PROBE]
        if args.shapes:
            shapes = [tuple(int(x) for x in spec.split("x")) for spec in args.shapes.split(",")]
        jobs = [(lambda m, n, k, rng: bench_dense(m, n, k, rng, only), spec) for spec in shapes]
    else:
        jobs = [(bench_dense, spec) for spec in (DENSE[:3] if args.quick else DENSE)]
        jobs += [(bench_grouped, spec) for spec in ((16, 256, 4096, 7168), (16, 256, 7168, 2048))]
        jobs += [(bench_act_quant, spec) for spec in ((4096, 7168), (128, 7168))]
        jobs += [(bench_mtp, spec) for spec in ((256, 5), (256, 8))]
    rows = []
    if args.small:  # the bandwidth anchor of this run (the weight-read floors are bytes / this)
        gbs = copy_gbs()
        rows.append({"kernel": "anchor_copy", "shape": "512 MB bf16", "us": "-",
                     "copy_GBps": round(gbs, 1) if gbs else None})
        print(json.dumps(rows[-1]), flush=True)
    for fn, spec in jobs:
        try:
            rows.append(fn(*spec, rng))
        except Exception as exc:  # one broken row must not hide the others
            rows.append({"kernel": fn.__name__, "shape": str(spec), "us": "FAIL", "error": repr(exc)[:300]})
        print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(rows, indent=1))
        (args.out / "bench.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
