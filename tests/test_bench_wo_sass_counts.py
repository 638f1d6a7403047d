"""bench/wo_sass_counts.py: the step loop's instruction counts from cuobjdump's SASS text (checked here on a
hand-written listing in its layout: a `Function :` header, then `/*offset*/  OPCODE operands ;` lines)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import wo_sass_counts  # noqa: E402

LISTING = """
Fatbin elf code:
================
arch = sm_90a

	code for sm_90a
		Function : _ZN52_GLOBAL__N__0_19_gemm_weight_only_cu_ab12cd3417wo_gemm_ws_kernelILi4ELi2ELi2ELi2EEEvNS_6ParamsE
	.headerflags	@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/                   LDS.64 R4, [R2] ;                           /* 0x0000000002047984 */
        /*0020*/                   HMMA.16816.F32.BF16 R8, R12, R4, RZ ;       /* 0x000000040c08723c */
        /*0030*/                   IMAD.MOV.U32 R5, RZ, RZ, R7 ;               /* 0x000000ffff057224 */
        /*0040*/              @!P0 LDS.U16 R6, [R3] ;                          /* 0x0000000003068984 */
        /*0050*/                   HMMA.16816.F32.BF16 R8, R16, R4, R8 ;       /* 0x000000041008723c */
        /*0060*/                   MOV R20, R21 ;                              /* 0x0000001500147202 */
        /*0070*/                   EXIT ;                                      /* 0x000000000000794d */
		Function : _ZN52_GLOBAL__N__0_19_gemm_weight_only_cu_ab12cd3411other_kernelEv
        /*0000*/                   LDS.128 R4, [R2] ;                          /* 0x0000000002047984 */
        /*0010*/                   EXIT ;                                      /* 0x000000000000794d */
"""


def test_counts_over_the_hmma_span(tmp_path, monkeypatch):
    tools = tmp_path / "nvidia" / "cu13" / "bin"
    tools.mkdir(parents=True)
    for name in ("cuobjdump", "nvdisasm"):
        (tools / name).write_text(f"#!/bin/sh\ncat {tmp_path / 'listing.txt'}\n")
        (tools / name).chmod(0o755)
    (tmp_path / "listing.txt").write_text(LISTING)
    for var in ("CUOBJDUMP", "NVDISASM_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DSX_SASS_TOOLS", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # (no cuobjdump of the machine's own)
    funcs = wo_sass_counts.sass_functions(tmp_path / "any.so")
    assert len(funcs) == 2
    ws = next(ops for name, ops in funcs.items() if "wo_gemm_ws_kernel" in name)
    # the span runs from the first HMMA (0x20) to the last (0x50): 4 instructions, one move and one predicated load
    # inside it; the MOV after the last HMMA and the loads before the first are outside
    assert wo_sass_counts.loop_counts(ws) == {"span": 4, "mma": 2, "moves": 1, "loop_moves": 1, "lds": {"U16": 1}}
    # the same HMMA pair further apart than a step loop's: its move is no loop move
    far = ws[:3] + ["LOP3.LUT"] * wo_sass_counts.LOOP_GAP + ws[3:]
    assert wo_sass_counts.loop_counts(far)["moves"] == 1 and wo_sass_counts.loop_counts(far)["loop_moves"] == 0
    # wgmma (the WG consumers) counts as the loops' tensor-core instruction too
    wg = ["R2UR", "HGMMA.64x32x16.F32.BF16", "IMAD.MOV.U32", "HGMMA.64x32x16.F32.BF16", "EXIT"]
    assert wo_sass_counts.loop_counts(wg) == {"span": 3, "mma": 2, "moves": 1, "loop_moves": 1, "lds": {}}
    other = next(ops for name, ops in funcs.items() if "other_kernel" in name)
    assert wo_sass_counts.loop_counts(other) is None
    assert wo_sass_counts.main([str(tmp_path / "any.so"), "wo_gemm_ws"]) == 0
    assert wo_sass_counts.main([str(tmp_path / "any.so"), "no_such_kernel"]) == 1


def test_missing_tools_say_what_to_install(tmp_path, monkeypatch):
    for var in ("CUOBJDUMP", "NVDISASM_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DSX_SASS_TOOLS", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(SystemExit, match="pip install nvidia-cuda-cuobjdump"):
        wo_sass_counts.sass_functions(tmp_path / "any.so")
