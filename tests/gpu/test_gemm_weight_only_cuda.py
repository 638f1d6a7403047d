"""CUDA weight-only GEMM (csrc/cuda/gemm_weight_only.cu) against float64 numpy and the CPU kernel.

GPU machine only (skipped where no CUDA device is visible); run by
tests/gpu/run_all.sh. The output buffer is poisoned (0xFFFF = NaN) first, so an
unwritten element fails.

Bound: the tensor cores multiply exactly (q and x are exact in bf16) and accumulate in
fp32 with their own alignment / rounding, about 2 fp32 ulps of the running magnitude per
16-wide mma; partials are scaled and summed in fp32. We allow
E = (K/8 + 16) * 2^-22 * sum|x||w| (4x the CPU kernel's bound) plus the bf16 rounding,
|out - ref| <= 2^-8 (|ref| + E) + E, and require >= 90% of outputs to be exactly the
correctly rounded bf16 of the float64 result (the accumulation error is normally far
below half a bf16 ulp).
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import weight_only as wo
from ds_export.native import cuda
from ds_export.native import gemm_weight_only as G

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

BF16 = ml_dtypes.bfloat16

# (M, N, K, bits, group): M across the 8-token tiles and the 64-row launches; N of one tile
# and ragged against 16 * warps; K with an int4 half step (K % 128 == 64) and DeepSeek's 7168.
CASES = [
    (1, 64, 64, 8, -1), (1, 64, 64, 4, -1), (3, 192, 320, 8, 64), (3, 192, 320, 4, 64),
    (8, 576, 1088, 4, 128), (9, 576, 1088, 8, 128), (16, 2048, 7168, 4, -1), (16, 2048, 7168, 8, -1),
    (17, 320, 448, 4, 64), (31, 128, 192, 4, -1), (33, 256, 2048, 8, 64), (64, 1024, 512, 4, 128),
    (65, 128, 256, 8, -1), (130, 192, 576, 4, 64), (4, 7168, 2048, 4, -1), (2, 512, 7168, 4, 64),
]


def make(m, n, k, bits, group, seed=0):
    rng = np.random.default_rng([seed, m, n, k, bits, group + 1])
    w = (rng.standard_normal((n, k)) * rng.uniform(0.5, 2.0, (n, 1))).astype(np.float32)
    q, s = wo.quantize_native(w, bits, group, 90)
    x = rng.standard_normal((m, k)).astype(BF16)
    return x, q, s, wo.dequantize_native(q, s, bits, group, 90, k).astype(np.float64)


def check_bound(out, x, wd, what, exact_frac=0.9, pre=None):
    """pre: (ref, mag) = reference(x, wd), when many outputs are checked against the same inputs."""
    got = out.astype(np.float64)
    ref, mag = pre if pre is not None else reference(x, wd)
    assert np.isfinite(got).all(), f"{what}: unwritten (NaN-poisoned) or non-finite outputs"
    e = (x.shape[1] / 8 + 16) * 2.0**-22 * mag
    bad = np.abs(got - ref) > 2.0**-8 * (np.abs(ref) + e) + e
    assert not bad.any(), f"{what}: {bad.sum()}/{bad.size} outside the bound, first at {np.argwhere(bad)[0]}"
    exact = out.view(np.uint16) == ref.astype(np.float32).astype(BF16).view(np.uint16)
    assert exact.mean() >= exact_frac, f"{what}: only {exact.mean():.1%} correctly rounded"


def reference(x, wd):
    x64 = x.astype(np.float64)
    return x64 @ wd.T, np.abs(x64) @ np.abs(wd).T


PDL = 1 << 24      # algo bit: programmatic dependent launch
ONE_STEP = 1 << 25  # algo bit: one step at a time (no step pairing)
ONE_GROUP = 1 << 26  # algo bit: one tile group a block (no persistent blocks)
BAL = 1 << 27  # algo bit: balanced persistent grid (int4 per channel, M <= 8; its own order)


def word(warps, splits, chunk, stages, box):
    """A tuning word with any ring depth: algo_word refuses 1 slot (the C entry takes it at M <= 8:
    one slot a warp, refilled as soon as its steps are in registers)."""
    return warps | splits << 4 | chunk << 8 | stages << 16 | box << 20


def run_raw(x, q, s, bits, group, algo, stream=None):
    """The C entry with any algo word, past the Python wrapper's check_algo (for words only C refuses)."""
    dx, dq, ds = cuda.to_device(x.view(np.uint16)), cuda.to_device(q), cuda.to_device(s.view(np.uint16))
    out = cuda.empty((x.shape[0], s.shape[-1]), np.uint16).fill_bytes(0xFF)
    rc = G._cuda_fns()[0](dx.ptr, dq.ptr, ds.ptr, out.ptr, x.shape[0], s.shape[-1], x.shape[1], bits, group, 90,
                          algo, stream.handle if stream else None)
    assert rc == 0, f"rc {rc} for algo {algo:#x}"
    cuda.synchronize()
    return out.numpy().view(BF16)


@pytest.mark.parametrize("m,n,k,bits,group", CASES)
def test_matches_float64_and_cpu(m, n, k, bits, group):
    x, q, s, wd = make(m, n, k, bits, group)
    out = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
    check_bound(out, x, wd, f"cuda {(m, n, k, bits, group)}")
    cpu = G.gemm_weight_only(x, q, s, bits, group, 90)
    diff = np.abs(out.astype(np.float64) - cpu.astype(np.float64))
    scale = np.abs(cpu.astype(np.float64))
    assert (diff <= 2.0**-7 * scale + 1e-3 * scale.max()).all(), f"cuda vs cpu: max diff {diff.max()}"


@pytest.mark.parametrize("bits,group", [(8, -1), (8, 128), (4, -1), (4, 128), (4, 64)])
def test_every_config_is_right_and_deterministic(bits, group):
    m, n, k = 12, 384, 2112  # 33 int8 steps / 16.5 int4 steps: ragged for every split
    x, q, s, wd = make(m, n, k, bits, group, seed=1)
    for splits in (1, 2, 3, 4, 5, 6, 7, 8):
        first = None
        for warps in (1, 2, 4, 8) if splits in (1, 2, 4, 8) else (2, 8):  # (any cluster size 1..8)
            for chunk, stages, box in ((1, 2, 1), (3, 5, 2), (0, 0, 0), (8, 3, 4), (2, 2, 8), (5, 15, 1)):
                algo = G.algo_word(warps, splits, chunk, stages, box)
                a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90, algo=algo)
                b = G.gemm_weight_only_cuda(x, q, s, bits, group, 90, algo=algo)
                assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"algo {algo:#x} not deterministic"
                check_bound(a, x, wd, f"algo {algo:#x}")
                # the header's claim: only splits moves the bits (warps, chunk, slots, box do not)
                first = a if first is None else first
                assert np.array_equal(a.view(np.uint16), first.view(np.uint16)), f"algo {algo:#x} changed the bits"
                if warps in (4, 8):  # two steps at a time (the default) or one, persistent or not: the same bits
                    c = run_raw(x, q, s, bits, group, algo | ONE_STEP | ONE_GROUP)
                    assert np.array_equal(c.view(np.uint16), first.view(np.uint16)), f"algo {algo:#x} one step"


@pytest.mark.parametrize("bits,group", [(8, -1), (8, 64), (4, -1), (4, 128), (4, 64)])
def test_persistent_blocks_match_one_group_a_block(bits, group):
    """With 1 block of 1 warp an SM (15 slots of 8 steps: 120 KB) the 256 tile groups exceed
    what is resident, so blocks loop over tile groups, their rings running on from one group
    into the next: right, and the same bits as one group a block."""
    n, k = 4096, 1088
    for m in (3, 16):
        x, q, s, wd = make(m, n, k, bits, group, seed=4)
        for splits in (1, 2, 3, 4, 6):
            algo = G.algo_word(1, splits, 0, 15, 8)
            a = run_raw(x, q, s, bits, group, algo)
            check_bound(a, x, wd, f"persistent m {m} splits {splits}")
            b = run_raw(x, q, s, bits, group, algo | ONE_GROUP)
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"m {m} splits {splits}: bits differ"


@pytest.mark.parametrize("bits,group", [(8, -1), (8, 128), (4, -1), (4, 128), (4, 64)])
def test_ragged_n_and_short_slots(bits, group):
    """In the last tile group of N = 448 some warps are past N (they must write nothing);
    slices of 1..6 steps against slots of 1..8 steps end in a short slot (and K ends in a half
    step for int4). Right, and for each split count the same bits for every warps / slots /
    box, persistent or one group a block, two steps at a time or one."""
    n, k = 448, 704  # int4: 5.5 steps (a half step at the end), int8: 11
    for m in (1, 7, 16):
        x, q, s, wd = make(m, n, k, bits, group, seed=5)
        for splits in (1, 2, 3, 4, 5, 7):
            first = None
            one_slot = ((8, 1, 2), (8, 1, 4), (4, 1, 1), (2, 1, 8), (1, 1, 3)) if m <= 8 else ()
            for warps, stages, box in ((8, 2, 2), (8, 3, 4), (8, 2, 8), (4, 2, 1), (2, 5, 3), (1, 2, 2)) + one_slot:
                algo = word(warps, splits, 0, stages, box)
                a = run_raw(x, q, s, bits, group, algo)
                check_bound(a, x, wd, f"m {m} splits {splits} algo {algo:#x}")
                first = a if first is None else first
                assert np.array_equal(a.view(np.uint16), first.view(np.uint16)), f"algo {algo:#x} changed the bits"
                b = run_raw(x, q, s, bits, group, algo | ONE_GROUP | ONE_STEP)
                assert np.array_equal(b.view(np.uint16), first.view(np.uint16)), f"algo {algo:#x} one group"


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 64), (4, 128), (8, 128)])
def test_rings_run_on_across_many_tile_groups(bits, group, m):
    """8 warps a block, 3 slots of 8 steps a warp (2 with 16 rows and group scales: shared
    memory; still one block an SM): the 181 tile groups of N = 23104 (the last one half empty) exceed the resident
    blocks, so each block's rings run on from group to group; right, and the same bits as one
    group a block, for clusters of 1, 2, 3 and 5."""
    n, k = 23104, 576
    x, q, s, wd = make(m, n, k, bits, group, seed=6)
    for splits in (1, 2, 3, 5):
        algo = G.algo_word(8, splits, 0, 2 if (m > 8 and group != -1) else 3, 8)
        a = run_raw(x, q, s, bits, group, algo)
        check_bound(a, x, wd, f"ring across groups, m {m} splits {splits}")
        b = run_raw(x, q, s, bits, group, algo | ONE_GROUP)
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"splits {splits}: bits differ"
        if m <= 8:  # one slot a warp (early refill), running on across the groups: the same bits
            for d_box in (2, 8):
                c = run_raw(x, q, s, bits, group, word(8, splits, 0, 1, d_box))
                assert np.array_equal(a.view(np.uint16), c.view(np.uint16)), f"splits {splits}: one slot differs"


@pytest.mark.parametrize("m", [1, 5, 11, 16])
@pytest.mark.parametrize("bits,group", [(4, -1), (4, 128), (4, 64), (8, -1)])
def test_auto_config_many_groups_matches_fixed_split(bits, group, m):
    """The automatic choice on a shape with more tile groups than the GPU holds at once: right,
    and the same bits as the same split count given explicitly with one tile group a block."""
    n, k = 9216, 1536
    x, q, s, wd = make(m, n, k, bits, group, seed=8)
    cfg = G.cuda_config(m, n, k, bits, group)
    assert 1 <= cfg["splits"] <= 8
    a = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
    check_bound(a, x, wd, f"auto {cfg}")
    b = run_raw(x, q, s, bits, group, G.algo_word(cfg["warps"], cfg["splits"], 0, 2, 1) | ONE_GROUP)
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"auto {cfg}: bits differ from one group a block"


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("n,k,bits,group", [(2048, 7168, 4, -1), (4096, 7168, 4, -1), (7168, 2048, 4, 128),
                                            (1024, 18432, 4, 64), (1536, 1536, 8, -1)])
def test_decode_sizes_match_cpu(m, n, k, bits, group):
    """DeepSeek-like K at decode M, automatic config, against float64 and the CPU kernel; at
    M <= 8 also the same split with one ring slot of 2 and 4 steps (early refill): the same bits."""
    x, q, s, wd = make(m, n, k, bits, group, seed=2)
    out = G.gemm_weight_only_cuda(x, q, s, bits, group, 90)
    check_bound(out, x, wd, f"cuda {(m, n, k, bits, group)}")
    if m <= 8:
        cfg = G.cuda_config(m, n, k, bits, group)
        for box in (2, 4):
            one = run_raw(x, q, s, bits, group, word(cfg["warps"], cfg["splits"], 0, 1, box))
            assert np.array_equal(one.view(np.uint16), out.view(np.uint16)), f"one slot of {box}: bits differ"
    cpu = G.gemm_weight_only(x, q, s, bits, group, 90).astype(np.float64)
    diff = np.abs(out.astype(np.float64) - cpu)
    assert (diff <= 2.0**-7 * np.abs(cpu) + 1e-3 * np.abs(cpu).max()).all(), f"cuda vs cpu: max diff {diff.max()}"


def test_whole_x_rule_up_to_8_rows():
    """Int4 per channel up to 8 rows: where x would come in chunks at the chosen split but twice the
    splits hold it whole, auto takes twice the splits (7168 x 18432: 144 steps; from 6 rows on,
    4 splits would stage x in chunks). Up to 8 rows on that shape x is then always staged whole;
    at 8 rows: right against float64, and the same bits as 8 splits with x in chunks of 3 steps,
    2 slots of 2 steps one step at a time, one tile group a block (only splits moves the bits)."""
    n, k = 7168, 18432
    for m in range(1, 9):
        cfg = G.cuda_config(m, n, k, 4, -1)
        per = -(-144 // cfg["splits"])
        assert cfg["chunk"] >= per, f"m {m}: x in chunks {cfg}"
        if m >= 6:  # (4 splits would chunk x: 6 rows x 36 steps x 256 bytes > 48 KB)
            assert cfg["splits"] == 8 and cfg["chunk"] == 18, f"m {m}: {cfg}"
    x, q, s, wd = make(8, n, k, 4, -1, seed=12)
    pre = reference(x, wd)
    a = G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)
    check_bound(a, x, wd, "whole x rule, m 8", pre=pre)
    # (8 rows: the 56 tile groups may exceed the resident clusters of 8, and auto then takes the
    # balanced grid (bit 27) at the same fields: its bits, which differ from the plain kernel's
    # only in tiles cut between warps)
    bal = run_raw(x, q, s, 4, -1, word(8, 8, 0, 1, 4) | BAL)
    plain = run_raw(x, q, s, 4, -1, word(8, 8, 0, 1, 4))
    assert np.array_equal(a.view(np.uint16), bal.view(np.uint16)) or \
        np.array_equal(a.view(np.uint16), plain.view(np.uint16)), "auto: neither the plain nor the balanced bits"
    for w in (word(8, 8, 3, 1, 4), word(8, 8, 0, 2, 2) | ONE_STEP, word(8, 8, 0, 1, 4) | ONE_GROUP):
        b = run_raw(x, q, s, 4, -1, w)
        assert np.array_equal(plain.view(np.uint16), b.view(np.uint16)), f"plain vs {w:#x}: bits differ"


@pytest.mark.parametrize("m", [1, 4, 8])
def test_short_slice_rule_up_to_8_rows(m):
    """Int4 per channel up to 8 rows on 7168 x 2048 (16 steps): the kernel without bit 28 took 2 splits
    (the most splits whose slices hold >= 8 steps while the grid keeps a block for 3/4 of the SMs: 56
    blocks of 8 warps a slice); since the sixteenth session auto takes the warp-specialized kernel at
    twice that split (224 blocks) with one-step slots. Right against float64, the same bits as the
    existing path at 4 splits; the 2-split words agree with each other (other ring / x fields, one step
    at a time, one tile group a block). (The rule's choice, tables off: since the fortieth session the measured
    table takes 5..8 rows here to 2 slots of 2 steps at the same 4 splits, the same bits.)"""
    n, k = 7168, 2048
    with cuda.rules_only():
        cfg = G.cuda_config(m, n, k, 4, -1)
    assert (cfg["warps"], cfg["splits"], cfg["stages"], cfg["box"]) == (8, 4, 2, 1), cfg
    assert G.cuda_config(m, n, k, 4, -1)["splits"] == 4  # (with the table too: the bits compared below)
    x, q, s, wd = make(m, n, k, 4, -1, seed=13)
    a = G.gemm_weight_only_cuda(x, q, s, 4, -1, 90)
    check_bound(a, x, wd, f"short-slice rule, m {m}")
    assert np.array_equal(a.view(np.uint16), run_raw(x, q, s, 4, -1, word(8, 4, 0, 0, 0)).view(np.uint16))
    two = run_raw(x, q, s, 4, -1, word(8, 2, 0, 0, 0))
    check_bound(two, x, wd, f"2 splits, m {m}")
    for w in (word(8, 2, 3, 2, 2) | ONE_STEP, word(8, 2, 0, 1, 2) | ONE_GROUP, word(4, 2, 1, 3, 1)):
        b = run_raw(x, q, s, 4, -1, w)
        assert np.array_equal(two.view(np.uint16), b.view(np.uint16)), f"2 splits vs {w:#x}: bits differ"


@pytest.mark.parametrize("m,n,k", [(17, 16896, 2048), (32, 16896, 2048), (40, 16896, 2048), (64, 8576, 2048),
                                   (100, 16896, 2048), (32, 16896, 7232), (64, 8576, 7232), (64, 7168, 2048),
                                   (32, 1024, 2048)])
def test_wide_x_rule_above_16_rows(m, n, k):
    """The existing path, int4 per channel above 16 rows, splits automatic (8 warps given: not the
    automatic launch, which takes the warp-specialized kernel up to 32 rows a launch since the
    twenty-second session): where 8 splits make non-empty slices whose x fits whole in 128 KB and the
    blocks loop over >= 4 tile groups, 8 splits, x whole, 2 slots of 2 steps (not taken: x of 8 steps
    at 64 rows, 135 KB; 7168 and 1024 channels, too few groups). Right against float64, and the same
    bits as 8 splits with other x chunk / ring fields (only splits moves the bits), one tile group a
    block, one step at a time."""
    x, q, s, wd = make(m, n, k, 4, -1, seed=11)
    nsteps = (k // 64 + 1) // 2
    per8 = -(-nsteps // 8)
    rows = min(m, 64)
    taken = n >= 8576 and rows * (per8 * 128 + 32) * 2 <= 128 * 1024
    existing = word(8, 0, 0, 0, 0)
    cfg = G.cuda_config(rows, n, k, 4, -1, algo=existing)
    assert G.cuda_path(rows, n, k, 4, -1, algo=existing) == {"ws": False, "tiles": 1, "xring": False, "fold": False, "wgmma": False}
    rule = (8, per8, 2, 2)
    got = (cfg["splits"], cfg["chunk"], cfg["stages"], cfg["box"])
    assert (got == rule) == taken, cfg
    a = run_raw(x, q, s, 4, -1, existing)
    check_bound(a, x, wd, f"auto {cfg} M={m}")
    if taken:
        for w in (word(8, 8, 1, 3, 1), word(8, 8, 2, 4, 1) | ONE_GROUP, word(8, 8, 0, 2, 2) | ONE_STEP):
            b = run_raw(x, q, s, 4, -1, w)
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"auto {cfg} vs {w:#x}: bits differ"


@pytest.mark.parametrize("bits,group", [(4, 64), (4, 128), (8, 64), (4, -1)])
@pytest.mark.parametrize("shift", [1, 3, 7])
def test_scale_pointer_only_2_byte_aligned(bits, group, shift):
    """Scale rows are bulk-copied from the 16-byte boundary below them: any even address works."""
    m, n, k = 3, 320, 1088
    x, q, s, wd = make(m, n, k, bits, group, seed=3)
    sb = s.view(np.uint16)
    padded = np.full(sb.size + 16, 0x7FC0, np.uint16)  # NaN around: a misread shows
    padded[shift:shift + sb.size] = sb.reshape(-1)
    dpad, dx, dq = cuda.to_device(padded), cuda.to_device(x.view(np.uint16)), cuda.to_device(q)
    out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)
    run = G._cuda_fns()[0]
    rc = run(dx.ptr, dq.ptr, dpad.ptr + 2 * shift, out.ptr, m, n, k, bits, group, 90, 0, None)
    assert rc == 0
    cuda.synchronize()
    check_bound(out.numpy().view(BF16), x, wd, f"scale at +{2 * shift} bytes")


def test_planted_nibble_swap_is_caught():
    x, q, s, wd = make(5, 256, 1024, 4, -1)
    u = q.view(np.uint8)
    swapped = ((u >> 4) | (u << 4)).astype(np.uint8).view(np.int8)
    out = G.gemm_weight_only_cuda(x, swapped, s, 4, -1, 90)
    with pytest.raises(AssertionError):
        check_bound(out, x, wd, "nibble-swapped weights")


def test_device_api_stream_and_graph():
    m, n, k, bits, group = 4, 1024, 2048, 4, 128
    x, q, s, wd = make(m, n, k, bits, group)
    dx, dq, ds = cuda.to_device(x.view(np.uint16)), cuda.to_device(q), cuda.to_device(s.view(np.uint16))
    out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)
    stream = cuda.Stream()
    G.gemm_weight_only_cuda_device(dx, dq, ds, out, bits=bits, group_size=group, stream=stream)
    stream.synchronize()
    first = out.numpy()
    check_bound(first.view(BF16), x, wd, "device api")
    out.fill_bytes(0xFF)
    stream.synchronize()
    graph = cuda.Graph(lambda st: G.gemm_weight_only_cuda_device(dx, dq, ds, out, bits=bits, group_size=group,
                                                                 stream=st), stream)
    graph.launch()
    stream.synchronize()
    assert np.array_equal(out.numpy(), first), "graph replay differs from the direct launch"


@pytest.mark.parametrize("bits,group,m", [(4, -1, 1), (4, 128, 16), (8, -1, 5), (4, 64, 9)])
def test_programmatic_dependent_launch_chain(bits, group, m):
    """Layer 2 reads layer 1's output: with PDL (bit 24) each waits for the previous kernel
    before it reads x, so a chain in a stream and in a CUDA graph gives the plain launch's bits."""
    n1, k1, n2 = 1024, 2048, 512
    rng = np.random.default_rng([7, bits, group + 1, m])
    w1 = rng.standard_normal((n1, k1)).astype(np.float32)
    w2 = rng.standard_normal((n2, n1)).astype(np.float32)
    (q1, s1), (q2, s2) = wo.quantize_native(w1, bits, group, 90), wo.quantize_native(w2, bits, group, 90)
    xs = [rng.standard_normal((m, k1)).astype(BF16) for _ in range(3)]
    want = []
    for x in xs:
        h = G.gemm_weight_only_cuda(x, q1, s1, bits, group, 90)
        want.append(G.gemm_weight_only_cuda(h, q2, s2, bits, group, 90).view(np.uint16))
    dxs = [cuda.to_device(x.view(np.uint16)) for x in xs]
    dq1, ds1 = cuda.to_device(q1), cuda.to_device(s1.view(np.uint16))
    dq2, ds2 = cuda.to_device(q2), cuda.to_device(s2.view(np.uint16))
    hid = cuda.empty((m, n1), np.uint16)
    outs = [cuda.empty((m, n2), np.uint16) for _ in xs]
    run = G._cuda_fns()[0]

    def chain(st):  # x_i -> hid -> out_i, hid reused: a read before its writer ends shows
        for dx, out in zip(dxs, outs):
            for a, b, c, n, k in ((dx, dq1, ds1, n1, k1), (None, dq2, ds2, n2, n1)):
                src, dst = (a, hid) if a is not None else (hid, out)
                assert run(src.ptr, b.ptr, c.ptr, dst.ptr, m, n, k, bits, group, 90, PDL, st.handle) == 0

    stream = cuda.Stream()
    for how in ("stream", "graph"):
        for out in outs:
            out.fill_bytes(0xFF)
        hid.fill_bytes(0xFF)
        stream.synchronize()
        if how == "stream":
            chain(stream)
        else:
            graph = cuda.Graph(chain, stream)
            graph.launch()
        stream.synchronize()
        for i, out in enumerate(outs):
            assert np.array_equal(out.numpy(), want[i]), f"{how}: layer 2 of input {i} differs"


def test_config_and_bad_algo():
    cfg = G.cuda_config(1, 2048, 7168, 4, -1)
    assert cfg["warps"] in (1, 2, 4, 8) and 1 <= cfg["splits"] <= 8 and cfg["chunk"] >= 1
    assert 1 <= cfg["stages"] <= 15 and 1 <= cfg["box"] <= 8
    assert G.cuda_config(16, 2048, 7168, 4, -1, algo=G.algo_word(2, 4, 7, 9, 3)) == \
        {"warps": 2, "splits": 4, "chunk": 7, "stages": 9, "box": 3}
    x, q, s, _ = make(2, 64, 128, 8, -1)
    with pytest.raises(DsxError, match="algo"):
        G.gemm_weight_only_cuda(x, q, s, 8, -1, 90, algo=3)  # 3 warps
    with pytest.raises(DsxError, match="algo"):
        G.gemm_weight_only_cuda(x, q, s, 8, -1, 90, algo=1 << 27)  # the balanced grid: int4 per channel only
    one_slot = G.algo_word(stages=1)  # one ring slot a warp: M <= 8 only, the same bits
    assert np.array_equal(G.gemm_weight_only_cuda(x, q, s, 8, -1, 90, algo=one_slot).view(np.uint16),
                          G.gemm_weight_only_cuda(x, q, s, 8, -1, 90).view(np.uint16))
    x9, q9, s9, _ = make(9, 64, 128, 8, -1)
    with pytest.raises(DsxError, match="invalid"):
        G.gemm_weight_only_cuda(x9, q9, s9, 8, -1, 90, algo=one_slot)
    x4, q4, s4, _ = make(2, 64, 128, 4, -1)
    with pytest.raises(DsxError, match="invalid"):  # 15 slots of 8 warps and 255 x steps: too much shared memory
        G.gemm_weight_only_cuda(x4, q4, s4, 4, -1, 90, algo=G.algo_word(8, 1, 255, 15))
    v = [ctypes.c_int() for _ in range(5)]
    cfg_fn = G._cuda_fns()[1]
    assert cfg_fn(1, 64, 64, 8, -1, PDL | ONE_STEP | ONE_GROUP, *[ctypes.byref(i) for i in v]) == 0
    assert cfg_fn(1, 64, 64, 8, -1, 1 << 27, *[ctypes.byref(i) for i in v]) != 0  # balanced grid: not int8
    assert cfg_fn(1, 64, 1024, 8, -1, 9 << 4, *[ctypes.byref(i) for i in v]) != 0  # 9 splits
    assert cfg_fn(8, 64, 1024, 4, -1, word(8, 2, 0, 1, 2), *[ctypes.byref(i) for i in v]) == 0  # one slot: M <= 8
    assert v[3].value == 1 and v[4].value == 2
    assert cfg_fn(9, 64, 1024, 4, -1, word(8, 2, 0, 1, 2), *[ctypes.byref(i) for i in v]) != 0
    with pytest.raises(DsxError, match="arch"):
        G.gemm_weight_only_cuda(x, q, s, 8, -1, 70)


# The balanced grid (bit 27): clusters own runs of 16-channel tiles, each block's warps equal runs
# of (tile, K step) units; a tile cut by a run boundary is summed from two pieces (lower + upper).
# 18496 channels = 1156 tiles: more than 8 tiles a cluster for any resident count, and no multiple
# of the warps, so runs cut tiles; K = 1088 (int4: 8.5 steps, a half step at the end) and 576.
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("k", [1088, 576])
def test_balanced_grid_right_and_reproducible(m, k):
    n = 18496
    x, q, s, wd = make(m, n, k, 4, -1, seed=21)
    pre = reference(x, wd)
    for splits in (1, 3, 4, 7):
        for w in (word(8, splits, 0, 1, 4), word(8, splits, 0, 2, 2), word(4, splits, 0, 1, 2)):
            a = run_raw(x, q, s, 4, -1, w | BAL)
            check_bound(a, x, wd, f"balanced m {m} k {k} word {w:#x}", pre=pre)
            b = run_raw(x, q, s, 4, -1, w | BAL)  # run to run: the same bits
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"{w:#x}: not reproducible"
            c = run_raw(x, q, s, 4, -1, w | BAL | ONE_STEP | PDL)  # pairing and PDL do not move the bits
            assert np.array_equal(a.view(np.uint16), c.view(np.uint16)), f"{w:#x}: one step / PDL differ"
            # uncut tiles have the plain kernel's bits (same split); cut ones differ by a few fp32
            # ulps before the bf16 rounding, which almost never moves the bf16
            plain = run_raw(x, q, s, 4, -1, w)
            same = (a.view(np.uint16) == plain.view(np.uint16)).mean()
            assert same >= 0.99, f"{w:#x}: only {same:.2%} equal to the plain kernel"


def test_balanced_grid_ragged_small_and_refusals():
    """Forced on shapes with few tiles (fewer than warps a cluster, an empty slice at 8 splits of 4.5
    steps, N of 4 tiles): still right; refused where it does not apply."""
    for m, n, k in ((1, 64, 576), (5, 448, 576), (8, 3008, 7232), (2, 1024, 64)):
        x, q, s, wd = make(m, n, k, 4, -1, seed=22)
        for splits in (1, 2, 5, 8):
            for w in (word(8, splits, 0, 1, 4), word(2, splits, 0, 2, 1)):
                a = run_raw(x, q, s, 4, -1, w | BAL)
                check_bound(a, x, wd, f"balanced small m {m} n {n} k {k} {w:#x}")
    v = [ctypes.c_int() for _ in range(5)]
    cfg_fn = G._cuda_fns()[1]
    assert cfg_fn(8, 18496, 1088, 4, -1, BAL, *[ctypes.byref(i) for i in v]) == 0
    for m, bits, group, algo in ((9, 4, -1, BAL), (1, 8, -1, BAL), (1, 4, 128, BAL), (1, 4, 64, BAL),
                                 (1, 4, -1, BAL | ONE_GROUP), (8, 4, -1, BAL | word(8, 1, 2, 1, 4))):
        assert cfg_fn(m, 18496, 1088, bits, group, algo, *[ctypes.byref(i) for i in v]) != 0, (m, bits, group, algo)


@pytest.mark.parametrize("m", [1, 8])
def test_auto_takes_balanced_grid_where_groups_loop(m):
    """36864 x 7168 (288 tile groups of 8 warps: more than any GPU of <= 132 SMs holds clusters of 4
    at once): the balanced grid with the plain grid's automatic fields (bit 27; auto itself now takes
    several tiles a warp of the warp-specialized kernel there, the plain kernel's bits at its own
    split: 4 at M = 1, 8 at M = 2..8 since the twelfth session): the same bits with bits 24, 25, >= 99%
    the plain kernel's bits, and right against the CPU kernel."""
    n, k = 36864, 7168
    rng = np.random.default_rng([23, m])
    q = rng.integers(-128, 128, (n // 2, k), dtype=np.int8)
    s = rng.uniform(0.004, 0.012, n).astype(np.float32).astype(BF16)
    x = rng.standard_normal((m, k)).astype(BF16)
    cfg = G.cuda_config(m, n, k, 4, -1, BAL)
    a = run_raw(x, q, s, 4, -1, BAL)
    w = word(cfg["warps"], cfg["splits"], cfg["chunk"], cfg["stages"], cfg["box"])
    for extra in (BAL, BAL | PDL | ONE_STEP):
        b = run_raw(x, q, s, 4, -1, w | extra)
        assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), f"bit 27 vs {w | extra:#x}: bits differ"
    plain = run_raw(x, q, s, 4, -1, w & ~(0xFF << 8 | 0xFF << 16))
    auto = run_raw(x, q, s, 4, -1, 0)
    auto_splits = G.cuda_config(m, n, k, 4, -1)["splits"]
    plain_auto = plain if auto_splits == cfg["splits"] else run_raw(x, q, s, 4, -1, word(8, auto_splits, 0, 0, 0))
    assert np.array_equal(auto.view(np.uint16), plain_auto.view(np.uint16)), "auto: bits differ from the plain kernel"
    assert np.array_equal(auto.view(np.uint16), run_raw(x, q, s, 4, -1, PDL).view(np.uint16)), "auto vs PDL"
    same = (a.view(np.uint16) == plain.view(np.uint16)).mean()
    assert same >= 0.99, f"only {same:.2%} equal to the plain kernel"
    cpu = G.gemm_weight_only(x, q, s, 4, -1, 90).astype(np.float64)
    diff = np.abs(a.astype(np.float64) - cpu)
    assert np.isfinite(a.astype(np.float64)).all()
    assert (diff <= 2.0**-7 * np.abs(cpu) + 1e-3 * np.abs(cpu).max()).all(), f"cuda vs cpu: max diff {diff.max()}"
