"""Throughput of block-FP8 dequant-to-bf16 and quantize (GB/s of input bytes).

For each shape, compares the C++ path (ds_export.formats.fp8_block *_native) with
a plain numpy implementation (the *_ref functions: ml_dtypes casts + broadcasting)
and with np.copy of the same input bytes as an anchor (np.copy allocates its
output like the kernels do, so it pays the same first-touch page faults); the
"copyto" line is np.copyto into a preallocated buffer (memory bandwidth alone).

  .venv/bin/python bench/quant_fp8.py [--repeat 5] [--shapes 2048x7168,7168x2048]

Threads: the C++ path uses OpenMP (OMP_NUM_THREADS), numpy is single-threaded.
"""

from __future__ import annotations

import argparse
import os
import time

import ml_dtypes
import numpy as np

from ds_export.formats import fp8_block as f8


def best_seconds(fn, repeat: int) -> float:
    fn()  # warm-up (also builds/loads the library)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def row(label: str, nbytes: int, sec: float, anchor: float | None = None, numpy_sec: float | None = None) -> str:
    gbs = nbytes / sec / 1e9
    extra = ""
    if numpy_sec is not None:
        extra += f"  {numpy_sec / sec:6.1f}x numpy"
    if anchor is not None:
        extra += f"  {anchor / sec:6.2f}x of np.copy"
    return f"  {label:<28} {sec * 1e3:9.2f} ms {gbs:8.2f} GB/s{extra}"


def bench_shape(n: int, k: int, repeat: int) -> list[str]:
    rng = np.random.default_rng(0)
    w32 = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    wbf = w32.astype(ml_dtypes.bfloat16)
    codes, scale = f8.quantize_native(w32)
    out = [f"[{n}, {k}]"]

    # dequant fp8 -> bf16: input = fp8 bytes (+ scales, negligible)
    nb = codes.nbytes
    t_copy = best_seconds(lambda: np.copy(codes), repeat)
    buf = np.empty_like(codes)
    out.append(row("np.copyto fp8 bytes", nb, best_seconds(lambda: np.copyto(buf, codes), repeat)))
    t_nat = best_seconds(lambda: f8.dequant_native(codes, scale, out_dtype="bfloat16"), repeat)
    t_np = best_seconds(lambda: f8.dequant_ref(codes, scale).astype(ml_dtypes.bfloat16), repeat)
    out.append(row("np.copy fp8 bytes", nb, t_copy))
    out.append(row("dequant->bf16 native", nb, t_nat, t_copy, t_np))
    out.append(row("dequant->bf16 numpy", nb, t_np, t_copy))

    # quantize bf16 -> fp8 and float32 -> fp8: input = bf16 / f32 bytes
    for name, w in (("bf16", wbf), ("f32", w32)):
        nb = w.nbytes
        t_copy = best_seconds(lambda: np.copy(w), repeat)
        buf = np.empty_like(w)
        out.append(row(f"np.copyto {name} bytes", nb, best_seconds(lambda: np.copyto(buf, w), repeat)))
        t_nat = best_seconds(lambda: f8.quantize_native(w), repeat)
        t_np = best_seconds(lambda: f8.quantize_ref(w), repeat)
        out.append(row(f"np.copy {name} bytes", nb, t_copy))
        out.append(row(f"quantize {name} native", nb, t_nat, t_copy, t_np))
        out.append(row(f"quantize {name} numpy", nb, t_np, t_copy))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shapes", default="2048x7168,7168x2048")
    args = ap.parse_args()
    print(f"cores: {os.cpu_count()}  OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(all)')}  best of {args.repeat}")
    for spec in args.shapes.split(","):
        n, k = (int(v) for v in spec.lower().split("x"))
        print("\n".join(bench_shape(n, k, args.repeat)))


if __name__ == "__main__":
    main()
