"""GPU benchmark of the weight-only GEMM against torch bf16 matmul on the dequantized weight.

Run on the GPU machine (tests/gpu/run_all.sh does):
``python bench/gpu_gemm_weight_only.py --out DIR [--quick] [--sweep]``.

Rows: DeepSeek-V3 (N, K) in (36864, 7168), (7168, 18432), (2048, 7168), (7168, 2048),
(24576, 1536), (4096, 7168) x M in 1, 2, 4, 8, 16, 64 for int4 per channel (the headline:
DeepSeek's routed experts), and M in 1, 4, 16 for int4 group 128 and int8 per channel.
Method (as bench/gpu_kernels.py): random weight bytes (every byte is a valid code; never
zeros) copied into as many device sets as it takes to exceed 3x the 60 MB L2 (at most 16);
one launch per set captured in a CUDA graph, replayed between CUDA events; the figure is
the median over replays of (replay time / sets). The anchor, torch's x @ W^T with W the
bf16 dequantized weight [N, K], is timed the same way in the same run (once per shape and
M: the int4 per-channel rows time it, after checking its output against ours, interleaved with
their automatic config (gpu_timing.interleaved), which is that row's "us"; the other layouts
reuse that time, the same bf16 product). Reported: microseconds, GB/s on the
weight bytes (qweight + scales), ratio = anchor time / our time (goal >= 3 at M <= 16 for
int4), and the fraction of the device-to-device copy bandwidth measured in the same run.
Each row is also timed with programmatic dependent launch (algo bit 24: each launch of the
graph starts, and fetches its first weights, while the one before it ends, as consecutive
layers of a served model would; "PDL us", its own ratio) and, at M <= 16, one step at a time
(algo bit 25, "1step us": the schedule before step pairing, same bits) and one tile group a
block (algo bit 26, "1grp us": no persistent blocks, same bits); int4 per channel at M <= 8 also
with the balanced grid (algo bit 27 with the automatic fields, "bal us").
With --sweep, int4 per channel at M = 1 and 16 is also timed over (warps, splits, ring
slots, steps per slot; x chunk at M = 16) so the automatic choice can be tuned; the best is
printed beside the automatic one. --sweep-list "w8s4d1b2,w8s2d2b4,..." replaces that list
(and --sweep-ms 1,4,8 the M values swept): any words, ring slots 1 included (one slot refilled
early, M <= 8), packed here directly (algo_word refuses one slot); a trailing "+HEX" adds those
algo bits (w8s4d1b4+1000000: PDL). With --sweep-libs a.so,b.so (other builds of the entry, e.g.
diagnostic ones made by bench/wo_alt_lib.sh) every swept word is timed on them too, same inputs,
same run ("w0s0d0b0" is the automatic config).
With --alt-lib LIB (a shared library exporting dsx_wo_gemm_bf16_nt_cuda, e.g. the previous
kernel built alone: bench/wo_alt_lib.sh), that build is timed on the same inputs in the same
run ("alt us" and its ratio to torch), so two kernels compare without run-to-run drift.
With --ab WORDS (and --ms), auto, the words, the --alt-lib build and torch are timed interleaved;
--ab-libs a.so,b.so adds auto and every word on those builds to the same interleaving ("w...@a"),
e.g. a -DDSX_WO_NOMATH build for the weight stream alone under each configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.formats import weight_only as wo  # noqa: E402
from ds_export.native import cuda  # noqa: E402
from ds_export.native import gemm_weight_only as G  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_timing  # noqa: E402
from gpu_timing import n_sets, time_ours  # noqa: E402
SHAPES = [(36864, 7168), (7168, 18432), (2048, 7168), (7168, 2048), (24576, 1536), (4096, 7168)]
MS = [1, 2, 4, 8, 16, 64]
MS_OTHER = [1, 4, 16]
LAYOUTS = [(4, -1), (4, 128), (4, 64), (8, -1)]  # (int4 group 64 since the forty-second session: the same kernels)
# (warps, splits, x chunk, ring slots, steps per slot); chunk 0 = automatic
SWEEP = [(w, s, 0, d, b) for w in (4, 8) for s in range(1, 9) for d, b in ((4, 1), (2, 2), (2, 4))]
SWEEP_M16 = [(8, s, 16, d, b) for s in (2, 3, 4, 6, 8) for d, b in ((4, 1), (2, 4))]  # larger x chunks at M = 16
SWEEP_MS = [1, 16]
SWEEP_LIST = []  # --sweep-list: replaces SWEEP / SWEEP_M16

PDL = 1 << 24       # algo bit: programmatic dependent launch (launches overlap: serving)
ONE_STEP = 1 << 25  # algo bit: one step at a time (the pre-pairing schedule; same bits)
ONE_GROUP = 1 << 26  # algo bit: one tile group a block (no persistent blocks; same bits)
BAL = 1 << 27  # algo bit: balanced persistent grid (int4 per channel, M <= 8; its own cut points)

try:
    import torch
except ImportError:  # our figures still print
    torch = None


def time_graph(launches, reps: int = 30) -> tuple[float, str]:
    """(median us per launch, mode) of graph replays of `launches` (fn(stream) each)."""
    return time_ours(launches, reps)


def copy_bandwidth_tbps() -> float | None:
    """Device copy (read + written bytes) in TB/s: bench/gpu_timing.py's anchor, shared with the other benches."""
    gbs = gpu_timing.copy_gbs()
    return None if gbs is None else gbs / 1e3


class Problem:
    """Device sets of one (N, K, bits, group): Paddle bytes, scales and (for torch) bf16 weights."""

    def __init__(self, n, k, bits, group, rng):
        self.n, self.k, self.bits, self.group = n, k, bits, group
        q = rng.integers(-128, 128, (n if bits == 8 else n // 2, k), dtype=np.int8)
        sshape = (n,) if group == -1 else (-(-k // group), n)
        s = rng.uniform(0.004, 0.012, sshape).astype(np.float32).astype(G.BF16)
        self.q, self.s = q, s
        self.weight_bytes = q.nbytes + s.nbytes
        self.sets = n_sets(self.weight_bytes)
        self.dq = [cuda.to_device(q) for _ in range(self.sets)]
        self.ds = [cuda.to_device(s.view(np.uint16)) for _ in range(self.sets)]
        self.tw = None

    def torch_weights(self):
        if self.tw is None:
            w = torch.from_numpy(wo.dequantize_native(self.q, self.s, self.bits, self.group, 90, self.k))
            w0 = w.to(device="cuda", dtype=torch.bfloat16)
            del w
            self.tw = [w0] + [w0.clone() for _ in range(n_sets(w0.numel() * 2) - 1)]
        return self.tw

    def free_torch(self):
        self.tw = None


DIAG = {}  # "fn": dsx_wo_gemm_bf16_nt_cuda of a build with -DDSX_WO_NOMATH (--diag-lib)
ALT = {}   # "fn": the same entry of another build (--alt-lib: e.g. the previous kernel), timed beside ours
SWEEP_LIBS = {}  # name -> the same entry of other builds (--sweep-libs): each swept word timed there too
AB_LIBS = {}  # name -> the same entry of other builds (--ab-libs): auto and each --ab word timed there too, interleaved


def _ok(rc: int) -> None:
    if rc:
        raise RuntimeError(f"rc {rc}")


def load_entry(path: str):
    import ctypes
    lib = ctypes.CDLL(path)
    fn = lib.dsx_wo_gemm_bf16_nt_cuda
    P, I64, I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes = [P, P, P, P, I64, I64, I64, I32, I32, I32, I32, P]
    fn.restype = I32
    return fn


def bench_row(pb: Problem, m: int, rng, sweep: bool, anchors: dict) -> dict:
    x = rng.standard_normal((m, pb.k)).astype(np.float32).astype(G.BF16)
    dx = [cuda.to_device(x.view(np.uint16)) for _ in range(pb.sets)]
    out = cuda.empty((m, pb.n), np.uint16)

    run = G._cuda_fns()[0]

    def launch(i, algo, st, fn):  # the C entry (ours or another build's): takes algo bits 24, 25 too
        rc = fn(dx[i].ptr, pb.dq[i].ptr, pb.ds[i].ptr, out.ptr, m, pb.n, pb.k, pb.bits, pb.group, 90, algo,
                st.handle if st else None)
        if rc:
            raise RuntimeError(f"rc {rc} for algo {algo:#x}")

    def calls(algo, fn=run):
        return [lambda st, i=i: launch(i, algo, st, fn) for i in range(pb.sets)]

    akey = (pb.n, pb.k, m)
    times_anchor = torch is not None and akey not in anchors and (pb.bits, pb.group) == (4, -1)
    if times_anchor:  # this row times the anchor (its output is checked against ours below)
        tw = pb.torch_weights()
        tx = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
        # The headline pair, auto and torch, timed interleaved (gpu_timing.interleaved): one after
        # another, the anchor moved ~10% between calls as the clock sagged under load.
        auto, mode = gpu_timing.ours_sampler(calls(0))
        anchor = gpu_timing.torch_sampler([lambda w=w: tx @ w.t() for w in tw])
        t = gpu_timing.interleaved({"auto": auto, "torch": anchor})
        us, anchors[akey] = t["auto"], t["torch"]
    else:
        us, mode = time_graph(calls(0))
    us_pdl, mode_pdl = time_graph(calls(PDL))
    us_one = time_graph(calls(ONE_STEP))[0] if m <= 16 else None
    us_1grp = time_graph(calls(ONE_GROUP))[0] if m <= 16 else None
    us_bal = None
    if m <= 8 and (pb.bits, pb.group) == (4, -1):  # the balanced grid with the automatic fields
        us_bal = time_graph(calls(BAL))[0]
    us_nomath = None
    if DIAG and m in (1, 16):  # the same launch without the arithmetic: the weight stream alone
        us_nomath = time_graph(calls(0, DIAG["fn"]))[0]
    us_alt = None
    if ALT:  # another build's kernel (its automatic config), same inputs, same run
        us_alt = time_graph(calls(0, ALT["fn"]))[0]
    cfg = G.cuda_config(m, pb.n, pb.k, pb.bits, pb.group)
    row = {"kernel": "gemm_weight_only", "layout": f"int{pb.bits} g{pb.group}", "M": m, "N": pb.n, "K": pb.k,
           "sets": pb.sets, "mode": mode, "config": cfg, "us": round(us, 2),
           "weight_GBps": round(pb.weight_bytes / us / 1e3, 1), "us_pdl": round(us_pdl, 2), "mode_pdl": mode_pdl,
           "us_one_step": us_one and round(us_one, 2), "us_one_group": us_1grp and round(us_1grp, 2),
           "us_nomath": us_nomath and round(us_nomath, 2), "us_alt": us_alt and round(us_alt, 2),
           "us_bal": us_bal and round(us_bal, 2)}
    if sweep:
        best = ("auto", us)
        for w, s, c, d, b, *fl in SWEEP_LIST or (SWEEP + (SWEEP_M16 if m == 16 else [])):
            extra = fl[0] if fl else 0
            key = f"w{w}_s{s}_d{d}_b{b}" + (f"_c{c}" if c else "") + (f"_x{extra:x}" if extra else "")
            algo = w | s << 4 | c << 8 | d << 16 | b << 20 | extra
            try:
                t, _ = time_graph(calls(algo))
            except Exception as exc:  # a config that does not fit (shared memory) is skipped
                row[f"us_{key}"] = repr(exc)[:60]
                continue
            row[f"us_{key}"] = round(t, 2)
            best = min(best, (key, t), key=lambda b: b[1])
            for name, f in SWEEP_LIBS.items():  # the same word on another build (diagnostic builds)
                try:
                    row[f"us_{key}@{name}"] = round(time_graph(calls(algo, f))[0], 2)
                except Exception as exc:
                    row[f"us_{key}@{name}"] = repr(exc)[:60]
        row.update(best=best[0], best_us=round(best[1], 2))
    if times_anchor:
        G.gemm_weight_only_cuda_device(dx[0], pb.dq[0], pb.ds[0], out, bits=pb.bits, group_size=pb.group)
        cuda.synchronize()
        ours = torch.from_numpy(out.numpy().view(np.int16)).cuda().view(torch.bfloat16).float()
        theirs = (tx @ tw[0].t()).float()
        row.update(rel_diff_vs_anchor=float(((ours - theirs).norm() / theirs.norm()).item()),
                   timing="auto and torch interleaved")
    if akey in anchors:
        t_us = anchors[akey]
        row.update(anchor_us=round(t_us, 2), ratio=round(t_us / us, 2), ratio_pdl=round(t_us / us_pdl, 2))
        if us_alt:
            row["ratio_alt"] = round(t_us / us_alt, 2)
        if sweep:
            row["best_ratio"] = round(t_us / row["best_us"], 2)
    return row


def ab_row(pb: Problem, m: int, rng, words: list, rounds: int, anchor: bool = True) -> dict:
    """--ab: int4 per channel (or --ab-layout's) at M, the automatic config, each word of `words` ((name, algo)), the
    --alt-lib build's automatic config and torch, all timed interleaved (gpu_timing.interleaved:
    rounds of a few replays each, the order rotating), so that the clock's sag under load does not
    favour whichever runs first (anchor=False: without torch). {name: median us} plus the configs."""
    x = rng.standard_normal((m, pb.k)).astype(np.float32).astype(G.BF16)
    dx = [cuda.to_device(x.view(np.uint16)) for _ in range(pb.sets)]
    out = cuda.empty((m, pb.n), np.uint16)
    run = G._cuda_fns()[0]

    def calls(algo, fn=run):
        def one(st, i, algo=algo, fn=fn):
            _ok(fn(dx[i].ptr, pb.dq[i].ptr, pb.ds[i].ptr, out.ptr, m, pb.n, pb.k, pb.bits, pb.group, 90, algo,
                   st.handle if st else None))
        return [lambda st, i=i: one(st, i) for i in range(pb.sets)]

    samplers = {"auto": gpu_timing.ours_sampler(calls(0))[0]}
    for name, algo in words:
        try:
            samplers[name] = gpu_timing.ours_sampler(calls(algo))[0]
        except Exception as exc:  # a word that does not fit is reported, not timed
            print(json.dumps({"N": pb.n, "K": pb.k, "M": m, "word": name, "error": repr(exc)[:80]}))
    if ALT:
        samplers["alt"] = gpu_timing.ours_sampler(calls(0, ALT["fn"]))[0]
    for lib, f in AB_LIBS.items():  # --ab-libs: auto and every word on another build (e.g. no arithmetic)
        for name, algo in [("auto", 0)] + list(words):
            try:
                samplers[f"{name}@{lib}"] = gpu_timing.ours_sampler(calls(algo, f))[0]
            except Exception as exc:
                print(json.dumps({"N": pb.n, "K": pb.k, "M": m, "word": f"{name}@{lib}", "error": repr(exc)[:80]}))
    if torch is not None and anchor:
        tw = pb.torch_weights()
        tx = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
        samplers["torch"] = gpu_timing.torch_sampler([lambda w=w: tx @ w.t() for w in tw])
    t = gpu_timing.interleaved(samplers, rounds=rounds)
    row = {"N": pb.n, "K": pb.k, "M": m, "bits": pb.bits, "group": pb.group,
           "config": G.cuda_config(m, pb.n, pb.k, pb.bits, pb.group)}
    row.update({f"us_{k}": round(v, 2) for k, v in t.items()})
    if "torch" in t:
        row.update({f"x_{k}": round(t["torch"] / v, 3) for k, v in t.items() if k != "torch"})
        # The outputs, checked as the timing ran them (this build's automatic choice, and the --alt-lib build's):
        # the largest difference from torch's, in units of torch's rms (bench/tune_auto.py --ab-summary flags a row
        # where the new build's is far above the old's; --emit --slower keeps the old word there).
        ref = (tx @ tw[0].t()).float()
        rms = float(ref.square().mean().sqrt().item()) or 1.0
        for name, fn in [("auto", run)] + ([("alt", ALT["fn"])] if ALT else []):
            out.fill_bytes(0xFF)  # (NaN: an output the launch left unwritten shows)
            _ok(fn(dx[0].ptr, pb.dq[0].ptr, pb.ds[0].ptr, out.ptr, m, pb.n, pb.k, pb.bits, pb.group, 90, 0, None))
            cuda.synchronize()
            got = torch.from_numpy(out.numpy().view(np.int16)).cuda().view(torch.bfloat16).float()
            err = float((got - ref).abs().max().item()) / rms
            row[f"err_{name}"] = round(err, 4) if math.isfinite(err) else "nan"
    return row


def table(rows, copy_tbps) -> str:
    head = (f"{'layout':<10}{'M':>4}{'N':>7}{'K':>7}{'us':>9}{'GB/s':>8}{'%copy':>7}{'torch us':>10}{'ratio':>7}"
            f"{'PDL us':>9}{'ratio':>7}{'1step us':>9}{'1grp us':>9}{'bal us':>9}{'nomath':>8}{'alt us':>9}{'ratio':>7}"
            f"  {'config (w s c d b)':<22}best")
    lines = [head, "-" * len(head)]
    for r in rows:
        pct = f"{100 * r['weight_GBps'] / 1e3 / copy_tbps:.0f}" if copy_tbps else "-"
        c = r["config"]
        cfg = f"{c['warps']} {c['splits']} {c['chunk']} {c['stages']} {c['box']}"
        best = f"{r['best']} {r['best_us']}us x{r.get('best_ratio', '-')}" if "best" in r else ""
        lines.append(f"{r['layout']:<10}{r['M']:>4}{r['N']:>7}{r['K']:>7}{r['us']:>9}{r['weight_GBps']:>8}{pct:>7}"
                     f"{r.get('anchor_us', '-'):>10}{r.get('ratio', '-'):>7}"
                     f"{r['us_pdl']:>9}{r.get('ratio_pdl', '-'):>7}"
                     f"{r['us_one_step'] or '-':>9}{r.get('us_one_group') or '-':>9}{r.get('us_bal') or '-':>9}{r['us_nomath'] or '-':>8}"
                     f"{r.get('us_alt') or '-':>9}{r.get('ratio_alt', '-'):>7}"
                     f"  {cfg:<22}{best}")
    return "\n".join(lines)


def profile(n: int, k: int, m: int, algo: int = 0) -> int:
    """Three plain launches (automatic config, or the word `algo`) on rotating weight sets: a target for ncu."""
    rng = np.random.default_rng(0)
    pb = Problem(n, k, 4, -1, rng)
    x = cuda.to_device(rng.standard_normal((m, k)).astype(np.float32).astype(G.BF16).view(np.uint16))
    out = cuda.empty((m, n), np.uint16)
    for i in range(3):
        _ok(G._cuda_fns()[0](x.ptr, pb.dq[i % pb.sets].ptr, pb.ds[i % pb.sets].ptr, out.ptr, m, n, k, 4, -1, 90,
                             algo, None))
    cuda.synchronize()
    print(json.dumps({"profiled": [n, k, m, hex(algo)], "config": G.cuda_config(m, n, k, 4, -1, algo & 0x7FFFFFF)}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/gpu")
    ap.add_argument("--quick", action="store_true", help="int4 per channel only")
    ap.add_argument("--sweep", action="store_true", help="time int4 per channel M=1, 16 over the tuning fields")
    ap.add_argument("--shapes", default="", help="comma-separated NxK subset, e.g. 36864x7168,2048x7168")
    ap.add_argument("--diag-lib", default="", help="a libdsx build with -DDSX_WO_NOMATH: adds a 'nomath' column")
    ap.add_argument("--alt-lib", default="",
                    help="another build of dsx_wo_gemm_bf16_nt_cuda (e.g. the previous kernel): adds 'alt us' + ratio")
    ap.add_argument("--profile", default="",
                    help="NxKxM: only launch int4 per channel there 3 times (for ncu)")
    ap.add_argument("--profile-algo", default="0", help="the algo word --profile launches (e.g. 0x80f0288)")
    ap.add_argument("--sweep-list", default="",
                    help='configs to sweep instead, e.g. "w8s4d1b2,w8s4d2b2c7,w8s4d1b4+1000000" (+HEX: more algo bits)')
    ap.add_argument("--sweep-libs", default="",
                    help="other builds (e.g. wo_alt_lib.sh . nomath.so -DDSX_WO_NOMATH): every swept word timed there too")
    ap.add_argument("--sweep-ms", default="", help="M values swept (default 1,16)")
    ap.add_argument("--ab", default="",
                    help='int4 per channel: time auto, these words (as --sweep-list), --alt-lib and torch interleaved')
    ap.add_argument("--ab-libs", default="",
                    help="other builds (e.g. a -DDSX_WO_NOMATH one): --ab's auto and words also timed there, interleaved")
    ap.add_argument("--ab-rounds", type=int, default=8, help="rounds of --ab's interleaved timing")
    ap.add_argument("--ab-layout", default="4,-1", help="--ab's layout: bits,group (default int4 per channel)")
    ap.add_argument("--ms", default="", help="comma-separated M for int4 per channel (any, e.g. 1,16,32; the other layouts keep their subset of these)")
    args = ap.parse_args()
    if args.profile:
        return profile(*(int(v) for v in args.profile.split("x")), int(args.profile_algo, 0))
    if args.sweep_list or args.ab:
        import re
        for t in (args.sweep_list or args.ab).split(","):
            w, sp, d, b, c, x = re.fullmatch(r"w(\d+)s(\d+)d(\d+)b(\d+)(?:c(\d+))?(?:\+([0-9a-fA-F]+))?",
                                             t.strip()).groups()
            SWEEP_LIST.append((int(w), int(sp), int(c or 0), int(d), int(b), int(x or "0", 16)))
    if args.sweep_ms:
        SWEEP_MS[:] = [int(v) for v in args.sweep_ms.split(",")]
    if args.diag_lib:
        DIAG["fn"] = load_entry(args.diag_lib)
    if args.alt_lib:
        ALT["fn"] = load_entry(args.alt_lib)
    for lib in filter(None, args.sweep_libs.split(",")):
        SWEEP_LIBS[Path(lib).stem] = load_entry(lib)
    for lib in filter(None, args.ab_libs.split(",")):
        AB_LIBS[Path(lib).stem] = load_entry(lib)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    copy_tbps = copy_bandwidth_tbps()
    tables = cuda.device_card() if cuda.tuned_tables() else "off"  # (whose measured table "auto" consults)
    print(json.dumps({"copy_TBps_read_plus_write": copy_tbps, "tables": tables}))
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows, failed, anchors = [], 0, {}
    if args.ab:  # interleaved comparison only (int4 per channel, or --ab-layout)
        ab_bits, ab_group = (int(v) for v in args.ab_layout.split(","))
        words = [(f"w{w}s{sp}d{d}b{b}" + (f"c{c}" if c else "") + (f"+{x:x}" if x else ""),
                  w | sp << 4 | c << 8 | d << 16 | b << 20 | x) for w, sp, c, d, b, x in SWEEP_LIST]
        SWEEP_LIST.clear()
        with open(out / "bench_ab.jsonl", "w") as log:
            for n, k in shapes:
                pb = Problem(n, k, ab_bits, ab_group, rng)
                for m in ([int(t) for t in args.ms.split(",")] if args.ms else [1, 8]):
                    row = ab_row(pb, m, rng, words, args.ab_rounds)
                    log.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
                pb.free_torch()
                del pb
                if torch is not None:
                    torch.cuda.empty_cache()
        return 0
    layouts = LAYOUTS[:1] if args.quick else LAYOUTS
    with open(out / "bench_gemm_weight_only.jsonl", "w") as log:
        for bits, group in layouts:
            for n, k in shapes:
                pb = Problem(n, k, bits, group, rng)
                ms = MS if (bits, group) == (4, -1) else MS_OTHER
                if args.ms:  # int4 per channel: exactly these M (e.g. 32 too); other layouts: a subset
                    want = [int(t) for t in args.ms.split(",")]
                    ms = want if (bits, group) == (4, -1) else [v for v in ms if v in want] or ms
                for m in ms:
                    try:
                        sweep = args.sweep and (bits, group) == (4, -1) and m in SWEEP_MS
                        row = bench_row(pb, m, rng, sweep, anchors)
                    except Exception as exc:  # one bad row must not hide the others
                        row, failed = {"layout": f"int{bits} g{group}", "M": m, "N": n, "K": k, "error": repr(exc)}, 1
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    if "error" in row:
                        print(json.dumps(row))
                    else:
                        rows.append(row)
                        if row.get("rel_diff_vs_anchor", 0) > 2e-2:
                            print(json.dumps(row))
                            failed = 1
                pb.free_torch()
                del pb
                if torch is not None:
                    torch.cuda.empty_cache()
    text = table(rows, copy_tbps)
    (out / "bench_gemm_weight_only.txt").write_text(text + "\n")
    print(f"\ncopy bandwidth (read + write): {copy_tbps and round(copy_tbps, 2)} TB/s; auto's measured table: {tables}")
    print(text)
    return failed


if __name__ == "__main__":
    sys.exit(main())
