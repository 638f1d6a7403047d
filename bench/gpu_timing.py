"""How the GPU benchmarks time things: one place for the method, shared by bench/gpu_*.py.

- Our kernels run through ds_export.native.cuda (no framework); torch is used for anchors only.
- A figure is the median, over replays, of one CUDA-graph replay of S launches divided by S,
  timed between CUDA events: host launch latency stays out, and a launch that cannot be
  captured is reported (the timing then falls back to plain launches and says so).
- Inputs rotate over n_sets(bytes) sets whose total exceeds the 60 MB L2 about three times, so
  a figure is not an L2 figure.
- When several variants and their anchor are compared, they are timed interleaved (rounds of a
  few replays each, the order rotating every round): under sustained load the H200's clock sinks
  within a second, and one-after-another timing favoured whichever ran first by up to 20%.
- Anchors measured in the same run: device copy bandwidth (read + write of 512 MB of bf16) and
  the bf16 matmul rate (8192^3).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.native import cuda  # noqa: E402

try:
    import torch
except ImportError:  # anchors are optional; our own figures still print
    torch = None

L2_BYTES = 60 << 20


def n_sets(bytes_per_set: int, most: int = 16) -> int:
    """How many input sets to rotate over so that they exceed the L2 about three times."""
    return int(min(most, max(2, math.ceil(3 * L2_BYTES / max(bytes_per_set, 1)))))


def ours_sampler(launches):
    """(sample, mode): sample() times one graph replay of `launches` (fn(stream) each, our library's
    launches) and returns microseconds per launch. mode is "graph", or "direct (why)" when capture failed."""
    stream = cuda.Stream()
    for f in launches:
        f(stream)
    stream.synchronize()
    mode, graph = "graph", None
    try:
        graph = cuda.Graph(lambda s: [f(s) for f in launches], stream)
        run = graph.launch
    except Exception as exc:  # noqa: BLE001 - reported in the table, then plain launches are timed
        mode, run = f"direct ({exc.__class__.__name__})", (lambda: [f(stream) for f in launches])
    run()
    stream.synchronize()
    e0, e1 = cuda.Event(), cuda.Event()

    def sample():
        e0.record(stream)
        run()
        e1.record(stream)
        return e0.elapsed_ms(e1) * 1e3 / len(launches)

    sample.keep = graph  # the graph lives as long as the sampler
    return sample, mode


def time_ours(launches, reps: int = 20) -> tuple[float, str]:
    """(median microseconds per launch, mode) of graph replays of `launches`."""
    sample, mode = ours_sampler(launches)
    return statistics.median(sample() for _ in range(reps)), mode


def torch_sampler(calls):
    """sample() times one torch CUDA-graph replay of `calls` (no-argument callables) in us per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()  # warm-up on a side stream, as graph capture needs
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [c() for c in calls]  # noqa: F841 - kept alive while capturing: no call reuses another's output memory
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def sample():
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3 / len(calls)

    sample.keep = g
    return sample


def time_torch(calls, reps: int = 20) -> float:
    """Median microseconds per call of torch graph replays of `calls`."""
    sample = torch_sampler(calls)
    return statistics.median(sample() for _ in range(reps))


def interleaved(samplers: dict, rounds: int = 8, per_round: int = 3) -> dict:
    """{name: median us}: every sampler timed per_round times per round, the order rotating each round."""
    names, times = list(samplers), {name: [] for name in samplers}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name] += [samplers[name]() for _ in range(per_round)]
    return {name: statistics.median(t) for name, t in times.items()}


def copy_gbs() -> float | None:
    """Device copy of 512 MB of bf16: (bytes read + written) / time in GB/s, graph-timed like the kernels."""
    if torch is None:
        return None
    x = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    # Timed eagerly: captured in a CUDA graph, a device-to-device copy becomes a memcpy node that the
    # copy engines run (~2.7 TB/s on the H200) instead of an SM kernel (~4 TB/s), a different anchor.
    y.copy_(x)
    e0, e1, times = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for _ in range(10):
        e0.record()
        y.copy_(x)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return 2 * (1 << 28) * 2 / statistics.median(times) / 1e3


def matmul_tflops() -> float | None:
    """bf16 matmul 8192^3 in TFLOP/s: the dense tensor-core rate this GPU sustains."""
    if torch is None:
        return None
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = time_torch([lambda: torch.matmul(a, w)] * 4, reps=10)
    return 2 * n**3 / us / 1e6
