"""dsx quantize vs `cp` of the same files, side by side, on a checkpoint with DeepSeek-V3's real dimensions.

Prints, per quant type: seconds, GB/s of input, the ratio to a plain `cp` (+ sync) of the
same shards measured in the same run, and the peak RssAnon+RssShmem of the quantize process.
Then the weight-only kernel against paddle.nn.quant.weight_quantize on a real expert tensor.

    python bench/quantize_vs_cp.py --workdir /tmp/dsx-bench [--layers 3 --experts 16] [--types ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ds_export.procmem import run_measured

TYPES = ["bf16", "a8w8_fp8", "weight_only_int8", "weight_only_int4", "a8w8_fp8_wint4"]


def _sync():
    subprocess.run(["sync"], check=True)


def time_cp(src: Path, dst: Path) -> float:
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    files = sorted(str(p) for p in src.glob("*.safetensors"))
    _sync()
    t0 = time.perf_counter()
    subprocess.run(["cp", *files, str(dst)], check=True)
    _sync()
    dt = time.perf_counter() - t0
    shutil.rmtree(dst)
    return dt


def time_dsx(src: Path, dst: Path, typ: str, workers: int | None) -> tuple[float, int, int]:
    if dst.exists():
        shutil.rmtree(dst)
    cmd = [sys.executable, "-m", "ds_export.cli.app", "quantize", str(src), "--out", str(dst), "--type", typ, "-q"]
    if workers:
        cmd += ["-j", str(workers)]
    _sync()
    t0 = time.perf_counter()
    r, _, peak = run_measured(cmd)
    _sync()
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"dsx quantize --type {typ} failed")
    out_bytes = sum(p.stat().st_size for p in dst.glob("*.safetensors"))
    shutil.rmtree(dst)
    return dt, peak, out_bytes


def paddle_vs_native(src: Path) -> list[str]:
    from ds_export.formats import fp8_block, weight_only
    from ds_export.io.checkpoint import Checkpoint

    ck = Checkpoint.open(src)
    name = next(n for n in ck.names() if n.endswith("experts.0.gate_proj.weight"))
    w = fp8_block.dequant_native(ck.get(name), ck.get(name + "_scale_inv"), out_dtype="bfloat16")
    gb = w.nbytes / 1e9
    lines = []
    try:
        import paddle

        x = paddle.to_tensor(w.T.astype(np.float32)).astype("bfloat16")
        t0 = time.perf_counter()
        q, s = paddle.nn.quant.weight_quantize(x, algo="weight_only_int4", arch=90, group_size=-1)
        tp = time.perf_counter() - t0
        qp = q.numpy()
    except ImportError:
        tp, qp = None, None
    t0 = time.perf_counter()
    qn, _ = weight_only.quantize_native(w, 4, -1, 90)
    tn = time.perf_counter() - t0
    same = qp is not None and qp.tobytes() == qn.tobytes()
    lines.append(f"weight_quantize int4 on {name} {list(w.shape)} bf16 ({gb * 1e3:.0f} MB):")
    if tp:
        lines.append(f"  paddle op {gb / tp:6.3f} GB/s   dsx native {gb / tn:6.2f} GB/s   ratio {tp / tn:5.1f}x   "
                     f"bytes identical: {same}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-bench"))
    ap.add_argument("--src", type=Path, help="existing checkpoint (default: generate --real-dims in workdir)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--types", nargs="*", default=TYPES)
    ap.add_argument("--workers", type=int)
    a = ap.parse_args()
    src = a.src or a.workdir / f"real-l{a.layers}-e{a.experts}"
    if not (src / "model.safetensors.index.json").exists():
        if src.exists():
            shutil.rmtree(src)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ds_export.cli.app", "tiny", str(src), "--real-dims",
                        "--layers", str(a.layers), "--experts", str(a.experts), "-q"], check=True)
        print(f"generated {src} in {time.perf_counter() - t0:.0f} s")
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    subprocess.run(["cat", *map(str, sorted(src.glob("*.safetensors")))], stdout=subprocess.DEVNULL, check=True)
    print(f"source {src}: {size / 1e9:.2f} GB in {len(list(src.glob('*.safetensors')))} shards; "
          f"{os.cpu_count()} cores")
    rows = []
    for typ in a.types:
        t_cp = time_cp(src, a.workdir / "cp")
        t_dsx, peak, out_bytes = time_dsx(src, a.workdir / "out", typ, a.workers)
        rows.append((typ, t_dsx, t_cp, peak, out_bytes))
    print(f"\n{'type':18} {'dsx s':>7} {'cp s':>7} {'ratio':>6} {'GB/s in':>8} {'out GB':>7} {'peak MiB':>9}")
    for typ, t_dsx, t_cp, peak, out_bytes in rows:
        print(f"{typ:18} {t_dsx:7.2f} {t_cp:7.2f} {t_dsx / t_cp:6.2f} {size / t_dsx / 1e9:8.2f} "
              f"{out_bytes / 1e9:7.2f} {peak / 2**20:9.0f}")
    print()
    for line in paddle_vs_native(src):
        print(line)


if __name__ == "__main__":
    main()
