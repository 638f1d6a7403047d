"""Throughput of dsx's weight-only quantizer against Paddle's CPU weight_quantize.

Usage: python bench/quant_weight_only.py [--threads 2] [--repeat 3] [--shapes 2048x7168,7168x2048]

Shapes are HF layout [out, in] (bf16, Gaussian). For each (shape, bits,
group_size) it prints the best-of-N wall time and GB/s of bf16 input for
quantize_native (OpenMP, --threads) and for paddle.nn.quant.weight_quantize
(arch 90; fed the [in, out] transpose, which is made outside the timed region),
checks the bytes are identical, and prints the speed ratio dsx / Paddle.
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from ds_export.formats.weight_only import quantize_native


def best_time(fn, repeat: int) -> float:
    fn()  # warm-up (also builds/loads the kernel library on first use)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shapes", default="2048x7168,7168x2048")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--no-paddle", action="store_true", help="time dsx only")
    args = ap.parse_args()

    paddle = None
    if not args.no_paddle:
        import paddle

        paddle.set_device("cpu")

    rng = np.random.default_rng(0)
    print(f"threads={args.threads} arch={args.arch} (GB/s = bf16 input bytes / best time)")
    print(f"{'shape [out,in]':>16} {'bits':>4} {'group':>5} {'dsx s':>8} {'dsx GB/s':>9} {'paddle s':>9} {'paddle GB/s':>11} {'ratio':>7}  bytes")
    for spec in args.shapes.split(","):
        n, k = (int(v) for v in spec.lower().split("x"))
        w = rng.standard_normal((n, k), dtype=np.float32).astype(ml_dtypes.bfloat16)
        gb = w.nbytes / 1e9
        x = None
        if paddle is not None:
            x = paddle.to_tensor(np.ascontiguousarray(w.T).view(np.uint16)).view(paddle.bfloat16)
        for bits in (8, 4):
            for group in (-1, 128):
                res = {}

                def run_dsx():
                    res["dsx"] = quantize_native(w, bits, group, args.arch, threads=args.threads)

                t_dsx = best_time(run_dsx, args.repeat)
                line = f"{spec:>16} {bits:>4} {group:>5} {t_dsx:8.4f} {gb / t_dsx:9.2f}"
                if paddle is not None:

                    def run_paddle():
                        q, s = paddle.nn.quant.weight_quantize(
                            x, algo=f"weight_only_int{bits}", arch=args.arch, group_size=group
                        )
                        res["paddle"] = (q.numpy(), s.view(paddle.uint16).numpy())

                    t_pd = best_time(run_paddle, max(1, args.repeat // 2))
                    same = np.array_equal(res["paddle"][0], res["dsx"][0]) and np.array_equal(
                        res["paddle"][1], res["dsx"][1].view(np.uint16)
                    )
                    line += f" {t_pd:9.4f} {gb / t_pd:11.3f} {t_pd / t_dsx:6.1f}x  {'identical' if same else 'DIFFERENT'}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
