"""pytest plugin: every weight-only entry through a standalone build (bench/wo_alt_lib.sh), xdist workers included.

bench/wo_with_lib.py patches one process; under pytest-xdist each worker loads the plugins named by -p, so
  DSX_WO_LIB=new.so PYTHONPATH=.:bench python3 -m pytest -p wo_lib_plugin -n 14 tests/gpu/test_gemm_weight_only_cuda.py
runs the weight-only GPU tests on new.so in every worker (only the weight-only files: other kernels' entries are
absent from a standalone build).
"""

from __future__ import annotations

import os

import pytest
from wo_with_lib import use


def pytest_configure(config):
    path = os.environ.get("DSX_WO_LIB")
    if not path:
        raise pytest.UsageError("wo_lib_plugin: set DSX_WO_LIB to the standalone weight-only build to test (bench/wo_alt_lib.sh)")
    try:
        use(path)  # (in each worker: the same patch as bench/wo_with_lib.py's, which is on the path with this plugin)
    except OSError as e:
        raise pytest.UsageError(f"wo_lib_plugin: cannot load DSX_WO_LIB={path}: {e}") from None
