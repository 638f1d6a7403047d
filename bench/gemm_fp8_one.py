"""Run the block FP8 GEMM once per algo at one shape (a target for ncu; no timing, no checks).

``ncu --clock-control none python3 bench/gemm_fp8_one.py 4096 2048 7168 20487 7 5``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ds_export.native import cuda  # noqa: E402


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2
    m, n, k, *algos = (int(v) for v in sys.argv[1:])
    rng = np.random.default_rng(0)
    kb, nb = (k + 127) // 128, (n + 127) // 128
    host = [rng.integers(0, 120, (m, k), dtype=np.uint8), rng.uniform(5e-3, 2e-2, (m, kb)).astype(np.float32),
            rng.integers(0, 120, (n, k), dtype=np.uint8), rng.uniform(5e-3, 2e-2, (nb, kb)).astype(np.float32)]
    dev = [cuda.to_device(x) for x in host]
    out = cuda.empty((m, n), np.uint16)
    for algo in algos or [0]:
        ws = cuda.empty((max(1, cuda.gemm_workspace_bytes(m, n, k, algo)),), np.uint8)
        cuda.gemm_fp8_nt_device(*dev, out, workspace=ws, algo=algo)
        print(algo, out.numpy()[0, :4])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
