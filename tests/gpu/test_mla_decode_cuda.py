"""CUDA MLA decode (csrc/cuda/mla_decode.cu) against float64 numpy and the CPU kernel.

GPU machine only (skipped without a CUDA device). Inputs come from tests/test_mla_decode_cpu.py
(shuffled pages, ragged lengths, NaN in unused cache slots); outputs are poisoned first.
Bound: as the CPU test (fp32 scores and sums, bf16 output; p is rounded to bf16 before P V
on the tensor cores, within 2^-8 relative), and against the CPU kernel within 2^-7 |cpu| + 4e-3.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from ds_export.native import cuda
from ds_export.native import mla_decode as M

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (no package)
from test_mla_decode_cpu import CASES, make_case, reference, within  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

GPU_CASES = CASES + [(5, 1, 128, [64, 1, 4096, 333, 1000]), (3, 2, 48, [2, 640, 77]), (1, 6, 100, [2000]),
                     # row tiles of 1 (partial), 2, 3 (also partial) x 16 rows over rings that wrap many times
                     (3, 1, 8, [100, 4097, 64]), (2, 2, 16, [5000, 33]), (2, 3, 16, [3000, 50]),
                     (2, 1, 40, [700, 129]),
                     # partial k-split CTAs: 24 and 20 of 32 rows, 12 of 16 rows
                     (2, 3, 8, [300, 1100]), (3, 5, 4, [5, 640, 3000]), (2, 1, 12, [77, 2000]),
                     # wgmma path (> 64 rows, 64-row tiles): H 128 x S_q 1..2, ragged, shorter than a page,
                     # partial last tiles (72 = 64 + 8, 200 = 3 x 64 + 8 rows)
                     (3, 2, 128, [5, 700, 4099]), (2, 1, 128, [40, 4096]), (1, 1, 72, [300]),
                     (2, 2, 100, [130, 64]),
                     # TMA-multicast CTA pairs: 3 row tiles (150 rows: the pair's second CTA has no rows),
                     # one-page caches (a full page, two tokens), 256 rows over many pages
                     (2, 3, 50, [700, 65]), (2, 2, 128, [64, 2]), (1, 4, 64, [8192])]


@pytest.mark.parametrize("b,s_q,h,lens", GPU_CASES)
@pytest.mark.parametrize("splits", [0, 1, 3])
def test_cuda_matches_float64_and_cpu(b, s_q, h, lens, splits):
    q, kv, pt, cl, scale = make_case(b, s_q, h, lens)
    out, lse = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=splits)
    ref, ref_lse = reference(q, kv, pt, cl, scale)
    ok, err = within(out, lse, ref, ref_lse)
    assert ok, f"splits={splits}: max |out - ref| = {err}"
    cpu, cpu_lse = M.mla_decode(q, kv, pt, cl, scale)
    d = np.abs(out.astype(np.float64) - cpu.astype(np.float64))
    assert (d <= 2.0**-7 * np.abs(cpu.astype(np.float64)) + 4e-3).all(), d.max()
    assert np.abs(lse - cpu_lse).max() <= 1e-3


def test_cuda_is_deterministic_with_splits():
    q, kv, pt, cl, scale = make_case(4, 2, 16, [3000, 70, 4000, 2])
    a = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=7)
    b = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=7)
    assert np.array_equal(a[0].view(np.uint16), b[0].view(np.uint16)) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("splits", [0, 3])
def test_cuda_wgmma_path_is_deterministic(splits):
    # more than 64 rows: the wgmma CTAs (TMA-multicast pairs), ragged lengths, a partial last page
    q, kv, pt, cl, scale = make_case(3, 2, 128, [3000, 70, 4001])
    a = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=splits)
    b = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=splits)
    assert np.array_equal(a[0].view(np.uint16), b[0].view(np.uint16)) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("mode", ["1", "0"])
def test_cuda_wgmma_load_modes_give_the_same_bits(mode, monkeypatch):
    # the fallbacks of the TMA-multicast pairs (no pair scheduling: TMA per CTA; no tensor-map encoder:
    # cp.async), forced through DSX_MLA_LOADS: same bits as the default, and still right
    q, kv, pt, cl, scale = make_case(3, 2, 128, [3000, 70, 4001])
    want = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=3)
    monkeypatch.setenv("DSX_MLA_LOADS", mode)
    got = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=3)
    assert np.array_equal(want[0].view(np.uint16), got[0].view(np.uint16)) and np.array_equal(want[1], got[1])
    ref, ref_lse = reference(q, kv, pt, cl, scale)
    assert within(got[0], got[1], ref, ref_lse)[0]


@pytest.mark.parametrize("mode", ["2", "1", "0"])
def test_cuda_wgmma_page_two_waits_for_q(mode, monkeypatch):
    # the wgmma CTAs stage Q in page buffer 2, which takes page 2 only once every warp of warpgroup 0 (of
    # both CTAs of a pair) has read its fragments: sequences of 3-4 pages (page 2 partial or full, or the
    # last), 200 rows (a 64-row tile of 8 rows: zero-filled padding rows; an odd tile count), one split so
    # page 2 is every CTA's own; right in each load mode, and the same bits on a second run
    monkeypatch.setenv("DSX_MLA_LOADS", mode)
    q, kv, pt, cl, scale = make_case(8, 2, 100, [129, 192, 193, 256, 130, 191, 200, 250])
    a = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=1)
    ref, ref_lse = reference(q, kv, pt, cl, scale)
    ok, err = within(a[0], a[1], ref, ref_lse)
    assert ok, f"mode {mode}: max |out - ref| = {err}"
    b = M.mla_decode_cuda(q, kv, pt, cl, scale, num_splits=1)
    assert np.array_equal(a[0].view(np.uint16), b[0].view(np.uint16)) and np.array_equal(a[1], b[1])


def test_cuda_refuses_misaligned_pointers():
    # the kernels copy and store 16-byte pieces: an output 2 bytes off its allocation is refused, not written
    from ds_export.native import cuda as C

    q, kv, pt, cl, scale = make_case(2, 1, 128, [300, 70])
    b, s_q, h = q.shape[:3]
    run, _ = M._cuda_fns()
    dq, dkv, dpt, dcl = (C.to_device(np.ascontiguousarray(x).view(np.uint16) if x.dtype.itemsize == 2 else x)
                         for x in (q, kv, pt, cl))
    out = C.empty((b * s_q * h * 512 + 8,), np.uint16).fill_bytes(0x7F)
    lse = C.empty((b, s_q, h), np.float32)
    rc = run(dq.ptr, dkv.ptr, dpt.ptr, dcl.ptr, out.ptr + 2, lse.ptr, b, s_q, h, kv.shape[0], pt.shape[1], scale, 1,
             None, 0, None)
    assert rc == -1  # DSX_EINVAL
    assert (out.numpy() == 0x7F7F).all()
    rc = run(dq.ptr, dkv.ptr, dpt.ptr, dcl.ptr, out.ptr, lse.ptr, b, s_q, h, kv.shape[0], pt.shape[1], scale, 1,
             None, 0, None)
    assert rc == 0
