"""dsx export vs `cp` of the same source files, side by side, on a checkpoint with DeepSeek-V3's real dimensions.

The export reads its source's shards (a `dsx quantize` output, or the original FP8 checkpoint) and writes the
program and its parameter file (rank by rank with --tp); the anchor copies the same shards with `cp` + `sync`, timed
just before each export. Prints seconds, the ratio to cp, GB/s of source bytes, the GB written, the peak
RssAnon + RssShmem of the export's process tree and its CPU seconds (user + system: what the disk's mood on a shared
machine does not change).

    python bench/export_vs_cp.py --workdir /tmp/dsx-bench [--layers 3 --experts 16] [--sources orig,a8w8_fp8_wint4]
        [--tp 1] [--dtype bfloat16] [--speculate]

The real-dims checkpoint (`dsx tiny --real-dims`, ~11 GB at 3 layers and 16 experts) and each quantized source are
made once in the workdir and kept (the quantize bench uses the same one).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ds_export.procmem import run_measured  # noqa: E402
from quantize_vs_cp import _sync, time_cp  # noqa: E402


def _dsx(*args: str) -> list[str]:
    return [sys.executable, "-m", "ds_export.cli.app", *args]


def source(workdir: Path, layers: int, experts: int, kind: str, real_dims: bool = True) -> Path:
    """The original real-dims checkpoint ("orig") or its `dsx quantize --type kind` output, made if missing."""
    orig = workdir / f"{'real' if real_dims else 'small'}-l{layers}-e{experts}"
    if not (orig / "model.safetensors.index.json").exists():
        shutil.rmtree(orig, ignore_errors=True)
        subprocess.run(_dsx("tiny", str(orig), *(["--real-dims"] if real_dims else []), "--layers", str(layers),
                            "--experts", str(experts), "-q"), check=True)
    if kind == "orig":
        return orig
    q = workdir / f"{orig.name}-{kind}"
    if not (q / "model.safetensors.index.json").exists():
        shutil.rmtree(q, ignore_errors=True)
        subprocess.run(_dsx("quantize", str(orig), "--out", str(q), "--type", kind, "-q"), check=True)
    return q


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_export(src: Path, dst: Path, tp: int, dtype: str, speculate: bool) -> tuple[float, int, int, float]:
    """(seconds, peak bytes, bytes written, CPU seconds) of one `dsx export` (the output removed afterwards)."""
    shutil.rmtree(dst, ignore_errors=True)
    cmd = _dsx("export", str(src), "--out", str(dst), "--tp", str(tp), "--dtype", dtype, "-q")
    if speculate:
        cmd.append("--speculate")
    _sync()
    t0, c0 = time.perf_counter(), _children_cpu()
    r, _, peak = run_measured(cmd)
    _sync()
    dt, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if r.returncode:
        raise SystemExit(f"dsx export {src} failed (rc {r.returncode})")
    out = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    shutil.rmtree(dst)
    return dt, peak, out, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-bench"))
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--sources", default="orig,a8w8_fp8_wint4",
                    help="comma-separated: orig (the FP8 checkpoint) and/or dsx quantize types")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--speculate", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="export and cp pairs per source (the best of each kept)")
    ap.add_argument("--small", action="store_true", help="the tiny model's dimensions (a check that the bench runs)")
    a = ap.parse_args()
    rows = []
    for kind in a.sources.split(","):
        src = source(a.workdir, a.layers, a.experts, kind, real_dims=not a.small)
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        best_cp = best = None
        for _ in range(a.rounds):
            t_cp = time_cp(src, a.workdir / "cp")
            run = time_export(src, a.workdir / "export", a.tp, a.dtype, a.speculate)
            best_cp = t_cp if best_cp is None else min(best_cp, t_cp)
            best = run if best is None or run[0] < best[0] else best
        rows.append((kind, size, best_cp, *best))
    print(f"\nexport --tp {a.tp} --dtype {a.dtype}{' --speculate' if a.speculate else ''}, "
          f"{a.layers} layers x {a.experts} experts at {'the tiny model' if a.small else 'DeepSeek-V3'}'s dimensions")
    print(f"{'source':16} {'GB in':>6} {'dsx s':>7} {'cp s':>7} {'ratio':>6} {'GB/s in':>8} {'GB out':>7} "
          f"{'peak MiB':>9} {'dsx cpu s':>9}")
    for kind, size, t_cp, t, peak, out, cpu in rows:
        print(f"{kind:16} {size / 1e9:6.3f} {t:7.3f} {t_cp:7.3f} {t / t_cp:6.2f} {size / t / 1e9:8.3f} "
              f"{out / 1e9:7.3f} {peak / 2**20:9.0f} {cpu:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
