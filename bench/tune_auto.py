"""Tune the automatic choice (algo 0) of the weight-only and block FP8 GEMMs at the shapes a deployment
meets (GPU machine).

Each kernel's automatic choice is a set of rules tuned on DeepSeek-V3's tp = 1 shapes; a tensor-parallel
rank multiplies by other ones (N or K divided by tp). This script times, for every weight GEMM shape of
DeepSeek-V3 at tp in --tp (`ds_export.models.deepseek_v3.gemm_shapes`), each M in --ms (and, --kernel wo,
each layout), the automatic choice against candidate words, interleaved (CUDA-graph replays, inputs
rotated past L2), then confirms each winner that beats auto by more than --gain at both ends of its row
range (more rounds, torch beside as the anchor), and writes the confirmed words as the C table the
automatic choice consults first on GPUs with the SM count it was measured on:

    --kernel wo:  bench/gpu_gemm_weight_only.py's ab_row, 22 words of the warp-specialized kernel
                  (CANDIDATES), layouts --layouts; table csrc/cuda/gemm_weight_only_tuned.inc
    --kernel fp8: every non-PDL variant of bench/gpu_kernels.py's TUNE_SMALL and TUNE_LARGE (the small-M
                  kernel's knobs, CUTLASS pingpong, swap-AB and cooperative, the persistent large-M
                  kernel's tiles); table csrc/cuda/gemm_fp8_tuned.inc

    python bench/tune_auto.py --kernel wo|fp8 --out DIR [--tp 1,2,4,8] [--ms ...] [--layouts 4,-1/8,128]
    python bench/tune_auto.py --kernel wo|fp8 --emit DIR/tune.jsonl [...] [--card h100] > csrc/cuda/<its table>
    python bench/tune_auto.py --kernel wo --emit TABLE.inc DIR/tune.jsonl ... --slower DIR/ab.log ... (rows an A/B
                  of TABLE against the new words timed slower keep TABLE's word)
    python bench/tune_auto.py --kernel wo|fp8 --changed OLD.inc NEW.inc      (the rows an A/B of the two must time)
    python bench/tune_auto.py --ab-summary DIR/ab.log      (an A/B's sums and the rows that moved over 2%)

The first form measures (DIR/tune.jsonl: every sweep and confirmation row); the second, anywhere, turns
confirmed rows into the table. The measuring form runs with DSX_TUNED_TABLES=0, so that "auto" is the
rules alone whatever table the library was built with. Row ranges: each M of --ms stands for the rows
above the previous M up to it (wo default 1 | 2..4 | 5..8 | 9..16, the shipped table measured at every
row, --ms 1,2,...,16 per layout, ~140 s for the four; fp8 1..16 | 17..32 | 33..64 | 65..128), confirmed
at both ends; where a winner held at one end only, the table gets that one row (a row an M stands for without
timing it keeps an earlier entry timed at that very row: emit_table). --emit reads the files
in order, a later one deciding the rows it swept (emit_table); a table (.inc) may stand first for the
files it was emitted from. Rows 17..32 (four token tiles a launch
since the twenty-second session) are swept on their own: --ms 17,20,24,28,32 --rows-from 17, with the
words of CANDIDATES_WIDE (one channel tile a warp), against the rules there; so are rows 33..64 (one launch of
eight token tiles through wgmma, CANDIDATES_WG, e.g. --ms 40,48,56,64 --rows-from 33; the automatic choice
consults the table there since the forty-fifth session, plan_launch). Every shape and layout is
tabled where a word was confirmed, the shapes the rules were tuned on too (the GPU tests of the rules run with the tables off,
native.cuda.rules_only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# candidate words: w{warps}s{splits}d{ring slots}b{steps a slot}[c{chunk}]+{bits 28..30: warp-specialized, tiles a
# warp}; a chunk equal to the steps a slot (and shorter than the slice): x through the ring (9..16 rows, int4 per
# channel and group 128, two tiles a warp; elsewhere the word is refused and the sweep skips it); a chunk that holds
# the whole slice (short K, e.g. 512 at 4 splits) stages x whole, at any rows, as the automatic chunk does
ONE, TWO, FOUR = 0x10000000, 0x30000000, 0x50000000
CANDIDATES = (
    [(8, s, 2, 2, ONE) for s in (2, 4, 8)] + [(4, s, 2, 2, ONE) for s in (4, 8)] + [(8, 4, 4, 1, ONE), (8, 8, 4, 1, ONE)]
    + [(8, s, 2, 2, TWO) for s in (1, 2, 4, 8)] + [(4, 8, 2, 2, TWO), (8, 4, 4, 1, TWO)]
    # (two tiles with 2 one-step slots: at 4 splits the only two-tile 4-split ring that leaves 36864x7168 two
    # blocks an SM at 12..16 rows, where x's 14-step slice takes 44-58 KB, with 2 x 2 or 4 x 1 slots 122-140 KB;
    # at 8 splits the rules' 2 x 2 ring leaves one block an SM at 16 rows on 2048x7168 int4 / int8 group 128
    # (116.1 KB, 2.6 KB over) and int8 7168x9216 (119.9 KB), two with one-step slots)
    + [(8, s, 2, 1, TWO) for s in (4, 8)]
    + [(8, s, 2, 1, FOUR) for s in (2, 4, 8)] + [(8, s, 2, 2, FOUR) for s in (4, 8)]
    + [(0, 0, 2, 2, ONE), (0, 0, 2, 2, TWO)]
    # (x through the ring, twenty-seventh session: 4 splits with 2 x 2 slots keep two blocks an SM at 11..16 rows;
    # its copies by TMA since the twenty-eighth, and more rings and block sizes: one-step slots; 6 and 4 warps with
    # deeper rings or three blocks an SM, and 7 warps, whose tile groups fill the resident clusters' rounds
    # more evenly on 36864x7168 (192 or 288 groups for 66 or 99 clusters of 4, where 8 warps' 144 take 2.18 rounds)
    # and 7168x18432 (32 groups x 8 splits for 264 blocks))
    + [(8, 4, 2, 2, TWO, 2), (8, 4, 4, 1, TWO, 1), (8, 2, 2, 2, TWO, 2), (8, 8, 2, 2, TWO, 2)]
    + [(8, 8, 4, 1, TWO, 1), (6, 4, 3, 2, TWO, 2), (4, 4, 4, 2, TWO, 2), (8, 4, 3, 1, TWO, 1)]
    + [(4, 4, 2, 2, TWO, 2), (7, 8, 2, 2, TWO, 2), (6, 8, 3, 2, TWO, 2)]
)
# 17..32 rows (four token tiles; one channel tile a warp: the tiles bits are ignored there)
CANDIDATES_WIDE = (
    [(8, s, d, b, ONE) for s in (2, 4, 8) for d, b in ((4, 1), (2, 2), (2, 1))]
    + [(4, s, 4, 1, ONE) for s in (4, 8)] + [(0, 0, 4, 1, ONE), (0, 0, 2, 2, ONE)]
)
# 33..64 rows (one launch of eight token tiles through wgmma: bits 28..29, one channel tile a warp, 4 or 8 warps, x for
# all the rows staged whole, so a split whose slice of x fits; the others are refused and not timed). The rules there
# cut at 32 rows, run two grid parts, or take one launch with 2 slots of 2 steps (1 step per channel where only that
# keeps two blocks an SM: ws_wide_rule); the automatic warps and split with deeper rings of 1 step, and given ones
BANDS = ((1, 16), (17, 32), (33, 64))
CANDIDATES_WG = (
    [(w, s, 2, b, TWO) for w in (4, 8) for s in (2, 4, 8) for b in (1, 2)]
    + [(0, 0, 2, 1, TWO), (0, 0, 2, 2, TWO), (0, 0, 3, 1, TWO), (0, 0, 4, 1, TWO)]
)


def band_candidates(ms: list[int], rows_from: int) -> tuple:
    """The candidate words of the row band (1..16, 17..32 or 33..64) that --ms and --rows-from lie in: one band a
    run, since each is a kind of launch of its own (a table range never crosses one)."""
    for (lo, hi), cands in zip(BANDS, (CANDIDATES, CANDIDATES_WIDE, CANDIDATES_WG)):
        if lo <= rows_from <= min(ms) and max(ms) <= hi:
            return cands
    raise SystemExit(f"--kernel wo: --ms {','.join(map(str, ms))} from row {rows_from} is not inside one of the row bands "
                     f"{', '.join(f'{lo}..{hi}' for lo, hi in BANDS)} (sweep each on its own, --rows-from its first row)")


def word_name(w, s, d, b, x, c=0) -> str:
    return f"w{w}s{s}d{d}b{b}" + (f"c{c}" if c else "") + f"+{x:x}"


def word_value(w, s, d, b, x, c=0) -> int:
    return w | s << 4 | c << 8 | d << 16 | b << 20 | x


def ranges(ms: list[int], first: int = 1) -> dict[int, tuple[int, int]]:
    """M -> (first row, last row) of the rows it stands for (from row `first`)."""
    out, lo = {}, first
    for m in sorted(ms):
        out[m] = (lo, m)
        lo = m + 1
    return out


def deployment_shapes(args) -> dict[tuple[int, int], list[str]]:
    """(N, K) -> the GEMMs ("name@tpT") of DeepSeek-V3 at the degrees of --tp (--shapes: only those)."""
    from ds_export.models import deepseek_v3 as ds
    from ds_export.tiny import REAL_CONFIG

    cfg = ds.DeepseekV3Config.from_dict(REAL_CONFIG)
    shapes: dict[tuple[int, int], list[str]] = {}
    for tp in (int(t) for t in args.tp.split(",")):
        for shape, names in ds.gemm_shapes(cfg, tp).items():
            shapes.setdefault(shape, []).extend(f"{n}@tp{tp}" for n in names)
    if args.shapes:
        keep = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")}
        shapes = {s: v for s, v in shapes.items() if s in keep}
    return dict(sorted(shapes.items()))


class Log:
    """DIR/tune.jsonl, appended, each row also printed."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.f = open(out / "tune.jsonl", "a")

    def __call__(self, row: dict) -> None:
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()
        print(json.dumps(row), flush=True)


def sweep_and_confirm(log, key, names, ms, time_at, candidates, args, kernel):
    """For each M: time auto and every candidate (time_at(m, words, rounds, anchor) -> {name: us}), and
    confirm a winner more than --gain faster at both ends of its row range (kept if more than --keep)."""
    span = ranges(ms, args.rows_from)
    for m in ms:
        t = time_at(m, candidates, args.rounds, False)
        auto = t.pop("auto")
        best = min(t.items(), key=lambda kv: kv[1]) if t else None
        log({"kind": "sweep", "kernel": kernel, "key": key, "M": m, "names": names, "us_auto": auto,
             **{f"us_{k}": v for k, v in t.items()}, "best": best and best[0], "best_us": best and best[1]})
        if not best or best[1] >= (1 - args.gain) * auto:
            continue
        lo, hi = span[m]
        at, ok = {}, True
        for r in sorted({lo, hi}):
            c = time_at(r, {best[0]: candidates[best[0]]}, args.confirm_rounds, True)
            at[str(r)] = {f"us_{k}": v for k, v in c.items()}
            # (a word the end refuses, e.g. x for more rows than fit, is not confirmed there: no entry, no crash)
            ok = ok and best[0] in c and c[best[0]] < (1 - args.keep) * c["auto"]
        log({"kind": "confirm", "kernel": kernel, "key": key, "rows": [lo, hi], "word": best[0],
             "value": candidates[best[0]], "taken": ok, "names": names, "at": at})


def measure_wo(args, log) -> None:
    import gpu_gemm_weight_only as B

    ms = [int(m) for m in args.ms.split(",")]
    words = {word_name(*c): word_value(*c) for c in band_candidates(ms, args.rows_from)}
    rng = np.random.default_rng(0)
    torch_mod = B.torch
    for lay in args.layouts.split("/"):
        bits, group = (int(v) for v in lay.split(","))
        for (n, k), names in deployment_shapes(args).items():
            pb = B.Problem(n, k, bits, group, rng)

            def time_at(m, cands, rounds, anchor, pb=pb):
                row = B.ab_row(pb, m, rng, list(cands.items()), rounds, anchor=anchor)
                return {kk[3:]: v for kk, v in row.items() if kk.startswith("us_")}

            sweep_and_confirm(log, [bits, group, n, k], names, ms, time_at, words, args, "wo")
            pb.free_torch()
            del pb
            if torch_mod is not None:
                torch_mod.cuda.empty_cache()


def fp8_words() -> dict[str, int]:
    """bench/gpu_kernels.py's small-M and large-M variants without programmatic dependent launch (a launch
    mode, not a configuration: the automatic choice keeps the caller's); the large-M kernels because at 128
    rows cuBLAS beats every small-M variant at some tp shapes."""
    import gpu_kernels as GK

    return {name: a for name, a in {**GK.TUNE_SMALL, **GK.TUNE_LARGE}.items() if a and not a & GK.PDL}


def measure_fp8(args, log) -> None:
    import gpu_kernels as GK
    from ds_export.native import cuda
    from ds_export.native import kernels as K

    words = fp8_words()
    rng = np.random.default_rng(0)
    for (n, k), names in deployment_shapes(args).items():
        kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
        # the weights once per shape (as many sets as rotate them past L2), the activations per M
        wsets = [(cuda.to_device(GK.fp8_bytes(rng, (n, k))),
                  cuda.to_device(rng.uniform(5e-3, 2e-2, (nb, kb)).astype(np.float32)))
                 for _ in range(GK.n_sets(n * k + 4 * nb * kb))]

        def time_at(m, cands, rounds, anchor, n=n, k=k, kb=kb, wsets=wsets):
            dev = [(cuda.to_device(GK.fp8_bytes(rng, (m, k))),
                    cuda.to_device(rng.uniform(5e-3, 2e-2, (m, kb)).astype(np.float32))) + w for w in wsets]
            out = cuda.empty((m, n), np.uint16)
            # (a variant that does not take this shape is not timed)
            samplers = GK.fp8_samplers(dev, out, {"auto": 0, **cands}, k, skip_refused=True)[0]
            calls = GK.anchor_calls([[x.numpy() for x in d] for d in dev]) if anchor else None
            if calls:
                samplers["torch"] = GK.torch_sampler(calls)
            return {name: round(us, 2) for name, us in GK.interleaved(samplers, rounds=rounds).items()}

        sweep_and_confirm(log, [n, k], names, [int(m) for m in args.ms.split(",")], time_at, words, args, "fp8")


def measure(args) -> int:
    # "auto" must be the rules alone (read at the library's first automatic launch): with the tables on it
    # would already run their words, and a re-run would find nothing to confirm where they apply
    os.environ["DSX_TUNED_TABLES"] = "0"
    log = Log(Path(args.out))
    sms = None
    try:
        import torch
        sms = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001 - the SM count is only recorded
        pass
    log({"meta": True, "kernel": args.kernel, "date": datetime.date.today().isoformat(), "sms": sms,
         "tp": args.tp, "ms": args.ms, "layouts": args.layouts if args.kernel == "wo" else None,
         "gain": args.gain, "keep": args.keep, "rows_from": args.rows_from, "tables": "off"})
    (measure_wo if args.kernel == "wo" else measure_fp8)(args, log)
    return 0


ROOT = Path(__file__).resolve().parents[1]
TABLES = {"wo": ROOT / "csrc" / "cuda" / "gemm_weight_only_tuned.inc", "fp8": ROOT / "csrc" / "cuda" / "gemm_fp8_tuned.inc"}
# the cards a table is measured on (csrc/cuda/tuned_card.cuh's kCards): the H200's tables above, and the other
# cards' tables each kernel has (a launch on a card without its own table uses the H200's)
CARDS = {"h200": "H200 (132 SMs)", "h100": "H100 SXM (132 SMs)"}
CARD_TABLES = {("wo", "h200"): TABLES["wo"], ("fp8", "h200"): TABLES["fp8"],
               ("wo", "h100"): ROOT / "csrc" / "cuda" / "gemm_weight_only_tuned_h100.inc",
               ("fp8", "h100"): ROOT / "csrc" / "cuda" / "gemm_fp8_tuned_h100.inc"}
COLUMNS = {"wo": "{bits, group, N, K, first row, last row, algo word}", "fp8": "{N, K, first M, last M, algo word}"}
WHAT = {"wo": "the weight-only GEMM's", "fp8": "the block FP8 GEMM's"}


def _row_key(r: dict) -> tuple:
    if "key" in r:
        return tuple(r["key"])
    return tuple(r.get(f) for f in ("bits", "group", "N", "K"))  # (rows written before "key")


# a line of bench/wo_ab.sh's output: layout, shape, row, the new build's and the old build's median us
_AB_LINE = re.compile(r"^(\d+)/(-?\d+) (\d+)x(\d+) M=\s*(\d+) new\s+([\d.]+) old\s+([\d.]+)")


def ab_rows(path: str) -> list[tuple[tuple[int, ...], float, float]]:
    """The rows an A/B of two weight-only builds timed (bench/wo_ab.sh's lines, as bench/wo_retune.sh's ab.log keeps
    them), in order: ((bits, group, N, K, M), new us, old us); the log's other lines are skipped."""
    return [(tuple(int(v) for v in m.groups()[:5]), float(m[6]), float(m[7]))
            for m in map(_AB_LINE.match, Path(path).read_text().splitlines()) if m]


def ab_slower_rows(path: str, margin: float = 0.02) -> set[tuple[int, ...]]:
    """The rows (bits, group, N, K, M) that an A/B's log timed more than `margin` slower with the new build."""
    return {row for row, new, old in ab_rows(path) if new > (1 + margin) * old}


# the same line's output check (bench/gpu_gemm_weight_only.py's ab_row, since the sixty-first session): each build's
# largest difference from torch's output, in units of torch's rms ("nan": a NaN in the output; "-": not checked)
_AB_ERR = re.compile(r" err new (\S+) old (\S+)")
# a new build's output is off where its error is NaN, or over both this floor and twice the old build's (bf16
# rounding of a right output leaves a few hundredths; a wrong tile or a lost split sum, the order of 1)
ERR_FLOOR, ERR_FACTOR = 0.1, 2.0


def _err(v: str) -> float | None:
    return None if v == "-" else math.inf if v == "nan" else float(v)


def ab_errors(path: str) -> dict[tuple[int, ...], tuple[float, float | None]]:
    """{(bits, group, N, K, M): (the new build's error, the old build's)} of the rows whose outputs an A/B's log
    checked (its lines with "err new E old E"; NaN as inf)."""
    errs = {}
    for line in Path(path).read_text().splitlines():
        m, e = _AB_LINE.match(line), _AB_ERR.search(line)
        if m and e and _err(e[1]) is not None:
            errs[tuple(int(v) for v in m.groups()[:5])] = (_err(e[1]), _err(e[2]))
    return errs


def _off(new: float, old: float | None) -> bool:
    """A new output's error off: NaN (read as inf), or over ERR_FLOOR and ERR_FACTOR times the old build's (taken as
    0 where the old one was not checked, or NaN)."""
    base = old if old is not None and math.isfinite(old) else 0.0
    return new > max(ERR_FLOOR, ERR_FACTOR * base)


def ab_wrong_rows(path: str) -> set[tuple[int, ...]]:
    """The rows whose new output an A/B's log found off (_off)."""
    return {row for row, e in ab_errors(path).items() if _off(*e)}


def print_ab_summary(path: str) -> int:
    """--ab-summary AB_LOG: the rows' sums, old -> new, the rows that moved more than 2% either way, and (where the
    log checked outputs) the largest errors and the rows whose new output is off."""
    rows = ab_rows(path)
    if rows:
        new, old = sum(r[1] for r in rows), sum(r[2] for r in rows)
        def moved(f):
            return ", ".join(f"{r[2]}x{r[3]} M={r[4]} {o} -> {n}" for r, n, o in rows if f(n / o)) or "-"
        print(f"A/B: {len(rows)} rows, old {old:.2f} -> new {new:.2f} us summed ({100 * (new / old - 1):+.1f}%)")
        print(f"  over 2% faster: {moved(lambda r: r < 0.98)}")
        print(f"  over 2% slower: {moved(lambda r: r > 1.02)}")
    errs = ab_errors(path)
    if errs:
        def shown(v):
            return "nan" if v == math.inf else f"{v:g}"

        def worst(i):
            vals = [e[i] for e in errs.values() if e[i] is not None]
            return shown(max(vals)) if vals else "-"
        wrong = [r for r, e in errs.items() if _off(*e)]
        print(f"  outputs checked: {len(errs)} rows, largest error new {worst(0)} / old {worst(1)} (torch's rms); "
              "off: " + (", ".join(f"{r[2]}x{r[3]} M={r[4]} {shown(errs[r][0])}" for r in sorted(wrong)) or "-"))
    return 0


def emit_table(paths: list[str], kernel: str = "wo", out=sys.stdout, card: str = "h200",
               slower: list[str] = ()) -> int:
    """The confirmed words of `kernel` in the given tune.jsonl files as its table for `card` (to `out`).

    A later file decides the rows it measured: its confirmed words replace what the files before it said of
    those rows, and an earlier entry of a row it swept stays only if that sweep still timed the entry's word
    more than the later run's --keep faster than the rules (a later run confirms only winners over --gain,
    so an earlier 2.5-4% word would otherwise be lost to a sweep that found it again); a confirmed word replaces
    such an entry only where the sweep timed it --keep faster than the entry's word too (fifty-eighth session: the
    H100's sweep over the H200's table swapped words the sweep timed within 1% of each other, and the H100 ran
    16x36864x7168 2% slower for it). Rows a file did not
    sweep keep what earlier files said, and so does a row a file's sweep stands for without timing it (a row
    between two of its --ms) where the earlier entry was timed at that very row (forty-eighth session: a sweep
    at 1, 2, 4, 6, 8 rows took group 64's row 5 at 7168x18432 back to the rules, 27.7 -> 44.1 us).
    `slower`: A/B logs of the first file (a table) against a build of what the files decide (bench/wo_retune.sh's
    ab.log); a row they timed over 2% slower keeps the first table's word (the rules where it has none): the
    sweep and the A/B measure apart, and where they disagree the table a deployment runs stays (fifty-ninth
    session: 13 of 115 rows of the H100's int4 per-channel re-sweep, 7168x256 M = 8 4.47 -> 4.72 us); so does a row
    whose new output they found off (ab_wrong_rows)."""
    taken, meta = {}, []  # (key..., row) -> (value, word, {row: times} where measured)
    first_table: dict | None = None  # the first file's rows, where it is a table
    for p in paths:
        if p.endswith(".inc"):  # a table written before: its entries, as if confirmed by a file before the next
            dates, entries = read_table_entries(Path(p))
            meta += [{"date": d} for d in dates]
            for key, lo, hi, value, word, at in entries:
                if not word:
                    raise ValueError(f"{p}: an entry without its word: {key + (lo, hi)}")
                for row in range(lo, hi + 1):
                    taken[key + (row,)] = (value, word, {k: v for k, v in at.items() if int(k) == row})
            if first_table is None:
                first_table = dict(taken)
            continue
        if first_table is None:
            first_table = {}
        with open(p) as fh:
            rows = [r for r in map(json.loads, fh) if r.get("kernel", "wo") == kernel]
        run = next((r for r in rows if r.get("meta")), {})
        keep, first = run.get("keep", 0.025), run.get("rows_from", 1)
        meta += [r for r in rows if r.get("meta")]
        swept: dict[tuple, dict[int, dict]] = {}
        at_row: dict[tuple, dict] = {}  # (key..., row) -> the sweep that stands for the row
        for r in rows:
            if r.get("kind") == "sweep":
                swept.setdefault(_row_key(r), {})[int(r["M"])] = r
            elif r.get("kind") == "confirm":  # (a confirm's ends were swept: at least its upper one)
                swept.setdefault(_row_key(r), {}).setdefault(int(r["rows"][1]), {})
        for key, at_m in swept.items():
            span = ranges(sorted(at_m), first)
            for m, sw in at_m.items():
                for row in range(span[m][0], span[m][1] + 1):
                    at_row[key + (row,)] = sw
                    if row != m and str(row) in (taken.get(key + (row,)) or (0, 0, {}))[2]:
                        continue  # timed at this very row before, and not by this sweep: that word stays
                    old = taken.pop(key + (row,), None)
                    t = sw.get(f"us_{old[1]}") if old else None
                    if t is not None and sw.get("us_auto") and t < (1 - keep) * sw["us_auto"]:
                        taken[key + (row,)] = (old[0], old[1], {str(m): {"us_auto": sw["us_auto"], f"us_{old[1]}": t}}
                                               if row == m else {})

        def take(full: tuple, r: dict) -> None:
            old, sw = taken.get(full), at_row.get(full, {})
            t_old, t_new = (sw.get(f"us_{old[1]}"), sw.get(f"us_{r['word']}")) if old else (None, None)
            if t_old is not None and t_new is not None and t_new >= (1 - keep) * t_old:
                return  # an earlier word the sweep timed about as fast stays (a switch needs evidence)
            taken[full] = (r["value"], r["word"], {k: v for k, v in r["at"].items() if int(k) == full[-1]})

        for r in rows:
            if r.get("kind") != "confirm":
                continue
            key = _row_key(r)
            lo, hi = r["rows"]
            if r["taken"]:
                for row in range(lo, hi + 1):
                    take(key + (row,), r)
                continue
            # not confirmed over its range: an end where the word held by itself is an entry of that row
            # alone (the rules' cliffs: int8 group 128 7168x9216 at 7..8 rows, auto 23.67 / 34.06 us)
            for row, v in r["at"].items():
                if v.get(f"us_{r['word']}", float("inf")) < (1 - keep) * v["us_auto"]:
                    take(key + (int(row),), r)
    if slower and kernel != "wo":
        raise ValueError("--slower reads bench/wo_ab.sh's lines: --kernel wo only")
    if slower and not paths[0].endswith(".inc"):
        raise ValueError("--slower: the A/B's old table must come first among the --emit files")
    for full in set().union(*(ab_slower_rows(p) | ab_wrong_rows(p) for p in slower)):
        if full in first_table:
            taken[full] = first_table[full]
        else:
            taken.pop(full, None)
    # adjacent rows of one key with the same word become one entry
    entries = []
    for full in sorted(taken):
        key, row = full[:-1], full[-1]
        value, word, at = taken[full]
        prev = entries[-1] if entries else None
        if prev and prev[0] == key and prev[2] + 1 == row and prev[3] == value:
            entries[-1] = (key, prev[1], row, value, word, {**prev[5], **at})
        else:
            entries.append((key, row, row, value, word, dict(at)))
    dates = sorted({m["date"] for m in meta})
    print(f"// Generated by bench/tune_auto.py --kernel {kernel} --emit (do not edit by hand): {WHAT[kernel]} measured", file=out)
    print(f"// automatic choice at DeepSeek-V3's tensor-parallel shapes, {CARDS[card]}, {', '.join(dates) or '-'}.", file=out)
    print(f"// {COLUMNS[kernel]}, then the rules' / the word's median us at the", file=out)
    print("// range's ends in the confirmation run (interleaved, same process).", file=out)
    for key, lo, hi, value, word, at in entries:
        times = ", ".join(f"M={r} {v['us_auto']} -> {v[f'us_{word}']}" for r, v in sorted(at.items(), key=lambda kv: int(kv[0])))
        print("{" + ", ".join(str(v) for v in key) + f", {lo}, {hi}, {value:#x}}},  // {word}: {times}", file=out)
    return 0


_ENTRY = re.compile(r"^\{((?:-?\d+, )+)(0x[0-9a-f]+)\},")


_DATES = re.compile(r"tensor-parallel shapes, .* \(\d+ SMs\), (.*)\.$")
_TIMES = re.compile(r"M=(\d+) (\S+) -> (\S+?)(?:,|$)")


def read_table_entries(path: Path) -> tuple[list[str], list[tuple]]:
    """A table this script wrote, whole: its measurement dates and its entries as emit_table holds them
    (key, first, last, value, word, {row: {"us_auto": t, "us_<word>": t}}; word "" where the comment is
    missing), so that a table can stand for the tune logs it came from (`--emit TABLE.inc new.jsonl`: the new
    sweep decides the rows it swept)."""
    dates: list[str] = []
    entries = []
    for line in path.read_text().splitlines():
        m = _DATES.search(line)
        if line.startswith("//") and m:
            dates = [d for d in m.group(1).split(", ") if d != "-"]
        if not line.startswith("{"):
            continue
        e = _ENTRY.match(line)
        if not e:
            raise ValueError(f"{path}: not a table entry: {line!r}")
        word, _, times = line.partition("  // ")[2].partition(": ")
        cols = [int(v) for v in e.group(1).rstrip(", ").split(", ")]
        at = {r: {"us_auto": json.loads(a), f"us_{word}": json.loads(b)} for r, a, b in _TIMES.findall(times)}
        entries.append((tuple(cols[:-2]), cols[-2], cols[-1], int(e.group(2), 16), word, at))
    return dates, entries


def read_table(path: Path = TABLES["wo"]) -> list[tuple[int, ...]]:
    """The entries of a table this script wrote: tuples of its columns (COLUMNS)."""
    return [key + (lo, hi, value) for key, lo, hi, value, _, _ in read_table_entries(path)[1]]


# the weight-only layouts the table holds (the default of --layouts; tests/test_tuned_tables.py checks the table by it)
WO_LAYOUTS = ((4, -1), (4, 128), (4, 64), (8, -1), (8, 128))

# rows an A/B of two fp8 tables times where their words differ: the ends of the sweep's default row ranges
FP8_AB_ROWS = (1, 16, 17, 32, 33, 64, 65, 128)


def changed_rows(old: Path, new: Path, kernel: str = "wo") -> list[tuple[tuple, list[int]]]:
    """Where two tables of `kernel` choose differently: (key, rows) for each key with a row whose word (an entry's
    value, or the rules where a table has none) differs, keys and rows ascending. Weight-only: every such row;
    fp8: those of FP8_AB_ROWS (its tables hold rows up to 128). What an A/B of the two tables' builds has to time:
    an A/B at a few fixed shapes misses most of a re-tune (the forty-first session's int8 tables: a tie at its five
    shapes, -5..+3% at the 66 rows whose words changed)."""
    def words(path: Path) -> dict[tuple, int]:
        return {key + (row,): value for key, lo, hi, value, _, _ in read_table_entries(path)[1] for row in range(lo, hi + 1)}
    a, b = words(old), words(new)
    out: dict[tuple, list[int]] = {}
    for full in sorted(set(a) | set(b)):
        if a.get(full) != b.get(full) and (kernel == "wo" or full[-1] in FP8_AB_ROWS):
            out.setdefault(full[:-1], []).append(full[-1])
    return list(out.items())


def print_changed(old: str, new: str, kernel: str) -> int:
    """--changed OLD NEW: one line a key, "bits,group NxK m,m,..." (wo: wo_ab.sh's LAYOUT, SHAPES and MS) or
    "NxK m,m,..." (fp8), then a last line "# keys rows"."""
    rows = changed_rows(Path(old), Path(new), kernel)
    for key, ms in rows:
        layout = f"{key[0]},{key[1]} " if kernel == "wo" else ""
        print(f"{layout}{key[-2]}x{key[-1]} {','.join(map(str, ms))}")
    print(f"# {len(rows)} {sum(len(ms) for _, ms in rows)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", choices=("wo", "fp8"), default="wo")
    ap.add_argument("--out", default="out/tune")
    ap.add_argument("--tp", default="1,2,4,8", help="tensor-parallel degrees whose shapes are tuned")
    ap.add_argument("--shapes", default="", help="only these NxK (comma-separated) of those")
    ap.add_argument("--layouts", default="/".join(f"{b},{g}" for b, g in WO_LAYOUTS),
                    help="--kernel wo: bits,group pairs separated by /")
    ap.add_argument("--ms", default=None, help="M values (default wo 1,4,8,16; fp8 16,32,64,128)")
    ap.add_argument("--rows-from", type=int, default=1, help="the first row the smallest of --ms stands for")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the sweep")
    ap.add_argument("--confirm-rounds", type=int, default=8)
    ap.add_argument("--gain", type=float, default=0.04, help="a sweep winner is confirmed if this much faster than auto")
    ap.add_argument("--keep", type=float, default=0.025, help="and taken if this much faster at both ends of its rows")
    ap.add_argument("--emit", nargs="+", metavar="TUNE_JSONL", help="write the table from these measurements instead (a .inc table may come first)")
    ap.add_argument("--card", choices=sorted(CARDS), default="h200",
                    help="--emit: the card the measurements were made on (its table: CARD_TABLES)")
    ap.add_argument("--slower", nargs="+", default=[], metavar="AB_LOG",
                    help="--emit: rows these A/B logs timed over 2%% slower, or found the new output off, keep the "
                         "first (.inc) file's word")
    ap.add_argument("--ab-summary", metavar="AB_LOG", help="sum an A/B log of bench/wo_ab.sh's lines")
    ap.add_argument("--changed", nargs=2, metavar=("OLD_INC", "NEW_INC"), help="print the rows where two tables' words differ")
    args = ap.parse_args()
    if args.changed:
        return print_changed(*args.changed, args.kernel)
    if args.ab_summary:
        return print_ab_summary(args.ab_summary)
    if args.emit:
        try:
            return emit_table(args.emit, args.kernel, card=args.card, slower=args.slower)
        except ValueError as e:  # (a file that is not what --emit reads: one line, no table written)
            sys.exit(f"tune_auto --emit: {e}")
    args.ms = args.ms or ("1,4,8,16" if args.kernel == "wo" else "16,32,64,128")
    if args.kernel == "wo":  # (refused before any GPU work)
        band_candidates([int(m) for m in args.ms.split(",")], args.rows_from)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
