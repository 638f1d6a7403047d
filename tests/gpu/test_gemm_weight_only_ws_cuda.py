"""CUDA weight-only GEMM, warp-specialized path (algo bit 28, csrc/cuda/gemm_weight_only_ws.cuh and _ws_host.cuh).

GPU machine only (skipped where no CUDA device is visible). Every output is checked against
float64 within the header's bound (check_bound of test_gemm_weight_only_cuda.py), and against
the existing path at the same split: the header promises the same bits (the same per-step
partials joined in increasing k, the same slice-order reduction), so auto may switch between
the two freely. The output buffer is poisoned (NaN) first, so an unwritten element fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.native import cuda
from ds_export.native import gemm_weight_only as G

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gemm_weight_only_cuda import BF16, ONE_GROUP, ONE_STEP, PDL, check_bound, make, run_raw, word  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

WS = 1 << 28  # algo bit: warp-specialized path
LAYOUTS = [(4, -1), (4, 128), (4, 64), (8, -1), (8, 128)]


def same(a, b) -> bool:
    return np.array_equal(a.view(np.uint16), b.view(np.uint16))


def existing(x, q, s, wd, bits, group, splits, what):
    """The existing path's output at this split, checked against float64: the bits the others must give."""
    ref = run_raw(x, q, s, bits, group, word(8, splits, 0, 0, 0))
    check_bound(ref, x, wd, f"existing {what} splits {splits}")
    return ref


def check_same_bits(x, q, s, wd, bits, group, ref, algo, what, also=()):
    """The kernel at `algo` right against float64 and bit for bit `ref`; so too with each flag of
    `also` (one step, one group, PDL) set."""
    a = run_raw(x, q, s, bits, group, algo)
    check_bound(a, x, wd, f"{what} algo {algo:#x}")
    assert same(a, ref), f"{what} algo {algo:#x}: bits differ from the existing path"
    for flag in also:
        assert same(run_raw(x, q, s, bits, group, algo | flag), ref), f"{what} algo {algo:#x} | {flag:#x}: bits differ"


@pytest.mark.parametrize("bits,group", LAYOUTS)
def test_same_bits_as_existing_path_every_split(bits, group):
    """N = 320: 2.5 blocks of 128 channels (the last block's upper warps are past N); K = 2112:
    16.5 int4 steps (a half step at the end), 33 int8 steps, so the slices of 1..8 splits are
    ragged and end in short ring slots for most boxes. M 9..16 (and not multiples of 8), and
    one M <= 8. For each split: right, reproducible, and the same bits as the existing path,
    whatever the block ring (slots, steps per slot), the warps, one step at a time or two."""
    n, k = 320, 2112
    for m in (9, 12, 16, 5):
        x, q, s, wd = make(m, n, k, bits, group, seed=11)
        for splits in range(1, 9):
            ref = existing(x, q, s, wd, bits, group, splits, f"m {m}")
            for warps, stages, box in ((8, 0, 0), (8, 2, 2), (8, 3, 4), (8, 1, 8), (4, 5, 3), (2, 2, 1)):
                check_same_bits(x, q, s, wd, bits, group, ref, word(warps, splits, 0, stages, box) | WS, f"ws m {m}")
            # one step / one group, and again as it was (reproducible)
            algo = word(8, splits, 0, 2, 2) | WS
            check_same_bits(x, q, s, wd, bits, group, ref, algo, f"ws m {m}", also=(ONE_STEP | ONE_GROUP, 0))


@pytest.mark.parametrize("m", [10, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 64), (8, 128)])
def test_persistent_blocks_many_tile_groups(bits, group, m):
    """N = 23104: 181 tile groups of 128 channels (the last one half empty). A ring of 10 slots
    of 2 steps (one block an SM) keeps fewer blocks resident than there are groups, so each
    persistent block loops over groups, its producer running ahead into the next group while
    the consumers reduce (and joining each group's cluster barriers). Right, and the same bits
    as the existing path, as one group a block, and with programmatic dependent launch."""
    n, k = 23104, 576
    x, q, s, wd = make(m, n, k, bits, group, seed=12)
    for splits in (1, 2, 3, 5):
        ref = run_raw(x, q, s, bits, group, word(8, splits, 0, 0, 0))
        for stages, box in ((10, 2), (4, 1)):
            algo = word(8, splits, 0, stages, box) | WS
            check_same_bits(x, q, s, wd, bits, group, ref, algo, f"ws persistent m {m}", also=(ONE_GROUP, PDL))


def ws_config(m, n, k, bits, group, algo):
    """(warps, splits, chunk, stages, box) of the C config entry (any algo word, bit 28 too)."""
    v = [ctypes.c_int() for _ in range(5)]
    assert G._cuda_fns()[1](m, n, k, bits, group, algo, *[ctypes.byref(i) for i in v]) == 0
    return tuple(i.value for i in v)


@pytest.mark.parametrize("m", [1, 8, 9, 13, 16])
@pytest.mark.parametrize("n,k,bits,group", [(2048, 7168, 4, -1), (4096, 7168, 4, 128), (1536, 1536, 8, -1)])
def test_automatic_fields_on_decode_shapes(m, n, k, bits, group):
    """Bit 28 with every field automatic: x whole, the ring 4 x 1, and the same bits as the
    existing path at the split it resolves to (int4 per channel: as auto itself, which takes this
    path on these shapes at any M up to 16); right against float64."""
    warps, splits, chunk, stages, box = ws_config(m, n, k, bits, group, WS)
    nsteps = k // 64 if bits == 8 else (k // 64 + 1) // 2
    assert chunk == -(-nsteps // splits) and (stages, box) == (4, 1), (warps, splits, chunk, stages, box)
    x, q, s, wd = make(m, n, k, bits, group, seed=13)
    a = run_raw(x, q, s, bits, group, WS)
    check_bound(a, x, wd, f"ws auto {(m, n, k, bits, group)}")
    assert same(a, run_raw(x, q, s, bits, group, word(warps, splits, 0, 0, 0))), "bits differ from the existing path"
    if bits == 4 and group == -1:  # (two tiles a warp at 9..16 rows since the sixteenth session)
        path = G.cuda_path(m, n, k, bits, group)  # (x through the ring where the table says so: 9..16 rows)
        assert (path["ws"], path["tiles"]) == (True, 2 if m > 8 else 1) and (m > 8 or not path["xring"]), path
        auto_splits = G.cuda_config(m, n, k, bits, group)["splits"]
        ref = a if auto_splits == splits else run_raw(x, q, s, bits, group, word(8, auto_splits, 0, 0, 0))
        auto = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
        check_bound(auto, x, wd, f"auto {(m, n, k, bits, group)} {path}")
        assert path["fold"] or same(ref, auto), "bits differ from auto"  # (the fold: its own bits, test_fold_x_ring)


@pytest.mark.parametrize("bits,group", LAYOUTS)
def test_17_to_32_rows_four_token_tiles_same_bits(bits, group):
    """17..32 rows with bit 28: four token tiles a warp (one channel tile), x whole. The shapes of
    test_same_bits_as_existing_path_every_split (ragged slices, a half int4 step, the last block's
    upper warps past N): for each split right, reproducible, and the bits of the existing path;
    with its persistent blocks looping over groups (N = 23104) and with PDL too."""
    n, k = 320, 2112
    for m in (17, 24, 29, 32):
        x, q, s, wd = make(m, n, k, bits, group, seed=16)
        for splits in range(1, 9):
            ref = existing(x, q, s, wd, bits, group, splits, f"m {m}")
            for warps, stages, box in ((8, 0, 0), (8, 2, 2), (8, 3, 2), (4, 5, 3)):  # (rings x whole leaves room for)
                algo = word(warps, splits, 0, stages, box) | WS
                got = G.cuda_path(m, n, k, bits, group, algo=algo)
                got.pop("wgmma")  # (where it pays: test_17_to_32_rows_wgmma_same_bits_as_mma)
                assert got == {"ws": True, "tiles": 1, "xring": False, "fold": False}, algo
                check_same_bits(x, q, s, wd, bits, group, ref, algo, f"ws m {m}", also=(0,))  # (and reproducible)
    n, k, m = 23104, 576, 32
    x, q, s, wd = make(m, n, k, bits, group, seed=17)
    for splits in (1, 3, 4):
        ref = run_raw(x, q, s, bits, group, word(8, splits, 0, 0, 0))
        check_same_bits(x, q, s, wd, bits, group, ref, word(8, splits, 0, 4, 1) | WS, f"ws persistent m {m}", also=(PDL,))


WGMMA, MMA = 1 << 29, 2 << 29  # (17..32 rows, with bit 28: the consumers multiply through wgmma / mma.sync)


@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (4, 64), (8, -1), (8, 128)])
def test_17_to_32_rows_wgmma_same_bits_as_mma(bits, group):
    """17..32 rows, one tile a warp: bits 29..30 = 1 make 4 or 8 consumer warps (whole warpgroups) multiply through
    wgmma (unpacked weights as the register A operand, x as the shared-memory B, ceil(M / 8) token groups of it),
    = 2 through mma.sync. The wgmma chain runs the mma chain's k-steps in its order (int4 group 64: step_g64_wgmma, x in
    the group-64 k order, forty-third session): at every split the same bits,
    right against float64, with M not a multiple of 8, a ragged K (a half int4 step), N past the last block's upper
    warpgroup, persistent blocks looping over tile groups, and PDL."""
    for n, k, m, splits_all in ((320, 2112, 17, (1, 2, 3, 8)), (320, 2112, 32, (1, 2, 5, 8)), (1088, 4160, 25, (2, 3, 8)),
                                (23104, 576, 30, (1, 4))):
        x, q, s, wd = make(m, n, k, bits, group, seed=32)
        for splits in splits_all:
            for warps, stages, box in ((8, 2, 2), (4, 3, 1), (8, 4, 1)):
                mma = word(warps, splits, 0, stages, box) | WS | MMA
                assert not G.cuda_path(m, n, k, bits, group, algo=mma)["wgmma"], mma
                ref = run_raw(x, q, s, bits, group, mma)
                check_bound(ref, x, wd, f"mma m {m} {(n, k)} {mma:#x}")
                algo = word(warps, splits, 0, stages, box) | WS | WGMMA
                assert G.cuda_path(m, n, k, bits, group, algo=algo)["wgmma"], algo
                check_same_bits(x, q, s, wd, bits, group, ref, algo, f"wgmma m {m} {(n, k)} {algo:#x}", also=(PDL,))


def test_17_to_32_rows_wgmma_where_it_pays_and_refusals():
    """Automatic (tables off): wgmma where the steps a block runs reach 32 (36864 x 7168 at 24 or 32 rows: 7-step
    slices over 9 rounds of blocks; 7168 x 18432 at 17..32: 18-step slices over 2 to 4), mma.sync where they do not
    (7168 x 2048, 24576 x 1536: one or two rounds of 4..6 steps) or where x for whole token groups would cost a block
    an SM (36864 x 7168 at 17 rows: x for 24); int4 group 64 as per channel there (since the forty-third session;
    before, never). Asked for where it cannot run (2 warps): DSX_EINVAL."""
    skip_unless_h200()
    want = {(36864, 7168): (False, True, True), (7168, 18432): (True, True, True), (7168, 2048): (False, False, False),
            (24576, 1536): (False, False, False)}
    with cuda.rules_only():
        for (n, k), w in want.items():
            assert [G.cuda_path(m, n, k, 4, -1)["wgmma"] for m in (17, 24, 32)] == list(w), (n, k)
        assert [G.cuda_path(m, 36864, 7168, 4, 64)["wgmma"] for m in (17, 24, 32)] == [False, True, True]
    for bits, group in ((4, -1), (4, 64)):
        with pytest.raises(DsxError):
            G.cuda_path(24, 2048, 7168, bits, group, algo=word(2, 4, 0, 2, 2) | WS | WGMMA)
    assert G.cuda_path(24, 2048, 7168, 4, 64, algo=word(8, 4, 0, 2, 2) | WS | WGMMA)["wgmma"]
    assert not G.cuda_path(24, 36864, 7168, 4, -1, algo=word(8, 8, 0, 2, 2) | WS | MMA)["wgmma"]
    assert G.cuda_path(24, 2048, 7168, 4, -1, algo=word(8, 8, 0, 2, 2) | WS | WGMMA)["wgmma"]


@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (4, 64), (8, -1), (8, 128)])
def test_33_to_64_rows_eight_token_tiles_same_bits(bits, group):
    """33..64 rows in one launch with bit 28 and bits 29..30 = 1: eight token tiles, wgmma consumers (m64n64k16, x staged
    whole for ceil(M / 8) token groups). At every split whose x fits, the bits of the existing path (eight token tiles
    through mma.sync, the same slices), right against float64: M not a multiple of 8, a ragged K (a half int4 step),
    N past the last block's upper warpgroup, persistent blocks looping over tile groups, PDL. Where x for the rows does
    not fit (K = 2112 in one slice: 17 steps of 64 rows) the word falls back to the existing path, as at 17..32 rows."""
    for n, k, m, splits_all in ((320, 2112, 33, (3, 5, 8)), (320, 2112, 64, (3, 8)), (1088, 4160, 47, (4, 8)),
                                (23104, 576, 57, (1, 4))):
        x, q, s, wd = make(m, n, k, bits, group, seed=33)
        for splits in splits_all:
            ref = existing(x, q, s, wd, bits, group, splits, f"m {m} {(n, k)}")
            for warps, stages, box in ((8, 2, 2), (4, 3, 1)):
                algo = word(warps, splits, 0, stages, box) | WS | WGMMA
                assert G.cuda_path(m, n, k, bits, group, algo=algo) == {
                    "ws": True, "tiles": 1, "xring": False, "fold": False, "wgmma": True}, (m, n, k, algo)
                assert G.cuda_launch(m, n, k, bits, group, algo=algo) == {"rows": m, "parts": 1}, algo
                check_same_bits(x, q, s, wd, bits, group, ref, algo, f"wide m {m} {(n, k)} {algo:#x}", also=(PDL,))
    x, q, s, wd = make(64, 320, 2112, bits, group, seed=34)
    algo = word(8, 1, 0, 0, 0) | WS | WGMMA  # (x of 17 steps x 64 rows: no room; the existing path, its bits)
    assert not G.cuda_path(64, 320, 2112, bits, group, algo=algo)["ws"]
    assert same(run_raw(x, q, s, bits, group, algo), existing(x, q, s, wd, bits, group, 1, "no room"))
    with pytest.raises(DsxError):  # (a ring asked for that leaves x no room: refused, as at 17..32 rows)
        G.cuda_path(64, 320, 2112, bits, group, algo=word(8, 1, 0, 2, 2) | WS | WGMMA)


def test_33_to_64_rows_eight_token_tiles_rule_on_h200():
    """Automatic (tables off), 33..64 rows: one launch of eight token tiles with 2 slots of 2 steps, or of 1 step where
    only that holds two blocks an SM, per channel only (36864 x 7168 at 40 rows: x for 40 rows of a 7-step slice; at 41
    and 64 rows one block an SM either way; the group layouts keep 2 steps a slot, forty-third session); the cut at 32
    rows where x for the rows does not fit (7168 x 18432: 18-step slices) or where its two launches run side by side
    (7168 x 256); int4 group 64 as per channel at 64 rows (since the forty-third session; before, no wgmma instance:
    the cut at 32 rows)."""
    skip_unless_h200()
    with cuda.rules_only():
        for m, want in ((40, (8, 8, 7, 2, 1)), (41, (8, 8, 7, 2, 2)), (64, (8, 8, 7, 2, 2))):
            assert G.cuda_path(m, 36864, 7168, 4, -1)["wgmma"], m
            assert G.cuda_launch(m, 36864, 7168, 4, -1) == {"rows": m, "parts": 1}, m
            assert ws_config(m, 36864, 7168, 4, -1, 0) == want, m
        for bits, group in ((4, 128), (4, 64), (8, 128)):  # (a scale row copy a step: 2 steps a slot at 40 rows too)
            assert ws_config(40, 36864, 7168, bits, group, 0)[3:] == (2, 2), (bits, group)
        assert ws_config(40, 36864, 7168, 8, -1, 0)[3:] == (2, 1)
        assert G.cuda_launch(64, 7168, 18432, 4, -1) == {"rows": 32, "parts": 1}
        assert G.cuda_launch(64, 7168, 256, 4, -1) == {"rows": 64, "parts": 2}
        assert G.cuda_launch(64, 36864, 7168, 4, 64) == {"rows": 64, "parts": 1}
        assert G.cuda_path(64, 36864, 7168, 4, 64)["wgmma"]


def test_33_to_64_rows_eight_token_tiles_refusals():
    """Eight token tiles need whole warpgroups (DSX_EINVAL otherwise; int4 group 64 takes them since the forty-third
    session); bit 28 alone (or with bits 29..30 = 2) above 32 rows keeps the existing path
    (test_more_than_32_rows_ignore_the_bit)."""
    for bits, group in ((4, -1), (4, 64)):
        with pytest.raises(DsxError):
            G.cuda_path(48, 2048, 7168, bits, group, algo=word(2, 4, 0, 2, 2) | WS | WGMMA)
    assert G.cuda_path(48, 2048, 7168, 4, 64, algo=word(8, 8, 0, 2, 2) | WS | WGMMA)["wgmma"]
    for extra in (0, MMA):
        assert not G.cuda_path(48, 2048, 7168, 4, -1, algo=word(8, 8, 0, 2, 2) | WS | extra)["ws"], extra
    assert G.cuda_path(48, 2048, 7168, 4, -1, algo=word(8, 8, 0, 2, 2) | WS | WGMMA)["wgmma"]


@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (4, 64), (8, -1), (8, 128)])
@pytest.mark.parametrize("n,k", [(16896, 2048), (7168, 2048), (1024, 1536)])
def test_automatic_rule_17_to_64_rows(n, k, bits, group):
    """The rules (tables off), 17..32 rows: this path, choose()'s split, x whole, 2 slots of 2 steps,
    the same bits as the existing path at that split; 33..64 rows, where x for them fits whole: one launch of eight
    token tiles through wgmma, 2 slots of 2 steps, the existing path's bits at its split, unless the cut at 32 rows runs
    as two grid parts side by side (1024 x 1536: 8 tile groups; check_rows_past_32). Right against float64."""
    nsteps = k // 64 if bits == 8 else (k // 64 + 1) // 2
    with cuda.rules_only():
        for m in (17, 32, 40, 64):
            x, q, s, wd = make(m, n, k, bits, group, seed=18)
            warps, splits, chunk, stages, box = ws_config(m, n, k, bits, group, 0)
            got = G.cuda_path(m, n, k, bits, group)
            wg = got.pop("wgmma")  # (17..32 rows, where it pays: test_17_to_32_rows_wgmma_same_bits_as_mma)
            assert got == {"ws": True, "tiles": 1, "xring": False, "fold": False}, (m, warps)
            a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
            check_bound(a, x, wd, f"auto 17..64 rows m {m} {(n, k, bits, group)}")
            if m > 32 and n == 1024:
                assert check_rows_past_32(a, x, q, s, bits, group, ws_config(32, n, k, bits, group, 0)[:2], f"m {m}") == 2
                continue
            assert wg or m <= 32, (m, n, k)
            assert G.cuda_launch(m, n, k, bits, group) == {"rows": m, "parts": 1}, (m, n, k)
            assert (chunk, stages, box) == (-(-nsteps // splits), 2, 2), (m, warps, splits, chunk, stages, box)
            assert same(a, run_raw(x, q, s, bits, group, word(warps, splits, 0, 0, 0))), f"m {m}: not the existing path's bits"


def check_rows_past_32(a, x, q, s, bits, group, first, what):
    """An automatic launch of 33..64 rows (output a): rows 0..31 as launched alone; the rest as launched
    alone (two launches) or, in one grid of two parts (dsx_wo_gemm_launch_cuda), at the first 32 rows'
    (warps, split): the existing path's bits there. Returns the parts."""
    m, n, k = x.shape[0], a.shape[1], x.shape[1]
    launch = G.cuda_launch(m, n, k, bits, group)
    top = G.gemm_weight_only_cuda(np.ascontiguousarray(x[:32]), q, s, bits, group, 90)
    if launch["parts"] == 2:
        assert launch["rows"] == m, (what, launch)
        rest = run_raw(np.ascontiguousarray(x[32:]), q, s, bits, group, word(*first, 0, 0, 0))
    else:
        assert launch == {"rows": 32, "parts": 1}, (what, launch)
        rest = G.gemm_weight_only_cuda(np.ascontiguousarray(x[32:]), q, s, bits, group, 90)
    assert same(a[:32], top), f"{what}: rows 0..31 not as launched alone ({launch})"
    assert same(a[32:], rest), f"{what}: the rest not as expected ({launch})"
    return launch["parts"]


@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (8, -1), (8, 128)])
def test_33_to_64_rows_two_parts_side_by_side(bits, group):
    """Automatic 33..64 rows where both 32-row launches' blocks fit the GPU at once (7168 x 256, DeepSeek-V3's down
    projections at tp 8: 56 tile groups of at most 2 splits; 1024 x 10240: 8 tile groups of 8 splits, where x for 64 rows
    would not fit whole either: 10-step slices): one launch, two grid parts (rows 32.. beside rows 0..31, with their configuration: the
    table's word or the rules'), not the one launch of eight token tiles; right against float64, the bits above
    (check_rows_past_32), the same with PDL (a launch option), with the tables on and off. 2304 x 10240 (18 tile groups
    of 8 splits, more than one wave at once, x for 64 rows too large): two launches."""
    for n, k, m in ((7168, 256, 33), (7168, 256, 64), (1024, 10240, 33), (1024, 10240, 57), (1024, 10240, 64)):
        x, q, s, wd = make(m, n, k, bits, group, seed=19)
        for rules in (False, True):
            with cuda.rules_only() if rules else contextlib.nullcontext():
                a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
                check_bound(a, x, wd, f"two parts m {m} {(n, k, bits, group)} rules {rules}")
                cfg = ws_config(32, n, k, bits, group, 0)
                what = f"m {m} {(n, k, bits, group)} rules {rules}"
                assert check_rows_past_32(a, x, q, s, bits, group, cfg[:2], what) == 2, what
                assert same(run_raw(x, q, s, bits, group, PDL), a), f"{what}: PDL differs"
    n, k = 2304, 10240
    x, q, s, wd = make(64, n, k, bits, group, seed=20)
    a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
    check_bound(a, x, wd, f"2304x10240 m 64 {(bits, group)}")
    assert check_rows_past_32(a, x, q, s, bits, group, ws_config(32, n, k, bits, group, 0)[:2], "2304x10240") == 1


def test_more_than_32_rows_ignore_the_bit():
    """Launches of more than 32 rows take the existing path (same bits with and without the bit);
    M = 80 is one launch of 64 rows (existing) and one of 16 (warp-specialized); 17 rows take the
    warp-specialized path (four token tiles), the same bits."""
    n, k = 384, 1088
    for m in (17, 33, 80):
        x, q, s, wd = make(m, n, k, 4, -1, seed=14)
        a = run_raw(x, q, s, 4, -1, word(8, 4, 0, 0, 0) | WS)
        check_bound(a, x, wd, f"m {m}")
        assert same(a, run_raw(x, q, s, 4, -1, word(8, 4, 0, 0, 0)))
        assert G.cuda_path(m, n, k, 4, -1, algo=word(8, 4, 0, 0, 0) | WS)["ws"] == (m <= 32), m


def test_given_chunk_must_hold_the_slice():
    """x is staged whole on this path: a chunk shorter than the slice is refused (DSX_EINVAL), but for x through
    the ring (a chunk equal to the ring's steps a slot, int4, two tiles a warp, 9..16 rows): not with one tile a
    warp, not with a chunk other than the slot's steps, not at 8 rows or fewer, not for int8."""
    m, n, k = 16, 256, 2048  # 16 int4 steps: 8 a slice at 2 splits
    run = G._cuda_fns()[0]
    for bits, group, m in ((4, -1, 16), (4, -1, 8), (4, 128, 9), (8, -1, 16), (4, 64, 12)):
        x, q, s, _ = make(m, n, k, bits, group, seed=15)
        dx, dq, ds = cuda.to_device(x.view(np.uint16)), cuda.to_device(q), cuda.to_device(s.view(np.uint16))
        out = cuda.empty((m, n), np.uint16)

        def rc(algo):
            return run(dx.ptr, dq.ptr, ds.ptr, out.ptr, m, n, k, bits, group, 90, algo, None)

        ring = bits == 4 and m > 8
        half = k // (64 if bits == 8 else 128) // 2  # (the slice at 2 splits: 16 int8 steps, 8 int4 ones)
        assert rc(word(8, 2, 4, 0, 0) | WS) == -1
        assert rc(word(8, 2, half, 0, 0) | WS) == 0
        assert rc(word(8, 2, 2, 2, 2) | WS) == -1  # (one tile a warp)
        assert rc(word(8, 2, 2, 2, 2) | WS | TILES[4]) == -1  # (four)
        assert rc(word(8, 2, 4, 2, 2) | WS | TILES[2]) == -1  # (chunk 4, slots of 2 steps)
        assert rc(word(8, 2, 2, 2, 2) | WS | TILES[2]) == (0 if ring else -1), (bits, group, m)
        assert G.cuda_path(m, n, k, bits, group, algo=word(8, 2, half, 2, 2) | WS | TILES[2])["xring"] is False
        cuda.synchronize()


def test_odd_warps_need_several_tiles_and_a_split():
    """Warps other than a power of two (twenty-eighth session) only on the warp-specialized path with several tiles
    a warp and a given split; the block's channels follow them (6 warps x 2 tiles: 192, so 36864 channels make 192
    tile groups); elsewhere refused."""
    n, k = 36864, 7168
    cfg = G.cuda_config(16, n, k, 4, -1, algo=word(6, 4, 2, 3, 2) | WS | TILES[2])
    assert (cfg["warps"], cfg["splits"], cfg["chunk"], cfg["stages"], cfg["box"]) == (6, 4, 2, 3, 2), cfg
    assert G.cuda_path(16, n, k, 4, -1, algo=word(7, 8, 0, 2, 2) | WS | TILES[2]) == {"ws": True, "tiles": 2, "xring": False, "fold": False, "wgmma": False}
    for algo in (word(6, 0, 2, 3, 2) | WS | TILES[2],  # (no split given)
                 word(6, 4, 0, 2, 2) | WS,  # (one tile a warp)
                 word(6, 4, 0, 0, 0),  # (the existing kernel)
                 word(9, 4, 0, 2, 2) | WS | TILES[2]):  # (more than 8)
        with pytest.raises(DsxError):
            G.cuda_config(16, n, k, 4, -1, algo=algo)
    with pytest.raises(DsxError):  # (17..32 rows: one tile a warp)
        G.cuda_config(24, n, k, 4, -1, algo=word(6, 4, 0, 2, 2) | WS | TILES[2])


@pytest.mark.parametrize("m", [9, 11, 13, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (4, 64)])
def test_x_through_the_ring_same_bits(bits, group, m):
    """x through the ring (XR: a second ring holds x's rows of each slot's steps, one tensor copy a step issued by the
    producer warp, zeros past K and M, 64-byte swizzle; a given
    chunk equal to the slot's steps): the same slices, so the same bits as the existing path at every split, and
    right against float64. K = 2112 (16.5 int4 steps: ragged slices, a half step of zeros past K, short last
    slots), N = 320 and 448 (the last block's group part empty), slots of 1, 2 and 3 steps, 2 to 4 of them; then
    N = 23104 (91 tile groups: blocks loop over groups) at 2, 4 and 8 splits (pulled; pushed; pushed with the
    reducer warp), with one group a block and with PDL."""
    k = 2112
    for n in (320, 448):
        x, q, s, wd = make(m, n, k, bits, group, seed=31)
        for splits in (1, 2, 3, 4, 8):
            ref = existing(x, q, s, wd, bits, group, splits, f"xring m {m} n {n}")
            per_split = -(-17 // splits)
            for warps, stages, box in ((8, 2, 2), (4, 3, 1), (8, 2, 3), (8, 4, 1), (6, 3, 2), (7, 2, 1)):
                if box >= per_split:
                    continue  # (the slice fits one slot: x whole)
                algo = word(warps, splits, box, stages, box) | WS | TILES[2]
                assert G.cuda_path(m, n, k, bits, group, algo=algo) == {"ws": True, "tiles": 2, "xring": True, "fold": False, "wgmma": False}, algo
                check_same_bits(x, q, s, wd, bits, group, ref, algo, f"xring m {m} n {n} splits {splits}")
    n, k = 23104, 1152  # (9 steps)
    x, q, s, wd = make(m, n, k, bits, group, seed=32)
    for splits in (2, 4):  # (8 splits fold here, int4 per channel: test_fold_x_ring)
        ref = run_raw(x, q, s, bits, group, word(8, splits, 0, 0, 0))
        per_split = -(-9 // splits)
        box = 1 if per_split <= 2 else 2
        for warps in (8, 6):  # (6: 12 tiles a block, 120.3 groups: the last one partial)
            algo = word(warps, splits, box, 2, box) | WS | TILES[2]
            assert G.cuda_path(m, n, k, bits, group, algo=algo) == {"ws": True, "tiles": 2, "xring": True, "fold": False, "wgmma": False}, algo
            check_same_bits(x, q, s, wd, bits, group, ref, algo, f"xring persistent m {m} splits {splits} warps {warps}",
                            also=(ONE_GROUP, PDL))


@pytest.mark.parametrize("group", [128, 64])
@pytest.mark.parametrize("m", [12, 16])
def test_group_scales_at_any_address(m, group):
    """int4 groups of 128 and 64 through the x ring: a slot's scale rows by one tensor copy (STMA, thirty-ninth session;
    group 64, two rows a step, forty-second: K = 2112 ends in a half step whose second row is past K) where the
    scales' address is 16-byte aligned and the slots hold 2 steps or more, at least 6 a tile group (ws_smap_pays: here
    1 split of 17 steps, slots of 2 or 3, 8 or 6 warps, the last slot short and the last block's channels past N);
    else a bulk copy a step from the 16-byte boundary below the address (scales 1, 4 or 7 bf16 past one; 4 splits: 3
    slots a group). The existing path's bits every way, and with x whole."""
    n, k = 448, 2112
    x, q, s, wd = make(m, n, k, 4, group, seed=36)
    refs = {sp: run_raw(x, q, s, 4, group, word(8, sp, 0, 0, 0)) for sp in (1, 4)}
    check_bound(refs[1], x, wd, f"existing m {m}")
    words = [(1, word(8, 1, 2, 2, 2)), (1, word(8, 1, 3, 2, 3)), (1, word(6, 1, 2, 3, 2)), (4, word(8, 4, 2, 2, 2))]
    words = [(sp, w | WS | TILES[2]) for sp, w in words] + [(4, word(8, 4, 0, 2, 2) | WS)]
    for sp, w in words:
        path = G.cuda_path(m, n, k, 4, group, algo=w)
        assert (path["ws"], path["xring"]) == (True, (w >> 8) & 255 != 0), (w, path)
    dx, dq = cuda.to_device(x.view(np.uint16)), cuda.to_device(q)
    flat = s.view(np.uint16).ravel()
    for off in (0, 1, 4, 7):  # (bf16 past the allocation's 256-byte-aligned start)
        buf = np.zeros(flat.size + 8, np.uint16)
        buf[off:off + flat.size] = flat
        ds = cuda.to_device(buf)
        for sp, algo in words:
            out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)
            rc = G._cuda_fns()[0](dx.ptr, dq.ptr, ds.ptr + 2 * off, out.ptr, m, n, k, 4, group, 90, algo, None)
            assert rc == 0, f"rc {rc} for algo {algo:#x} offset {off}"
            cuda.synchronize()
            got = out.numpy().view(BF16)
            assert same(got, refs[sp]), f"group {group} m {m} algo {algo:#x}, scales {2 * off} bytes past 16-byte alignment"


@pytest.mark.parametrize("m", [9, 11, 13, 16])
def test_fold_x_ring(m):
    """The fold (int4 per channel, x through the ring, where every block loops over two tile groups or more: 91 or 121
    tile groups of 8 or 6 warps at 8 splits, 181 at 4 with K = 1088, a half step): right against float64, and the same
    bits for every x-ring word at a split (the producer's sums of x in step order), with one tile group a block (the
    same decision: the rule counts the grid, not the loop) and with PDL. Group 128 at the same words: no fold, the
    existing path's bits (test_x_through_the_ring_same_bits)."""
    for n, k, splits in ((23104, 1152, 8), (46208, 1088, 4)):
        x, q, s, wd = make(m, n, k, 4, -1, seed=33)
        nsteps = (k // 64 + 1) // 2
        box = 1 if -(-nsteps // splits) <= 2 else 2
        first = None
        for warps, stages in ((8, 2), (6, 2), (8, 3)):
            algo = word(warps, splits, box, stages, box) | WS | TILES[2]
            assert G.cuda_path(m, n, k, 4, -1, algo=algo) == {"ws": True, "tiles": 2, "xring": True, "fold": True, "wgmma": False}, algo
            a = run_raw(x, q, s, 4, -1, algo)
            check_bound(a, x, wd, f"fold m {m} n {n} splits {splits} warps {warps} stages {stages}")
            first = a if first is None else first
            assert same(a, first), f"fold m {m} n {n} warps {warps} stages {stages}: bits differ between x-ring words"
            for flag in (ONE_GROUP, PDL):
                assert same(run_raw(x, q, s, 4, -1, algo | flag), first), f"fold m {m} n {n} {algo | flag:#x}"
        # (not the existing path's bits: the fold sums q + 136)
        assert not same(first, run_raw(x, q, s, 4, -1, word(8, splits, 0, 0, 0))), "the fold gave the existing path's bits"


@pytest.mark.parametrize("m", [9, 12, 16])
@pytest.mark.parametrize("n,k", [(4096, 7168), (1024, 18432)])
def test_automatic_rule_9_to_16_rows(m, n, k):
    """Int4 per channel, 9..16 rows, every field automatic: auto takes this path, x staged whole
    with 2 slots of 2 steps, at the existing choice's split (4096 x 7168), or at 8 splits where
    the existing choice would stage x in chunks (1024 x 18432: 144 steps, 18 a slice at 8 splits,
    74 KB of x at 16 rows; the existing path would take chunks of a few steps). Right against
    float64, and the same bits as the existing path and as bit 28 given explicitly at that split."""
    cfg = G.cuda_config(m, n, k, 4, -1)
    nsteps = (k // 64 + 1) // 2
    per = -(-nsteps // cfg["splits"])
    assert (cfg["stages"], cfg["box"], cfg["chunk"]) == (2, 2, per), cfg
    if k == 18432:
        assert (cfg["splits"], cfg["chunk"]) == (8, 18), cfg
    x, q, s, wd = make(m, n, k, 4, -1, seed=16)
    a = G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)
    check_bound(a, x, wd, f"auto {cfg} m {m}")
    assert same(a, run_raw(x, q, s, 4, -1, word(8, cfg["splits"], 0, 0, 0))), "bits differ from the existing path"
    assert same(a, run_raw(x, q, s, 4, -1, word(8, cfg["splits"], 0, 4, 1) | WS)), "bits differ from bit 28"


def test_not_with_the_balanced_grid():
    """Bits 27 and 28 are two kernels: together, DSX_EINVAL (config entry and launch)."""
    v = [ctypes.c_int() for _ in range(5)]
    assert G._cuda_fns()[1](4, 2048, 7168, 4, -1, WS | 1 << 27, *[ctypes.byref(i) for i in v]) != 0
    x, q, s, _ = make(4, 256, 1024, 4, -1, seed=17)
    with pytest.raises(DsxError, match="invalid"):
        G.gemm_weight_only_cuda(x, q, s, 4, -1, 90, algo=WS | 1 << 27)


def test_up_to_8_rows_where_auto_takes_the_balanced_grid():
    """36864 x 1024 int4 per channel at M = 4: 288 tile groups, more than the clusters resident,
    so choose() takes the balanced grid (bit 27; auto now takes two tiles a warp there); bit 28 with
    the automatic fields keeps choose()'s warps and split but runs its own kernel (x whole, the ring
    4 x 1): right, and the same bits as the plain kernel at that split."""
    m, n, k = 4, 36864, 1024
    warps, splits, chunk, stages, box = ws_config(m, n, k, 4, -1, WS)
    assert chunk == -(-8 // splits) and (stages, box) == (4, 1), (warps, splits, chunk, stages, box)
    x, q, s, wd = make(m, n, k, 4, -1, seed=18)
    a = run_raw(x, q, s, 4, -1, WS)
    check_bound(a, x, wd, "ws auto m 4 n 36864")
    assert same(a, run_raw(x, q, s, 4, -1, word(warps, splits, 0, 0, 0))), "bits differ from the plain kernel"


TILES = {2: 1 << 29, 4: 2 << 29}  # algo bits 29..30 (with bit 28): 16-channel tiles a consumer warp, 1..16 rows
TWO = TILES[2]
TWO_LAYOUTS = [(4, -1), (4, 128), (4, 64), (8, -1), (8, 128)]


@pytest.mark.parametrize("tiles", [2, 4])
@pytest.mark.parametrize("bits,group", TWO_LAYOUTS)
def test_two_tiles_a_warp_same_bits_every_split(bits, group, tiles):
    """Bits 29..30: each consumer warp owns 2 or 4 tiles of 16 channels (one x load feeds all). N = 320
    and 448: with 8 warps of 2 tiles a block covers 256 channels, so the last block has only 4 or 12
    of its 16 tiles inside N (of 4 tiles: 512 channels, 1 block); with 4 warps 128 or 256 (2.5 / 3.5
    blocks; 1.25 / 1.75). K = 2112: ragged slices ending in short ring slots. M 9..16 (13: not a
    multiple of 8) and M 5 (one token tile: the kernel instance with one x fragment of 8 rows). For
    each split: right against float64, reproducible, and the same bits as the existing path."""
    k, two = 2112, TILES[tiles]
    for n in (320, 448):
        for m in (9, 13, 16, 5):
            x, q, s, wd = make(m, n, k, bits, group, seed=21)
            for splits in range(1, 9):
                ref = existing(x, q, s, wd, bits, group, splits, f"m {m} n {n}")
                for warps, stages, box in ((8, 0, 0), (4, 2, 2), (8, 3, 2 if tiles == 2 else 1), (2, 1, 8), (1, 5, 3)):
                    algo = word(warps, splits, 0, stages, box) | WS | two
                    check_same_bits(x, q, s, wd, bits, group, ref, algo, f"{tiles} tiles m {m} n {n}")
                algo = word(4, splits, 0, 2, 2) | WS | two
                check_same_bits(x, q, s, wd, bits, group, ref, algo, f"{tiles} tiles m {m} n {n}",
                                also=(ONE_GROUP | ONE_STEP, 0))


@pytest.mark.parametrize("tiles", [2, 4])
@pytest.mark.parametrize("m", [3, 10, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 64), (8, 128)])
def test_two_tiles_persistent_blocks(bits, group, m, tiles):
    """N = 23104 (361 x 64): 91 groups of 256 channels (8 warps of two tiles; the last one a
    quarter full; of 4 tiles 46 of 512), more than stay resident with a deep ring (one block an SM),
    so blocks loop over groups. Right, and the same bits as the existing path, as one group a block,
    and with PDL."""
    n, k = 23104, 576
    x, q, s, wd = make(m, n, k, bits, group, seed=22)
    for splits in (1, 3, 5):
        ref = run_raw(x, q, s, bits, group, word(8, splits, 0, 0, 0))
        for warps, stages, box in ((8, 10 // tiles, 2), (4, 4, 1)):
            algo = word(warps, splits, 0, stages, box) | WS | TILES[tiles]
            check_same_bits(x, q, s, wd, bits, group, ref, algo, f"{tiles} tiles persistent m {m}", also=(ONE_GROUP, PDL))


@pytest.mark.parametrize("tiles", [1, 2, 4])
@pytest.mark.parametrize("m", [3, 11, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (4, 64), (8, -1)])
def test_pushed_sum_persistent_blocks(bits, group, m, tiles):
    """Where the split is 4 or 8 and divides the block's 16-channel tiles, the cluster's sum is
    pushed (ws_push): each block sends its pieces to the tile's owner (st.async on the owner's
    barrier) and the blocks hand the room back group after group (split 2: pulled, for contrast).
    N = 23104 (1444 tiles: the last group part empty, its idle warps still send), a deep ring (one
    block an SM) so that blocks loop over many groups: with two tiles a warp at 11 and 16 rows and with four, the
    kernel with the reducer warp (ws_red_warp: it sums every group but the last while the consumers go on). Right,
    and the same bits as the existing path (pulled sum), as one group a block (no reducer warp), and with PDL."""
    n, k = 23104, 1152
    x, q, s, wd = make(m, n, k, bits, group, seed=23)
    bit = TILES.get(tiles, 0)
    for splits in (2, 4, 8):
        ref = run_raw(x, q, s, bits, group, word(8, splits, 0, 0, 0))
        # (7 slots at most: the pushed sum's two barriers sit in the padding after the ring's)
        for warps, stages, box in ((8, {1: 7, 2: 4, 4: 2}[tiles], 2), (4, 3, 1)):
            algo = word(warps, splits, 0, stages, box) | WS | bit
            check_same_bits(x, q, s, wd, bits, group, ref, algo, f"pushed m {m}", also=(ONE_GROUP, PDL))


@pytest.mark.parametrize("tiles", [2, 4])
@pytest.mark.parametrize("bits,group", TWO_LAYOUTS)
def test_several_tiles_up_to_8_rows_same_bits(bits, group, tiles):
    """Bits 29..30 at 1..8 rows (one token tile a warp: x fragments of 8 rows, rows past M repeat the
    last one): N = 320 and 448 (the last block partly past N), K = 2112 (ragged slices, short ring
    slots), M 1, 4, 8; splits 1, 2, 3, 5, 8; several warps and rings. Right against float64, the
    same bits as the existing path at that split, and as bit 28 with one tile a warp; the path
    entry reports the tiles."""
    k, bit = 2112, TILES[tiles]
    for n in (320, 448):
        for m in (1, 4, 8):
            x, q, s, wd = make(m, n, k, bits, group, seed=31)
            for splits in (1, 2, 3, 5, 8):
                ref = existing(x, q, s, wd, bits, group, splits, f"m {m} n {n}")
                check_same_bits(x, q, s, wd, bits, group, ref, word(8, splits, 0, 2, 2) | WS, f"one tile m {m} n {n}")
                for warps, stages, box in ((8, 0, 0), (8, 2, 2), (4, 2, 1), (8, 4, 1), (2, 3, 4)):
                    algo = word(warps, splits, 0, stages, box) | WS | bit
                    want = {"ws": True, "tiles": tiles, "xring": False, "fold": False, "wgmma": False}
                    assert G.cuda_path(m, n, k, bits, group, algo=algo) == want, algo
                    check_same_bits(x, q, s, wd, bits, group, ref, algo, f"{tiles} tiles m {m} n {n}")
                algo = word(8, splits, 0, 2, 2) | WS | bit
                check_same_bits(x, q, s, wd, bits, group, ref, algo, f"{tiles} tiles m {m} n {n}", also=(ONE_GROUP | PDL,))


def test_two_tiles_refused_combinations():
    """Bits 29..30 without bit 28, or = 3: DSX_EINVAL from the config entry and the launch (before any launch);
    int4 group 64 takes them (since the forty-second session; before, refused). More than 16 rows: ignored (17
    rows: bit 28's four token tiles with one channel tile a warp; 80: the existing path for 64 of them), the same
    bits."""
    v = [ctypes.c_int() for _ in range(5)]
    cfg = G._cuda_fns()[1]
    assert cfg(16, 2048, 7168, 4, -1, TWO, *[ctypes.byref(i) for i in v]) != 0
    assert cfg(16, 2048, 7168, 4, -1, WS | TWO, *[ctypes.byref(i) for i in v]) == 0
    assert cfg(16, 2048, 7168, 4, -1, WS | 3 << 29, *[ctypes.byref(i) for i in v]) != 0
    for m in (4, 16):
        assert cfg(m, 2048, 7168, 4, 64, WS | TWO, *[ctypes.byref(i) for i in v]) == 0
        assert cfg(m, 2048, 7168, 4, 64, TWO, *[ctypes.byref(i) for i in v]) != 0
    run = G._cuda_fns()[0]
    for m, group, algo in ((12, -1, TWO), (12, 64, TWO), (3, 64, WS | 3 << 29), (16, -1, WS | 3 << 29)):
        x, q, s, _ = make(m, 256, 1024, 4, group, seed=23)
        dx, dq, ds = cuda.to_device(x.view(np.uint16)), cuda.to_device(q), cuda.to_device(s.view(np.uint16))
        out = cuda.empty((m, 256), np.uint16)
        assert run(dx.ptr, dq.ptr, ds.ptr, out.ptr, m, 256, 1024, 4, group, 90, algo, None) == -1, (m, group, algo)
    cuda.synchronize()
    x, q, s, _ = make(12, 256, 1024, 4, -1, seed=23)
    with pytest.raises(DsxError, match="algo"):
        G.gemm_weight_only_cuda(x, q, s, 4, -1, 90, algo=TWO)
    n, k = 384, 1088
    for m in (17, 80):
        x, q, s, wd = make(m, n, k, 4, -1, seed=24)
        a = run_raw(x, q, s, 4, -1, word(8, 4, 0, 0, 0) | WS | TWO)
        check_bound(a, x, wd, f"m {m}")
        assert same(a, run_raw(x, q, s, 4, -1, word(8, 4, 0, 0, 0)))


# (N, K, bits, group, M) -> (warp-specialized, tiles a warp) of the automatic choice on an H200
# (132 SMs; gemm_weight_only_ws_host.cuh, ws_auto_rule): int4 per channel four tiles a warp where that grid
# runs in one round with a block for at least 2/3 of the SMs and as many tiles resident as two; two
# tiles a warp where that grid has a block for every SM and keeps at least as many tiles resident an
# SM; else int8 with group scales and int4 group 128 at 2..16 rows two tiles a warp at 8 splits where one
# tile a warp at 8 splits leaves SMs without a block (2048 x 7168; sixteenth session); else at 9..16 rows
# int4 one tile a warp, int8 one tile a warp at 8 splits (fifteenth session; groups sixteenth); at <= 8 rows
# (int4 per channel only) one tile a warp where the plain grid would not be the balanced one. At 2..8 rows, where
# the two-tile grid takes more than one round of resident blocks: four tiles at twice its split
# (36864 x 7168: 8 splits; twelfth session).
AUTO_H200 = {
    (36864, 7168, 4, -1, 16): (True, 2), (36864, 7168, 4, -1, 12): (True, 2), (36864, 7168, 4, -1, 9): (True, 2),
    (7168, 18432, 4, -1, 16): (True, 4), (24576, 1536, 4, -1, 16): (True, 4), (7168, 18432, 4, -1, 9): (True, 4),
    (4096, 7168, 4, -1, 16): (True, 1), (4096, 7168, 4, -1, 9): (True, 1),  # (112 blocks of two tiles)
    (2048, 7168, 4, -1, 16): (True, 2), (7168, 2048, 4, -1, 12): (True, 1),
    # (group scales at 16 rows: two tiles since one scale row a step lets them keep two blocks an SM, 32 tiles
    # against one tile's 24; before, one block an SM. Twenty-seventh session, rules' 61.92 -> 54.53 us)
    (36864, 7168, 4, 128, 16): (True, 2),
    (36864, 7168, 4, 128, 9): (True, 2), (7168, 18432, 4, 128, 16): (True, 2),
    (36864, 7168, 8, -1, 16): (True, 2), (7168, 18432, 8, -1, 9): (True, 2),
    (4096, 7168, 8, -1, 16): (True, 1), (7168, 2048, 8, -1, 12): (True, 1), (2048, 7168, 8, -1, 9): (True, 1),
    # int8 groups of 128 and 64: int8 per channel's rules (sixteenth session)
    (7168, 2048, 8, 128, 16): (True, 1), (4096, 7168, 8, 128, 16): (True, 1), (24576, 1536, 8, 128, 16): (True, 2),
    (36864, 7168, 8, 128, 16): (True, 2), (36864, 7168, 8, 128, 12): (True, 2), (7168, 2048, 8, 128, 1): (True, 2),
    (2048, 7168, 8, 128, 1): (False, 1), (7168, 2048, 8, 64, 1): (True, 2), (7168, 2048, 8, -1, 4): (True, 2),
    (7168, 2048, 8, -1, 8): (True, 1), (7168, 2048, 4, 128, 4): (True, 2), (2048, 7168, 8, -1, 12): (True, 1),
    (36864, 7168, 8, 64, 16): (True, 2), (24576, 1536, 8, 64, 9): (True, 2), (7168, 18432, 8, 64, 16): (True, 2),
    # int4 group 64: group 128's rules (forty-second session; before, the existing path). At 16 rows on 36864 x 7168 one
    # tile a warp: two scale rows a step leave the two-tile block (2 x 2 slots, x for 14 steps) one an SM, 16 tiles
    # resident against one tile's 24 (the table's x-ring word takes that row: 78.9 -> 60.0 us)
    (36864, 7168, 4, 64, 16): (True, 1), (36864, 7168, 4, 64, 9): (True, 2), (7168, 18432, 4, 64, 16): (True, 2),
    (36864, 7168, 4, 64, 8): (True, 2), (7168, 18432, 4, 64, 1): (True, 2), (2048, 7168, 4, 64, 2): (True, 2),
    (2048, 7168, 4, 64, 12): (True, 2), (7168, 2048, 4, 64, 4): (True, 2),
    # 17..32 rows: four token tiles, one channel tile a warp, x whole, wherever it fits (twenty-second session;
    # before, the existing path); int4 group 64 too since the forty-second session
    (36864, 7168, 4, -1, 17): (True, 1), (7168, 18432, 4, -1, 32): (True, 1), (36864, 7168, 8, 128, 24): (True, 1),
    (36864, 7168, 4, 64, 32): (True, 1),
    # up to 8 rows (int4 per channel)
    (36864, 7168, 4, -1, 1): (True, 2), (36864, 7168, 4, -1, 2): (True, 4), (36864, 7168, 4, -1, 4): (True, 4),
    (36864, 7168, 4, -1, 8): (True, 4),
    (7168, 18432, 4, -1, 1): (True, 2), (7168, 18432, 4, -1, 6): (True, 2),  # (every SM a block: fourteenth session)
    (7168, 18432, 4, -1, 7): (True, 4), (7168, 18432, 4, -1, 8): (True, 4),
    (24576, 1536, 4, -1, 1): (True, 4), (24576, 1536, 4, -1, 8): (True, 4),
    (4096, 7168, 4, -1, 1): (True, 1), (4096, 7168, 4, -1, 8): (True, 1), (2048, 7168, 4, -1, 4): (True, 1),
    (7168, 2048, 4, -1, 1): (True, 1), (7168, 2048, 4, -1, 8): (True, 1),
    # int4 group 128 and int8 up to 8 rows: two tiles where that grid fills the SMs (fourteenth session)
    (36864, 7168, 4, 128, 8): (True, 2), (36864, 7168, 8, -1, 4): (True, 2), (7168, 18432, 4, 128, 1): (True, 2),
    (7168, 18432, 8, -1, 8): (True, 2), (4096, 7168, 4, 128, 8): (True, 2), (2048, 7168, 8, -1, 1): (False, 1),
    # else at 2..8 rows two tiles at 8 splits (sixteenth session)
    (2048, 7168, 8, -1, 4): (False, 1), (2048, 7168, 8, 128, 8): (True, 2), (2048, 7168, 4, 128, 2): (True, 2),
    (2048, 7168, 8, 64, 16): (True, 2), (2048, 7168, 4, 128, 12): (True, 2),
}


def skip_unless_h200():
    """The automatic rules count blocks against SMs: their expected choices are the H200's (132 SMs), with the H200's
    measured table, which this makes the process's (an H100 SXM, 132 SMs too, has its own: cuda.tuned_card)."""
    sms = ctypes.c_int()  # (cudaDevAttrMultiProcessorCount = 16, device 0)
    if cuda.cudart().cudaDeviceGetAttribute(ctypes.byref(sms), 16, 0) != 0 or sms.value != 132:
        pytest.skip("the expected choices are the H200's (132 SMs)")
    cuda.tuned_card("h200")


@pytest.mark.parametrize("case", sorted(AUTO_H200))
def test_automatic_two_tiles_rule_on_h200(case):
    """The automatic choice at 1..32 rows on DeepSeek-V3 shapes (config only: no data), as measured
    and documented; skipped on GPUs with another SM count (the rule counts blocks against SMs)."""
    skip_unless_h200()
    n, k, bits, group, m = case
    with cuda.rules_only():  # (the rules' choice: where the measured table lists the launch, it decides)
        got = G.cuda_path(m, n, k, bits, group)
        cfg = G.cuda_config(m, n, k, bits, group)
    assert (got["ws"], got["tiles"]) == AUTO_H200[case], f"{case}: {got} {cfg}"
    if got["ws"]:
        nsteps = k // 64 if bits == 8 else (k // 64 + 1) // 2
        # (one-step slots: four tiles; int4 per channel one tile with slices of <= 4 steps)
        short = (bits, group) == (4, -1) and got["tiles"] == 1 and -(-nsteps // cfg["splits"]) <= 4
        ring = (2, 1) if got["tiles"] == 4 or short else (2, 2)
        assert (cfg["stages"], cfg["box"], cfg["chunk"]) == (*ring, -(-nsteps // cfg["splits"])), cfg
        # (two tiles come with 8 warps, except int4 group 128 / int8 up to 8 rows: choose()'s warps,
        # 4 on 4096 x 7168, whose 224 blocks then give every SM one)
        assert cfg["warps"] == (8 if got["tiles"] > 1 and (m > 8 or (bits, group) == (4, -1)) else cfg["warps"]), cfg


def check_auto_choice(m, n, k, bits, group, tiles, fields, seed, also=()):
    """On an H200: auto takes the path with `tiles` tiles a warp and (warps, splits, stages, box) =
    `fields`; its output is right against float64, has the bits of the existing path at that split
    (and of each (word, message) of `also`), and is reproducible."""
    skip_unless_h200()
    with cuda.rules_only():  # (the rules' choice: where the measured table lists the launch, it decides)
        assert G.cuda_path(m, n, k, bits, group) == {"ws": True, "tiles": tiles, "xring": False, "fold": False, "wgmma": False}
        cfg = G.cuda_config(m, n, k, bits, group)
        assert (cfg["warps"], cfg["splits"], cfg["stages"], cfg["box"]) == tuple(fields), cfg
        x, q, s, wd = make(m, n, k, bits, group, seed=seed)
        a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
        check_bound(a, x, wd, f"auto {cfg} m {m}")
        assert same(a, run_raw(x, q, s, bits, group, word(8, fields[1], 0, 0, 0))), "bits differ from the existing path"
        for w, what in also:
            assert same(a, run_raw(x, q, s, bits, group, w)), what
        assert same(a, G.gemm_weight_only_cuda(x, q, s, bits, group, 90)), "not reproducible"


@pytest.mark.parametrize(
    "bits,group,m",
    [(b, g, m) for b, g in [(8, 128), (8, 64), (4, 128), (4, 64)] for m in (2, 5, 8, 9, 16)] + [(4, -1, 9), (4, -1, 16)],
)
def test_two_tiles_eight_splits_rule_on_h200(bits, group, m):
    """2048 x 7168, int8 with group scales and int4 group 128 (and 64: its rules since the forty-second session) at
    2..16 rows, int4 per channel at 9..16,
    where one tile a warp at 8 splits leaves SMs without a block: auto takes two tiles a warp, 8 warps,
    at 8 splits (sixteenth session; before, the kernel without bit 28 up to 8 rows, one tile a warp
    above). Right against float64, the same bits as the existing path and one tile a warp at 8 splits,
    and reproducible."""
    check_auto_choice(m, 2048, 7168, bits, group, 2, (8, 8, 2, 2), seed=31,
                      also=((word(8, 8, 0, 2, 2) | WS, "bits differ from one tile"),))


@pytest.mark.parametrize(
    "bits,group,m,want",
    [(8, g, m, (2, 4, 4, 2, 2)) for g in (128, 64) for m in (1, 4, 8)]
    + [(8, -1, m, (2, 4, 4, 2, 2)) for m in (1, 4)] + [(8, -1, m, (1, 8, 4, 2, 2)) for m in (5, 8)]
    + [(4, g, m, (2, 4, 4, 2, 2)) for g in (128, 64) for m in (1, 4, 8)] + [(4, -1, m, (1, 8, 4, 2, 1)) for m in (1, 4, 8, 9, 16)],
)
def test_short_slice_rules_on_h200(bits, group, m, want):
    """7168 x 2048 (32 int8 / 16 int4 steps), where the slices auto took kept at most 4 steps: int8 and
    int4 group 128 up to 8 rows at half the two-tile split (4), two tiles a warp and 4 warps with group
    scales and int8 per channel up to 4 rows, else one tile and 8 warps; int4 per channel one-step slots,
    up to 8 rows at twice the split (4) auto took before (sixteenth session). Right against float64, the
    same bits as the existing path at that split, and reproducible."""
    check_auto_choice(m, 7168, 2048, bits, group, want[0], want[1:], seed=37)


@pytest.mark.parametrize("m", [1, 8, 9, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (8, -1), (8, 128), (8, 64)])
def test_automatic_two_tiles_same_bits(bits, group, m):
    """24576 x 1536, where auto takes several tiles a warp on an H200 at 9..16 rows (int4 per channel
    four, 48 groups of 512 channels; the others two, 96 groups of 256 channels; 2 splits) and, int4 per
    channel, at 1..8 rows (four): right against float64, and the same bits as the existing path and as
    bit 28 with one tile a warp at that split; the path entry says which kernel ran."""
    with cuda.rules_only():  # (the rules' choice: where the measured table lists the launch, it decides)
        n, k = 24576, 1536
        path = G.cuda_path(m, n, k, bits, group)
        cfg = G.cuda_config(m, n, k, bits, group)
        x, q, s, wd = make(m, n, k, bits, group, seed=25)
        a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
        check_bound(a, x, wd, f"auto {cfg} {path} m {m}")
        assert same(a, run_raw(x, q, s, bits, group, word(8, cfg["splits"], 0, 0, 0))), f"{path}: bits differ from the existing path"
        assert same(a, run_raw(x, q, s, bits, group, word(8, cfg["splits"], 0, 2, 2) | WS)), f"{path}: bits differ from one tile"
        assert same(a, G.gemm_weight_only_cuda(x, q, s, bits, group, 90)), "not reproducible"
        want = {"ws": True, "tiles": 2, "xring": False, "fold": False, "wgmma": False}
        assert G.cuda_path(m, n, k, bits, group, algo=word(8, 4, 0, 2, 2) | WS | TWO) == want
        assert G.cuda_path(m, n, k, bits, group, algo=word(8, 4, 0, 0, 0)) == {"ws": False, "tiles": 1, "xring": False, "fold": False, "wgmma": False}


@pytest.mark.parametrize("m", [9, 12, 16])
@pytest.mark.parametrize("n,k,group", [(7168, 2048, -1), (2048, 7168, -1), (7168, 2048, 128), (7168, 2048, 64)])
def test_int8_one_tile_rule_on_h200(n, k, m, group):
    """int8 (per channel, groups of 128 and 64) at 9..16 rows where two tiles a warp do not fill an
    H200's SMs: auto takes the warp-specialized kernel with one tile a warp at 8 splits (fifteenth
    session, groups sixteenth; before, the kernel without bit 28). Right against float64, the same bits
    as the existing path at 8 splits, and reproducible."""
    check_auto_choice(m, n, k, 8, group, 1, (8, 8, 2, 2), seed=29)


@pytest.mark.parametrize("m", [2, 5, 8])
def test_four_tiles_at_twice_the_split_on_h200(m):
    """36864 x 7168 int4 per channel at 2..8 rows on an H200: auto takes four tiles a warp at 8 splits
    (twice the two-tile rule's 4; ws_auto_rule), 2 slots of 1 step, x whole; its output has the bits
    of the existing path at 8 splits and of two tiles a warp at 8 splits (the contract the other tests
    check against float64 at every split), and is reproducible. Random weight bytes (every byte a
    valid code), no float64 reference at this size."""
    skip_unless_h200()
    n, k = 36864, 7168
    assert G.cuda_path(m, n, k, 4, -1) == {"ws": True, "tiles": 4, "xring": False, "fold": False, "wgmma": False}
    cfg = G.cuda_config(m, n, k, 4, -1)
    assert (cfg["warps"], cfg["splits"], cfg["chunk"], cfg["stages"], cfg["box"]) == (8, 8, 7, 2, 1), cfg
    rng = np.random.default_rng([41, m])
    q = rng.integers(-128, 128, (n // 2, k), dtype=np.int8)
    s = rng.uniform(0.004, 0.012, n).astype(np.float32).astype(BF16)
    x = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
    a = G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)
    assert np.isfinite(a.astype(np.float32)).all()
    assert same(a, run_raw(x, q, s, 4, -1, word(8, 8, 0, 0, 0))), "bits differ from the existing path at 8 splits"
    assert same(a, run_raw(x, q, s, 4, -1, word(8, 8, 0, 2, 2) | WS | TWO)), "bits differ from two tiles a warp"
    assert same(a, G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)), "not reproducible"


def test_fold_on_36864x7168():
    """The fold where the table sends 36864 x 7168 (a DeepSeek-V3 dense gate_up at tp 1) at 12 rows: x through the ring,
    4 splits, 144 tile groups for 66 resident clusters; right against float64 and reproducible (H200: the rule counts
    the SMs)."""
    skip_unless_h200()
    m, n, k = 12, 36864, 7168
    assert G.cuda_path(m, n, k, 4, -1) == {"ws": True, "tiles": 2, "xring": True, "fold": True, "wgmma": False}
    x, q, s, wd = make(m, n, k, 4, -1, seed=34)
    a = G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)
    check_bound(a, x, wd, "fold 36864x7168 m 12")
    assert same(a, G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)), "not reproducible"


@pytest.mark.parametrize("m", [12, 16])
def test_group128_one_scale_copy_on_7168x18432(m):
    """Where the table sends int4 group 128 7168 x 18432 (a DeepSeek-V3 down projection at tp 1) at 12 and 16 rows: x
    through the ring, 8 splits of 18 steps, slots of 2 (9 a tile group), so each slot's scale rows come by one tensor
    copy (ws_smap_pays); right against float64, reproducible, and the bits of the existing path at 8 splits."""
    skip_unless_h200()
    n, k = 7168, 18432
    assert G.cuda_path(m, n, k, 4, 128) == {"ws": True, "tiles": 2, "xring": True, "fold": False, "wgmma": False}
    cfg = G.cuda_config(m, n, k, 4, 128)
    assert (cfg["splits"], cfg["box"]) == (8, 2), cfg
    x, q, s, wd = make(m, n, k, 4, 128, seed=37)
    a = G.gemm_weight_only_cuda(x, q, s, 4, 128, 90)
    check_bound(a, x, wd, f"group 128 7168x18432 m {m}")
    assert same(a, G.gemm_weight_only_cuda(x, q, s, 4, 128, 90)), "not reproducible"
    assert same(a, run_raw(x, q, s, 4, 128, word(8, 8, 0, 0, 0))), "bits differ from the existing path at 8 splits"
