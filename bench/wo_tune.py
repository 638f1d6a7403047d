"""Tune the weight-only GEMM's automatic choice at the shapes a deployment meets (GPU machine).

The automatic choice (algo 0) of `dsx_wo_gemm_bf16_nt_cuda` is a set of rules tuned on six DeepSeek-V3
shapes; a tensor-parallel rank multiplies by other ones (N or K divided by tp). This script times, for
every weight GEMM shape of DeepSeek-V3 at tp in --tp (`ds_export.models.deepseek_v3.gemm_shapes`), each
layout and each M in --ms, the automatic config against the candidate words below, interleaved
(bench/gpu_gemm_weight_only.py's ab_row: CUDA-graph replays, weights rotated past L2), then confirms each
winner that beats auto by more than --gain at both ends of its row range (more rounds, torch's bf16 matmul
timed beside), and writes the confirmed words as the C++ table the automatic choice consults first
(csrc/cuda/gemm_weight_only_tuned.inc, used on GPUs with the SM count it was measured on).

    python bench/wo_tune.py --out DIR [--tp 1,2,4,8] [--layouts 4,-1/4,128/8,-1/8,128] [--ms 1,4,8,12,16]
    python bench/wo_tune.py --emit DIR/tune.jsonl [DIR2/tune.jsonl ...] > csrc/cuda/gemm_weight_only_tuned.inc

The first form measures (DIR/tune.jsonl: every sweep and confirmation row); the second, anywhere, turns
confirmed rows into the table. Row ranges: M in --ms stands for the rows above the previous M up to it
(1 | 2..4 | 5..8 | 9..12 | 13..16), confirmed at both ends.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# candidate words: w{warps}s{splits}d{ring slots}b{steps a slot}+{bits 28..30: warp-specialized, tiles a warp}
ONE, TWO, FOUR = 0x10000000, 0x30000000, 0x50000000
CANDIDATES = (
    [(8, s, 2, 2, ONE) for s in (2, 4, 8)] + [(4, s, 2, 2, ONE) for s in (4, 8)] + [(8, 4, 4, 1, ONE), (8, 8, 4, 1, ONE)]
    + [(8, s, 2, 2, TWO) for s in (1, 2, 4, 8)] + [(4, 8, 2, 2, TWO), (8, 4, 4, 1, TWO)]
    + [(8, s, 2, 1, FOUR) for s in (2, 4, 8)]
    + [(0, 0, 2, 2, ONE), (0, 0, 2, 2, TWO)]
)


def word_name(w, s, d, b, x) -> str:
    return f"w{w}s{s}d{d}b{b}+{x:x}"


def word_value(w, s, d, b, x) -> int:
    return w | s << 4 | d << 16 | b << 20 | x


def ranges(ms: list[int]) -> dict[int, tuple[int, int]]:
    """M -> (first row, last row) of the rows it stands for."""
    out, lo = {}, 1
    for m in sorted(ms):
        out[m] = (lo, m)
        lo = m + 1
    return out


def measure(args) -> int:
    from ds_export.models import deepseek_v3 as ds
    from ds_export.tiny import REAL_CONFIG
    import gpu_gemm_weight_only as B

    cfg = ds.DeepseekV3Config.from_dict(REAL_CONFIG)
    shapes: dict[tuple[int, int], list[str]] = {}
    for tp in (int(t) for t in args.tp.split(",")):
        for shape, names in ds.gemm_shapes(cfg, tp).items():
            shapes.setdefault(shape, []).extend(f"{n}@tp{tp}" for n in names)
    if args.shapes:
        keep = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")}
        shapes = {s: v for s, v in shapes.items() if s in keep}
    ms = [int(m) for m in args.ms.split(",")]
    span = ranges(ms)
    words = [(word_name(*c), word_value(*c)) for c in CANDIDATES]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    torch_mod = B.torch
    sms = torch_mod.cuda.get_device_properties(0).multi_processor_count if torch_mod is not None else None
    with open(out / "tune.jsonl", "a") as log:
        def emit(row):
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)

        emit({"meta": True, "date": datetime.date.today().isoformat(), "sms": sms,
              "layouts": args.layouts, "ms": ms, "gain": args.gain})
        for lay in args.layouts.split("/"):
            bits, group = (int(v) for v in lay.split(","))
            for (n, k), names in sorted(shapes.items()):
                pb = B.Problem(n, k, bits, group, rng)
                for m in ms:
                    # (the sweep: ours only; torch's anchor in the confirmation)
                    row = B.ab_row(pb, m, rng, words, args.rounds, anchor=False)
                    timed = {kk[3:]: v for kk, v in row.items() if kk.startswith("us_") and kk != "us_auto"}
                    best = min(timed.items(), key=lambda kv: kv[1]) if timed else None
                    row.update({"kind": "sweep", "names": names, "best": best and best[0], "best_us": best and best[1]})
                    emit(row)
                    if not best or best[1] >= (1 - args.gain) * row["us_auto"]:
                        continue
                    value = dict(words)[best[0]]
                    lo, hi = span[m]
                    ok, conf = True, {}
                    for r in sorted({lo, hi}):
                        c = B.ab_row(pb, r, rng, [(best[0], value)], args.confirm_rounds)
                        conf[r] = c
                        ok = ok and c[f"us_{best[0]}"] < (1 - args.keep) * c["us_auto"]
                    emit({"kind": "confirm", "bits": bits, "group": group, "N": n, "K": k, "rows": [lo, hi],
                          "word": best[0], "value": value, "taken": ok, "names": names,
                          "at": {str(r): {kk: v for kk, v in c.items() if kk.startswith(("us_", "x_"))} for r, c in conf.items()},
                          "config_auto": {str(r): c["config"] for r, c in conf.items()}})
                pb.free_torch()
                del pb
                if torch_mod is not None:
                    torch_mod.cuda.empty_cache()
    return 0


# The six shapes the rules were tuned on, with interleaved A/B runs over sixteen sessions (each choice
# pinned by a GPU test): the table leaves them to the rules.
RULE_SHAPES = {(36864, 7168), (7168, 18432), (2048, 7168), (7168, 2048), (24576, 1536), (4096, 7168)}


def emit_table(paths: list[str], exclude=RULE_SHAPES, out=sys.stdout) -> int:
    """The confirmed words of the given tune.jsonl files as gemm_weight_only_tuned.inc (to `out`)."""
    taken, meta = {}, []
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if r.get("meta"):
                meta.append(r)
            elif r.get("kind") == "confirm" and r["taken"] and (r["N"], r["K"]) not in exclude:
                lo, hi = r["rows"]
                taken[(r["bits"], r["group"], r["N"], r["K"], lo)] = (hi, r["value"], r["word"], r["at"])
    # adjacent row ranges of one shape and layout with the same word become one entry
    entries = []
    for key in sorted(taken):
        bits, group, n, k, lo = key
        hi, value, word, at = taken[key]
        prev = entries[-1] if entries else None
        if prev and prev[:4] == (bits, group, n, k) and prev[5] + 1 == lo and prev[6] == value:
            entries[-1] = prev[:5] + (hi, value, prev[7], {**prev[8], **at})
        else:
            entries.append((bits, group, n, k, lo, hi, value, word, at))
    dates = sorted({m["date"] for m in meta})
    print("// Generated by bench/wo_tune.py --emit (do not edit by hand): the weight-only GEMM's measured", file=out)
    print(f"// automatic choice at DeepSeek-V3's tensor-parallel shapes, H200 (132 SMs), {', '.join(dates) or '-'}.", file=out)
    print("// {bits, group, N, K, first row, last row, algo word}, then the rules' / the word's median us at the", file=out)
    print("// range's ends in the confirmation run (interleaved, same process).", file=out)
    for bits, group, n, k, lo, hi, value, word, at in entries:
        times = ", ".join(f"M={r} {v['us_auto']} -> {v[f'us_{word}']}" for r, v in sorted(at.items(), key=lambda kv: int(kv[0])))
        print(f"{{{bits}, {group}, {n}, {k}, {lo}, {hi}, {value:#x}}},  // {word}: {times}", file=out)
    return 0


TABLE = Path(__file__).resolve().parents[1] / "csrc" / "cuda" / "gemm_weight_only_tuned.inc"
_ENTRY = re.compile(r"^\{(\d+), (-?\d+), (\d+), (\d+), (\d+), (\d+), (0x[0-9a-f]+)\},")


def read_table(path: Path = TABLE) -> list[tuple[int, int, int, int, int, int, int]]:
    """The entries of a gemm_weight_only_tuned.inc: (bits, group, N, K, first row, last row, word)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            m = _ENTRY.match(line)
            if not m:
                raise ValueError(f"{path}: not a table entry: {line!r}")
            rows.append(tuple(int(v, 0) for v in m.groups()))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/wo_tune")
    ap.add_argument("--tp", default="1,2,4,8", help="tensor-parallel degrees whose shapes are tuned")
    ap.add_argument("--shapes", default="", help="only these NxK (comma-separated) of those")
    ap.add_argument("--layouts", default="4,-1/4,128/8,-1/8,128", help="bits,group pairs separated by /")
    ap.add_argument("--ms", default="1,4,8,12,16")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the sweep")
    ap.add_argument("--confirm-rounds", type=int, default=8)
    ap.add_argument("--gain", type=float, default=0.04, help="a sweep winner is confirmed if this much faster than auto")
    ap.add_argument("--keep", type=float, default=0.025, help="and taken if this much faster at both ends of its rows")
    ap.add_argument("--emit", nargs="+", metavar="TUNE_JSONL", help="write the table from these measurements instead")
    args = ap.parse_args()
    if args.emit:
        return emit_table(args.emit)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
