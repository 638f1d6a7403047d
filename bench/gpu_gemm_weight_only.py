"""GPU benchmark of the weight-only GEMM against torch bf16 matmul on the dequantized weight.

Run on the GPU machine (tests/gpu/run_all.sh does):
``python bench/gpu_gemm_weight_only.py --out DIR [--quick] [--sweep]``.

Rows: DeepSeek-V3 (N, K) in (36864, 7168), (7168, 18432), (2048, 7168), (7168, 2048),
(24576, 1536), (4096, 7168) x M in 1, 2, 4, 8, 16, 64 for int4 per channel (the headline:
DeepSeek's routed experts), and M in 1, 4, 16 for int4 group 128 and int8 per channel.
Method (as bench/gpu_kernels.py): random weight bytes (every byte is a valid code; never
zeros) copied into as many device sets as it takes to exceed 3x the 60 MB L2 (at most 16);
one launch per set captured in a CUDA graph, replayed between CUDA events; the figure is
the median over replays of (replay time / sets). The anchor, torch's x @ W^T with W the
bf16 dequantized weight [N, K], is timed the same way in the same run (once per shape and
M: the int4 per-channel rows time it, after checking its output against ours; the other
layouts reuse that time, the same bf16 product). Reported: microseconds, GB/s on the
weight bytes (qweight + scales), ratio = anchor time / our time (goal >= 3 at M <= 16 for
int4), and the fraction of the device-to-device copy bandwidth measured in the same run.
With --sweep, int4 per channel at M = 1 and 16 is also timed over (warps, splits, ring
slots, steps per slot; x chunk at M = 16) so the automatic choice can be tuned; the best is
printed beside the automatic one.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.formats import weight_only as wo  # noqa: E402
from ds_export.native import cuda  # noqa: E402
from ds_export.native import gemm_weight_only as G  # noqa: E402

L2_BYTES = 60 << 20
SHAPES = [(36864, 7168), (7168, 18432), (2048, 7168), (7168, 2048), (24576, 1536), (4096, 7168)]
MS = [1, 2, 4, 8, 16, 64]
MS_OTHER = [1, 4, 16]
LAYOUTS = [(4, -1), (4, 128), (8, -1)]
# (warps, splits, x chunk, ring slots, steps per slot); chunk 0 = automatic
SWEEP = [(w, s, 0, d, b) for w in (4, 8) for s in (1, 2, 4, 8)
         for d, b in ((4, 1), (8, 1), (2, 2), (4, 2), (2, 4), (3, 4), (2, 8))]
SWEEP_M16 = [(8, s, 16, d, b) for s in (2, 4, 8) for d, b in ((4, 1), (2, 4))]  # larger x chunks at M = 16
SWEEP_MS = (1, 16)

try:
    import torch
except ImportError:  # our figures still print
    torch = None


def n_sets(bytes_per_set: int) -> int:
    return int(min(16, max(2, math.ceil(3 * L2_BYTES / max(bytes_per_set, 1)))))


def time_graph(launches, reps: int = 30) -> tuple[float, str]:
    """Median microseconds per launch of a CUDA-graph replay of `launches` (fn(stream) each)."""
    stream = cuda.Stream()
    for f in launches:
        f(stream)
    stream.synchronize()
    mode = "graph"
    try:
        graph = cuda.Graph(lambda s: [f(s) for f in launches], stream)
        run = graph.launch
    except Exception as exc:  # report it, then time plain launches
        mode, run = f"direct ({exc.__class__.__name__})", (lambda: [f(stream) for f in launches])
    run()
    stream.synchronize()
    e0, e1, times = cuda.Event(), cuda.Event(), []
    for _ in range(reps):
        e0.record(stream)
        run()
        e1.record(stream)
        times.append(e0.elapsed_ms(e1) * 1e3 / len(launches))
    return statistics.median(times), mode


def time_torch(calls, reps: int = 30) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [c() for c in calls]  # noqa: F841 (kept alive by the graph pool)
    g.replay()
    torch.cuda.synchronize()
    e0, e1, times = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    return statistics.median(times)


def copy_bandwidth_tbps() -> float | None:
    """Device-to-device copy of 1 GiB: (bytes read + written) / time, TB/s."""
    if torch is None:
        return None
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    us = time_torch([lambda: b.copy_(a)], reps=10)
    return 2 * a.numel() / us / 1e6


class Problem:
    """Device sets of one (N, K, bits, group): Paddle bytes, scales and (for torch) bf16 weights."""

    def __init__(self, n, k, bits, group, rng):
        self.n, self.k, self.bits, self.group = n, k, bits, group
        q = rng.integers(-128, 128, (n if bits == 8 else n // 2, k), dtype=np.int8)
        sshape = (n,) if group == -1 else (-(-k // group), n)
        s = rng.uniform(0.004, 0.012, sshape).astype(np.float32).astype(G.BF16)
        self.q, self.s = q, s
        self.weight_bytes = q.nbytes + s.nbytes
        self.sets = n_sets(self.weight_bytes)
        self.dq = [cuda.to_device(q) for _ in range(self.sets)]
        self.ds = [cuda.to_device(s.view(np.uint16)) for _ in range(self.sets)]
        self.tw = None

    def torch_weights(self):
        if self.tw is None:
            w = torch.from_numpy(wo.dequantize_native(self.q, self.s, self.bits, self.group, 90, self.k))
            w0 = w.to(device="cuda", dtype=torch.bfloat16)
            del w
            self.tw = [w0] + [w0.clone() for _ in range(n_sets(w0.numel() * 2) - 1)]
        return self.tw

    def free_torch(self):
        self.tw = None


def bench_row(pb: Problem, m: int, rng, sweep: bool, anchors: dict) -> dict:
    x = rng.standard_normal((m, pb.k)).astype(np.float32).astype(G.BF16)
    dx = [cuda.to_device(x.view(np.uint16)) for _ in range(pb.sets)]
    out = cuda.empty((m, pb.n), np.uint16)

    def calls(algo):
        return [lambda st, i=i: G.gemm_weight_only_cuda_device(dx[i], pb.dq[i], pb.ds[i], out, bits=pb.bits,
                                                               group_size=pb.group, algo=algo, stream=st)
                for i in range(pb.sets)]

    us, mode = time_graph(calls(0))
    cfg = G.cuda_config(m, pb.n, pb.k, pb.bits, pb.group)
    row = {"kernel": "gemm_weight_only", "layout": f"int{pb.bits} g{pb.group}", "M": m, "N": pb.n, "K": pb.k,
           "sets": pb.sets, "mode": mode, "config": cfg, "us": round(us, 2),
           "weight_GBps": round(pb.weight_bytes / us / 1e3, 1)}
    if sweep:
        best = ("auto", us)
        for w, s, c, d, b in SWEEP + (SWEEP_M16 if m == 16 else []):
            key = f"w{w}_s{s}_d{d}_b{b}" + (f"_c{c}" if c else "")
            try:
                t, _ = time_graph(calls(G.algo_word(w, s, c, d, b)))
            except Exception as exc:  # a config that does not fit (shared memory) is skipped
                row[f"us_{key}"] = repr(exc)[:60]
                continue
            row[f"us_{key}"] = round(t, 2)
            best = min(best, (key, t), key=lambda b: b[1])
        row.update(best=best[0], best_us=round(best[1], 2))
    akey = (pb.n, pb.k, m)
    if torch is not None and akey not in anchors and (pb.bits, pb.group) == (4, -1):
        tw = pb.torch_weights()
        tx = torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
        G.gemm_weight_only_cuda_device(dx[0], pb.dq[0], pb.ds[0], out, bits=pb.bits, group_size=pb.group)
        cuda.synchronize()
        ours = torch.from_numpy(out.numpy().view(np.int16)).cuda().view(torch.bfloat16).float()
        theirs = (tx @ tw[0].t()).float()
        row["rel_diff_vs_anchor"] = float(((ours - theirs).norm() / theirs.norm()).item())
        anchors[akey] = time_torch([lambda w=w: tx @ w.t() for w in tw])
    if akey in anchors:
        t_us = anchors[akey]
        row.update(anchor_us=round(t_us, 2), ratio=round(t_us / us, 2))
        if sweep:
            row["best_ratio"] = round(t_us / row["best_us"], 2)
    return row


def table(rows, copy_tbps) -> str:
    head = (f"{'layout':<10}{'M':>4}{'N':>7}{'K':>7}{'us':>9}{'GB/s':>8}{'%copy':>7}{'torch us':>10}{'ratio':>7}"
            f"  {'config (w s c d b)':<22}best")
    lines = [head, "-" * len(head)]
    for r in rows:
        pct = f"{100 * r['weight_GBps'] / 1e3 / copy_tbps:.0f}" if copy_tbps else "-"
        c = r["config"]
        cfg = f"{c['warps']} {c['splits']} {c['chunk']} {c['stages']} {c['box']}"
        best = f"{r['best']} {r['best_us']}us x{r.get('best_ratio', '-')}" if "best" in r else ""
        lines.append(f"{r['layout']:<10}{r['M']:>4}{r['N']:>7}{r['K']:>7}{r['us']:>9}{r['weight_GBps']:>8}{pct:>7}"
                     f"{r.get('anchor_us', '-'):>10}{r.get('ratio', '-'):>7}  {cfg:<22}{best}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/gpu")
    ap.add_argument("--quick", action="store_true", help="int4 per channel only, no sweep")
    ap.add_argument("--sweep", action="store_true", help="time int4 per channel M=1, 16 over the tuning fields")
    ap.add_argument("--shapes", default="", help="comma-separated NxK subset, e.g. 36864x7168,2048x7168")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    copy_tbps = copy_bandwidth_tbps()
    print(json.dumps({"copy_TBps_read_plus_write": copy_tbps}))
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows, failed, anchors = [], 0, {}
    layouts = LAYOUTS[:1] if args.quick else LAYOUTS
    with open(out / "bench_gemm_weight_only.jsonl", "w") as log:
        for bits, group in layouts:
            for n, k in shapes:
                pb = Problem(n, k, bits, group, rng)
                for m in (MS if (bits, group) == (4, -1) else MS_OTHER):
                    try:
                        sweep = args.sweep and not args.quick and (bits, group) == (4, -1) and m in SWEEP_MS
                        row = bench_row(pb, m, rng, sweep, anchors)
                    except Exception as exc:  # one bad row must not hide the others
                        row, failed = {"layout": f"int{bits} g{group}", "M": m, "N": n, "K": k, "error": repr(exc)}, 1
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    if "error" in row:
                        print(json.dumps(row))
                    else:
                        rows.append(row)
                        if row.get("rel_diff_vs_anchor", 0) > 2e-2:
                            print(json.dumps(row))
                            failed = 1
                pb.free_torch()
                del pb
                if torch is not None:
                    torch.cuda.empty_cache()
    text = table(rows, copy_tbps)
    (out / "bench_gemm_weight_only.txt").write_text(text + "\n")
    print(f"\ncopy bandwidth (read + write): {copy_tbps and round(copy_tbps, 2)} TB/s")
    print(text)
    return failed


if __name__ == "__main__":
    sys.exit(main())
