"""`dsx export --tp N`: ranks built by N processes at once against one after another, same run.

    python bench/export_workers.py [--tp 2] [--layers 8] [--experts 16] [--workdir /tmp/dsx-export-workers]

Writes a tiny DeepSeek-V3 checkpoint (MLP widths that N ranks can split; `--layers` decoder layers,
`--experts` routed experts, the MTP layer) and exports it with `--speculate` twice, `--workers 1`
(the anchor: one rank after another) and `--workers N`, alternating, `--repeats` times each. Prints
the median wall time and peak memory (RssAnon + RssShmem over the process tree) of each, the
ratio, and whether both wrote the same bytes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def same_files(a: Path, b: Path) -> bool:
    fa = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    fb = sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    return fa == fb and all((a / f).read_bytes() == (b / f).read_bytes() for f in fa)


def main() -> int:
    from ds_export.procmem import run_measured
    from ds_export.tiny import TinySpec, write_tiny

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-export-workers"))
    args = ap.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    src = args.workdir / "src"
    width = 128 * args.tp  # FP8 blocks of 128 per rank
    write_tiny(src, TinySpec(layers=args.layers, experts=args.experts, overrides=(
        ("intermediate_size", width), ("moe_intermediate_size", width))))
    times: dict[int, list[float]] = {1: [], args.tp: []}
    peaks: dict[int, list[int]] = {1: [], args.tp: []}
    for _ in range(args.repeats):
        for j in (1, args.tp):
            out = args.workdir / f"out-j{j}"
            cmd = [sys.executable, "-m", "ds_export.cli.app", "export", str(src), "--out", str(out), "--tp",
                   str(args.tp), "--speculate", "--max-seq-len", "64", "--workers", str(j), "-q", "--force"]
            r, dt, peak = run_measured(cmd, cwd=REPO)
            if r.returncode:
                print(f"export --workers {j} failed (exit {r.returncode})", file=sys.stderr)
                return 1
            times[j].append(dt)
            peaks[j].append(peak)
    same = same_files(args.workdir / "out-j1", args.workdir / f"out-j{args.tp}")
    t1, tn = statistics.median(times[1]), statistics.median(times[args.tp])
    print(f"tiny DeepSeek-V3, {args.layers} layers, {args.experts} experts, --tp {args.tp} --speculate, "
          f"median of {args.repeats}")
    print("| workers | seconds | peak MiB | speed-up vs 1 | same bytes |")
    print("|---|---|---|---|---|")
    print(f"| 1 (anchor) | {t1:.1f} | {max(peaks[1]) / 2**20:.0f} | 1.00 | |")
    print(f"| {args.tp} | {tn:.1f} | {max(peaks[args.tp]) / 2**20:.0f} | {t1 / tn:.2f} | {'yes' if same else 'NO'} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
