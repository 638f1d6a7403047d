"""Two libdsx_cuda builds on the block FP8 GEMM, timed interleaved in one process (bench/gpu_timing.py).

``python3 bench/gemm_fp8_ab_libs.py OLD.so NEW.so MxNxK[,MxNxK...] ALGO[,ALGO...] [ROUNDS]``: for each shape and
round, every algo on both builds over the same rotated input sets (past L2), medians of graph replays, and whether
the two builds' outputs are bitwise equal. Each build runs with the workspace its own query asks for. E.g. main's
build against a branch's, auto with and without PDL: ``... 64x7168x2048,128x7168x2048 0,268435456 3``. Random fp8
bytes 0..119 (no NaN codes), scales 5e-3..2e-2.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ds_export.native import cuda  # noqa: E402
from gpu_timing import interleaved, n_sets, ours_sampler  # noqa: E402

P, I64, I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def main() -> int:
    if len(sys.argv) < 5 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2
    cuda.cudart()  # the shared CUDA runtime first (RTLD_GLOBAL), then both builds, each RTLD_LOCAL
    libs = {name: ctypes.CDLL(path) for name, path in (("old", sys.argv[1]), ("new", sys.argv[2]))}
    for lib in libs.values():
        lib.dsx_gemm_fp8_nt_cuda.argtypes = [P, P, P, P, P, I64, I64, I64, P, I64, I32, P]
        lib.dsx_gemm_fp8_nt_cuda.restype = I32
        lib.dsx_gemm_fp8_nt_workspace_cuda.argtypes = [I64, I64, I64, I32, P]
        lib.dsx_gemm_fp8_nt_workspace_cuda.restype = I32
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[3].split(",")]
    algos = [int(a) for a in sys.argv[4].split(",")]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        for m, n, k in shapes:
            kb, nb = (k + 127) // 128, (n + 127) // 128
            sets = [[cuda.to_device(x) for x in (rng.integers(0, 120, (m, k), dtype=np.uint8),
                                                 rng.uniform(5e-3, 2e-2, (m, kb)).astype(np.float32),
                                                 rng.integers(0, 120, (n, k), dtype=np.uint8),
                                                 rng.uniform(5e-3, 2e-2, (nb, kb)).astype(np.float32))]
                    for _ in range(n_sets(m * k + n * k + 4 * (m * kb + nb * kb)))]
            outs = {name: cuda.empty((m, n), np.uint16) for name in libs}
            samplers = {}
            for name, lib in libs.items():
                for algo in algos:
                    # each build's own workspace for this algo (what its query asks; a build may need none)
                    need = I64(0)
                    assert lib.dsx_gemm_fp8_nt_workspace_cuda(m, n, k, algo, ctypes.byref(need)) == 0
                    ws = cuda.empty((max(1, need.value),), np.uint8)

                    def call(d, lib=lib, algo=algo, o=outs[name], ws=ws):
                        def f(s):
                            rc = lib.dsx_gemm_fp8_nt_cuda(d[0].ptr, d[1].ptr, d[2].ptr, d[3].ptr, o.ptr, m, n, k,
                                                          ws.ptr, ws.nbytes, algo, cuda._h(s))
                            assert rc == 0, f"algo {algo:#x}: rc {rc}"
                        return f
                    samplers[f"{name}:{algo:#x}"] = ours_sampler([call(d) for d in sets])[0]
            med = interleaved(samplers)
            # (every sampler's replay ends with the last input set: the two outputs are comparable)
            bits = np.array_equal(outs["old"].numpy(), outs["new"].numpy())
            print(f"{m}x{n}x{k} bits_equal={bits} " + ", ".join(f"{key} {v:.2f}" for key, v in med.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
