"""Bench the GPU conversion path (csrc/cuda/quant_convert.cu) on DeepSeek-V3 MoE shapes (GPU machine).

For FP8 -> weight-only on [2048, 7168] and [7168, 2048] expert weights (64 experts each,
128x128 block scales), in GB/s of FP8 input:
  kernel    : the kernel alone over the 64 experts already on the device (CUDA events,
              median of repeats; 64 x 14.7 MB rotates far past L2);
  pipeline  : CudaConverter.convert_chunks from host numpy arrays to host numpy results,
              through pinned memory (staging copies, H2D, kernel, D2H, copies out), wall clock;
  cpu       : the CPU path `dsx quantize` runs today (dequant_native bf16 + quantize_rows_native,
              all cores), on 8 of the experts;
and, measured in the same run, the anchors: HBM copy (torch clone of the same bytes; its
read + write bytes against the kernel's fp8-read + int-write bytes) and pinned H2D / D2H
(torch), the ceiling of the pipeline. Expert 0's GPU result is compared with the CPU bit
for bit. Prints one table last; writes bench_quant.json to --out.
DSX_QUANT_CUDA_LIB (harness only): a libdsx_cuda build to load instead of building one.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from ds_export.formats import fp8_block, weight_only
from ds_export.native import cuda
from ds_export.native import cuda_quant as cq

SHAPES = [(2048, 7168), (7168, 2048)]
CONFIGS = [(4, -1), (4, 128), (8, -1)]


def experts(rng, e: int, n: int, k: int, unique: int = 8):
    """e experts of FP8 codes (no NaN) + scales; `unique` random ones copied around (cheap to make)."""
    w = np.empty((e, n, k), np.uint8)
    for i in range(min(unique, e)):
        v = rng.integers(0, 254, (n, k), dtype=np.uint8)
        w[i] = (v >> 1) | ((v & 1) << 7)
    for i in range(unique, e):
        w[i] = w[i % unique]
    s = rng.uniform(1e-4, 1e-3, (e, -(-n // 128), -(-k // 128))).astype(np.float32)
    return w, s


def event_ms(fn, stream, reps: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        a, b = cuda.Event(), cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        times.append(a.elapsed_ms(b))
    return statistics.median(times)


def download(dev: cuda.DeviceArray, offset: int, shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    cuda.rt_check(cuda.cudart().cudaMemcpy(out.ctypes.data, dev.ptr + offset, out.nbytes, cuda.D2H), "cudaMemcpy")
    return out


def kernel_only(fns, dw, ds, shape, bits, group, stream):
    """Median ms of the WO kernel over all experts (one launch per expert), and expert 0's result."""
    e, n, k = shape
    qb, sshape = n * k * bits // 8, (n,) if group == -1 else (-(-k // group), n)
    dq, dsc = cuda.empty((e, qb), np.int8), cuda.empty((e,) + sshape, np.uint16)
    st = cuda.empty((1,), np.int32).fill_bytes(0)
    sb, scb = ds.nbytes // e, int(np.prod(sshape)) * 2

    def sweep():
        for i in range(e):
            rc = fns["wo"](dw.ptr + i * n * k, cq.QC_FP8, ds.ptr + i * sb, 128, 128, n, k, 0, n, bits, group, 90,
                           dq.ptr + i * qb, dsc.ptr + i * scb, st.ptr, stream.handle)
            assert rc == 0

    ms = event_ms(sweep, stream)
    stream.synchronize()
    assert st.numpy()[0] == 0
    return ms, download(dq, 0, (qb,), np.int8), download(dsc, 0, sshape, np.uint16)


def pipeline_s(conv, w, s, bits, group, copy=True, reps: int = 3) -> float:
    e, n, _ = w.shape
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _res in conv.convert_chunks((cq.fp8_to_weight_only_job(w[i], s[i], (128, 128), n, (0, n), bits, group)
                                         for i in range(e)), copy=copy):
            pass
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def cpu_s(w, s, bits, group, count: int = 8) -> float:
    n, count = w.shape[1], min(count, w.shape[0])
    t0 = time.perf_counter()
    for i in range(count):
        bf = fp8_block.dequant_native(w[i], s[i], (128, 128), "bfloat16")
        weight_only.quantize_rows_native(bf, n, (0, n), bits, group, 90)
    return (time.perf_counter() - t0) / count


def anchors(nbytes: int) -> dict:
    """ms for torch clone / pinned H2D / pinned D2H of nbytes (NaN where torch cannot run them)."""
    try:
        return _anchors(nbytes)
    except Exception as e:  # noqa: BLE001 - a missing anchor must not lose the rest of the table
        print(f"anchors unavailable: {type(e).__name__}: {e}", flush=True)
        return {"clone": float("nan"), "h2d": float("nan"), "d2h": float("nan")}


def _anchors(nbytes: int) -> dict:
    import torch

    x = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    out = {}
    for name, fn in {"clone": lambda: x.clone()}.items():
        fn()
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        out[name] = statistics.median(ts)
    h = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    for name, fn in {"h2d": lambda: x.copy_(h, non_blocking=True), "d2h": lambda: h.copy_(x, non_blocking=True)}.items():
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t0) / 3 * 1e3
    return out  # ms for nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out/gpu"))
    ap.add_argument("--experts", type=int, default=64)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = os.environ.get("DSX_QUANT_CUDA_LIB")
    cuda.cudart()  # load the runtime first: the kernels' library binds to it
    lib = ctypes.CDLL(path) if path else cuda.lib()
    print(f"kernels from {path or 'ds_export.native.cuda.lib() (libdsx_cuda)'}", flush=True)
    fns = cq.bind_entry_points(lib)
    conv = cq.CudaConverter(lib=lib)
    stream = cuda.Stream()
    rng = np.random.default_rng(0)
    rows, results = [], []
    for n, k in SHAPES:
        w, s = experts(rng, args.experts, n, k)
        gb = w.nbytes / 1e9
        anc = anchors(w.nbytes)
        dw, ds = cuda.to_device(w), cuda.to_device(s)
        clone_gbs = gb / (anc["clone"] / 1e3)
        for bits, group in CONFIGS:
            ms, q0, s0 = kernel_only(fns, dw, ds, w.shape, bits, group, stream)
            ref = weight_only.quantize_rows_native(fp8_block.dequant_native(w[0], s[0], (128, 128), "bfloat16"), n,
                                                   (0, n), bits, group, 90)
            exact = np.array_equal(q0, ref[0]) and np.array_equal(s0, ref[1].view(np.uint16))
            pipe = pipeline_s(conv, w, s, bits, group)
            pipe_nc = pipeline_s(conv, w, s, bits, group, copy=False, reps=2)
            cpu = cpu_s(w, s, bits, group)
            kern_gbs = gb / (ms / 1e3)
            moved = 1 + bits / 8  # bytes per element: fp8 read + int write
            r = dict(shape=f"{args.experts}x[{n},{k}]", bits=bits, group=group, exact=bool(exact),
                     kernel_gbs=kern_gbs, kernel_vs_copy=kern_gbs * moved / (clone_gbs * 2),
                     pipeline_gbs=gb / pipe, pipeline_nocopy_gbs=gb / pipe_nc, cpu_gbs=(n * k / 1e9) / cpu,
                     clone_gbs=clone_gbs, h2d_gbs=gb / (anc["h2d"] / 1e3), d2h_gbs=gb / (anc["d2h"] / 1e3))
            results.append(r)
            print(json.dumps(r), flush=True)
        del dw, ds
    (Path(args.out) / "bench_quant.json").write_text(json.dumps(results, indent=1))
    hdr = (f"{'FP8 -> weight-only':<22}{'bits':>5}{'group':>6}{'exact':>6}{'kernel':>9}{'%copy':>7}{'pipe':>8}"
           f"{'pipe0':>8}{'cpu':>7}{'gpu/cpu':>8}{'clone':>8}{'h2d':>7}{'d2h':>7}")
    rows.append(hdr)
    for r in results:
        rows.append(f"{r['shape']:<22}{r['bits']:>5}{r['group']:>6}{'yes' if r['exact'] else 'NO':>6}"
                    f"{r['kernel_gbs']:>9.1f}{100 * r['kernel_vs_copy']:>6.0f}%{r['pipeline_gbs']:>8.1f}"
                    f"{r['pipeline_nocopy_gbs']:>8.1f}{r['cpu_gbs']:>7.2f}{r['pipeline_gbs'] / r['cpu_gbs']:>7.1f}x"
                    f"{r['clone_gbs']:>8.0f}{r['h2d_gbs']:>7.1f}{r['d2h_gbs']:>7.1f}")
    print("\nGB/s of FP8 input. kernel: device-resident, events; %copy: its bytes moved (fp8 read + int write) over "
          "torch clone's (read + write) of the same bytes; pipe: host numpy -> pinned -> GPU -> host numpy "
          "(copy=True), pipe0: results left in pinned memory (copy=False); cpu: dequant_native + "
          "quantize_rows_native on all cores; clone/h2d/d2h: torch anchors of the same bytes.")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
