"""`dsx verify`'s weight numerics against reading the same files, side by side, at DeepSeek-V3's real dimensions.

Generates (once, in --workdir) a real-dims source checkpoint and its quantization (--type: a8w8_fp8_wint4; a8w8_fp8
keeps every Linear an FP8 copy, compared by bytes), then times the weight comparison (`verify.weights.check_weights`,
each in a process of its own, peak RssAnon+RssShmem measured) at each --workers, and the anchor: `cat` of the target's
and the source's shards to /dev/null in the same run (the page cache warm for both, so the anchor is memory bandwidth,
not the disk). Prints seconds, weights a second, the ratio to the anchor and the peak memory.

    python bench/verify_weights.py --workdir /tmp/dsx-vbench [--layers 4 --experts 8] [--workers 1,2]
    python bench/verify_weights.py ... --skip 'embed_tokens|lm_head'   # the tensors to leave out (a regex)

To time the code before a change, run this file from a worktree of the older commit, in that directory and with
PYTHONPATH=<worktree> (the editable install's finder wins over PYTHONPATH otherwise): a check_weights without
`workers` runs as it was.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ds_export.procmem import run_measured


def _child(target: str, reference: str, workers: int, skip: str, out: str, reproduce: str = "0") -> None:
    """In the measured process: one check_weights over the target's weights (reproduce "1": the stored bytes
    against a conversion of the reference too, as dsx verify does for a dsx output); writes 'seconds weights tensors
    failed' to `out`."""
    from ds_export.io.checkpoint import Checkpoint
    from ds_export.models import deepseek_v3 as ds
    from ds_export.verify.weights import check_weights

    with Checkpoint.open(target) as ck, Checkpoint.open(reference) as ref:
        if skip:  # the bench's own filter: the names check_weights walks
            ck.weight_map = {n: f for n, f in ck.weight_map.items() if not re.search(skip, n)}
        cfg = ds.DeepseekV3Config.from_dict(ck.config)
        kw = {"workers": workers} if "workers" in inspect.signature(check_weights).parameters else {}
        if reproduce == "1":
            kw["reproduce"] = True
        t0 = time.perf_counter()
        stats = check_weights(ck, ref, cfg, **kw)
        dt = time.perf_counter() - t0
        weights = sum(_numel(ref, s.name) for s in stats)
        bad = [s.name for s in stats if not s.ok]
    Path(out).write_text(f"{dt:.3f} {weights} {len(stats)} {len(bad)}\n")


def _numel(ck, name: str) -> int:
    n = 1
    for d in ck.info(name).shape:
        n *= d
    return n


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "ds_export.cli.app", *args], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-vbench"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--workers", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--type", default="a8w8_fp8_wint4",
                    help="the target's dsx quantize --type (a8w8_fp8: every Linear an FP8 copy, compared by bytes)")
    ap.add_argument("--skip", default="", help="regex of tensor names to leave out")
    ap.add_argument("--tiny", action="store_true", help="the tiny model's dimensions (a smoke run for the tests)")
    ap.add_argument("--reproduce", default="0", help="0, 1 or 0,1: check_weights without / with the byte "
                    "comparison against a conversion of the reference (dsx verify does it for dsx outputs)")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return _child(a.child[0], a.child[1], int(a.child[2]), a.child[3], a.child[4], a.child[5])
    dims = "tiny" if a.tiny else "real"
    src = a.workdir / f"{dims}-l{a.layers}-e{a.experts}"
    dst = a.workdir / (f"{dims}-l{a.layers}-e{a.experts}-" + a.type.replace("a8w8_", ""))
    if not (src / "model.safetensors.index.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        _cli("tiny", str(src), *([] if a.tiny else ["--real-dims"]), "--layers", str(a.layers), "--experts",
             str(a.experts), "-q")
    if not (dst / "dsx-manifest.json").exists():
        _cli("quantize", str(src), "--out", str(dst), "--type", a.type, "-q")
    files = [str(p) for d in (dst, src) for p in sorted(d.glob("*.safetensors"))]
    size = sum(os.path.getsize(f) for f in files)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # both in the page cache
    print(f"source {src.name} + target {dst.name}: {size / 1e9:.2f} GB of shards; {os.cpu_count()} cores; "
          f"skip {a.skip or '-'}")
    rows = []
    for w in [int(x) for x in a.workers.split(",")]:
        for rep in a.reproduce.split(","):
            t0 = time.perf_counter()
            subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
            t_cat = time.perf_counter() - t0
            res = a.workdir / "result.txt"
            res.unlink(missing_ok=True)
            r, _, peak = run_measured([sys.executable, __file__, "--child", str(dst), str(src), str(w), a.skip,
                                       str(res), rep])
            if r.returncode:
                raise SystemExit(f"check_weights with {w} workers failed (exit {r.returncode})")
            dt, weights, tensors, bad = res.read_text().split()
            rows.append((w, rep, float(dt), int(weights), int(tensors), int(bad), t_cat, peak))
    print(f"\n{'workers':>7} {'bytes':>5} {'verify s':>9} {'M weights/s':>12} {'cat s':>6} {'ratio':>6} "
          f"{'peak MiB':>9} {'tensors':>8} {'failed':>6}")
    for w, rep, dt, weights, tensors, bad, t_cat, peak in rows:
        print(f"{w:7d} {'yes' if rep == '1' else 'no':>5} {dt:9.2f} {weights / dt / 1e6:12.1f} {t_cat:6.2f} "
              f"{dt / t_cat:6.1f} {peak / 2**20:9.0f} {tensors:8d} {bad:6d}")


if __name__ == "__main__":
    main()
