"""GPU benchmark of the MLA decode kernel against a torch reference and the HBM copy anchor.

``python bench/gpu_mla_decode.py --out DIR [--quick]`` on the GPU machine. Rows: B in 64, 128 x
T in 4096, 8192 x H in 16, 128 x S_q in 1, 2; every sequence has length T, pages shuffled.
Figures (timing: bench/gpu_timing.py): microseconds (median of replays of a CUDA graph of >= 4 calls, over
enough cache sets to exceed 3x the 60 MB L2), GB/s on cache bytes (B * T * 576 * 2) and its fraction of the
device-to-device copy bandwidth measured in the same run, TFLOP/s (2 * B * S_q * H * T * (576 + 512))
and its fraction of a bf16 dense matmul measured in the same run, and the torch reference (bmm over
a contiguous [B, T, 576] cache, fp32 softmax) timed the same way.

Which ratio is the goal: a cache token costs 1152 bytes and 2 * S_q * H * 1088 FLOPs, so the
intensity is about 1.9 * S_q * H FLOP/byte. At H = 16 (DeepSeek TP8) that is 30-60 FLOP/byte, far
under the ridge (matmul rate / copy rate, about 200 FLOP/byte here): memory-bound, goal >= 0.8 of
copy. At H = 128 it is 240-480 FLOP/byte: compute-bound (0.8 of copy would need ~770 TFLOP/s of
mma, about the dense bf16 ceiling), so there the figure of merit is the fraction of the matmul
rate. The `bound` column says which applies, `goal` repeats that ratio.

``--alt NAME=PATH[,...]`` also times other builds of the same C entry points (a .so with
dsx_mla_decode_paged_bf16_cuda and dsx_mla_decode_workspace_cuda, e.g. an older version of
csrc/cuda/mla_decode.cu compiled alone) on the same inputs, one row per build and case. The builds
of a case and its torch reference are timed interleaved (gpu_timing.interleaved: rounds in a
rotating order), since one-after-another timing favoured whichever ran first.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.native import cuda  # noqa: E402
from ds_export.native import mla_decode as M  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_timing  # noqa: E402
from gpu_timing import L2_BYTES as L2, torch_sampler  # noqa: E402


def alt_fns(path):
    """(run, workspace) entry points of another build of the kernel (same signatures as libdsx_cuda)."""
    cuda.cudart()  # the shared CUDA runtime first, loaded globally, as for libdsx_cuda
    so = ctypes.CDLL(path)
    P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    run, ws = so.dsx_mla_decode_paged_bf16_cuda, so.dsx_mla_decode_workspace_cuda
    run.argtypes = [P, P, P, P, P, P, I64, I64, I64, I64, I64, F32, I32, P, I64, P]
    ws.argtypes = [I64, I64, I64, I64, I32, ctypes.POINTER(I32), ctypes.POINTER(I64)]
    run.restype = ws.restype = ctypes.c_int
    return run, ws


def workspace_of(ws_fn, b, s_q, h, pages, num_splits):
    n, nbytes = ctypes.c_int(), ctypes.c_int64()
    assert ws_fn(b, s_q, h, pages, int(num_splits), ctypes.byref(n), ctypes.byref(nbytes)) == 0
    return n.value, nbytes.value


def case(b, t, h, s_q, copy_gbs, mm_tflops, num_splits=0, libs=None):
    """One row per build in `libs` ([(name, (run, workspace))]; default: libdsx_cuda as 'ours')."""
    pages = t // 64
    cache_bytes = b * t * 576 * 2
    n_sets = max(1, min(8, -(-3 * L2 // cache_bytes)))
    stream = torch.cuda.current_stream()
    scale = 1 / 192 ** 0.5
    sets = []
    for i in range(n_sets):
        kv = torch.randn(b * pages, 64, 576, device="cuda", dtype=torch.bfloat16)
        pt = torch.randperm(b * pages, device="cuda", dtype=torch.int32).view(b, pages)
        q = torch.randn(b, s_q, h, 576, device="cuda", dtype=torch.bfloat16)
        sets.append((q, kv, pt))
    lens = torch.full((b,), t, device="cuda", dtype=torch.int32)
    out = torch.empty(b, s_q, h, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(b, s_q, h, device="cuda", dtype=torch.float32)
    q, kv, pt = sets[0]
    cache = kv[pt.long()].view(b, t, 576)  # contiguous copy for the torch reference
    pos = torch.arange(t, device="cuda")

    def ref(qq, cc):
        sc = torch.einsum("bshd,btd->bsht", qq.float(), cc.float()) * scale
        lim = (t - s_q + torch.arange(s_q, device="cuda"))[None, :, None, None]
        sc = sc.masked_fill(pos[None, None, None, :] > lim, float("-inf"))
        return torch.einsum("bsht,btd->bshd", torch.softmax(sc, -1), cc[..., :512].float())

    want = ref(q, cache)
    tsets = [(qq, kk[pp.long()].view(b, t, 576)) for qq, kk, pp in sets[: min(2, n_sets)]]
    del cache

    def torch_ref():
        for qq, cc in tsets:
            s = torch.matmul(qq.view(b, s_q * h, 576), cc.transpose(1, 2)).float() * scale
            p = torch.softmax(s, -1).to(torch.bfloat16)
            torch.matmul(p, cc[..., :512])

    samplers = {"torch reference": torch_sampler([torch_ref] * max(1, -(-4 // len(tsets))))}
    keep, meta = [], {}
    flops = 2.0 * b * s_q * h * t * (576 + 512)
    memory_bound = flops / cache_bytes < mm_tflops * 1e3 / copy_gbs
    rows = []
    for name, (fn, ws_fn) in libs or [("ours", M._cuda_fns())]:
        splits, need = workspace_of(ws_fn, b, s_q, h, pages, num_splits)
        ws = torch.empty(max(need, 1), device="cuda", dtype=torch.uint8)

        def ours():
            st = torch.cuda.current_stream().cuda_stream  # the capture stream while a graph is captured
            for q, kv, pt in sets:
                rc = fn(q.data_ptr(), kv.data_ptr(), pt.data_ptr(), lens.data_ptr(), out.data_ptr(), lse.data_ptr(),
                        b, s_q, h, b * pages, pages, scale, num_splits, ws.data_ptr(), need, st)
                assert rc == 0, rc

        # correctness of this size against torch on the first set (poisoned output first)
        out.fill_(float("nan"))
        rc = fn(q.data_ptr(), kv.data_ptr(), pt.data_ptr(), lens.data_ptr(), out.data_ptr(), lse.data_ptr(), b, s_q,
                h, b * pages, pages, scale, num_splits, ws.data_ptr(), need, stream.cuda_stream)
        assert rc == 0, (name, rc)
        err = (out.float() - want).abs().max().item()
        calls = max(1, -(-4 // n_sets))  # >= 4 kernel calls per replay
        samplers[name] = torch_sampler([ours] * calls)
        keep.append(ws)  # the graph replays into it
        meta[name] = (splits, err)
    med = gpu_timing.interleaved(samplers)
    tus = med["torch reference"] / len(tsets)
    for name, (splits, err) in meta.items():
        us, how = med[name] / n_sets, "graph, interleaved"
        gbs = cache_bytes / us / 1e3
        tflops = flops / us / 1e6
        rows.append(dict(lib=name, B=b, T=t, H=h, S_q=s_q, splits=splits, us=us, GBs=gbs, frac_copy=gbs / copy_gbs,
                         TFLOPs=tflops, frac_mm=tflops / mm_tflops, bound="memory" if memory_bound else "compute",
                         goal=gbs / copy_gbs if memory_bound else tflops / mm_tflops,
                         torch_us=tus, speedup=tus / us, max_err=err, timing=how))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/gpu")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="", help="B:T:H:S_q[:splits],... instead of the default grid")
    ap.add_argument("--alt", default="", help="NAME=PATH,...: also time these builds of the kernel entry points")
    a = ap.parse_args()
    libs = [("ours", M._cuda_fns())] + [(kv.split("=", 1)[0], alt_fns(kv.split("=", 1)[1]))
                                        for kv in a.alt.split(",") if kv]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    copy_gbs = gpu_timing.copy_gbs()
    mm_tflops = gpu_timing.matmul_tflops()
    rows = []
    grid = [(64, 4096, 16, 1), (64, 4096, 128, 1)] if a.quick else \
        [(b, t, h, s) for b in (64, 128) for t in (4096, 8192) for h in (16, 128) for s in (1, 2)]
    if a.cases:
        grid = [tuple(int(x) for x in c.split(":")) for c in a.cases.split(",")]
    for g in grid:
        for r in case(*g[:4], copy_gbs, mm_tflops, *g[4:], libs=libs):
            rows.append(r)
            print(json.dumps(r))
        torch.cuda.empty_cache()
    (Path(a.out) / "bench_mla_decode.json").write_text(
        json.dumps({"copy_GBs": copy_gbs, "matmul_TFLOPs": mm_tflops, "rows": rows}, indent=1))
    print(f"anchors: copy {copy_gbs:.0f} GB/s (read + write), bf16 matmul 8192^3 {mm_tflops:.0f} TFLOP/s")
    print(f"{'lib':>5} {'B':>4} {'T':>5} {'H':>4} {'Sq':>2} {'spl':>3} {'us':>8} {'GB/s':>7} {'/copy':>6} "
          f"{'TFLOP/s':>8} {'/mm':>5} {'bound':>7} {'goal':>5} {'torch us':>9} {'x':>5} {'err':>8}")
    for r in rows:
        print(f"{r['lib'][:5]:>5} {r['B']:>4} {r['T']:>5} {r['H']:>4} {r['S_q']:>2} {r['splits']:>3} {r['us']:>8.1f} "
              f"{r['GBs']:>7.0f} {r['frac_copy']:>6.2f} {r['TFLOPs']:>8.1f} {r['frac_mm']:>5.2f} {r['bound']:>7} "
              f"{r['goal']:>5.2f} {r['torch_us']:>9.1f} {r['speedup']:>5.2f} {r['max_err']:>8.1e}")

if __name__ == "__main__":
    main()
