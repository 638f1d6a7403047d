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


_RESIDENT = """
import ctypes, mmap, sys
import numpy as np
from ds_export.procmem import reuse_freed_pages
took = reuse_freed_pages() if sys.argv[1] == "reuse" else None
n, page = 96 << 20, mmap.PAGESIZE
np.ones(n, np.uint8)  # (made, touched, freed)
a = np.empty(n, np.uint8)  # (the next tensor of that size, not touched yet)
lo = -(-a.ctypes.data // page) * page  # (the whole pages inside it)
count = (a.ctypes.data + n - lo) // page
vec = (ctypes.c_ubyte * count)()
libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
assert libc.mincore(lo, count * page, vec) == 0, ctypes.get_errno()
print(took, sum(v & 1 for v in vec) / count)
"""


def test_reuse_freed_pages_lands_the_next_tensor_in_freed_pages():
    """By default a big array is a fresh mapping whose pages the kernel faults in and zeroes at its first touch;
    after reuse_freed_pages (an export's setting) the next array of that size is made of the pages its predecessor
    freed: resident before it is touched (the kernel's word: mincore), in fresh processes either way."""
    import subprocess

    def resident(mode):
        r = subprocess.run([sys.executable, "-c", _RESIDENT, mode], capture_output=True, text=True, check=True)
        took, share = r.stdout.split()
        return took, float(share)

    assert resident("plain") == ("None", 0.0)
    assert resident("reuse") == ("True", 1.0)


def test_export_sets_reuse_freed_pages(tmp_path, monkeypatch):
    """dsx export (and each rank process, `_rank_process`) reuses freed pages: a tensor made per weight (dequantized,
    transposed) would otherwise be fresh pages, about 0.4 s a GB of system time on the dev VM."""
    from ds_export.export import exporter

    calls = []
    monkeypatch.setattr(exporter, "reuse_freed_pages", lambda: calls.append(1))
    write_tiny(tmp_path / "ck", TinySpec(layers=1))
    exporter.export(tmp_path / "ck", tmp_path / "e", max_seq_len=64)
    assert calls
    calls.clear()
    exporter._rank_process(str(tmp_path / "ck"), str(tmp_path / "r"), 0, 2, "float32", 64, False)
    assert calls and (tmp_path / "r").exists()


def test_the_sampler_outlives_a_process_that_ends_between_its_reads(monkeypatch):
    """PeakSampler's walk of a process tree met a process that ended between the check of its /proc entry and the
    listing of its tasks: a traceback in the sampler's thread (seen once under dsx quantize). A gone process has no
    children. The race is made here: the listing of a live process's tasks fails as it does for a gone one."""
    import os
    import subprocess

    from ds_export.procmem import _children, tree

    gone = f"/proc/{os.getpid()}/task"

    def vanished(real):
        def call(path=".", *a):
            if str(path).startswith(gone):
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return real(path, *a)
        return call

    monkeypatch.setattr(os, "scandir", vanished(os.scandir))
    monkeypatch.setattr(os, "listdir", vanished(os.listdir))
    assert _children(os.getpid()) == [] and tree(os.getpid()) == [os.getpid()]
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # (reaped: its /proc entry is gone)
    assert tree(p.pid) == [p.pid]
