"""pytest plugin: every weight-only entry through a standalone build (bench/wo_alt_lib.sh), xdist workers included.

bench/wo_with_lib.py patches one process; under pytest-xdist each worker loads the plugins named by -p, so
  DSX_WO_LIB=new.so PYTHONPATH=.:bench python3 -m pytest -p wo_lib_plugin -n 14 tests/gpu/test_gemm_weight_only_cuda.py
runs the weight-only GPU tests on new.so in every worker (only the weight-only files: other kernels' entries are
absent from a standalone build).
"""

from __future__ import annotations

import ctypes
import os

import pytest

from ds_export.native import cuda


def pytest_configure(config):
    path = os.environ.get("DSX_WO_LIB")
    if not path:
        raise pytest.UsageError("wo_lib_plugin: set DSX_WO_LIB to the standalone weight-only build to test (bench/wo_alt_lib.sh)")
    cuda.cudart()  # (the CUDA runtime first, RTLD_GLOBAL, as lib() does)
    so = ctypes.CDLL(path)
    cuda.lib = lambda: so  # (_fn looks lib up at call time)
