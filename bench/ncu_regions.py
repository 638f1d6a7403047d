"""Where a kernel's warps spend their time, by code region: Nsight Compute's per-instruction warp samples summed.

Input: the source page of one profiled launch as CSV, SASS only, e.g. on the GPU machine
  ncu --set full --import-source yes -k regex:wo_gemm --launch-skip 1 --launch-count 1 -o m16 \\
      python3 bench/gpu_gemm_weight_only.py --profile 36864x7168x16
  ncu -i m16.ncu-rep --page source --csv --print-source sass > m16.csv
then here
  python3 bench/ncu_regions.py m16.csv [START:END ...] [--top N]
START:END are hex offsets from the kernel's first instruction (END exclusive); without them the kernel is cut
at its backward branches (each loop, and the straight code between loops, one region). Prints the share of
all samples and the leading stall reasons for the whole kernel, for each region and for the N instructions
with the most samples.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Inst:
    off: int
    text: str
    samples: int
    executed: int
    stalls: Counter = field(default_factory=Counter)


def read(path: str) -> tuple[str, int, list[Inst]]:
    """The kernel's name, its first instruction's address and its instructions (offsets from that address)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel = rows[0][1] if rows and rows[0] and rows[0][0] == "Kernel Name" else "?"
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        raise ValueError(f"{path}: no 'Address' header row (expected ncu --page source --csv --print-source sass)")
    hdr = rows[head]
    col = {h: i for i, h in enumerate(hdr)}
    for need in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in col:
            raise ValueError(f"{path}: no column {need!r} in the source page")
    reasons = [h for h in hdr if h.startswith("stall_") and "(Not Issued)" not in h]
    insts, base = [], None
    for r in rows[head + 1:]:
        if len(r) < len(hdr) or not r[0].startswith("0x"):
            continue
        addr = int(r[0], 16)
        base = addr if base is None else base

        def num(name: str) -> int:
            v = r[col[name]].replace(",", "")
            return int(float(v)) if v else 0

        insts.append(Inst(addr - base, r[col["Source"]].strip(), num("Warp Stall Sampling (All Samples)"),
                          num("Instructions Executed"), Counter({h[6:]: num(h) for h in reasons})))
    if not insts:
        raise ValueError(f"{path}: no instructions")
    return kernel, base, insts


def loop_regions(base: int, insts: list[Inst]) -> list[tuple[int, int]]:
    """Cut at every backward branch's target and just past the branch: each loop, and the code between, a region."""
    end = insts[-1].off + 16
    cuts = {0, end}
    for i in insts:
        m = re.search(r"BRA 0x([0-9a-f]+)", i.text)
        if m:
            tgt = int(m.group(1), 16) - base  # (branch targets are absolute addresses)
            if 0 <= tgt < i.off:
                cuts.update((tgt, i.off + 16))
    pts = sorted(c for c in cuts if 0 <= c <= end)
    return list(zip(pts, pts[1:]))


def summary(insts: list[Inst]) -> tuple[int, Counter]:
    tot, c = 0, Counter()
    for i in insts:
        tot += i.samples
        c.update(i.stalls)
    return tot, c


def fmt_reasons(c: Counter, total: int, n: int = 5) -> str:
    return ", ".join(f"{k} {100 * v / total:.1f}" for k, v in c.most_common(n) if v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("ranges", nargs="*", help="START:END hex offsets (END exclusive)")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    try:
        kernel, base, insts = read(a.csv)
        ranges = [tuple(int(x, 16) for x in s.split(":")) for s in a.ranges] or loop_regions(base, insts)
    except (OSError, ValueError) as e:
        print(f"ncu_regions: {e}", file=sys.stderr)
        return 2
    total, reasons = summary(insts)
    if total == 0:
        print(f"ncu_regions: {a.csv}: no warp samples (profile with --set full)", file=sys.stderr)
        return 2
    print(f"{kernel}\n{total} samples over {len(insts)} instructions; {fmt_reasons(reasons, total, 8)}")
    print(f"{'region':>15} {'share':>6} {'insts':>6} {'executed':>10}  leading stalls (% of all samples)")
    for lo, hi in ranges:
        part = [i for i in insts if lo <= i.off < hi]
        n, c = summary(part)
        ex = max((i.executed for i in part), default=0)
        print(f"{lo:6x}:{hi:<8x} {100 * n / total:5.1f}% {len(part):6d} {ex:10d}  {fmt_reasons(c, total)}")
    print(f"top {a.top} instructions:")
    for i in sorted(sorted(insts, key=lambda i: -i.samples)[: a.top], key=lambda i: i.off):
        print(f"{i.off:6x} {100 * i.samples / total:5.1f}% ex {i.executed:8d}  {i.text[:56]:56s} "
              f"{fmt_reasons(i.stalls, max(i.samples, 1), 3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
