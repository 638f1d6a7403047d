"""CUDA kernels (libdsx_cuda, sm_90a) against float64 numpy and the CPU kernels.

GPU machine only: skipped where no CUDA device is visible. Every output buffer is
poisoned (NaN / 0x7f bytes) before the kernel runs, so an unwritten element fails.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import fp8_block
from ds_export.native import cuda
from ds_export.native import kernels as K

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

FP8, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16
# hand-written swap-AB kernel for M <= 128: bits 16..23 K splits (cluster size, 0 automatic), bits 8..9
# weight rows per CTA (0 automatic, 1: 128, 2: 64), bits 12..15 wgmma temporaries (0 automatic, 1 one, 2 two
# where they fit), bits 24..27 tokens per CTA (0 automatic, 1: 16, 2: 32, 3: 64: M split over the grid, 4: all of M),
# bit 28 PDL
SMALL = 6
ROWS128, ROWS64 = 1 << 8, 2 << 8
# bits 8..9 = 3: 64 weight rows, two consumer warpgroups on the K halves (one CTA a weight tile, K >= 2 blocks): the
# bits of S = 2
HALVES = 3 << 8
TEMPS1, TEMPS2 = 1 << 12, 2 << 12
WIDTH16, WIDTH32, WIDTH64, WIDTH_ALL = 1 << 24, 2 << 24, 3 << 24, 4 << 24
L2_128B, L2_NONE = 2 << 4, 3 << 4  # bits 4..5: the TMA loads' L2 promotion (0 automatic, 1: 256 bytes)
STAGES = 1 << 20  # bits 20..23: the stage count (0 automatic, else 2..12, clamped to what fits)
WEIGHT_MAJOR, TOKEN_MAJOR = 1 << 6, 2 << 6  # bits 6..7: grid order (0 automatic = token tiles adjacent)
# bits 14..15: scales read after / before the wgmma wait / before the next K step's issue (two temporaries)
SCALES_LATE, SCALES_EARLY, SCALES_ISSUE = 1 << 14, 2 << 14, 3 << 14
# bits 10..11: the consumer loop's form (0 automatic = 3, or 2 where bits 14..15 name a scale-read point; 1: the
# form before; 2: stage counters, uniform wgmma descriptors, ld.shared scales; 3: 2 with each K step's scales read
# one step ahead where two temporaries run; with bits 14..15 non-zero refused)
FORM_OLD, FORM_UNI, FORM_AHEAD = 1 << 10, 2 << 10, 3 << 10
# bits 29..30: the output path (0 automatic = 2; 1: the fp32 tile through shared memory, the form before; 2: from
# the accumulator registers at S <= 2, the halves of the two partial tiles exchanged at S = 2; at S >= 3 with 16 or
# 32 tokens a tile the split sums through the workspace where it holds them)
OUT_SMEM, OUT_REG = 1 << 29, 2 << 29
# hand-written persistent kernel for large M: bits 8..11 = v, tile order in groups of 4v M tiles (0 default);
# bits 12..15 the variant (0 = 10: 128x128, scale products one K block ahead; 1: the order before, same bits)
LARGE = 7

# (M, N, K, path the automatic choice must take)
DENSE_CASES = [
    (256, 512, 1024, "cutlass"),  # aligned
    (64, 576, 7168, "cutlass"),  # kv_a_proj-like: N = 576 is not a multiple of 128
    (37, 256, 1040, "cutlass"),  # K = 8*128 + 16: a 16-wide last K block, ragged M
    (1, 2048, 512, "cutlass"),  # one token
    (300, 1536, 2048, "cutlass"),  # several M tiles, stream-K tail
    (19, 130, 300, "simple"),  # N % 8 != 0 and K % 16 != 0: no TMA
    (5, 200, 264, "simple"),  # K % 16 == 8
]


def make_gemm(rng, m, n, k, e=None):
    kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
    a = (rng.standard_normal((m, k)) * 40).clip(-448, 448).astype(FP8)
    sa = rng.uniform(1e-3, 2e-2, (m, kb)).astype(np.float32)
    bshape, sbshape = ((n, k), (nb, kb)) if e is None else ((e, n, k), (e, nb, kb))
    b = (rng.standard_normal(bshape) * 40).clip(-448, 448).astype(FP8)
    sb = rng.uniform(1e-3, 2e-2, sbshape).astype(np.float32)
    return a, sa, b, sb


def ref_gemm(a, sa, b, sb, absolute=False):
    f = (lambda x: np.abs(x.astype(np.float64))) if absolute else (lambda x: x.astype(np.float64))
    m, k = a.shape
    n = b.shape[0]
    out = np.zeros((m, n))
    for kb in range(K.cdiv(k, 128)):
        sl = slice(kb * 128, min(k, kb * 128 + 128))
        sbcol = np.repeat(sb[:, kb].astype(np.float64), 128)[:n]
        out += (f(a[:, sl]) @ f(b[:, sl]).T) * sa[:, kb : kb + 1] * sbcol[None, :]
    return out


def assert_gemm_close(out, a, sa, b, sb, what, pre=None):
    """Within one bf16 rounding plus the fp8 tensor-core accumulation bound of float64. pre: (ref, mag), the two
    ref_gemm of these operands (or of more rows of a, sliced: row by row), when they are already at hand."""
    ref, mag = pre if pre is not None else (ref_gemm(a, sa, b, sb), ref_gemm(a, sa, b, sb, absolute=True))
    got = out.astype(np.float64)
    assert np.isfinite(got).all(), f"{what}: unwritten (NaN-poisoned) or non-finite outputs"
    bad = np.abs(got - ref) > np.abs(ref) * 2.0**-8 + mag * 2.0**-10
    assert not bad.any(), f"{what}: {bad.sum()}/{bad.size} outside tolerance, first {np.argwhere(bad)[0]}"
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 4e-3, f"{what}: relative error {rel:.2e}"
    return rel


@pytest.mark.parametrize("m,n,k,path", DENSE_CASES)
def test_dense_gemm_matches_float64(m, n, k, path):
    rng = np.random.default_rng(m + n + k)
    a, sa, b, sb = make_gemm(rng, m, n, k)
    assert_gemm_close(cuda.gemm_fp8_nt(a, sa, b, sb), a, sa, b, sb, f"auto {(m, n, k)}")
    assert_gemm_close(cuda.gemm_fp8_nt(a, sa, b, sb, algo=2), a, sa, b, sb, f"simple {(m, n, k)}")
    # 1 cooperative stream-K, 3 pingpong, 4 swapped operands, 5 cooperative with the promotion
    # overlapped, then forced split-K, data-parallel and atomic-order reduction scheduling; 7 the
    # hand-written persistent kernel (default tile order, groups of 4 M tiles)
    for algo in (1, 3, 4, 5, 1 | 2 << 12 | 3 << 16, 1 | 1 << 12, 4 | 2 << 12 | 4 << 16, 1 | 3 << 12 | 1 << 24,
                 5 | 2 << 12 | 3 << 16, 5 | 3 << 12 | 1 << 24, LARGE, LARGE | 1 << 8):
        if path == "cutlass":
            assert_gemm_close(cuda.gemm_fp8_nt(a, sa, b, sb, algo=algo), a, sa, b, sb, f"algo {algo} {(m, n, k)}")
        else:
            with pytest.raises(DsxError, match="invalid"):
                cuda.gemm_fp8_nt(a, sa, b, sb, algo=algo)


def test_dense_gemm_agrees_with_cpu_kernel_and_is_deterministic():
    rng = np.random.default_rng(7)
    a, sa, b, sb = make_gemm(rng, 128, 1024, 2048)
    g1, g2 = cuda.gemm_fp8_nt(a, sa, b, sb), cuda.gemm_fp8_nt(a, sa, b, sb)
    assert np.array_equal(g1.view(np.uint16), g2.view(np.uint16)), "stream-K result changed between runs"
    cpu = K.gemm_fp8_nt(a, sa, b, sb).astype(np.float64)
    rel = np.linalg.norm(g1.astype(np.float64) - cpu) / np.linalg.norm(cpu)
    assert rel < 4e-3 and (g1.astype(np.float64) == cpu).mean() > 0.5


def test_auto_choice_matches_forced_kernels_bitwise():
    """algo 0 runs the hand-written small-M kernel (6) with the K halves (64 weight rows, all of M, two consumer
    warpgroups on the two halves of K) at M <= 128 with 1024 <= K < 4096 while ceil(N/64) <= the SMs < 2 ceil(N/64)
    (7168x2048 at M 16, 32, 33, 64, 65, 128; not 7168x4096, nor 8448x512 with K < 1024); with two 64-token tiles
    at 64 < M <= 128 with K >= 4096
    while 4 ceil(N/128) <= the SMs (2048x7168, 1024x4096, 4096x7168), or with any K while 2 ceil(N/128) <= the
    SMs < 4 ceil(N/128) (7168x4096, 8448x512: one K split; not 8576), with two 32-token tiles at 32 < M <= 64
    with K < 4096 while 2 ceil(N/128) fills half to all of the SMs (4160x2048); else swap-AB data-parallel when
    M <= 128 and its 128x32 tiles fill between half and all of the SMs (66..132 here; 128x4096x2048);
    else the hand-written small-M kernel (6) while the 128-row weight tiles are
    no more than the SMs at M <= 32, or at M <= 64 with K >= 4096, or at M <= 64 while its 64-row tiles
    fit one wave of three CTAs a SM (24576x1536: 384 <= 396; 64-row tiles at M <= 32 when they fill
    two CTAs a SM within 8 K splits, automatic S at most 2: 2 with K >= 4096, 1 on 7168x2048; 128-row
    tiles at 32 < M <= 64 on 4096x7168); else pingpong at M <= 128
    (swap-AB with 2-way split-K when that leaves fewer than 64 pingpong tiles and K >= 4096), cooperative
    stream-K above; from 1024 rows on the large-M kernel (7: 128x192 tiles when N % 192 == 0, else
    128x128; one CTA each), long K over many waves included (all deterministic)."""
    rng = np.random.default_rng(9)
    swap_dp = 4 | 1 << 12
    small_w64 = SMALL | ROWS128 | WIDTH64 | TEMPS2 | L2_128B  # what algo 6 does by itself at these shapes
    small_w32 = SMALL | ROWS128 | WIDTH32 | TEMPS2 | 2 << 16  # (4160x2048 at M = 64: 66 CTAs a split, S = 2 automatic)
    for m, n, k, forced in ((128, 512, 1024, 3), (129, 512, 1024, 1), (64, 2048, 7168, SMALL | ROWS128),
                            (16, 2048, 7168, SMALL), (128, 2048, 7168, small_w64), (100, 2048, 7168, small_w64),
                            (128, 1024, 4096, small_w64), (128, 7168, 2048, SMALL | HALVES),
                            (65, 7168, 2048, SMALL | HALVES), (128, 7168, 4096, small_w64), (100, 8448, 512, small_w64),
                            (128, 8576, 512, 3), (32, 7168, 2048, SMALL | HALVES), (33, 7168, 2048, SMALL | HALVES),
                            (64, 7168, 2048, SMALL | HALVES), (64, 4160, 2048, small_w32), (16, 7168, 1024, SMALL | HALVES),
                            (33, 4096, 4096, SMALL), (16, 24576, 1536, SMALL | ROWS64),
                            (64, 24576, 1536, SMALL | ROWS64), (65, 24576, 1536, 3), (128, 4096, 7168, small_w64),
                            (96, 4096, 7168, small_w64), (128, 4096, 2048, swap_dp),
                            (64, 7168, 4096, swap_dp), (64, 4096, 7168, SMALL | ROWS128),
                            (16, 4096, 7168, SMALL | ROWS64 | 2 << 16), (16, 7168, 2048, SMALL | HALVES),
                            (16, 7168, 512, SMALL | ROWS64 | 1 << 16),
                            (1023, 256, 512, 1),
                            (1024, 384, 1024, LARGE | 2 << 12), (1152, 384, 1024, LARGE | 2 << 12),
                            (1024, 4736, 1024, LARGE | 1 << 12), (1152, 4736, 1024, LARGE | 1 << 12),
                            (1024, 1024, 1024, LARGE | 1 << 12), (1100, 1280, 4096, LARGE | 1 << 12),
                            (2048, 2176, 4096, LARGE | 1 << 12), (1152, 3968, 4096, LARGE | 1 << 12)):
        a, sa, b, sb = make_gemm(rng, m, n, k)
        # (where the measured table lists the launch, on an H200, auto runs its word: test_gemm_fp8_tuned_cuda.py)
        forced = cuda.gemm_fp8_resolve(m, n, k) or forced
        auto, want = cuda.gemm_fp8_nt(a, sa, b, sb), cuda.gemm_fp8_nt(a, sa, b, sb, algo=forced)
        assert np.array_equal(auto.view(np.uint16), want.view(np.uint16)), f"M={m} N={n} K={k}"
        assert_gemm_close(auto, a, sa, b, sb, f"auto {(m, n, k)}")


@pytest.mark.parametrize("m,n,k", [(200, 512, 128), (200, 512, 256), (1100, 384, 384), (300, 1536, 1040),
                                   (96, 2048, 7168), (1024, 1024, 2048)])
def test_overlapped_promotion_is_bitwise_the_plain_mainloop(m, n, k):
    """Algo 5 changes when the promotion runs, not what it computes: bitwise equal to algo 1 under the
    same scheduling (odd and even K-tile counts, one K tile, stream-K and split-K units)."""
    rng = np.random.default_rng(m * 7 + n + k)
    a, sa, b, sb = make_gemm(rng, m, n, k)
    for plain, overlapped in ((1, 5), (1 | 1 << 12, 5 | 1 << 12), (1 | 2 << 12 | 3 << 16, 5 | 2 << 12 | 3 << 16),
                              (1 | 3 << 12, 5 | 3 << 12)):
        want, got = cuda.gemm_fp8_nt(a, sa, b, sb, algo=plain), cuda.gemm_fp8_nt(a, sa, b, sb, algo=overlapped)
        assert np.array_equal(want.view(np.uint16), got.view(np.uint16)), f"algo {overlapped} vs {plain} {(m, n, k)}"
    assert_gemm_close(got, a, sa, b, sb, f"overlapped {(m, n, k)}")


@pytest.mark.parametrize("m,n,k", [(300, 576, 1040), (129, 256, 128), (200, 384, 256), (520, 1000, 384),
                                   (256, 384, 7168), (130, 136, 48), (1100, 1536, 2048), (64, 2048, 1936)])
def test_large_m_kernel_matches_float64_and_is_deterministic(m, n, k):
    """Algo 7: ragged M (rows past M read zeros, stores past M dropped), ragged N (576, 1000, 136: partial
    tiles), K = 128 (one K block), 2, 3, 9 (a 16-wide last block), 56 K blocks, K < 128, K = 15*128 + 16,
    M < 128; tile-order knobs (groups of 4, 32 M tiles). Bitwise equal run to run and across tile orders
    (each tile is computed by one CTA in a fixed order)."""
    rng = np.random.default_rng(m * 3 + n + k)
    a, sa, b, sb = make_gemm(rng, m, n, k)
    got = cuda.gemm_fp8_nt(a, sa, b, sb, algo=LARGE)
    assert_gemm_close(got, a, sa, b, sb, f"large {(m, n, k)}")
    # the same arithmetic: tile orders, promotion overlapped (1) or not (3), 256-row tiles (4)
    # and the 2-CTA clusters sharing B by multicast (5: 128x128, 7: 256x128; a pair's second tile may lie
    # past M, or be the only one: M < 128) or sharing A (8: 128x128, pairs of N-adjacent tiles; the second
    # may lie past N: N = 384 and 576 have 3 and 5 tiles of 128), and 1 (the scale products formed after the
    # wgmma wait) against the default 0 = 10 (formed one K block ahead)
    for algo in (LARGE, LARGE | 1 << 8, LARGE | 8 << 8, LARGE | 1 << 12, LARGE | 3 << 12, LARGE | 4 << 12,
                 LARGE | 4 << 12 | 1 << 8, LARGE | 5 << 12, LARGE | 5 << 12 | 1 << 8, LARGE | 7 << 12,
                 LARGE | 8 << 12, LARGE | 8 << 12 | 1 << 8, LARGE | 10 << 12, LARGE | 10 << 12 | 8 << 8):
        again = cuda.gemm_fp8_nt(a, sa, b, sb, algo=algo)
        assert np.array_equal(got.view(np.uint16), again.view(np.uint16)), f"algo {algo} {(m, n, k)}"
    # 192-wide tiles (a tile may straddle two 128-column scale blocks at either offset)
    wide = cuda.gemm_fp8_nt(a, sa, b, sb, algo=LARGE | 2 << 12)
    assert_gemm_close(wide, a, sa, b, sb, f"large BN=192 {(m, n, k)}")
    for algo in (LARGE | 2 << 12 | 1 << 8, LARGE | 6 << 12, LARGE | 9 << 12):  # another tile order, pairs (B, A shared)
        again = cuda.gemm_fp8_nt(a, sa, b, sb, algo=algo)
        assert np.array_equal(wide.view(np.uint16), again.view(np.uint16)), f"algo {algo} {(m, n, k)}"


def test_large_m_kernel_agrees_with_cpu_kernel_and_fills_many_waves():
    rng = np.random.default_rng(17)
    m, n, k = 2304, 4096, 1152  # 18 x 32 = 576 tiles: over four waves of 132 SMs
    a, sa, b, sb = make_gemm(rng, m, n, k)
    g = cuda.gemm_fp8_nt(a, sa, b, sb, algo=LARGE)
    assert np.isfinite(g.astype(np.float64)).all()
    cpu = K.gemm_fp8_nt(a, sa, b, sb).astype(np.float64)
    rel = np.linalg.norm(g.astype(np.float64) - cpu) / np.linalg.norm(cpu)
    assert rel < 4e-3 and (g.astype(np.float64) == cpu).mean() > 0.5, rel
    ovl = cuda.gemm_fp8_nt(a, sa, b, sb, algo=5)
    rel5 = np.linalg.norm(g.astype(np.float64) - ovl.astype(np.float64)) / np.linalg.norm(ovl.astype(np.float64))
    assert rel5 < 4e-3, rel5
    wide = cuda.gemm_fp8_nt(a, sa, b, sb, algo=LARGE | 2 << 12)
    assert np.linalg.norm(wide.astype(np.float64) - cpu) / np.linalg.norm(cpu) < 4e-3
    # 128x192 tiles (half of them straddle two 128-column scale blocks) give the 128x128 tiles' bits: the
    # automatic choice may switch between them
    assert np.array_equal(wide.view(np.uint16), g.view(np.uint16))
    # the multicast pairs: 288 pairs of 128x128 (over two rounds of all resident clusters), bitwise
    for algo, want in ((LARGE | 5 << 12, g), (LARGE | 7 << 12, g), (LARGE | 6 << 12, wide), (LARGE | 8 << 12, g),
                       (LARGE | 9 << 12, wide), (LARGE | 10 << 12, g)):
        got = cuda.gemm_fp8_nt(a, sa, b, sb, algo=algo)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), algo


def test_large_m_kernel_in_cuda_graph():
    rng = np.random.default_rng(13)
    m, n, k = 384, 1024, 1024
    sets = [make_gemm(rng, m, n, k) for _ in range(2)]
    want = [cuda.gemm_fp8_nt(*x, algo=LARGE) for x in sets]
    pair = LARGE | 5 << 12  # the second launch in 2-CTA clusters (a cluster launch captured in the graph)
    dev = [[cuda.to_device(x.view(np.uint8) if x.dtype == FP8 else x) for x in st] for st in sets]
    assert cuda.gemm_workspace_bytes(m, n, k, LARGE) == 0
    outs = [cuda.empty((m, n), np.uint16).fill_bytes(0xFF) for _ in sets]
    stream = cuda.Stream()
    graph = cuda.Graph(lambda s: [cuda.gemm_fp8_nt_device(*dev[i], outs[i], algo=LARGE if i == 0 else pair, stream=s)
                                  for i in range(2)], stream)
    graph.launch()
    stream.synchronize()
    for i in range(2):
        assert np.array_equal(outs[i].numpy(), want[i].view(np.uint16)), i


@pytest.mark.parametrize("m,n,k", [(1, 2048, 512), (16, 7168, 2048), (37, 576, 1040), (64, 2048, 7168),
                                   (100, 1536, 128), (128, 640, 3072), (17, 256, 256), (33, 24576, 1536)])
def test_small_m_kernel_matches_float64_and_is_deterministic(m, n, k):
    """Algo 6: ragged M (zero-filled token rows), ragged N (576, 640: partial weight tiles), a 16-wide last
    K block, one K block, every token width (16/32/64/128), automatic and forced cluster split-K sizes,
    and programmatic dependent launch (same bits as without, where the TMA thread issues the first 1-4 loads before
    the CTA barrier; with it none); 64-row CTAs (two or three a SM) give
    bitwise the 128-row CTAs' output under the same split count (same wgmma rows, same order), and so
    do one or two alternating wgmma temporaries (same promotions in the same order), M split over
    token tiles of 16, 32 or 64 (ragged last tile; the same products per output element), the TMA
    loads' L2 promotion, the stage count (2..12, the partial tile's minimum at 128 tokens), the consumer
    loop's form (the stage counters wrap at odd stage counts; the scales one step ahead) and the output
    path (from the registers at S = 1 and 2, ragged M and N; through shared memory, the form before).
    The K halves over two warpgroups of one CTA (rows 3) give bitwise the 2-CTA cluster split (S = 2), odd
    K block counts (1040: 9 blocks, the second warpgroup takes 5) and every stage count (odd ones rounded
    down to even) included."""
    rng = np.random.default_rng(m * 3 + n + k)
    a, sa, b, sb = make_gemm(rng, m, n, k)
    kb = K.cdiv(k, 128)
    for rows in (0, ROWS128, ROWS64):
        auto = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | rows)
        assert_gemm_close(auto, a, sa, b, sb, f"small rows {rows >> 8} auto {(m, n, k)}")
        again = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | rows | 1 << 28)
        assert np.array_equal(auto.view(np.uint16), again.view(np.uint16)), "PDL / repeat changed the bits"
    for splits in sorted({1, 2, 3, 8, kb} & set(range(1, min(8, kb) + 1))):
        got = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | splits << 16)
        assert_gemm_close(got, a, sa, b, sb, f"small splits {splits} {(m, n, k)}")
        rep = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | splits << 16)
        assert np.array_equal(got.view(np.uint16), rep.view(np.uint16)), f"splits {splits}: not reproducible"
        r128 = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | ROWS128 | splits << 16)
        r64 = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | ROWS64 | splits << 16)
        assert np.array_equal(r128.view(np.uint16), r64.view(np.uint16)), f"splits {splits}: 64 vs 128 rows"
        for knobs in (TEMPS1, TEMPS2, ROWS64 | TEMPS2, WIDTH16, WIDTH32 | TEMPS2, WIDTH64 | TEMPS2,
                      ROWS64 | WIDTH16 | TEMPS2, L2_128B, L2_NONE | TEMPS2, WIDTH_ALL | TEMPS1 | 1 << 4,
                      12 * STAGES, 2 * STAGES | TEMPS2, 3 * STAGES | ROWS64 | WIDTH_ALL,
                      TOKEN_MAJOR | WIDTH32 | TEMPS2, WEIGHT_MAJOR | ROWS64 | WIDTH16, WEIGHT_MAJOR | WIDTH32 | TEMPS1,
                      12 * STAGES | ROWS64 | TEMPS1, 12 * STAGES | ROWS64 | WIDTH_ALL | TOKEN_MAJOR,
                      SCALES_LATE | TEMPS2, SCALES_LATE | TEMPS1 | ROWS64 | WIDTH32, SCALES_EARLY | TEMPS1,
                      SCALES_EARLY | WIDTH_ALL | TEMPS1, SCALES_LATE | WIDTH_ALL, FORM_OLD, FORM_OLD | TEMPS1,
                      FORM_OLD | ROWS64 | WIDTH16 | TEMPS2, FORM_OLD | SCALES_LATE | WIDTH_ALL,
                      FORM_OLD | 3 * STAGES | WIDTH32, FORM_UNI | 3 * STAGES | ROWS64 | WIDTH16,
                      FORM_UNI | 5 * STAGES | WIDTH_ALL | TEMPS1, FORM_UNI | SCALES_LATE | TEMPS2,
                      FORM_UNI | 2 * STAGES | ROWS64 | WIDTH16, FORM_OLD | 2 * STAGES | WIDTH_ALL | TEMPS1,
                      SCALES_ISSUE, SCALES_ISSUE | ROWS64 | WIDTH16 | 3 * STAGES, SCALES_ISSUE | FORM_OLD | WIDTH32,
                      SCALES_ISSUE | TEMPS1 | WIDTH_ALL, FORM_AHEAD, FORM_AHEAD | ROWS64 | WIDTH16,
                      FORM_AHEAD | WIDTH32 | 3 * STAGES, FORM_AHEAD | WIDTH64 | 5 * STAGES,
                      FORM_AHEAD | TEMPS1 | WIDTH_ALL, FORM_AHEAD | 2 * STAGES | WIDTH16, OUT_SMEM | FORM_AHEAD,
                      OUT_SMEM | FORM_UNI, OUT_SMEM | FORM_UNI | ROWS64 | WIDTH16, OUT_SMEM | FORM_OLD | WIDTH_ALL,
                      OUT_SMEM | FORM_UNI | WIDTH64 | TEMPS2, OUT_REG, OUT_REG | ROWS64 | WIDTH16,
                      OUT_REG | WIDTH_ALL | TEMPS1, OUT_REG | FORM_AHEAD | ROWS64 | WIDTH32 | TEMPS2,
                      OUT_REG | FORM_OLD | WIDTH64 | 3 * STAGES, OUT_REG | ROWS64 | WIDTH_ALL | TEMPS1):
            got = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | knobs | splits << 16)
            assert np.array_equal(got.view(np.uint16), r128.view(np.uint16)), f"splits {splits}: knobs {knobs:#x}"
    if kb >= 2:
        s2 = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | ROWS128 | 2 << 16)
        for knobs in (0, 1 << 16, TEMPS1, TEMPS2, WIDTH16, WIDTH32 | TEMPS2, WIDTH64, WIDTH_ALL | TEMPS1,
                      2 * STAGES, 3 * STAGES | WIDTH16, 5 * STAGES, 12 * STAGES, 12 * STAGES | WIDTH32 | TEMPS1,
                      FORM_UNI, FORM_UNI | WIDTH16 | TEMPS2, FORM_AHEAD | WIDTH32, SCALES_LATE | TEMPS2,
                      SCALES_ISSUE | WIDTH16, SCALES_EARLY | TEMPS1, OUT_REG, L2_NONE, WEIGHT_MAJOR | WIDTH16,
                      1 << 28, 1 << 28 | WIDTH32 | 4 * STAGES):
            got = cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | HALVES | knobs)
            assert np.array_equal(got.view(np.uint16), s2.view(np.uint16)), f"K halves: knobs {knobs:#x}"
        assert_gemm_close(got, a, sa, b, sb, f"small K halves {(m, n, k)}")
    if kb < 8:
        for rows in (ROWS128, ROWS64):
            with pytest.raises(DsxError, match="invalid"):
                cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | rows | (kb + 1) << 16)


@pytest.mark.parametrize("m,n,k,knobs", [(16, 2048, 7168, 0), (5, 3000, 1024, 3 << 16), (9, 640, 3072, 8 << 16),
                                          (32, 1000, 2048, OUT_REG | 5 << 16), (17, 520, 1040, ROWS64 | 4 << 16),
                                          (40, 256, 2048, WIDTH16 | 6 << 16), (100, 1000, 1024, WIDTH32 | 7 << 16)])
def test_small_m_split_sums_through_the_workspace_keep_the_bits(m, n, k, knobs):
    """Algo 6 at S >= 3 with 16 or 32 tokens a tile: the CTAs' partial sums through L2 (the workspace its query
    asks for) give bitwise the fp32 tile's reduction over distributed shared memory (forced by bits 29..30 = 1,
    which needs no workspace), and so do launches given no workspace or one 16 bytes short (they fall back to that
    reduction); a workspace full of NaN bytes is overwritten before it is read. Ragged M (token tiles split over the
    grid too) and N, 64 and 128 weight rows, 3..8 splits. At 64 tokens a tile no workspace is asked for."""
    rng = np.random.default_rng(m + n + k)
    a, sa, b, sb = make_gemm(rng, m, n, k)
    algo = SMALL | knobs
    need = cuda.gemm_workspace_bytes(m, n, k, algo)
    assert need > 0, "the split sums should go through the workspace here"
    assert cuda.gemm_workspace_bytes(m, n, k, algo & ~(3 << 29) | OUT_SMEM) == 0
    if m > 32:  # (64-token tiles: up to 64 tokens WIDTH64 is all of M in one tile of 16 or 32)
        assert cuda.gemm_workspace_bytes(m, n, k, algo & ~(15 << 24) | WIDTH64) == 0
    want = cuda.gemm_fp8_nt(a, sa, b, sb, algo=algo & ~(3 << 29) | OUT_SMEM)
    assert_gemm_close(want, a, sa, b, sb, f"small S >= 3 {(m, n, k, hex(knobs))}")
    dev = [cuda.to_device(x.view(np.uint8) if x.dtype == FP8 else x) for x in (a, sa, b, sb)]
    for i, ws in enumerate((cuda.empty((need,), np.uint8).fill_bytes(0xFF), None, cuda.empty((need - 16,), np.uint8))):
        out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)
        cuda.gemm_fp8_nt_device(*dev, out, workspace=ws, algo=algo)
        got = out.numpy()
        assert np.array_equal(got, want.view(np.uint16)), f"workspace {None if ws is None else ws.nbytes}"
        if i == 0:  # the sums did go through it: the NaN bytes were written over
            assert (ws.numpy() != 0xFF).any(), "the workspace was not used"


def test_small_m_kernel_rejects_what_it_cannot_take():
    rng = np.random.default_rng(5)
    for m, n, k in ((129, 256, 256), (16, 130, 256), (16, 256, 200)):  # M > 128, N % 8, K % 16
        a, sa, b, sb = make_gemm(rng, m, n, k)
        with pytest.raises(DsxError, match="invalid"):
            cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL)
    a, sa, b, sb = make_gemm(rng, 16, 256, 256)
    # the K halves: one CTA split, the uniform loop form, the output from the registers; at least two K blocks
    for bad in (SMALL | HALVES | 2 << 16, SMALL | HALVES | FORM_OLD, SMALL | HALVES | OUT_SMEM):
        with pytest.raises(DsxError, match="invalid"):
            cuda.gemm_fp8_nt(a, sa, b, sb, algo=bad)
    a1, sa1, b1, sb1 = make_gemm(rng, 16, 256, 128)
    with pytest.raises(DsxError, match="invalid"):
        cuda.gemm_fp8_nt(a1, sa1, b1, sb1, algo=SMALL | HALVES)
    with pytest.raises(DsxError, match="invalid"):  # at most two temporaries
        cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | 3 << 12)
    with pytest.raises(DsxError, match="invalid"):  # token widths 16, 32, 64, all
        cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | 5 << 24)
    for bad in (SMALL | 3 << 6, SMALL | 3 << 29, 1 << 29, 3 | 2 << 29, 1 | 1 << 30, 7 | 1 << 29):
        # two grid orders, two output paths; bits 29..30 are algo 6's only (not auto's, nor another's)
        with pytest.raises(DsxError, match="invalid"):
            cuda.gemm_fp8_nt(a, sa, b, sb, algo=bad)
    for scales in (SCALES_LATE, SCALES_EARLY, SCALES_ISSUE):  # the scales one step ahead have their own read point
        with pytest.raises(DsxError, match="invalid"):
            cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | FORM_AHEAD | scales)
    for stages in (1, 13):  # 2..12 stages
        with pytest.raises(DsxError, match="invalid"):
            cuda.gemm_fp8_nt(a, sa, b, sb, algo=SMALL | stages * STAGES)


def test_small_m_kernel_with_pdl_in_cuda_graph_keeps_launch_order():
    """Launches with programmatic dependent launch, captured back to back into one graph and all
    writing the same output: the last one's result must be what remains, and each reads fresh inputs."""
    rng = np.random.default_rng(13)
    m, n, k = 64, 7168, 2048
    sets = [make_gemm(rng, m, n, k) for _ in range(2)]
    dev = [[cuda.to_device(x.view(np.uint8) if x.dtype == FP8 else x) for x in s] for s in sets]
    stream = cuda.Stream()
    order = [1, 0, 1, 1, 0]
    for rows in (ROWS128, ROWS64, ROWS128 | TEMPS2 | WIDTH32, ROWS64 | OUT_SMEM | FORM_UNI,
                 ROWS128 | WIDTH32 | OUT_SMEM, ROWS128 | 2 << 16 | WIDTH16, ROWS128 | 8 << 16):
        # (S = 8 at 32 tokens a tile: the split sums through one workspace that every launch of the graph shares)
        want = cuda.gemm_fp8_nt(*sets[0], algo=SMALL | rows)
        out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)
        need = cuda.gemm_workspace_bytes(m, n, k, SMALL | rows | 1 << 28)
        assert (need > 0) == (rows == ROWS128 | 8 << 16)
        ws = cuda.empty((need,), np.uint8) if need else None
        graph = cuda.Graph(lambda s, rows=rows, ws=ws: [cuda.gemm_fp8_nt_device(*dev[i], out, workspace=ws,
                                                                                algo=SMALL | rows | 1 << 28, stream=s)
                                                        for i in order], stream)
        for _ in range(3):
            graph.launch()
        stream.synchronize()
        assert np.array_equal(out.numpy(), want.view(np.uint16)), f"rows {rows >> 8}"


class _Alias(cuda.DeviceArray):
    """Another shape and dtype over the bytes of a device array (the array itself keeps them)."""

    def __init__(self, base, shape, dtype):
        self.base, self.shape, self.dtype, self.ptr = base, tuple(shape), np.dtype(dtype), base.ptr
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        assert self.nbytes == base.nbytes

    def __del__(self):
        pass


def test_small_m_kernel_with_pdl_reads_its_tokens_only_after_the_previous_grid():
    """Two layers launched with PDL, the second's tokens being the first's output bytes read as e4m3 codes: a launch
    with PDL reads its weight tiles before griddepcontrol.wait (gemm_fp8.h, bit 28), so a token tile read there too
    would hold the buffer's old bytes (zeros) and its layer's output would differ from the plain launch's."""
    rng = np.random.default_rng(29)
    # layer 1: codes -1 / 0 / 1 (120 non-zero a token row), scales 1: integer sums of magnitude <= 120, exact in bf16,
    # whose bytes (an even low byte, a high byte <= 0x43 or in 0x80..0xc3) are never the e4m3 NaN codes 0x7f / 0xff.
    # K1 = 32768 on nine CTAs (no split): layer 2's CTAs start, and read, long before layer 1 stores (with one K block
    # layer 1 was done first and the test passed a token tile read before the wait). N1 = 1088: layer 2's K = 2 N1 is
    # 17 K blocks (an odd count for the K halves)
    m, n1, k1, n2 = 64, 1088, 32768, 7168
    k2 = 2 * n1
    a1 = np.zeros((m, k1), np.float32)
    for r in range(m):
        a1[r, rng.choice(k1, 120, replace=False)] = rng.choice((-1.0, 1.0), 120)
    a1, b1 = a1.astype(FP8), rng.integers(-1, 2, (n1, k1)).astype(np.float32).astype(FP8)
    sa1, sb1 = np.ones((m, k1 // 128), np.float32), np.ones((K.cdiv(n1, 128), k1 // 128), np.float32)
    h = (a1.astype(np.float64) @ b1.astype(np.float64).T).astype(BF16)
    x2 = h.view(np.uint8).reshape(m, k2)
    assert not np.isin(x2, (0x7F, 0xFF)).any() and x2.any()
    _, sa2, b2, sb2 = make_gemm(rng, m, n2, k2)
    dev1 = [cuda.to_device(x.view(np.uint8) if x.dtype == FP8 else x) for x in (a1, sa1, b1, sb1)]
    dev2 = [cuda.to_device(x.view(np.uint8) if x.dtype == FP8 else x) for x in (sa2, b2, sb2)]
    h1 = cuda.empty((m, n1), np.uint16)
    a2 = _Alias(h1, (m, k2), np.uint8)
    out = cuda.empty((m, n2), np.uint16)
    stream = cuda.Stream()
    pdl = 1 << 28
    checked = False
    for rows in (0, ROWS128, ROWS64, HALVES, HALVES | 4 * STAGES, ROWS128 | 3 * STAGES | WIDTH32, FORM_OLD | ROWS64,
                 FORM_AHEAD | WIDTH16, ROWS128 | TEMPS2 | WIDTH32, ROWS64 | OUT_SMEM | FORM_UNI,
                 ROWS128 | 2 << 16 | WIDTH16, ROWS128 | 8 << 16 | WIDTH32):
        want = cuda.gemm_fp8_nt(x2.view(FP8), sa2, b2, sb2, algo=SMALL | rows if rows else 0)
        if not checked:
            assert_gemm_close(want, x2.view(FP8), sa2, b2, sb2, "layer 2")
            checked = True
        algo = (SMALL | rows if rows else 0) | pdl
        need = cuda.gemm_workspace_bytes(m, n2, k2, algo)
        ws = cuda.empty((need,), np.uint8) if need else None
        for trial in range(3):
            h1.fill_bytes(0, stream)
            out.fill_bytes(0xFF, stream)
            cuda.gemm_fp8_nt_device(*dev1, h1, algo=SMALL | ROWS128 | 1 << 16 | pdl, stream=stream)
            cuda.gemm_fp8_nt_device(a2, *dev2, out, workspace=ws, algo=algo, stream=stream)
            stream.synchronize()
            assert np.array_equal(h1.numpy(), h.view(np.uint16)), f"layer 1, rows {rows:#x} trial {trial}"
            got = out.numpy()
            bad = (got != want.view(np.uint16)).any(axis=1).sum()
            assert bad == 0, f"rows {rows:#x} trial {trial}: {bad} of {m} token rows differ from the plain launch"


def test_dense_planted_scale_fault_is_caught():
    rng = np.random.default_rng(8)
    a, sa, b, sb = make_gemm(rng, 64, 256, 512)
    bad = sb.copy()
    bad[1, 3] *= 1.25
    with pytest.raises(AssertionError):
        assert_gemm_close(cuda.gemm_fp8_nt(a, sa, b, bad), a, sa, b, sb, "planted")


@pytest.mark.parametrize("n,k,algo", [(512, 1024, 0), (576, 2048, 0), (512, 1024, 2), (130, 300, 0)])
def test_grouped_gemm_matches_per_expert_float64(n, k, algo):
    rng = np.random.default_rng(n + k + algo)
    sizes = [0, 130, 1, 0, 257, 64, 7, 0]  # empty experts, tile-ragged ones
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    a, sa, b, sb = make_gemm(rng, int(off[-1]), n, k, e=len(sizes))
    out = cuda.gemm_fp8_grouped_nt_contiguous(a, sa, b, sb, off, algo=algo)
    for e in range(len(sizes)):
        r = slice(off[e], off[e + 1])
        if sizes[e]:
            assert_gemm_close(out[r], a[r], sa[r], b[e], sb[e], f"expert {e} algo {algo}")


def ref_act_quant(x):
    xf = x.astype(np.float32)
    m, k = xf.shape
    g = K.cdiv(k, 128)
    pad = np.zeros((m, g * 128), np.float32)
    pad[:, :k] = xf
    blocks = pad.reshape(m, g, 128)
    s = (np.abs(blocks).max(-1) / np.float32(448)).astype(np.float32)
    s[s == 0] = np.float32(1)  # all zero (or underflowing) group: scale 1, codes +-0
    q = (blocks / s[..., None]).reshape(m, g * 128)[:, :k]
    return q.astype(FP8), s


@pytest.mark.parametrize("m,k", [(64, 7168), (33, 300), (1, 128), (5, 200), (3, 1004)])
def test_act_quant_bit_exact(m, k):
    rng = np.random.default_rng(m * k)
    x = (rng.standard_normal((m, k)) * np.exp(rng.uniform(-8, 8, (m, 1)))).astype(BF16)
    x[0, :128] = 0  # an all-zero group: scale 1, codes 0
    x[-1, -min(k, 100):] = -0.0  # a negative-zero (part of a) group: codes -0 (0x80) where it is whole
    x[m // 2, :min(k, 128)] = (-1e-38) * (np.arange(min(k, 128)) % 2)  # subnormal amax: subnormal scale (no FTZ)
    q, s = cuda.act_quant_fp8(x)
    rq, rs = ref_act_quant(x)
    assert np.array_equal(s.view(np.uint32), rs.view(np.uint32))
    assert np.array_equal(q.view(np.uint8), rq.view(np.uint8))
    # the CPU kernel (the CI path, csrc/cpu/quant_fp8.cc) writes the same bits, special groups included
    cq, cs = fp8_block.act_quant_native(x)
    assert np.array_equal(s.view(np.uint32), np.asarray(cs).view(np.uint32))
    assert np.array_equal(q.view(np.uint8), np.asarray(cq).view(np.uint8))
    # round trip feeds the GEMM: dequantized q*s is within e4m3's half-step of x
    deq = q.astype(np.float32) * np.repeat(s, 128, axis=1)[:, :k]
    assert np.all(np.abs(deq - x.astype(np.float32)) <= np.abs(x.astype(np.float32)) * 2.0**-4 + np.repeat(s, 128, axis=1)[:, :k] * 2.0**-9)


def make_mtp(rng, bsz, k, dtype, vocab=4):
    target = rng.integers(0, vocab, (bsz, k + 1)).astype(dtype)
    draft = np.where(rng.random((bsz, k)) < 0.7, target[:, :k], rng.integers(0, vocab, (bsz, k))).astype(dtype)
    return draft, target, rng.integers(0, k + 1, bsz).astype(np.int32)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bsz,k", [(256, 5), (1000, 8), (3, 0)])
def test_mtp_accept_matches_cpu(dtype, bsz, k):
    d, t, nd = make_mtp(np.random.default_rng(bsz + k), bsz, k, dtype)
    acc, cnt = cuda.mtp_accept_greedy(d, t, nd)
    racc, rcnt = K.mtp_accept_greedy(d, t, nd)
    assert np.array_equal(acc, racc) and np.array_equal(cnt, rcnt)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bsz,k,c", [(256, 5, 8), (1000, 8, 3), (3, 0, 1)])
def test_mtp_accept_topp_matches_cpu(dtype, bsz, k, c):
    rng = np.random.default_rng(bsz + k + c)
    cand = rng.integers(0, 8, (bsz, k + 1, c)).astype(dtype)
    ncand = rng.integers(1, c + 1, (bsz, k + 1)).astype(np.int32)
    sampled = cand[:, :, 0].copy()
    pick = np.take_along_axis(cand[:, :k], rng.integers(0, c, (bsz, k))[..., None], axis=2)[..., 0]
    draft = np.where(rng.random((bsz, k)) < 0.85, pick, rng.integers(0, 8, (bsz, k))).astype(dtype)
    nd = rng.integers(0, k + 1, bsz).astype(np.int32)
    acc, cnt = cuda.mtp_accept_topp(draft, cand, ncand, sampled, nd)
    racc, rcnt = K.mtp_accept_topp(draft, cand, ncand, sampled, nd)
    assert np.array_equal(acc, racc) and np.array_equal(cnt, rcnt)


def test_mtp_accept_in_cuda_graph_reads_fresh_inputs_and_clamps():
    rng = np.random.default_rng(11)
    bsz, k = 256, 5
    d, t, nd = make_mtp(rng, bsz, k, np.int64)
    dd, td, ndd = cuda.to_device(d), cuda.to_device(t), cuda.to_device(nd)
    acc, cnt = cuda.empty((bsz, k + 1), np.int64), cuda.empty((bsz,), np.int32)
    stream = cuda.Stream()
    graph = cuda.Graph(lambda s: cuda.mtp_accept_greedy_device(dd, td, ndd, acc, cnt, stream=s), stream)
    d2, t2, nd2 = make_mtp(rng, bsz, k, np.int64)
    nd2[:3] = [k + 3, -2, 99]  # out of range on the device: clamped to [0, K]
    dd.upload(d2), td.upload(t2), ndd.upload(nd2)
    graph.launch()
    stream.synchronize()
    racc, rcnt = K.mtp_accept_greedy(d2, t2, np.clip(nd2, 0, k))
    assert np.array_equal(acc.numpy(), racc) and np.array_equal(cnt.numpy(), rcnt)


def test_dense_gemm_captures_in_cuda_graph():
    rng = np.random.default_rng(12)
    m, n, k = 96, 1024, 1024
    a, sa, b, sb = make_gemm(rng, m, n, k)
    direct = cuda.gemm_fp8_nt(a, sa, b, sb)
    dev = [cuda.to_device(x.view(np.uint8) if x.dtype == FP8 else x) for x in (a, sa, b, sb)]
    out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)
    ws_n = cuda.gemm_workspace_bytes(m, n, k)
    ws = cuda.empty((max(ws_n, 1),), np.uint8)
    stream = cuda.Stream()
    graph = cuda.Graph(lambda s: cuda.gemm_fp8_nt_device(*dev, out, workspace=ws, stream=s), stream)
    graph.launch()
    stream.synchronize()
    assert np.array_equal(out.numpy(), direct.view(np.uint16))


def test_cuda_wrappers_reject_bad_device_arrays():
    a = cuda.empty((4, 128), np.uint8)
    with pytest.raises(DsxError, match="sa"):
        cuda.gemm_fp8_nt_device(a, cuda.empty((4, 2), np.float32), cuda.empty((128, 128), np.uint8),
                                cuda.empty((1, 1), np.float32), cuda.empty((4, 128), np.uint16))
