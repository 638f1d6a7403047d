"""The NaN-code scan dsx quantize runs over an FP8 source weight it copies or casts as it is, against a memory copy
of the same bytes (the anchor: the copy path moves every byte once anyway) and numpy's count (the reference).

    python bench/fp8_nan_scan.py [--mib 1024] [--rounds 5]

Random e4m3 codes without NaNs (the whole buffer is scanned), one thread; median of --rounds, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.formats import fp8_block  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, args.mib << 20, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    dst = np.empty_like(codes)
    runs = {"scan (C++)": lambda: fp8_block.count_nan_native(codes), "copy (anchor)": lambda: np.copyto(dst, codes),
            "scan (numpy ref)": lambda: fp8_block.count_nan_ref(codes)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():
        f()  # (pages touched, library loaded)
    for _ in range(args.rounds):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    assert fp8_block.count_nan_native(codes) == fp8_block.count_nan_ref(codes) == (0, -1)
    anchor = statistics.median(times["copy (anchor)"])
    print(f"{args.mib} MiB of e4m3 codes, median of {args.rounds}:")
    for k, ts in times.items():
        t = statistics.median(ts)
        print(f"  {k:18s} {t * 1e3:8.2f} ms  {codes.size / t / 1e9:6.2f} GB/s  {anchor / t:5.2f}x the copy's speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
