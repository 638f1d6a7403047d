"""dsx quantize on 1 and N GPUs vs the CPU path and `cp`, side by side, on a real-dimension checkpoint.

For each device configuration: seconds, GB/s of input, the ratio to `cp` + sync of the same shards
(measured in the same run), and whether the output is byte-identical to the CPU path's. "cuda x1,
1 worker" is one worker process on one GPU (the engine's rule before it ran several per GPU).

    python bench/quantize_gpus.py --workdir /tmp/qg [--layers 3 --experts 32] [--type weight_only_int4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ds_export.io.writer import sha256_file


def _run(cmd: list[str]) -> float:
    subprocess.run(["sync"], check=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0


def _hashes(d: Path) -> dict:
    return {p.name: sha256_file(p) for p in sorted(d.glob("*.safetensors"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-gpu-bench"))
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--type", default="weight_only_int4")
    ap.add_argument("--gpus", type=int, default=None, help="largest GPU count to try (default: all)")
    ap.add_argument("--shard-mb", type=int, default=2048, help="source shard size of the generated checkpoint")
    a = ap.parse_args()
    from ds_export.native import cuda

    n_gpu = cuda.device_count() if cuda.available() else 0
    n_gpu = min(n_gpu, a.gpus or n_gpu)
    src = a.workdir / f"real-l{a.layers}-e{a.experts}-s{a.shard_mb}"
    if not (src / "model.safetensors.index.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        t = _run([sys.executable, "-m", "ds_export.cli.app", "tiny", str(src), "--real-dims", "--layers",
                  str(a.layers), "--experts", str(a.experts), "--shard-mb", str(a.shard_mb), "-q"])
        print(f"generated {src} in {t:.0f} s")
    shards = sorted(src.glob("*.safetensors"))
    size = sum(p.stat().st_size for p in shards)
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)
    print(f"source: {size / 1e9:.2f} GB in {len(shards)} shards; {os.cpu_count()} cores, {n_gpu} GPU(s); "
          f"type {a.type}")
    rows = []
    cp_dir = a.workdir / "cp"
    shutil.rmtree(cp_dir, ignore_errors=True)
    cp_dir.mkdir(parents=True)
    t_cp = _run(["cp", *map(str, shards), str(cp_dir)])
    shutil.rmtree(cp_dir)
    configs = [("cpu", [])] + ([("cuda x1, 1 worker", ["--device", "cuda", "--gpus", "0", "--workers", "1"])]
                               if n_gpu else [])
    configs += [(f"cuda x{g}", ["--device", "cuda", "--gpus", ",".join(map(str, range(g)))]) for g in range(1, n_gpu + 1)]
    ref = None
    for label, extra in configs:
        out = a.workdir / "out"
        shutil.rmtree(out, ignore_errors=True)
        t = _run([sys.executable, "-m", "ds_export.cli.app", "quantize", str(src), "--out", str(out), "--type",
                  a.type, "-q", *extra])
        h = _hashes(out)
        ref = ref or h
        rows.append((label, t, h == ref))
        shutil.rmtree(out)
    print(f"\n{'config':18} {'seconds':>8} {'GB/s in':>8} {'x cp':>6} {'identical to cpu':>17}")
    print(f"{'cp':18} {t_cp:8.2f} {size / t_cp / 1e9:8.2f} {1.0:6.2f} {'-':>17}")
    for label, t, same in rows:
        print(f"{label:18} {t:8.2f} {size / t / 1e9:8.2f} {t / t_cp:6.2f} {'yes' if same else 'NO':>17}")


if __name__ == "__main__":
    main()
