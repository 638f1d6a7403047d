"""The CUDA weight-only GEMM without a GPU: it compiles for sm_90a, and its data mapping is right.

1. csrc/cuda/gemm_weight_only.cu compiles with the local nvcc for sm_90a (skipped
   without nvcc): all 25 kernel instances (20 + the five M <= 8 one-slot ones) and the two of
   the balanced grid (algo bit 27: int4 per channel, M <= 8, one slot or more), no register spills; and,
   in its SASS (cuobjdump / nvdisasm from PyPI), no register moves in the step loops to pair mma operands
   (a planted split pair shows the check can fail).
2. A numpy model of what each lane of the kernel does (which 16 bytes it loads, which bits
   make which bf16 value, which x element in shared memory it pairs them with, which scale
   and partial sum they go to, the int4 group-64 word exchange between lanes) reproduces
   x @ dequantize_ref(W)^T in float64. The model restates the kernel's index expressions
   (gemm_weight_only.cu / .cuh) one for one, so a layout slip there has a twin here; the
   planted faults show the check can fail.
3. The header is plain C, and the Python device-array entry point refuses bad inputs
   before it touches the GPU.
4. Every entry of the measured table (gemm_weight_only_tuned.inc) is what the automatic choice resolves
   to on a 132-SM GPU, host code only (a harness compiled with the unit; a planted word is caught), and
   none of them with DSX_TUNED_TABLES=0 (the rules alone).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import weight_only as wo
from ds_export.native import cuda
from ds_export.native import gemm_weight_only as G
from ds_export.native.build import CSRC
from ptx_entries import ptx_entries

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import wo_sass_counts  # noqa: E402
import tune_auto  # noqa: E402

BF16 = ml_dtypes.bfloat16
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
# the tests that run nvcc (CI has it; a machine without it skips them)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
UNIT = CSRC / "cuda" / "gemm_weight_only.cu"


# ---------------------------------------------------------------- 1. compile


@pytest.fixture(scope="module")
def wo_object(tmp_path_factory):
    """The unit compiled once for the tests below: (its object file, ptxas -v's report)."""
    obj = tmp_path_factory.mktemp("wo") / "wo.o"
    cmd = [NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-O3",
           "-DNDEBUG", "-Xcompiler", "-fPIC", "-Xptxas", "-v", f"-I{CSRC / 'include'}", "-c", str(UNIT), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    log = res.stdout + res.stderr
    assert res.returncode == 0, f"nvcc failed:\n{log[-4000:]}"
    return obj, log


@pytest.fixture(scope="module")
def entries(wo_object):
    """ptxas -v's report of every kernel entry of the unit."""
    return wo_object[1].split("Compiling entry function")[1:]


@needs_nvcc
def test_compiles_for_sm90a_without_spills(entries):
    blocks = [b for b in entries if "wo_gemm_kernel" in b.split("\n")[0]]
    names = {re.search(r"wo_gemm_kernelILi(\d)ELi(\d)ELi(\d)", b).groups() for b in blocks}
    want = {(b, mt, gm) for b, gms in (("8", "01"), ("4", "012")) for gm in gms for mt in "1248"}
    assert names == want, f"kernel instances: got {sorted(names)}"
    early = {re.search(r"wo_gemm_kernelILi(\d)ELi(\d)ELi(\d)ELb1", b).groups() for b in blocks if "ELb1" in b.split("\n")[0]}
    assert early == {w for w in want if w[1] == "1"}, f"one-slot instances: got {sorted(early)}"
    bal = [b for b in entries if "wo_gemm_bal_kernel" in b.split("\n")[0]]
    bal_names = {re.search(r"wo_gemm_bal_kernelILi(\d)ELi(\d)ELi(\d)ELb(\d)", b).groups() for b in bal}
    assert bal_names == {("4", "1", "0", "0"), ("4", "1", "0", "1")}, f"balanced-grid instances: got {sorted(bal_names)}"
    for b in blocks + bal:
        assert "0 bytes spill stores" in b and "0 bytes spill loads" in b, f"spills in {b[:200]}"
        regs = int(re.search(r"Used (\d+) registers", b).group(1))
        assert regs <= 255


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_header_is_plain_c(tmp_path):
    src = tmp_path / "t.c"
    src.write_text(  # also pins the CPU signature the Python binding declares
        '#include "dsx.h"\n'
        "typedef int (*cpu_fn)(const uint16_t*, const int8_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t,"
        " int, int, int, int);\n"
        "int main(void) { cpu_fn f = dsx_wo_gemm_bf16_nt_cpu; return f == 0; }\n"
    )
    res = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", f"-I{CSRC / 'include'}", str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------- 2. lane model


def _half(u32: np.ndarray, hi: bool) -> np.ndarray:
    bits = ((u32 >> 16) if hi else (u32 & 0xFFFF)).astype(np.uint16)
    return bits.view(BF16).astype(np.float64)


def _bf16x2_add(a: np.ndarray, c: int):
    """fma.rn.bf16x2(a, 1, c) of the kernel, for exact small integers: (low, high) values."""
    c = np.uint32(c)
    return _half(a, False) + _half(c, False), _half(a, True) + _half(c, True)


def i8_pair(w: np.ndarray, pair: int, fault=None):
    if fault == "pair":
        pair ^= 1
    t = (w >> np.uint32(8)) if pair else w
    val = (t & np.uint32(0x007F007F)) | np.uint32(0x43004300)
    neg = (t & np.uint32(0x00800080)) ^ np.uint32(0xC380C380)
    return _half(val, False) + _half(neg, False), _half(val, True) + _half(neg, True)


def i4_pair(w: np.ndarray, j: int, fault=None):
    if fault == "pair":
        j ^= 1
    val = ((w >> np.uint32(4 * j)) & np.uint32(0x000F000F)) | np.uint32(0x43004300)
    return _bf16x2_add(val, 0xC308C308)


def model_gemm(x, qweight, scale, bits, group, fault=None):
    """float64 [M, N]: the kernel's per-lane loads, unpacking, x pairing and scaling, summed exactly."""
    m, k = x.shape
    n = scale.shape[-1]
    kt = k // 64
    step_k = 64 if bits == 8 else 128
    nsteps = kt if bits == 8 else (kt + 1) // 2
    gmode = 0 if group == -1 else (2 if bits == 4 and group == 64 else 1)
    xs = np.zeros((m, nsteps * step_k))
    xs[:, :k] = x.astype(np.float64)  # stage_x: zeros past K
    qb = np.ascontiguousarray(qweight).view(np.uint8).reshape(-1)
    s32 = scale.astype(np.float64)
    ngroups = 1 if group == -1 else -(-k // group)
    chans = np.arange(n)
    k2 = 2 * k
    out = np.zeros((m, n))

    def lane_words(c, step):  # ring load of rows n (both mma rows are just channels here)
        if bits == 8:
            off = (chans >> 1) * k2 + (chans & 1) * 64 + 16 * c + step * 128
        else:
            off = (chans >> 2) * k2 + (chans & 3) * 32 + (c >> 1) * 128 + (c & 1) * 16 + step * 256
        if bits == 4 and 2 * step + (c >> 1) >= kt:
            return np.zeros((n, 4), np.uint32)
        return qb[off[:, None] + np.arange(16)].copy().view("<u4").reshape(n, 4)

    def scale_of(grp):
        return s32[grp] if 0 <= grp < ngroups else np.zeros(n)

    for step in range(nsteps):
        xstep = xs[:, step * step_k:(step + 1) * step_k]
        words = [lane_words(c, step) for c in range(4)]
        parts = [np.zeros((m, n)), np.zeros((m, n))]  # per 64-group of the step (gmode 2) or one
        for c in range(4):
            pairs = []  # (value array [n], x offset of its element) per used half of a bf16x2
            if bits == 8:
                for s in range(4):
                    lo, hi = i8_pair(words[c][:, s], 0, fault), i8_pair(words[c][:, s], 1, fault)
                    base = 16 * c
                    pairs += [(0, lo[0], base + 2 * s), (0, lo[1], base + 2 * s + 1),
                              (0, hi[0], base + 2 * (s + 4)), (0, hi[1], base + 2 * (s + 4) + 1)]
            elif gmode != 2 or fault == "noswap":
                for s in range(8):
                    w, h = s >> 1, s & 1
                    lo, hi = i4_pair(words[c][:, w], 2 * h, fault), i4_pair(words[c][:, w], 2 * h + 1, fault)
                    base, sg = 32 * c, (s >= 4 if gmode == 2 else 0)
                    pairs += [(sg, lo[0], base + 2 * (w + 8 * h)), (sg, lo[1], base + 2 * (w + 8 * h) + 1),
                              (sg, hi[0], base + 2 * (w + 8 * h + 4)), (sg, hi[1], base + 2 * (w + 8 * h + 4) + 1)]
            else:
                hi_lane = c >> 1
                own, partner = words[c], words[c ^ 2]
                # got0/got1 = what the partner sends: (hi ? v.x : v.z), (hi ? v.y : v.w) of the partner
                got = (partner[:, 2], partner[:, 3]) if hi_lane else (partner[:, 0], partner[:, 1])
                slots = [got[0], got[1], own[:, 2], own[:, 3]] if hi_lane else [own[:, 0], own[:, 1], got[0], got[1]]
                # (step_g64_tiles_with: k-step J of group sg takes nibble pair J of slots 2 sg (the lower logical
                # half) and 2 sg + 1 (the upper), and x piece J of the group, real k r .. r + 3, as its B pair)
                for sg in range(2):
                    for j in range(4):
                        r = 64 * sg + 32 * (c & 1) + 4 * hi_lane + 8 * j
                        lo, hi = i4_pair(slots[2 * sg], j, fault), i4_pair(slots[2 * sg + 1], j, fault)
                        if fault == "halves":  # (the two slots' logical halves swapped)
                            lo, hi = hi, lo
                        pairs += [(sg, lo[0], r), (sg, lo[1], r + 1), (sg, hi[0], r + 2), (sg, hi[1], r + 3)]
            for sg, val, off in pairs:
                parts[sg] += xstep[:, off:off + 1] * val[None, :]
        if gmode == 0:
            out += parts[0]
        elif gmode == 1:
            out += parts[0] * scale_of(step * step_k // group)[None, :]
        else:
            out += parts[0] * scale_of(2 * step)[None, :] + parts[1] * scale_of(2 * step + 1)[None, :]
    if gmode == 0:
        out *= s32[None, :]
    return out


CASES = [  # (m, n, k, bits, group): K % 128 == 64 gives int4 a half step
    (3, 64, 320, 8, -1), (2, 128, 192, 8, 64), (5, 64, 384, 8, 128),
    (3, 64, 320, 4, -1), (2, 128, 256, 4, 128), (4, 64, 192, 4, 128), (3, 64, 320, 4, 64), (2, 128, 256, 4, 64),
]


def make_case(m, n, k, bits, group, seed=0):
    rng = np.random.default_rng(seed + m * 7 + n + k + bits + group)
    w = rng.standard_normal((n, k)).astype(BF16)
    q, s = wo.quantize_ref(w, bits, group, 90)
    x = rng.standard_normal((m, k)).astype(BF16)
    wd = wo.dequantize_ref(q, s, bits, group, 90, k).astype(np.float64)
    return x, q, s, x.astype(np.float64) @ wd.T, np.abs(x.astype(np.float64)) @ np.abs(wd).T


@pytest.mark.parametrize("m,n,k,bits,group", CASES)
def test_lane_model_reads_paddle_layout(m, n, k, bits, group):
    x, q, s, ref, mag = make_case(m, n, k, bits, group)
    got = model_gemm(x, q, s, bits, group)
    assert np.all(np.abs(got - ref) <= 1e-12 * mag + 1e-300), np.abs(got - ref).max()


@pytest.mark.parametrize("fault,case", [("pair", CASES[0]), ("pair", CASES[3]), ("noswap", CASES[6]), ("pair", CASES[6]),
                                        ("halves", CASES[7])])
def test_lane_model_catches_planted_faults(fault, case):
    m, n, k, bits, group = case
    x, q, s, ref, mag = make_case(m, n, k, bits, group)
    got = model_gemm(x, q, s, bits, group, fault=fault)
    assert np.abs(got - ref).max() > 1e-2 * np.abs(ref).max()


def test_bf16_magic_constants():
    """The bit constants of gemm_weight_only.cuh are the numbers the comments claim."""
    dec = lambda b: float(np.array([b], np.uint16).view(BF16)[0])  # noqa: E731
    assert (dec(0x4300), dec(0x4380), dec(0xC380), dec(0xC308), dec(0x3F80)) == (128, 256, -256, -136, 1)
    u = np.arange(256, dtype=np.uint32)
    lo, _ = i8_pair(u | (u << 16), 0)
    assert np.array_equal(lo, u.astype(np.float64) - 128)
    v = np.arange(16, dtype=np.uint32)
    for j in range(4):  # every nibble pair of a word, each nibble value in each half, the other nibbles set
        w = (v << np.uint32(4 * j)) | (v[::-1] << np.uint32(16 + 4 * j)) | np.uint32(0x5A5A5A5A & ~(0xF000F << 4 * j))
        lo4, hi4 = i4_pair(w, j)
        assert np.array_equal(lo4, v - 8.0) and np.array_equal(hi4, v[::-1] - 8.0), j


# ---------------------------------------------------------------- 3. binding checks


def _fake_device_array(shape, dtype):
    """A DeviceArray shell (no allocation) for argument checks that never reach the GPU."""
    a = object.__new__(cuda.DeviceArray)
    a.shape, a.dtype, a.ptr = tuple(shape), np.dtype(dtype), None
    return a


@pytest.mark.parametrize("case,match", [
    ("numpy_x", "x: expected a ds_export.native.cuda.DeviceArray"),
    ("q_int8_shape_for_int4", "qweight: expected an int8 DeviceArray"),
    ("scale_float32", "scale: expected a DeviceArray"),
    ("out_wrong_n", "out: expected a DeviceArray"),
    ("arch70", "arch"),
    ("k_not_64", "multiples of 64"),
    ("bad_algo", "algo"),
])
def test_device_entry_checks_before_launch(case, match):
    m, n, k = 4, 128, 256
    args = dict(x=_fake_device_array((m, k), np.uint16), qweight=_fake_device_array((n // 2, k), np.int8),
                scale=_fake_device_array((n,), np.uint16), out=_fake_device_array((m, n), np.uint16))
    kw = dict(bits=4, group_size=-1, arch=90)
    if case == "numpy_x":
        args["x"] = np.zeros((m, k), np.uint16)
    elif case == "q_int8_shape_for_int4":
        args["qweight"] = _fake_device_array((n, k), np.int8)
    elif case == "scale_float32":
        args["scale"] = _fake_device_array((n,), np.float32)
    elif case == "out_wrong_n":
        args["out"] = _fake_device_array((m, n + 64), np.uint16)
    elif case == "arch70":
        kw["arch"] = 70
    elif case == "k_not_64":
        args["x"] = _fake_device_array((m, 200), np.uint16)
    elif case == "bad_algo":
        kw["algo"] = 1 << 30  # no such bit
    with pytest.raises(DsxError, match=match):
        G.gemm_weight_only_cuda_device(*args.values(), **kw)
    with pytest.raises(DsxError, match="warps must be"):
        G.algo_word(3, 1)
    with pytest.raises(DsxError, match="splits 0..8"):
        G.algo_word(8, 9)
    assert G.algo_word(8, 3) == 8 | 3 << 4  # any split count 1..8 (cluster size)
    # (3, 5, 6, 7 warps: the warp-specialized kernel with several tiles a warp and a given split only)
    assert G.algo_word(6, 4, 2, 3, 2, warp_specialized=True, tiles=2) == 6 | 4 << 4 | 2 << 8 | 3 << 16 | 2 << 20 | 3 << 28
    G.check_algo(6 | 4 << 4 | 3 << 28)
    for bad in (dict(warps=6, splits=4), dict(warps=6, splits=4, warp_specialized=True),
                dict(warps=6, warp_specialized=True, tiles=2), dict(warps=9, splits=4, warp_specialized=True, tiles=2)):
        with pytest.raises(DsxError):
            G.algo_word(**bad)
    for bad in (6 | 4 << 4, 6 | 4 << 4 | 1 << 28, 6 | 3 << 28):
        with pytest.raises(DsxError):
            G.check_algo(bad)
    assert G.algo_word(stages=1) == 1 << 16  # one ring slot (the kernel takes it at M <= 8 only)
    G.check_algo(1 << 16)
    assert G.algo_word(8, 2, pdl=True) == 8 | 2 << 4 | 1 << 24
    G.check_algo(1 << 24 | 1 << 25 | 1 << 26)  # PDL and the two measurement bits are well-formed
    assert G.algo_word(8, 4, balanced=True) == 8 | 4 << 4 | 1 << 27  # the balanced grid
    G.check_algo(1 << 27)
    assert G.algo_word(8, 4, 0, 2, 2, warp_specialized=True) == 8 | 4 << 4 | 2 << 16 | 2 << 20 | 1 << 28
    G.check_algo(1 << 28 | 1 << 24)  # the warp-specialized path (with PDL)
    with pytest.raises(DsxError, match="algo"):
        G.check_algo(1 << 29)  # tiles a warp: only on the warp-specialized path (bit 28)
    assert G.algo_word(4, 8, 0, 2, 2, warp_specialized=True, tiles=2) == 4 | 8 << 4 | 2 << 16 | 2 << 20 | 3 << 28
    assert G.algo_word(8, warp_specialized=True, tiles=4) == 8 | 1 << 28 | 2 << 29
    G.check_algo(3 << 28)
    G.check_algo(5 << 28)
    with pytest.raises(DsxError, match="algo"):
        G.check_algo(7 << 28)  # (bits 29..30 = 3: no such tile count)
    with pytest.raises(DsxError, match="warps must be"):
        G.algo_word(8, tiles=3)
    with pytest.raises(DsxError, match="algo"):
        G.check_algo(1 << 30)  # no such bit
    with pytest.raises(DsxError, match="algo"):
        G.check_algo(9 << 4)  # 9 splits


@needs_nvcc
def test_warp_specialized_instances_compile_without_spills(entries):
    """Algo bit 28's kernel (gemm_weight_only_ws.cuh, up to 32 rows: mt 1, 2 and 4 (17..32 rows, one tile a warp, 2
    blocks an SM: 112 registers) of every layout, and 2 or 4 tiles a warp (bits 29..30) at mt 1 and 2 for every layout
    (int4 group 64 too since the forty-second session)) at its register cap (3 blocks of 9 warps an SM; 2 for int4
    group 64 at 16 rows, for 2 tiles a warp and for 4 at mt 1, 1 for 4 at mt 2): 0 spills. At mt 1 two tiles a warp
    stay within 72 registers and four within 112 (3 and 2 blocks an SM: what ws_blocks_per_sm, the automatic rule's
    count, assumes). Each exists pulled and pushed (the PUSH template argument: the cluster sum sent to the tiles'
    owners). One known exception: the pushed int4-per-channel instance with two token tiles and one tile a warp spills
    at its 72-register cap (16 bytes in the fourteenth session, 3 reloads a step; measured on the H200 it still beat
    the pulled one, 2048x7168 M = 9..16; 4 bytes since its owner applies the scales, fifteenth session): at most 4
    bytes. Two at four token tiles (17..32 rows; twenty-second session): int4 group 128 pushed, 4 / 8 bytes (measured
    with them: 1.3-2.5x the existing path at 17..32 rows). Nowhere else (int4 group 64's spilled 52 / 92 bytes pulled
    and 56 / 76 pushed until its k-steps took each B pair from one x piece, the forty-fourth session: about 50
    register moves a step gone). The four-token-tile instances exist once more with PARTS (two grid parts side by
    side, twenty-third session), under the same limits. The pushed instances with two tiles a warp and two token
    tiles, or four tiles a warp, exist once more with the reducer warp (RED, twenty-fifth session: 10 warps a block):
    no spills, and the blocks an SM of the instance without it (2: 96 registers; 1 at four tiles and two token tiles).
    The int4 instances (per channel, group 128) with two tiles a warp and two token tiles exist once more with x
    through the ring (XR, twenty-seventh session; pulled, pushed, pushed with the reducer warp): no spills, the same
    register limits (and for int4 group 64 since the forty-second session).
    Eight token tiles (33..64 rows in one launch, wgmma consumers only, every layout (int4 group 64 since the
    forty-third session); thirty-third session): launch bounds of one block an SM (at two, ptxas capped them at 96
    registers and the int4 ones spilled 84-104 bytes), no spills within 112 registers. The int4 x-ring instances exist
    once more folded (FOLD, per channel) and with group 128's scale rows by one tensor copy a slot (STMA, thirty-ninth
    session; group 64's too since the forty-third): no spills, the same register limits."""
    blocks = [b for b in entries if "wo_gemm_ws_kernel" in b.split("\n")[0]]
    names = {re.search(r"wo_gemm_ws_kernelILi(\d)ELi(\d)ELi(\d)ELi(\d)", b).groups() for b in blocks}
    want = {(b, mt, gm, "1") for b, gms in (("8", "01"), ("4", "012")) for gm in gms for mt in "124"}
    want |= {(b, "8", gm, "1") for b, gms in (("8", "01"), ("4", "012")) for gm in gms}  # (eight token tiles: wgmma only)
    want |= {(b, mt, gm, ct) for b, gm in (("8", "0"), ("8", "1"), ("4", "0"), ("4", "1"), ("4", "2")) for ct in "24" for mt in "12"}
    assert names == want, f"warp-specialized instances: got {sorted(names)}"
    pushed = {re.search(r"wo_gemm_ws_kernelILi\dELi\dELi\dELi\dELb([01])E", b).group(1) for b in blocks}
    assert pushed == {"0", "1"}, "pulled and pushed instances"
    # (PARTS: two grid parts of 32 rows side by side, four token tiles only)
    flags = re.compile(r"wo_gemm_ws_kernelILi(\d)ELi(\d)ELi(\d)ELi(\d)ELb([01])ELb([01])ELb([01])E")
    assert all(flags.search(b) for b in blocks), "every instance names PUSH, PARTS and RED"
    parts = {flags.search(b).groups()[:4] for b in blocks if flags.search(b).group(6) == "1"}
    assert parts == {w for w in want if w[1] == "4"}, f"two-part instances: got {sorted(parts)}"
    # (RED: the reducer warp, pushed only)
    red = {flags.search(b).groups()[:5] for b in blocks if flags.search(b).group(7) == "1"}
    assert red == {w + ("1",) for w in want if (w[3], w[1]) in (("2", "2"), ("4", "1"), ("4", "2"))}, f"reducer: {sorted(red)}"
    # (XR: x through the ring, int4 per channel and group 128 with two tiles a warp and two token tiles)
    xr_flags = re.compile(r"wo_gemm_ws_kernelILi(\d)ELi(\d)ELi(\d)ELi(\d)ELb([01])ELb[01]ELb([01])ELb([01])E")
    assert all(xr_flags.search(b) for b in blocks), "every instance names XR"
    xr = {xr_flags.search(b).groups()[:6] for b in blocks if xr_flags.search(b).group(7) == "1"}
    assert xr == {("4", "2", gm, "2", push, red) for gm in "012" for push, red in (("0", "0"), ("1", "0"), ("1", "1"))}, (
        f"x through the ring: {sorted(xr)}")
    # (FOLD: int4 per channel through the ring, pulled and pushed, the pushed one with and without the reducer warp (its
    # launch without that warp); STMA: int4 group 128 and 64 through the ring, its scale rows by one tensor copy a slot, the
    # same three)
    more = re.compile(r"wo_gemm_ws_kernelILi(\d)ELi(\d)ELi(\d)ELi(\d)ELb([01])ELb[01]ELb([01])ELb[01]ELb([01])ELb[01]ELb([01])E")
    assert all(more.search(b) for b in blocks), "every instance names FOLD and STMA"
    three = {(push, red) for push, red in (("0", "0"), ("1", "0"), ("1", "1"))}
    fold = {more.search(b).groups()[:6] for b in blocks if more.search(b).group(7) == "1"}
    assert fold == {("4", "2", "0", "2") + pr for pr in three}, f"fold instances: {sorted(fold)}"
    stma = {more.search(b).groups()[:6] for b in blocks if more.search(b).group(8) == "1"}
    assert stma == {("4", "2", gm, "2") + pr for gm in "12" for pr in three}, f"one scale copy a slot: {sorted(stma)}"
    allowed = {"4201b1": (4, 4), "4411b1": (4, 8)}  # (stores, loads)
    for b in blocks:
        inst = "".join(re.search(r"wo_gemm_ws_kernelILi(\d)ELi(\d)ELi(\d)ELi(\d)EL(b[01])E", b).groups())
        if inst in allowed:
            spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", b)
            assert int(spill.group(1)) <= allowed[inst][0] and int(spill.group(2)) <= allowed[inst][1], f"spills in {b[:200]}"
        else:
            assert "0 bytes spill stores" in b and "0 bytes spill loads" in b, f"spills in {b[:200]}"
        regs = int(re.search(r"Used (\d+) registers", b).group(1))
        bits, mt, gm, ct = re.search(r"wo_gemm_ws_kernelILi(\d)ELi(\d)ELi(\d)ELi(\d)", b).groups()
        if flags.search(b).group(7) == "1":
            limit = 200 if (ct, mt) == ("4", "2") else 96  # (10 warps: 2 blocks an SM, or 1)
        elif mt == "1" and ct != "1":
            limit = 112 if ct == "4" else 72
        elif mt == "8":
            limit = 112  # (one block an SM by its launch bounds; two fit by registers where x leaves room)
        else:
            limit = 224 if ct == "4" else 112 if ct == "2" or mt == "4" else 96 if (bits, mt, gm) == ("4", "2", "2") else 72
        assert regs <= limit, f"{regs} registers (more than {limit}) in {b[:120]}"


# cuobjdump and nvdisasm (the test extras install them from PyPI; bench/wo_sass_counts.py finds them)
needs_sass_tools = pytest.mark.skipif(
    NVCC is None or wo_sass_counts.find_tool("cuobjdump") is None or wo_sass_counts.find_tool("nvdisasm") is None,
    reason="nvcc, cuobjdump or nvdisasm not installed")
# At most one register move per this many mma (HMMA, or HGMMA in the wgmma consumers) inside a kernel's step loops (the
# kernels have at most 2 per 12 there since the forty-fourth session; int4 group 64's loops had 49-58 per 32 before it)
MMA_PER_MOVE = 4


@needs_sass_tools
def test_step_loops_take_mma_operands_as_loaded(wo_object):
    """Every kernel instance's step loops, in the SASS: the mma operand pairs come from registers as the unpacking and
    the shared-memory loads left them, without register moves. A step whose B pair joins words of two x loads pays about
    one move an mma (int4 group 64 until the forty-fourth session: about 50 a step, 5-9% of its time at 9..16 rows on the
    H200); the loops' moves (`loop_moves`: between mma at most LOOP_GAP apart, so the producer's and the epilogue's code
    between the loops is not counted) stay below one per MMA_PER_MOVE mma (HMMA, or HGMMA in the wgmma consumers)."""
    funcs = wo_sass_counts.sass_functions(wo_object[0])
    counted = {name: wo_sass_counts.loop_counts(ops) for name, ops in funcs.items() if "wo_gemm" in name}
    counted = {name: c for name, c in counted.items() if c is not None}
    assert len(counted) >= 150, f"{len(counted)} weight-only kernel instances with mma in the SASS, expected all of them"
    heavy = {re.sub(r"^.*?(wo_gemm)", r"\1", name)[:80]: (c["loop_moves"], c["mma"]) for name, c in counted.items()
             if c["loop_moves"] * MMA_PER_MOVE > c["mma"]}
    assert not heavy, f"register moves in step loops (moves, mma): {heavy}"


PLANTED = r"""
#include <cstdint>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// SPLIT 0: each mma's B pair is one 8-byte shared load as loaded; SPLIT 1: word 0 of one load, word 1 of the next
template <int SPLIT>
__global__ void planted(const uint4* w, float* out) {
  __shared__ uint2 xs[8 * 32];
  const int l = threadIdx.x;
  for (int i = l; i < 8 * 32; i += 32) xs[i] = make_uint2(i, 3 * i);
  __syncthreads();
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const uint4 a4 = w[l];
  const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
  uint2 v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = xs[32 * j + l];
#pragma unroll
  for (int j = 0; j < 8; ++j) mma(d, a, v[j].x, SPLIT ? v[(j + 1) & 7].y : v[j].y);
  out[l] = d[0] + d[1] + d[2] + d[3];
}
template __global__ void planted<0>(const uint4*, float*);
template __global__ void planted<1>(const uint4*, float*);
"""


@needs_sass_tools
def test_step_loop_move_check_catches_a_split_operand_pair(tmp_path):
    """The check above can fail: the same eight mma with each B pair from two loads pay moves the check counts."""
    (tmp_path / "planted.cu").write_text(PLANTED)
    cmd = [NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-c", str(tmp_path / "planted.cu"),
           "-o", str(tmp_path / "planted.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc failed:\n{(res.stdout + res.stderr)[-4000:]}"
    got = {("split" if "ILi1E" in name else "whole"): wo_sass_counts.loop_counts(ops)
           for name, ops in wo_sass_counts.sass_functions(tmp_path / "planted.o").items() if "planted" in name}
    assert got["whole"]["mma"] == got["split"]["mma"] == 8
    assert got["whole"]["loop_moves"] == 0
    assert got["split"]["loop_moves"] * MMA_PER_MOVE > got["split"]["mma"], got["split"]


@needs_nvcc
def test_fold_instances_unpack_without_the_subtraction(tmp_path):
    """The fold's point (FOLD instances: int4 per channel through the x ring): the unpack leaves each weight at 128 + u,
    so their PTX has no bf16x2 fma (the - 136 of i4_pairj) at all, while the x-ring instances without the fold (per
    channel and group 128) have one for every weight pair (so the check can fail)."""
    ptx = tmp_path / "wo.ptx"
    cmd = [NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
           f"-I{CSRC / 'include'}", "-ptx", str(UNIT), "-o", str(ptx)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc failed:\n{(res.stdout + res.stderr)[-4000:]}"
    name = re.compile(r"wo_gemm_ws_kernelILi4ELi2ELi([01])ELi2ELb([01])ELb0ELb([01])ELb1ELb([01])ELb0E")
    seen = {}
    for m, entry in ptx_entries(ptx.read_text(), name):
        seen[m.groups()] = entry.count("fma.rn.bf16x2")
    assert {("0", "1", "1", "1"), ("0", "0", "0", "1"), ("1", "1", "1", "0"), ("0", "1", "1", "0")} <= set(seen), sorted(seen)
    for (gm, push, red, fold), fmas in seen.items():
        if fold == "1":
            assert fmas == 0, f"fold instance (group mode {gm}, push {push}, reducer {red}): {fmas} bf16x2 fma"
        else:
            assert fmas >= 64, f"x-ring instance without the fold (group mode {gm}): {fmas} bf16x2 fma, want one a pair"


# ------------------------------------------------- 4. the measured table, host side

HARNESS = r"""
#include "UNIT"
#include <cstdio>
// the first launch as plan_launch makes it (the automatic choice's path: the table up to 64 rows, the rules' cut)
struct Plan {
  int rc, rows;
  bool ws;
  Config c;
};
static Plan plan(int rows, const WsTuned& t, int algo) {
  Plan p{};
  p.rc = plan_launch(rows, t.n, t.k, t.bits, t.group, algo, kWsTunedSms, &p.rows, &p.c, &p.ws);
  return p;
}
// (every Config field and the rows the launch takes)
static bool same(const Plan& a, const Plan& b) {
  return a.rc == 0 && b.rc == 0 && a.rows == b.rows && a.ws == b.ws && a.c.warps == b.c.warps &&
         a.c.splits == b.c.splits && a.c.chunk == b.c.chunk && a.c.stages == b.c.stages && a.c.box == b.c.box &&
         a.c.mt == b.c.mt && a.c.smem == b.c.smem && a.c.blocks_n == b.c.blocks_n && a.c.pdl == b.c.pdl &&
         a.c.pair == b.c.pair && a.c.persist == b.c.persist && a.c.bal == b.c.bal && a.c.grid_y == b.c.grid_y &&
         a.c.ct == b.c.ct && a.c.parts == b.c.parts && a.c.xring == b.c.xring && a.c.fold == b.c.fold &&
         a.c.wg == b.c.wg;
}
static bool same(int rows, const WsTuned& t, int word) { return same(plan(rows, t, 0), plan(rows, t, word)); }
// (ends checked, ends whose automatic choice is not the entry's word; printed: whether it is the rules' then)
static int count(int* n, bool print) {
  int bad = 0;
  *n = 0;
  for (const WsTuned& t : TABLE) {
    if (!t.bits) break;
    for (int rows : {t.rows_lo, t.rows_hi}) {
      ++*n;
      if (!same(rows, t, t.word)) {
        ++bad;
        if (print) {
          const Plan a = plan(rows, t, 0);
          const int was = dsx_tuned_tables_cuda(0);
          const Plan r = plan(rows, t, 0);
          dsx_tuned_tables_cuda(was);
          std::printf("differs: %d/%d %ldx%ld rows %d word %#x: %s\n", t.bits, t.group, (long)t.n, (long)t.k, rows,
                      t.word, same(a, r) ? "the rules" : "not the rules");
        }
      }
    }
  }
  return bad;
}
int main() {
  int n = 0;
  const int bad = count(&n, true);
  // planted: the first entry against its word with another split must differ
  const WsTuned& t = TABLE[0];
  const int other = (t.word & ~0xF0) | (((t.word >> 4) & 15) == 1 ? 2 : 1) << 4;
  std::printf("planted %s\n", same(t.rows_lo, t, other) ? "missed" : "caught");
  std::printf("%d checked, %d differ\n", n, bad);
  // the runtime switch (dsx_tuned_tables_cuda): off, the rules alone; on again, the table
  const int was = dsx_tuned_tables_cuda(0);
  const int off = count(&n, false);
  const int then = dsx_tuned_tables_cuda(1);
  const int on = count(&n, false);
  std::printf("switch: was %d, off %d differ, then %d, on %d differ, bad argument %d\n", was, off, then, on,
              dsx_tuned_tables_cuda(2));
  return 0;
}
"""

TS = 1 << 28 | 1 << 29  # (bits 28..29: the warp-specialized kernel, wgmma consumers above 16 rows)
# Entries at 33..64 rows planted into a copy of the table (the shipped one has none measured yet; where it gets some,
# a planted key it already lists at those rows is left out): one launch of all the rows through wgmma, words the rules
# do not choose (3 slots of 1 step, 4 warps), and one whose x for 64 rows of a 2304-element K slice
# (295 KB) cannot fit, which must leave the launch to the rules.
WIDE_FIT = [(4, -1, 36864, 7168, 33, 40, TS | 3 << 16 | 1 << 20 | 8 << 4 | 8),
            (4, 128, 18432, 7168, 41, 64, TS | 2 << 16 | 2 << 20 | 8 << 4 | 4),
            (8, -1, 7168, 2048, 33, 48, TS | 2 << 16 | 1 << 20 | 4 << 4 | 4)]
WIDE_UNFIT = [(4, 64, 7168, 18432, 49, 64, TS | 2 << 16 | 2 << 20 | 8 << 4 | 8),
              (4, 64, 7168, 16384, 49, 64, TS | 2 << 16 | 2 << 20 | 8 << 4 | 8)]  # (used where the table has none)


# each card's table: (its file, its array in the unit)
CARD_TABLES = {"h200": ("gemm_weight_only_tuned.inc", "kWsTuned"), "h100": ("gemm_weight_only_tuned_h100.inc",
                                                                           "kWsTunedH100")}


@needs_nvcc
@pytest.mark.parametrize("card", sorted(CARD_TABLES))
def test_tuned_table_is_the_automatic_choice_host_side(tmp_path, card):
    """Every entry of each card's table (gemm_weight_only_tuned.inc: the H200's, ..._h100.inc), at both ends of its
    row range, is what the automatic choice resolves to for a 132-SM GPU of that card (plan_launch, host code only:
    a word that did not fit would fall back to the rules silently; DSX_TUNED_CARD names the card, the harness has no
    device to judge); tests/gpu checks the same on a GPU, with data. Run on a copy of the sources whose table also
    has entries at 33..64 rows planted (WIDE_FIT: the automatic choice takes them, one launch of all the rows;
    WIDE_UNFIT: the rules)."""
    cuda_dir = tmp_path / "cuda"
    shutil.copytree(UNIT.parent, cuda_dir)
    table = cuda_dir / CARD_TABLES[card][0]
    shipped = [line for line in table.read_text().splitlines() if line.startswith("{")]
    wide = {tuple(int(v) for v in line[1:].split(",")[:4]) for line in shipped
            if int(line.split(",")[5]) > 32}
    fit = [e for e in WIDE_FIT if e[:4] not in wide]
    unfit = [e for e in WIDE_UNFIT if e[:4] not in wide]
    assert len(fit) >= 2 and unfit
    # (in the table's order: the unit bisects it and static_asserts the order)
    lines = table.read_text().splitlines(keepends=True)
    head = [line for line in lines if not line.startswith("{")]
    planted = ["{" + ", ".join(map(str, e[:6])) + f", {e[6]:#x}}},  // planted\n" for e in fit + unfit]
    table.write_text("".join(head) + "".join(sorted(
        [line for line in lines if line.startswith("{")] + planted,
        key=lambda line: tuple(int(v) for v in line[1:].split(",")[:6]))))
    src = tmp_path / "harness.cu"
    src.write_text(HARNESS.replace("UNIT", str(cuda_dir / UNIT.name)).replace("TABLE", CARD_TABLES[card][1]))
    exe = tmp_path / "harness"
    # (PTX only: the device code is the unit's, compiled to SASS by the fixture above; this needs its host code)
    cmd = [NVCC, "-std=c++17", "-O1", "-gencode=arch=compute_90a,code=compute_90a", f"-I{CSRC / 'include'}",
           f"-I{cuda_dir}", str(src), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc failed:\n{(res.stdout + res.stderr)[-4000:]}"
    # (the H200's: as a device-less harness judges a 132-SM GPU; the H100's: named)
    env = {**os.environ, "DSX_TUNED_CARD": card} if card != "h200" else os.environ
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    entries = len(shipped) + len(fit) + len(unfit)
    unfit_ends = {f"differs: {b}/{g} {n}x{k} rows {r} word {w:#x}: the rules" for b, g, n, k, lo, hi, w in unfit
                  for r in (lo, hi)}
    assert set(re.findall(r"^differs: .*$", run.stdout, re.M)) == unfit_ends, run.stdout[-3000:]
    assert f"{2 * entries} checked, {len(unfit_ends)} differ" in run.stdout, run.stdout[-3000:]
    assert "planted caught" in run.stdout and run.returncode == 0
    # DSX_TUNED_TABLES=0 (bench/tune_auto.py's measuring runs): the rules alone. Each entry was confirmed faster
    # than the rules' choice at its ends on the H200, so there every end resolves to another configuration
    # (tests/gpu checks all of them); host-side, where the rules' occupancy queries get no answer, a few come
    # out as the word (9 of 384 ends on 2026-12-01: 7168x14336 int4, 12288x1536 int8)
    off = subprocess.run([str(exe)], capture_output=True, text=True, env={**env, "DSX_TUNED_TABLES": "0"})
    differ = int(re.search(r"(\d+) checked, (\d+) differ", off.stdout).group(2))
    assert differ >= 0.95 * 2 * entries, off.stdout[-3000:]
    planted_off = {f"differs: {b}/{g} {n}x{k} rows {r} word {w:#x}: the rules" for b, g, n, k, lo, hi, w in fit
                   for r in (lo, hi)}
    assert planted_off <= set(re.findall(r"^differs: .*$", off.stdout, re.M)), off.stdout[-3000:]
    # dsx_tuned_tables_cuda switches them for the process at any time (the GPU tests of the rules where the
    # table lists the launch): the same ends off, the unfit ones on again; it reports the state before, -1 = EINVAL
    on = len(unfit_ends)
    assert f"switch: was 1, off {differ} differ, then 0, on {on} differ, bad argument -1" in run.stdout, run.stdout[-500:]
    assert f"switch: was 0, off {differ} differ, then 0, on {on} differ, bad argument -1" in off.stdout, off.stdout[-500:]
    # the other card's table in effect: this table's entries where the two tables' words differ are not auto's
    # (the H100's group-64 rows 1..8), all others are
    other = "h100" if card == "h200" else "h200"
    cross = subprocess.run([str(exe)], capture_output=True, text=True, env={**os.environ, "DSX_TUNED_CARD": other})
    theirs = {e[:4] + (r,): e[6] for e in tune_auto.read_table(cuda_dir / CARD_TABLES[other][0])
              for r in range(e[4], e[5] + 1)}
    mine = {e[:4] + (r,): e[6] for e in tune_auto.read_table(UNIT.parent / CARD_TABLES[card][0]) for r in e[4:6]}
    moved = {e for e, w in mine.items() if theirs.get(e) != w}
    differs = {tuple(int(v) for v in (m[0], m[1], m[2], m[3], m[4])) for m in
               re.findall(r"^differs: (-?\d+)/(-?\d+) (\d+)x(\d+) rows (\d+) ", cross.stdout, re.M)}
    planted_ends = {e[:4] + (r,) for e in fit + unfit for r in (e[4], e[5])}
    assert len(moved) >= 20 and differs - planted_ends <= moved, cross.stdout[-2000:]
    assert len(differs) >= 0.5 * len(moved), cross.stdout[-2000:]
