"""Run a script or pytest with ds_export.native.cuda.lib() replaced by a standalone weight-only build.

bench/wo_alt_lib.sh builds the weight-only GEMM alone (seconds, no CUTLASS units); this loads it as
the library every weight-only entry resolves through, so the GPU tests and benches of that kernel
run on it (other kernels' entries are absent from it: only the weight-only files work).
  python3 bench/wo_with_lib.py new.so pytest -q tests/gpu/test_gemm_weight_only_ws_cuda.py
  python3 bench/wo_with_lib.py new.so bench/gpu_gemm_weight_only.py --alt-lib old.so --ab ...
(One process only: for the GPU tests under pytest-xdist, -n 14, use the plugin bench/wo_lib_plugin.py.)
"""

from __future__ import annotations

import ctypes
import runpy
import sys

from ds_export.native import cuda


def use(path: str) -> None:
    """Every weight-only entry of this process through the standalone build at `path`."""
    cuda.cudart()  # (the CUDA runtime first, RTLD_GLOBAL, as lib() does)
    so = ctypes.CDLL(path)
    cuda.lib = lambda: so  # _fn looks lib up at call time


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2
    use(sys.argv[1])
    args = sys.argv[2:]
    if args[0] == "pytest":
        import pytest

        return pytest.main(args[1:])
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
