"""Host time of the measured tables' lookups (CPU only; no GPU needed).

The automatic choice of the weight-only and block FP8 GEMMs looks every launch up in a table measured by
bench/tune_auto.py (csrc/cuda/gemm_weight_only_tuned.inc, about 700 entries; gemm_fp8_tuned.inc) before
its rules (the FP8 one: gemm_fp8_tuned_table.cuh). That lookup runs on the host for every launch, ahead of cudaLaunchKernel. This script compiles the
units' host code (nvcc, PTX only, as tests/test_gemm_weight_only_cuda_compile.py's harness does) with a small
timing program and prints, side by side in one process, the ns a lookup takes through the units' binary search
(tuned_tables.cuh's tuned_find) against the anchor, a linear scan of the same table (the lookup before the
forty-sixth session), for launches the table lists (both ends of every entry) and shapes it does not list.
Each table lookup is also checked against the scan (same word for every query), so a wrong search shows.

    python3 bench/tuned_lookup_cost.py [--csrc DIR] [--iters N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROGRAM = r"""
#include "WO_UNIT"
#include "gemm_fp8_tuned_table.cuh"
#include <chrono>
#include <cstdio>
#include <vector>

// the anchor: the lookup as it was, a linear scan of the same table
static int linear_wo(int rows, int64_t n, int64_t k, int bits, int group) {
  for (size_t i = 0; i < kWsTunedLen; ++i) {
    const WsTuned& t = kWsTuned[i];
    if (t.bits == bits && t.group == group && t.n == n && t.k == k && rows >= t.rows_lo && rows <= t.rows_hi)
      return t.word;
  }
  return 0;
}
static int binary_wo(int rows, int64_t n, int64_t k, int bits, int group) {
  return ws_tuned_word(rows, n, k, bits, group, kWsTunedSms);
}
static int linear_fp8(int64_t m, int64_t n, int64_t k) {
  for (size_t i = 0; i < dsx_cuda::kFp8TunedLen; ++i) {
    const dsx_cuda::Fp8Tuned& t = dsx_cuda::kFp8Tuned[i];
    if (t.n == n && t.k == k && m >= t.m_lo && m <= t.m_hi) return t.algo;
  }
  return 0;
}
static int binary_fp8(int64_t m, int64_t n, int64_t k) {  // (as gemm_fp8_api.cu's tuned(): the card's table)
  const dsx_cuda::Fp8Tuned* t = dsx_cuda::fp8_tuned_find(dsx_cuda::tuned_card(132), n, k, m);
  return t ? t->algo : 0;
}

struct Q { int rows; int64_t n, k; int bits, group; };
volatile int sink;

template <class F>
static double ns_per_query(const std::vector<Q>& qs, F f, int iters) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it)
      for (const Q& q : qs) sink = f(q);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ns / (double(iters) * qs.size()));
  }
  return best;
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  std::vector<Q> wo_hit, wo_miss, fp8_hit, fp8_miss;
  for (size_t i = 0; i < kWsTunedLen; ++i) {
    const WsTuned& t = kWsTuned[i];
    wo_hit.push_back({t.rows_lo, t.n, t.k, t.bits, t.group});
    wo_hit.push_back({t.rows_hi, t.n, t.k, t.bits, t.group});
    wo_miss.push_back({t.rows_lo, t.n + 8, t.k, t.bits, t.group});  // (a shape no table lists)
  }
  for (size_t i = 0; i < dsx_cuda::kFp8TunedLen; ++i) {
    const dsx_cuda::Fp8Tuned& t = dsx_cuda::kFp8Tuned[i];
    fp8_hit.push_back({t.m_lo, t.n, t.k, 0, 0});
    fp8_hit.push_back({t.m_hi, t.n, t.k, 0, 0});
    fp8_miss.push_back({t.m_lo, t.n + 8, t.k, 0, 0});
  }
  // the same word both ways, for every query and the rows around each entry's ends
  int wrong = 0, checked = 0;
  for (const auto* qs : {&wo_hit, &wo_miss})
    for (const Q& q : *qs)
      for (int d = -1; d <= 1; ++d, ++checked)
        wrong += binary_wo(q.rows + d, q.n, q.k, q.bits, q.group) != linear_wo(q.rows + d, q.n, q.k, q.bits, q.group);
  for (const auto* qs : {&fp8_hit, &fp8_miss})
    for (const Q& q : *qs)
      for (int d = -1; d <= 1; ++d, ++checked)
        wrong += binary_fp8(q.rows + d, q.n, q.k) != linear_fp8(q.rows + d, q.n, q.k);
  std::printf("checked %d queries, %d differ\n", checked, wrong);
  std::printf("table entries: weight-only %zu, fp8 %zu\n", kWsTunedLen, dsx_cuda::kFp8TunedLen);
  auto row = [&](const char* what, const std::vector<Q>& qs, auto bin, auto lin) {
    const double b = ns_per_query(qs, bin, iters), l = ns_per_query(qs, lin, iters);
    std::printf("%-34s %9.1f %9.1f %7.1fx\n", what, b, l, l / b);
  };
  std::printf("%-34s %9s %9s %8s\n", "ns a lookup", "binary", "linear", "speedup");
  row("weight-only, listed (both ends)", wo_hit, [](const Q& q) { return binary_wo(q.rows, q.n, q.k, q.bits, q.group); },
      [](const Q& q) { return linear_wo(q.rows, q.n, q.k, q.bits, q.group); });
  row("weight-only, not listed", wo_miss, [](const Q& q) { return binary_wo(q.rows, q.n, q.k, q.bits, q.group); },
      [](const Q& q) { return linear_wo(q.rows, q.n, q.k, q.bits, q.group); });
  row("fp8, listed (both ends)", fp8_hit, [](const Q& q) { return binary_fp8(q.rows, q.n, q.k); },
      [](const Q& q) { return linear_fp8(q.rows, q.n, q.k); });
  row("fp8, not listed", fp8_miss, [](const Q& q) { return binary_fp8(q.rows, q.n, q.k); },
      [](const Q& q) { return linear_fp8(q.rows, q.n, q.k); });
  return wrong != 0;
}
"""

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csrc", type=Path, default=REPO / "csrc", help="the csrc tree to time (default: this one)")
    ap.add_argument("--iters", type=int, default=200, help="passes over the queries a repetition (best of 5)")
    a = ap.parse_args(argv)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        print("error: nvcc not found: this bench compiles the units' host code with it (install the CUDA toolkit)",
              file=sys.stderr)
        return 2
    cuda = a.csrc / "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "lookup.cu"
        src.write_text(PROGRAM.replace("WO_UNIT", str(cuda / "gemm_weight_only.cu")))
        exe = tmp / "lookup"
        cmd = [nvcc, "-std=c++17", "-O2", "-gencode=arch=compute_90a,code=compute_90a",
               f"-I{a.csrc / 'include'}", f"-I{cuda}", str(src), "-o", str(exe)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            print(f"error: nvcc failed on the lookup program:\n{(res.stdout + res.stderr)[-3000:]}", file=sys.stderr)
            return 1
        # (each lookup first asks which card's table applies, tuned_card.cuh: named here, as no device is
        # asked on a machine without one; on a GPU the judged card costs a cudaGetDevice and a cached load besides)
        run = subprocess.run([str(exe), str(a.iters)], capture_output=True, text=True,
                             env={**os.environ, "DSX_TUNED_CARD": "h200"})
        print("card: h200 (DSX_TUNED_CARD)")
        print(run.stdout, end="")
        if run.returncode:
            print("error: the binary search and the linear scan disagree (see above)", file=sys.stderr)
        return run.returncode


if __name__ == "__main__":
    sys.exit(main())
