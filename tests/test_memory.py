"""Bounded memory: quantizing tensors far larger than the chunk budget stays within it (RSS measured).

Peak = RssAnon + RssShmem of the quantize process (file pages of the mmapped
source do not count: the kernel can drop them), sampled every 20 ms.
"""

from __future__ import annotations

import sys

import pytest

from ds_export.procmem import run_measured
from ds_export.tiny import TinySpec, write_tiny

ROWS, COLS = 24576, 2048  # each dense MLP weight: 48 MiB FP8, 96 MiB as bf16, 192 MiB as float32
WIDE = TinySpec(layers=1, overrides=(("hidden_size", COLS), ("intermediate_size", ROWS)))


@pytest.fixture(scope="module")
def wide_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("wide") / "ck"
    write_tiny(out, WIDE)
    return out


def _peak(src, out, args):
    cmd = [sys.executable, "-m", "ds_export.cli.app", "quantize", str(src), "--out", str(out), "-j", "1", "-q", *args]
    r, _, peak = run_measured(cmd)
    assert r.returncode == 0
    return peak


# type -> MiB of one converted [24576, 2048] tensor (0: a copy straight from the mapped file)
OUT_MIB = {"bf16": 96, "weight_only_int8": 48, "weight_only_int4": 24, "a8w8_fp8": 0}


@pytest.mark.parametrize("typ", list(OUT_MIB))
def test_peak_memory_is_bounded_by_the_chunk_budget(wide_ckpt, tmp_path, typ):
    base = _peak(wide_ckpt, tmp_path / "d", ["--type", typ, "--dry-run"])  # interpreter + libraries + plan
    small = _peak(wide_ckpt, tmp_path / "s", ["--type", typ, "--memory-mb", "16"])
    large = _peak(wide_ckpt, tmp_path / "l", ["--type", typ, "--memory-mb", "2048", "--force"])
    print(f"{typ}: base {base / 2**20:.0f} MiB, 16 MiB budget {small / 2**20:.0f} MiB, "
          f"2 GiB budget {large / 2**20:.0f} MiB")
    # 16 MiB of chunks (plus the output chunk and scales) over the baseline: nowhere near one tensor.
    assert small - base < 48 * 2**20, f"{typ}: {(small - base) / 2**20:.0f} MiB over the baseline"
    if not OUT_MIB[typ]:  # FP8 -> a8w8_fp8 is a copy straight from the mapped file: no budget is used at all
        assert large - base < 48 * 2**20
    else:  # the budget is what bounds it: with room for whole tensors the same run holds a whole output
        assert large - small > OUT_MIB[typ] * 2**20 // 2
