"""The CPU block FP8 GEMM (csrc/cpu/gemm_fp8.cc: the reference of the CUDA kernels, `dsx verify --device cpu`, and
the Paddle CPU ops of `dsx export`) on DeepSeek-V3 shapes: its AVX2 path and its scalar path (dsx_cpu_simd),
side by side in one process, against an anchor measured in the same run: numpy's float32 matmul of the same
operands already decoded and scaled (BLAS, which may use FMA; the kernel may not, its order is fixed), so the
anchor leaves out the decode and block scales the kernel does. Also checks the two paths give the same bits.

    python3 bench/cpu_kernels.py [--shapes MxNxK,...] [--repeat R] [--threads T]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from quant_weight_only import best_time as best_of  # noqa: E402  (bench/: best of R calls after a warm-up)

SHAPES = "1x7168x2048,16x7168x2048,128x7168x2048,1x2048x7168,16x2048x7168,128x2048x7168,16x24576x1536"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="MxNxK, comma-separated (N x K weights, M tokens)")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls each, the best kept")
    ap.add_argument("--threads", type=int, default=0, help="OpenMP and BLAS threads (0: their defaults)")
    a = ap.parse_args(argv)
    if a.threads:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
        os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    from ds_export.formats import fp8_block
    from ds_export.native import kernels as K

    rng = np.random.default_rng(0)
    print(f"cores {os.cpu_count()}, threads {a.threads or 'default'}; best of {a.repeat}, ms a call")
    print(f"{'M x N x K':>16} {'avx2':>9} {'scalar':>9} {'numpy f32':>10} {'vs scalar':>9} {'vs numpy':>9} "
          f"{'weights GB/s':>12}  bits")
    before = K.cpu_simd()
    try:
        for spec in a.shapes.split(","):
            m, n, k = (int(v) for v in spec.split("x"))
            w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
            x = rng.standard_normal((m, k)).astype(np.float32)
            wq, ws = fp8_block.quantize_native(w)
            xq, xs = fp8_block.act_quant_native(x)
            # the anchor's operands: the same values decoded and scaled, float32
            wd = fp8_block.dequant_ref(wq, ws).astype(np.float32)
            xd = fp8_block.dequant_ref(xq, xs, (1, 128)).astype(np.float32)
            K.cpu_simd(True)
            fast = K.gemm_fp8_nt(xq, xs, wq, ws)
            t_fast = best_of(lambda: K.gemm_fp8_nt(xq, xs, wq, ws), a.repeat)
            K.cpu_simd(False)
            slow = K.gemm_fp8_nt(xq, xs, wq, ws)
            t_slow = best_of(lambda: K.gemm_fp8_nt(xq, xs, wq, ws), a.repeat)
            t_np = best_of(lambda: xd @ wd.T, a.repeat)
            same = np.array_equal(fast.view(np.uint16), slow.view(np.uint16))
            close = np.allclose(fast.astype(np.float32), (xd @ wd.T).astype(ml_dtypes.bfloat16).astype(np.float32),
                                rtol=2e-2, atol=1e-3)
            print(f"{spec:>16} {t_fast * 1e3:9.2f} {t_slow * 1e3:9.2f} {t_np * 1e3:10.2f} {t_slow / t_fast:8.2f}x "
                  f"{t_np / t_fast:8.2f}x {n * k / t_fast / 1e9:12.2f}  {'same' if same else 'DIFFER'}"
                  f"{'' if close else ' (far from numpy!)'}")
            if not same:
                print(f"error: {spec}: the AVX2 and scalar paths differ", file=sys.stderr)
                return 1
    finally:
        K.cpu_simd(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
