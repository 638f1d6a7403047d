"""The CUDA MLA decode without a GPU: it compiles for sm_90a, the header is plain C, and the
device entry refuses bad inputs before it touches the GPU. (Numbers are checked on the GPU
machine by tests/gpu/test_mla_decode_cuda.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.native import cuda
from ds_export.native import mla_decode as M
from ds_export.native.build import CSRC

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
UNIT = CSRC / "cuda" / "mla_decode.cu"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_compiles_for_sm90a_without_spills(tmp_path):
    cmd = [NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-O3",
           "-Xcompiler", "-fPIC", "-Xptxas", "-v", f"-I{CSRC / 'include'}", "-c", str(UNIT), "-o", str(tmp_path / "m.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"nvcc failed:\n{log[-4000:]}"
    blocks = log.split("Compiling entry function")[1:]
    names = {re.search(r"mla_decode_kernelILi(\d)E", b).group(1) for b in blocks if "mla_decode_kernel" in b[:80]}
    assert names == {"1", "2", "3", "4"}, names
    assert any("mla_combine_kernel" in b[:80] for b in blocks)
    # the path for > 64 rows: TMA-multicast pairs (2, the default), TMA per CTA (1), cp.async (0, the
    # fallback without the driver's tensor-map encoder)
    wg = {re.search(r"mla_decode_wgmma_kernelILi(\d)E", b).group(1) for b in blocks if "mla_decode_wgmma_kernel" in b[:80]}
    assert wg == {"0", "1", "2"}, wg
    # setmaxnreg honoured (C7507) and no wgmma serialized by the compiler (C7510-C7512, C7520)
    for code in ("C7507", "C7510", "C7511", "C7512", "C7520"):
        assert code not in log, f"ptxas {code}: " + next(x for x in log.splitlines() if code in x)
    for b in blocks:
        assert "0 bytes spill stores" in b and "0 bytes spill loads" in b, f"spills in {b[:200]}"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_header_is_plain_c(tmp_path):
    src = tmp_path / "t.c"
    src.write_text(  # pins the signatures the Python binding declares
        '#include "dsx.h"\n'
        "typedef int (*cpu_fn)(const uint16_t*, const uint16_t*, const int32_t*, const int32_t*, uint16_t*, float*,"
        " int64_t, int64_t, int64_t, int64_t, int64_t, float, int);\n"
        "typedef int (*cuda_fn)(const void*, const void*, const void*, const void*, void*, void*, int64_t, int64_t,"
        " int64_t, int64_t, int64_t, float, int, void*, int64_t, void*);\n"
        "typedef int (*ws_fn)(int64_t, int64_t, int64_t, int64_t, int, int*, int64_t*);\n"
        "int main(void) { cpu_fn f = dsx_mla_decode_paged_bf16_cpu; cuda_fn g = dsx_mla_decode_paged_bf16_cuda;\n"
        "  ws_fn w = dsx_mla_decode_workspace_cuda; return f == 0 || g == 0 || w == 0; }\n"
    )
    res = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", f"-I{CSRC / 'include'}", str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_shared_memory_plan_fits_sm90():
    """Smem<MT>::kBytes restated: Q tile + 3 stages of 32 tokens + scores + probabilities + stats <= 227 KB."""
    for mt in (1, 2, 3, 4):
        rows = 16 * mt
        total = rows * 576 * 2 + 3 * 32 * 576 * 2 + rows * 36 * 4 + rows * 40 * 2 + 3 * rows * 4
        assert total <= 227 * 1024, (mt, total)


def _fake(shape, dtype):
    a = object.__new__(cuda.DeviceArray)
    a.shape, a.dtype, a.ptr, a.nbytes = tuple(shape), np.dtype(dtype), None, 0
    return a


@pytest.mark.parametrize("case,match", [
    ("numpy_q", "q: expected a ds_export.native.cuda.DeviceArray"), ("sq7", "S_q"), ("h129", "H"),
    ("kv_dtype", "kv_cache: expected a DeviceArray"), ("out_shape", "out: expected a DeviceArray"),
    ("lse_dtype", "lse: expected a DeviceArray"), ("lens_shape", "cache_lens: expected a DeviceArray"),
])
def test_device_entry_checks_before_launch(case, match):
    b, s_q, h, mp = 2, 2, 16, 4
    args = dict(q=_fake((b, s_q, h, 576), np.uint16), kv=_fake((10, 64, 576), np.uint16), pt=_fake((b, mp), np.int32),
                lens=_fake((b,), np.int32), out=_fake((b, s_q, h, 512), np.uint16), lse=_fake((b, s_q, h), np.float32))
    if case == "numpy_q":
        args["q"] = np.zeros((b, s_q, h, 576), np.uint16)
    elif case == "sq7":
        args["q"] = _fake((b, 7, h, 576), np.uint16)
    elif case == "h129":
        args["q"] = _fake((b, s_q, 129, 576), np.uint16)
    elif case == "kv_dtype":
        args["kv"] = _fake((10, 64, 576), np.float32)
    elif case == "out_shape":
        args["out"] = _fake((b, s_q, h, 576), np.uint16)
    elif case == "lse_dtype":
        args["lse"] = _fake((b, s_q, h), np.float64)
    elif case == "lens_shape":
        args["lens"] = _fake((b + 1,), np.int32)
    with pytest.raises(DsxError, match=match):
        M.mla_decode_cuda_device(*args.values(), 0.1)
