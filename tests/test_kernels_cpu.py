"""CPU kernels of csrc/cpu/ against float64 numpy: block FP8 GEMM (dense, grouped), MTP accept."""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.native import kernels as K

FP8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16

# (M, N, K): aligned, ragged N and K (kv_a_proj-like 576 rows), K with a short last block,
# tiny shapes smaller than one block, a single token.
GEMM_CASES = [(1, 128, 128), (16, 256, 512), (7, 200, 300), (33, 576, 512), (5, 130, 129), (40, 64, 1040), (3, 1, 1)]


def make_fp8(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * 40 * scale).clip(-448, 448).astype(FP8)


def make_gemm(rng, m, n, k, e=None):
    kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
    a = make_fp8(rng, (m, k))
    sa = rng.uniform(1e-3, 2e-2, (m, kb)).astype(np.float32)
    bshape, sbshape = ((n, k), (nb, kb)) if e is None else ((e, n, k), (e, nb, kb))
    b = make_fp8(rng, bshape)
    sb = rng.uniform(1e-3, 2e-2, sbshape).astype(np.float32)
    return a, sa, b, sb


def ref_gemm(a, sa, b, sb):
    """float64: sum over K blocks of (block dot) * sa * sb, exactly as the header defines it."""
    m, k = a.shape
    n = b.shape[0]
    af, bf = a.astype(np.float64), b.astype(np.float64)
    out = np.zeros((m, n))
    for kb in range(K.cdiv(k, 128)):
        sl = slice(kb * 128, min(k, kb * 128 + 128))
        part = af[:, sl] @ bf[:, sl].T
        sbcol = np.repeat(sb[:, kb].astype(np.float64), 128)[:n]
        out += part * sa[:, kb : kb + 1].astype(np.float64) * sbcol[None, :]
    return out


def assert_close_bf16(out, ref, a, sa, b, sb, what=""):
    """out (bf16) within one bf16 rounding of ref plus the fp32 accumulation error bound."""
    assert out.dtype == BF16 and out.shape == ref.shape
    got = out.astype(np.float64)
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    # magnitude of the summed terms bounds the fp32 accumulation error
    mag = ref_gemm_abs(a, sa, b, sb)
    tol = np.abs(ref) * 2.0**-8 + mag * 2e-6 + 1e-30
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} outside tolerance, first at {np.argwhere(bad)[0]}"
    exact = (ref.astype(np.float32).astype(BF16).astype(np.float64) == got).mean()
    assert exact > 0.97, f"{what}: only {exact:.3f} of outputs are the correctly rounded bf16"


def ref_gemm_abs(a, sa, b, sb):
    return np.abs(ref_gemm(np.abs(a.astype(np.float32)).astype(FP8), sa, np.abs(b.astype(np.float32)).astype(FP8), sb))


@pytest.mark.parametrize("m,n,k", GEMM_CASES)
def test_gemm_fp8_nt_matches_float64(m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    a, sa, b, sb = make_gemm(rng, m, n, k)
    out = K.gemm_fp8_nt(a, sa, b, sb)
    assert_close_bf16(out, ref_gemm(a, sa, b, sb), a, sa, b, sb, f"{(m, n, k)}")


def test_gemm_accepts_uint8_bytes_and_is_deterministic():
    rng = np.random.default_rng(1)
    a, sa, b, sb = make_gemm(rng, 9, 300, 260)
    o1 = K.gemm_fp8_nt(a, sa, b, sb)
    o2 = K.gemm_fp8_nt(a.view(np.uint8), sa, b.view(np.uint8), sb)
    assert np.array_equal(o1.view(np.uint16), o2.view(np.uint16))


def test_gemm_planted_scale_block_fault_is_caught():
    """Scale one weight block wrongly: exactly the outputs that use it must move."""
    rng = np.random.default_rng(2)
    a, sa, b, sb = make_gemm(rng, 8, 256, 384)
    ref = ref_gemm(a, sa, b, sb)
    bad_sb = sb.copy()
    bad_sb[1, 2] *= 1.5  # columns 128..255, K block 2
    got = K.gemm_fp8_nt(a, sa, b, bad_sb).astype(np.float64)
    off = np.abs(got - ref) > np.abs(ref) * 2.0**-7 + 1e-6
    assert off[:, 128:].mean() > 0.5 and not off[:, :128].any()
    with pytest.raises(AssertionError):
        assert_close_bf16(K.gemm_fp8_nt(a, sa, b, bad_sb), ref, a, sa, b, sb)


def test_gemm_nan_propagates_and_zero_rows():
    rng = np.random.default_rng(3)
    a, sa, b, sb = make_gemm(rng, 4, 128, 128)
    a = a.view(np.uint8).copy()
    a[2, 5] = 0x7F  # e4m3 NaN
    out = K.gemm_fp8_nt(a, sa, b, sb).astype(np.float32)
    assert np.isnan(out[2]).all() and np.isfinite(out[[0, 1, 3]]).all()
    empty = K.gemm_fp8_nt(a[:0], sa[:0], b, sb)
    assert empty.shape == (0, 128)


def emulate_order(a, sa, b, sb, tree=True):
    """The CPU kernel's result bit for bit, from the header's order in float32 numpy (no code shared with the
    kernel): per K block, lane j of 16 sums the products of k = j mod 16 in increasing k, the lanes are combined
    j + j+8, then +4, +2, +1 (tree=False: one after another, a planted fault), acc = acc + dot * (sa * sb), one
    rounding to bf16 at the end."""
    af = a.view(FP8).astype(np.float32)
    bf = b.view(FP8).astype(np.float32)
    m, k = af.shape
    n = bf.shape[0]
    acc = np.zeros((m, n), np.float32)
    for kb in range(K.cdiv(k, 128)):
        k0, k1 = kb * 128, min(k, kb * 128 + 128)
        lanes = np.zeros((m, n, 16), np.float32)
        for i in range(k0, k1, 16):
            w = min(16, k1 - i)
            lanes[:, :, :w] = lanes[:, :, :w] + af[:, None, i:i + w] * bf[None, :, i:i + w]
        if tree:
            for w in (8, 4, 2, 1):
                lanes[:, :, :w] = lanes[:, :, :w] + lanes[:, :, w:2 * w]
            dot = lanes[:, :, 0]
        else:
            dot = lanes[:, :, 0]
            for j in range(1, 16):
                dot = dot + lanes[:, :, j]
        s = sa[:, kb][:, None] * sb[np.arange(n) // 128, kb][None, :]  # (float32 x float32: one rounding)
        acc = acc + dot * s
    return acc.astype(BF16)


def random_codes(rng, shape):
    """Every e4m3 code but the two NaNs (subnormals, zeros of both signs, the largest values)."""
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] ^= 0x01
    return c


@pytest.fixture(params=["simd", "scalar"])
def cpu_path(request):
    """Both paths of the CPU kernels (dsx_cpu_simd); the state before is put back."""
    before = K.cpu_simd(request.param == "simd")
    yield request.param
    K.cpu_simd(before)


EXACT_CASES = GEMM_CASES + [(2, 192, 147), (17, 130, 1000), (4, 64, 15), (6, 65, 2048)]


@pytest.mark.parametrize("m,n,k", EXACT_CASES)
def test_gemm_fp8_nt_is_the_documented_order_bit_for_bit(cpu_path, m, n, k):
    """Both paths give exactly the bits of the header's accumulation order (emulated in float32 numpy), on every
    code but NaN with scales over a wide range: ragged K (short last blocks, K < 16), odd M and N, N across
    weight-scale blocks."""
    rng = np.random.default_rng(7 * m + 11 * n + k)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa = np.exp2(rng.uniform(-12, 4, (m, K.cdiv(k, 128)))).astype(np.float32)
    sb = np.exp2(rng.uniform(-12, 4, (K.cdiv(n, 128), K.cdiv(k, 128)))).astype(np.float32)
    got = K.gemm_fp8_nt(a, sa, b, sb).view(np.uint16)
    assert np.array_equal(got, emulate_order(a, sa, b, sb).view(np.uint16))


def test_gemm_order_emulation_catches_another_lane_tree(cpu_path):
    """The bit-for-bit test can fail, and the order is the tree's: lane 0 sums 8 x 448 x 448 and lane 8 its negative,
    lane 1 one product 2^-9. The tree cancels lanes 0 and 8 first and keeps 2^-9; lanes added one after another
    lose it under lane 0's ulp (0.125) and give 0."""
    a = np.zeros((1, 128), np.uint8)
    b = np.zeros((1, 128), np.uint8)
    a[0, 0::16] = a[0, 8::16] = b[0, 0::16] = 0x7E  # 448
    b[0, 8::16] = 0xFE  # -448
    a[0, 1], b[0, 1] = 0x38, 0x01  # 1.0 x 2^-9
    ones = np.ones((1, 1), np.float32)
    got = K.gemm_fp8_nt(a, ones, b, ones).view(np.uint16)
    assert got[0, 0] == 0x3B00  # bf16 2^-9
    assert np.array_equal(got, emulate_order(a, ones, b, ones).view(np.uint16))
    assert emulate_order(a, ones, b, ones, tree=False).view(np.uint16)[0, 0] == 0


def test_gemm_nan_propagates_on_both_paths(cpu_path):
    rng = np.random.default_rng(6)
    a, sa, b, sb = make_gemm(rng, 5, 130, 300)
    a, b = a.view(np.uint8).copy(), b.view(np.uint8).copy()
    a[1, 299] = 0xFF  # (in the short last block)
    b[129, 0] = 0x7F
    out = K.gemm_fp8_nt(a, sa, b, sb).astype(np.float32)
    nan = np.zeros(out.shape, bool)
    nan[1, :] = nan[:, 129] = True
    assert np.array_equal(np.isnan(out), nan)


def test_cpu_simd_switch():
    before = K.cpu_simd()
    try:
        assert K.cpu_simd(False) is before and K.cpu_simd() is False
        with K.scalar_paths():
            assert K.cpu_simd() is False
        assert K.cpu_simd(True) is False and K.cpu_simd() is True
    finally:
        K.cpu_simd(before)
    with pytest.raises(DsxError, match="cpu simd"):
        K.check(K.bind("dsx_cpu_simd", K.I32)(2), "cpu simd switch")
    # DSX_CPU_SIMD=0 starts a process on the scalar paths
    code = "from ds_export.native import kernels as K; print(K.cpu_simd())"
    for env, want in (("0", "False"), ("1", "True")):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "DSX_CPU_SIMD": env})
        assert run.stdout.strip() == want, run.stderr[-2000:]


def test_gemm_grouped_matches_per_expert_reference():
    rng = np.random.default_rng(4)
    e, n, k = 4, 200, 300
    offsets = np.array([0, 5, 5, 37, 40], dtype=np.int64)  # expert 1 has no tokens
    a, sa, b, sb = make_gemm(rng, 40, n, k, e=e)
    out = K.gemm_fp8_grouped_nt_contiguous(a, sa, b, sb, offsets)
    for i in range(e):
        r = slice(offsets[i], offsets[i + 1])
        if r.start == r.stop:
            continue
        assert_close_bf16(out[r], ref_gemm(a[r], sa[r], b[i], sb[i]), a[r], sa[r], b[i], sb[i], f"expert {i}")
    # planted fault: shifting the expert boundary by one row changes that row's result
    wrong = K.gemm_fp8_grouped_nt_contiguous(a, sa, b, sb, np.array([0, 6, 6, 37, 40]))
    assert not np.array_equal(wrong[5].view(np.uint16), out[5].view(np.uint16))


def test_gemm_input_errors_name_the_problem():
    rng = np.random.default_rng(5)
    a, sa, b, sb = make_gemm(rng, 4, 256, 256)
    with pytest.raises(DsxError, match="sb"):
        K.gemm_fp8_nt(a, sa, b, sb.T.copy()[:1])
    with pytest.raises(DsxError, match="float8_e4m3fn"):
        K.gemm_fp8_nt(a.astype(np.float32), sa, b, sb)
    with pytest.raises(DsxError, match="float32"):
        K.gemm_fp8_nt(a, sa.astype(np.float64), b, sb)
    with pytest.raises(DsxError, match="share K"):
        K.gemm_fp8_nt(a, sa, b[:, :128], sb[:, :1])
    with pytest.raises(DsxError, match="offsets"):
        K.gemm_fp8_grouped_nt_contiguous(a, sa, b[None], sb[None], np.array([0, 3]))


def ref_mtp(draft, target, num_draft):
    bsz, k = draft.shape
    acc = np.full((bsz, k + 1), -1, dtype=draft.dtype)
    cnt = np.zeros(bsz, dtype=np.int32)
    for b in range(bsz):
        i = 0
        while i < num_draft[b] and draft[b, i] == target[b, i]:
            acc[b, i] = draft[b, i]
            i += 1
        acc[b, i] = target[b, i]
        cnt[b] = i + 1
    return acc, cnt


def make_mtp(rng, bsz, k, dtype, vocab=4):
    """Small vocab so drafts often match; num_draft covers 0..K."""
    target = rng.integers(0, vocab, (bsz, k + 1)).astype(dtype)
    draft = np.where(rng.random((bsz, k)) < 0.7, target[:, :k], rng.integers(0, vocab, (bsz, k))).astype(dtype)
    num_draft = rng.integers(0, k + 1, bsz).astype(np.int32)
    return draft, target, num_draft


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bsz,k", [(1, 1), (37, 5), (256, 8), (3, 0)])
def test_mtp_accept_greedy_matches_reference(dtype, bsz, k):
    rng = np.random.default_rng(bsz + k)
    draft, target, nd = make_mtp(rng, bsz, k, dtype)
    acc, cnt = K.mtp_accept_greedy(draft, target, nd)
    racc, rcnt = ref_mtp(draft, target, nd)
    assert acc.dtype == dtype and np.array_equal(acc, racc) and np.array_equal(cnt, rcnt)
    assert (cnt >= 1).all() and (cnt <= nd + 1).all()


def test_mtp_edge_cases_and_planted_fault():
    draft = np.array([[7, 8, 9], [7, 8, 9], [7, 8, 9]], dtype=np.int64)
    target = np.array([[7, 8, 9, 10], [7, 0, 9, 10], [7, 8, 9, 10]], dtype=np.int64)
    acc, cnt = K.mtp_accept_greedy(draft, target, np.array([3, 3, 1]))
    assert cnt.tolist() == [4, 2, 2]
    assert acc.tolist() == [[7, 8, 9, 10], [7, 0, -1, -1], [7, 8, -1, -1]]
    # a token id above 2^31 must survive the int64 path
    big = np.array([[2**40]], dtype=np.int64)
    acc, cnt = K.mtp_accept_greedy(big, np.array([[2**40, 2**41]]), np.array([1]))
    assert acc.tolist() == [[2**40, 2**41]] and cnt.tolist() == [2]
    # planted fault: a reference that takes the bonus from the next position disagrees
    rng = np.random.default_rng(9)
    d, t, nd = make_mtp(rng, 64, 4, np.int32)
    acc, _ = K.mtp_accept_greedy(d, t, nd)
    shifted = np.concatenate([t[:, 1:], t[:, -1:]], axis=1)
    wrong, _ = ref_mtp(d, shifted, nd)
    assert not np.array_equal(acc, wrong)


def test_mtp_input_errors():
    d = np.zeros((2, 3), np.int32)
    with pytest.raises(DsxError, match="num_draft"):
        K.mtp_accept_greedy(d, np.zeros((2, 4), np.int32), np.array([1, 4]))
    with pytest.raises(DsxError, match="K\\+1"):
        K.mtp_accept_greedy(d, np.zeros((2, 3), np.int32), np.array([1, 1]))
    with pytest.raises(DsxError, match="dtype"):
        K.mtp_accept_greedy(d, np.zeros((2, 4), np.int64), np.array([1, 1]))


def ref_mtp_topp(draft, cand, ncand, sampled, num_draft):
    """Plain Python top-p acceptance: keep a draft while it is in its position's candidate set."""
    bsz, k = draft.shape
    acc = np.full((bsz, k + 1), -1, dtype=draft.dtype)
    cnt = np.zeros(bsz, dtype=np.int32)
    for b in range(bsz):
        i = 0
        while i < num_draft[b] and draft[b, i] in set(cand[b, i, : ncand[b, i]].tolist()):
            acc[b, i] = draft[b, i]
            i += 1
        acc[b, i] = sampled[b, i]
        cnt[b] = i + 1
    return acc, cnt


def make_topp(rng, bsz, k, c, dtype, vocab=8):
    cand = np.stack([np.stack([rng.permutation(vocab)[:c] for _ in range(k + 1)]) for _ in range(bsz)])
    ncand = rng.integers(1, c + 1, (bsz, k + 1)).astype(np.int32)
    sampled = np.take_along_axis(cand, rng.integers(0, ncand)[..., None], axis=2)[..., 0]
    # drafts: often inside the real candidates, sometimes in the padding beyond num_candidates (must not count)
    pick = np.take_along_axis(cand[:, :k], rng.integers(0, c, (bsz, k))[..., None], axis=2)[..., 0]
    draft = np.where(rng.random((bsz, k)) < 0.85, pick, rng.integers(0, vocab, (bsz, k)))
    return (draft.astype(dtype), cand.astype(dtype), ncand, sampled.astype(dtype),
            rng.integers(0, k + 1, bsz).astype(np.int32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bsz,k,c", [(1, 1, 1), (37, 5, 4), (256, 8, 8), (3, 0, 2)])
def test_mtp_accept_topp_matches_reference(dtype, bsz, k, c):
    args = make_topp(np.random.default_rng(bsz * 10 + k + c), bsz, k, c, dtype)
    acc, cnt = K.mtp_accept_topp(*args)
    racc, rcnt = ref_mtp_topp(*args)
    assert acc.dtype == dtype and np.array_equal(acc, racc) and np.array_equal(cnt, rcnt)


def test_mtp_accept_topp_with_one_candidate_is_greedy_and_errors():
    rng = np.random.default_rng(5)
    d, t, nd = make_mtp(rng, 64, 5, np.int64)
    acc, cnt = K.mtp_accept_topp(d, t[:, :, None], np.ones((64, 6), np.int32), t, nd)
    gacc, gcnt = K.mtp_accept_greedy(d, t, nd)
    assert np.array_equal(acc, gacc) and np.array_equal(cnt, gcnt)
    # a draft in the padding beyond num_candidates is not accepted
    cand = np.array([[[3, 9], [4, 4]]], np.int32)
    acc, cnt = K.mtp_accept_topp(np.array([[9]], np.int32), cand, np.array([[1, 1]], np.int32),
                                 np.array([[3, 4]], np.int32), np.array([1], np.int32))
    assert cnt.tolist() == [1] and acc.tolist() == [[3, -1]]
    with pytest.raises(DsxError, match="num_candidates"):
        K.mtp_accept_topp(np.array([[9]], np.int32), cand, np.array([[0, 1]], np.int32),
                          np.array([[3, 4]], np.int32), np.array([1], np.int32))
    with pytest.raises(DsxError, match="candidates"):
        K.mtp_accept_topp(np.array([[9]], np.int32), cand[:, :1], np.array([[1, 1]], np.int32),
                          np.array([[3, 4]], np.int32), np.array([1], np.int32))


def test_bench_cpu_kernels_runs():
    """bench/cpu_kernels.py (the figures of docs/benchmarks.md) runs on small shapes and finds the same bits."""
    bench = os.path.join(os.path.dirname(__file__), "..", "bench", "cpu_kernels.py")
    run = subprocess.run([sys.executable, bench, "--shapes", "3x130x300,1x64x129", "--repeat", "1"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.strip().startswith(("3x130x300", "1x64x129"))]
    assert len(rows) == 2 and all(r.endswith("same") for r in rows), run.stdout
