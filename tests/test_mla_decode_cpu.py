"""CPU MLA decode (csrc/cpu/mla_decode.cc) against a float64 numpy reference.

Inputs: random bf16 q and cache, shuffled page tables (unused entries -1), ragged lengths
from S_q up to several pages, and NaN in every cache slot no sequence uses, so reading past
a length or through a wrong page shows. Bound: the kernel's fp32 scores and sums against
float64 plus one bf16 rounding: |out - ref| <= 2^-8 |ref| + 2e-3 max|c|, |lse - ref| <= 1e-3.
The planted faults (causal mask off by one, one page-table entry swapped) must break it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.native import mla_decode as M

BF16 = ml_dtypes.bfloat16
NAN_BF16 = np.uint16(0x7FC0)


def make_case(b, s_q, h, lens, seed=0, spare_pages=3):
    """Random inputs; returns (q, kv_cache, page_table, cache_lens, scale)."""
    rng = np.random.default_rng([seed, b, s_q, h, *lens])
    need = [-(-n // M.PAGE) for n in lens]
    max_pages = max(need) + 1
    num_pages = sum(need) + spare_pages
    ids = rng.permutation(num_pages)
    pt = np.full((b, max_pages), -1, np.int32)
    kv = np.full((num_pages, M.PAGE, M.DIM), NAN_BF16, np.uint16).view(BF16)
    at = 0
    for i, (n, k) in enumerate(zip(lens, need)):
        pt[i, :k] = ids[at:at + k]
        at += k
        tok = rng.standard_normal((k * M.PAGE, M.DIM)).astype(BF16)
        for j in range(k):  # only the first n tokens are real; the rest of the last page stays NaN
            m = min(M.PAGE, n - j * M.PAGE)
            kv[pt[i, j], :m] = tok[j * M.PAGE:j * M.PAGE + m]
    q = rng.standard_normal((b, s_q, h, M.DIM)).astype(BF16)
    return q, kv, pt, np.array(lens, np.int32), 1.0 / np.sqrt(192.0)


def reference(q, kv, pt, lens, scale, *, mask_shift=0):
    """float64 (out [B, S_q, H, 512], lse [B, S_q, H]); mask_shift != 0 plants an off-by-one."""
    b, s_q, h, _ = q.shape
    out = np.zeros((b, s_q, h, M.LATENT))
    lse = np.zeros((b, s_q, h))
    for i in range(b):
        n = int(lens[i])
        toks = np.concatenate([kv[pt[i, j]] for j in range(-(-n // M.PAGE))])[:n].astype(np.float64)
        for s in range(s_q):
            vis = n - s_q + s + 1 + mask_shift
            k = toks[:vis]
            sc = q[i, s].astype(np.float64) @ k.T * scale  # [H, vis]
            m = sc.max(axis=1, keepdims=True)
            p = np.exp(sc - m)
            out[i, s] = (p @ k[:, :M.LATENT]) / p.sum(axis=1, keepdims=True)
            lse[i, s] = m[:, 0] + np.log(p.sum(axis=1))
    return out, lse


def within(got, got_lse, ref, ref_lse, kv_scale=4.5):
    o = got.astype(np.float64)
    ok_o = np.abs(o - ref) <= 2.0**-8 * np.abs(ref) + 2e-3 * kv_scale
    ok_l = np.abs(got_lse.astype(np.float64) - ref_lse) <= 1e-3
    return bool(np.isfinite(o).all() and ok_o.all() and ok_l.all()), float(np.abs(o - ref).max())


CASES = [  # (B, S_q, H, lens): one-page, many-page, ragged, lengths at page edges
    (1, 1, 16, [1]), (2, 1, 16, [64, 65]), (3, 2, 16, [2, 130, 64 * 5]), (2, 3, 128, [3, 200]),
    (3, 4, 16, [4, 63, 257]), (2, 5, 16, [70, 128]), (2, 6, 128, [6, 191]), (4, 6, 16, [6, 64, 129, 400]),
]


@pytest.mark.parametrize("b,s_q,h,lens", CASES)
def test_cpu_matches_float64(b, s_q, h, lens):
    q, kv, pt, cl, scale = make_case(b, s_q, h, lens)
    out, lse = M.mla_decode(q, kv, pt, cl, scale)
    assert out.dtype == BF16 and out.shape == (b, s_q, h, 512) and lse.shape == (b, s_q, h)
    ref, ref_lse = reference(q, kv, pt, cl, scale)
    ok, err = within(out, lse, ref, ref_lse)
    assert ok, f"max |out - ref| = {err}"


def test_threads_do_not_change_result():
    q, kv, pt, cl, scale = make_case(3, 2, 16, [5, 100, 300])
    a = M.mla_decode(q, kv, pt, cl, scale, threads=1)
    b = M.mla_decode(q, kv, pt, cl, scale, threads=2)
    assert np.array_equal(a[0].view(np.uint16), b[0].view(np.uint16)) and np.array_equal(a[1], b[1])


def _no_nan(kv):
    return np.nan_to_num(kv.astype(np.float32)).astype(BF16)


def test_planted_causal_off_by_one_fails():
    q, kv, pt, cl, scale = make_case(2, 3, 16, [70, 200])
    out, lse = M.mla_decode(q, kv, pt, cl, scale)
    assert within(out, lse, *reference(q, kv, pt, cl, scale))[0]
    for shift in (-1, 1):  # query i sees one token too few / too many
        ref, ref_lse = reference(q, _no_nan(kv), pt, cl, scale, mask_shift=shift)
        ok, _ = within(out[:, :-1], lse[:, :-1], ref[:, :-1], ref_lse[:, :-1])
        assert not ok, f"mask shift {shift} went unnoticed"


def test_planted_page_swap_fails():
    q, kv, pt, cl, scale = make_case(1, 2, 16, [100])
    out, lse = M.mla_decode(q, kv, pt, cl, scale)
    bad = pt.copy()
    bad[0, [0, 1]] = bad[0, [1, 0]]  # pages 0 and 1 exchanged in the table
    assert not within(out, lse, *reference(q, _no_nan(kv), bad, cl, scale))[0]


@pytest.mark.parametrize("what,match", [
    ("len_short", "cache_lens"), ("len_long", "cache_lens"), ("page_id", "page_table"), ("q_dim", "q: expected"),
    ("sq", "S_q"), ("heads", "H"), ("pt_dtype", "page_table"), ("kv_shape", "kv_cache"),
])
def test_input_checks(what, match):
    q, kv, pt, cl, scale = make_case(2, 2, 16, [10, 70])
    if what == "len_short":
        cl = np.array([1, 70], np.int32)
    elif what == "len_long":
        cl = np.array([10, 64 * pt.shape[1] + 1], np.int32)
    elif what == "page_id":
        pt = pt.copy()
        pt[1, 1] = kv.shape[0]
    elif what == "q_dim":
        q = q[..., :512]
    elif what == "sq":
        q = np.zeros((2, 7, 16, 576), BF16)
    elif what == "heads":
        q = np.zeros((2, 2, 129, 576), BF16)
    elif what == "pt_dtype":
        pt = pt.astype(np.int64)
    elif what == "kv_shape":
        kv = kv.reshape(-1, 32, 576)
    with pytest.raises(DsxError, match=match):
        M.mla_decode(q, kv, pt, cl, scale)
