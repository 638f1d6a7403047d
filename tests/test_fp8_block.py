"""Block FP8 (e4m3fn + float32 scale_inv): C++ fast path == numpy reference, bit for bit,
and both checked against independent oracles (ml_dtypes casts, float64 numpy)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import fp8_block as f8

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

# ---------------------------------------------------------------- cases (data only)

SHAPES = [(576, 320), (130, 257), (128, 128), (1, 1), (3, 700), (257, 129)]
BLOCKS = [(128, 128), (64, 32), (1, 128)]
ROW_CHUNKS = [128, 256]  # multiples of the 128-row block

# ---------------------------------------------------------------- helpers and generators


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_bitwise_equal(got, want, what: str) -> None:
    """Bit-pattern equality; on failure names the first mismatching index and both values."""
    g, w = _bits(got), _bits(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    bad = np.argwhere(g != w)
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} mismatches, first at {i}: got {got[i]!r} ({g[i]:#x}), want {want[i]!r} ({w[i]:#x})")


def gaussian(shape, seed=0, std=0.02, dtype=np.float32):
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * np.float32(std)
    return w if dtype == np.float32 else w.astype(dtype)


def with_outliers_and_zero_block(shape, seed=1):
    w = gaussian(shape, seed)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, w.size, size=max(1, w.size // 500))
    w.flat[idx] *= 50.0
    if shape[0] > 128 and shape[1] > 130:
        w[:128, 128:256] = 0.0  # an all-zero block (with a -0.0 in it)
        w[0, 130] = -0.0
    return w


def random_fp8_source(shape, block, seed=2):
    """A plausible FP8 checkpoint tensor: random finite codes, positive scales of mixed magnitude."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x42  # no NaN codes in a real checkpoint
    s = (2.0 ** rng.uniform(-20, 4, size=f8.scale_shape(shape, block))).astype(np.float32)
    return codes, s


def e4m3_grid() -> np.ndarray:
    """float64 values of codes 0..126 (non-negative finite e4m3fn), built from the format definition."""
    out = []
    for c in range(127):
        e, m = c >> 3, c & 7
        out.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(out)


def rne_e4m3_f64(x: np.ndarray) -> np.ndarray:
    """Independent oracle: nearest e4m3 code in float64, ties to the even code, saturating to 448."""
    grid = e4m3_grid()
    x = np.asarray(x, dtype=np.float64)
    y = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(grid, y), 0, 126)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = y - grid[lo], grid[hi] - y
    code = np.where(dhi < dlo, hi, np.where(dlo < dhi, lo, np.where(hi % 2 == 0, hi, lo)))
    code = np.where(grid[hi] == y, hi, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def sweep_f32() -> np.ndarray:
    """All 2^16 upper halves of float32, each with boundary and random lower halves."""
    rng = np.random.default_rng(3)
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000]
    parts = [upper | np.uint32(lo) for lo in lows]
    parts += [upper | rng.integers(0, 1 << 16, size=upper.size, dtype=np.uint32) for _ in range(6)]
    return np.concatenate(parts).view(np.float32)


def boundary_values() -> np.ndarray:
    """Every e4m3 value and every midpoint between neighbours, each +- one float32 ulp, both signs."""
    g = e4m3_grid().astype(np.float32)
    mids = ((g[:-1].astype(np.float64) + g[1:]) / 2).astype(np.float32)  # exact in float32
    extra = np.array([448, 456, 464, 472, 480, 512, 1e6, 3e38, np.inf, 2.0**-10, 3 * 2.0**-10, 2.0**-7], np.float32)
    base = np.concatenate([g, mids, extra])
    near = [base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(0))]
    v = np.concatenate(near)
    return np.concatenate([v, -v])


def truncating_encoder(x: np.ndarray) -> np.ndarray:
    """Planted fault: the same encoder with truncation instead of round-to-nearest-even."""
    a = np.abs(x.astype(np.float32)).view(np.uint32).astype(np.int64)
    normal = (a >> 20) - (120 << 3)
    sub = (np.minimum(np.abs(x.astype(np.float64)), 1.0) * 512).astype(np.int64)
    code = np.where(a >= 0x3C800000, normal, sub)
    code = np.where(np.abs(x) > 448, 0x7E, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def nan_free(x: np.ndarray) -> np.ndarray:
    return x[~np.isnan(x)]


# ---------------------------------------------------------------- e4m3 decode / encode


def test_decode_table_matches_ml_dtypes_and_definition():
    codes = np.arange(256, dtype=np.uint8)
    got = f8.decode_e4m3_native(codes)
    assert_bitwise_equal(got, codes.view(E4M3).astype(np.float32), "decode table vs ml_dtypes")
    assert_bitwise_equal(got, f8.decode_e4m3_ref(codes), "decode table vs reference")
    finite = (codes & 0x7F) != 0x7F
    sign = np.where(codes >= 128, -1.0, 1.0)
    want = sign * e4m3_grid()[np.minimum(codes & 0x7F, 126)]  # NaN codes masked below
    assert np.array_equal(got[finite].astype(np.float64), want[finite])
    assert np.isnan(got[~finite]).all() and (~finite).sum() == 2  # 0x7F, 0xFF only; no inf
    assert got[0x7E] == 448.0 and got[0x01] == 2.0**-9 and np.signbit(got[0x80])


def test_encode_dense_sweep_matches_reference():
    x = sweep_f32()
    assert_bitwise_equal(f8.encode_e4m3_native(x), f8.encode_e4m3_ref(x), "encode sweep native vs ref")


def test_encode_boundaries_match_float64_oracle():
    x = boundary_values()
    got = f8.encode_e4m3_native(x)
    assert_bitwise_equal(got, f8.encode_e4m3_ref(x), "boundaries native vs ref")
    assert_bitwise_equal(got, rne_e4m3_f64(x), "boundaries native vs float64 RNE oracle")


def test_encode_sweep_matches_float64_oracle_on_finite_values():
    x = sweep_f32()
    x = x[np.isfinite(x)]
    assert_bitwise_equal(f8.encode_e4m3_native(x), rne_e4m3_f64(x), "sweep vs float64 RNE oracle")


def test_encode_saturates_where_ml_dtypes_gives_nan():
    """Documented difference: |x| > 464 and +-inf -> +-448 here; ml_dtypes' raw cast gives NaN."""
    x = sweep_f32()
    with np.errstate(invalid="ignore"):
        raw = x.astype(E4M3).view(np.uint8)
    got = f8.encode_e4m3_native(x)
    over = (np.abs(x) > 464) & ~np.isnan(x)
    assert over.sum() > 1000
    assert ((raw[over] & 0x7F) == 0x7F).all(), "ml_dtypes no longer gives NaN on overflow: revisit the doc"
    assert_bitwise_equal(got[over], np.where(np.signbit(x[over]), 0xFE, 0x7E).astype(np.uint8), "saturation")
    assert_bitwise_equal(got[~over], raw[~over], "encode vs raw ml_dtypes cast where no overflow")


def test_encode_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448, 464, 464.0001, 1e-45,
                  2.0**-10, 2.0**-10 * 1.0001, 3 * 2.0**-10, 2.0**-6, -2.0**-9], np.float32)
    want = [0x00, 0x80, 0x7E, 0xFE, 0x7F, 0xFF, 0x7E, 0x7E, 0x7E, 0x00, 0x00, 0x01, 0x02, 0x08, 0x81]
    assert f8.encode_e4m3_native(x).tolist() == want


def test_planted_fault_truncation_is_detected():
    x = sweep_f32()
    x = x[np.isfinite(x)]
    bad = truncating_encoder(x)
    with pytest.raises(AssertionError, match="mismatches"):
        assert_bitwise_equal(bad, rne_e4m3_f64(x), "truncating encoder")
    with pytest.raises(AssertionError, match="mismatches"):
        assert_bitwise_equal(bad, f8.encode_e4m3_native(x), "truncating encoder")


# ---------------------------------------------------------------- dequant


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", BLOCKS)
def test_dequant_matches_float64(shape, block):
    codes, s = random_fp8_source(shape, block)
    bn, bk = block
    exact = e4m3_grid()[np.minimum(codes & 0x7F, 126)] * np.where(codes >= 128, -1.0, 1.0)
    s64 = np.repeat(np.repeat(s.astype(np.float64), bn, 0)[: shape[0]], bk, 1)[:, : shape[1]]
    want = (exact * s64).astype(np.float32)  # exact product (4 x 24 bits) rounded once = IEEE f32 multiply
    assert_bitwise_equal(f8.dequant_ref(codes, s, block), want, "dequant_ref vs float64")
    assert_bitwise_equal(f8.dequant_native(codes, s, block), want, "dequant_native vs float64")
    assert_bitwise_equal(f8.dequant_native(codes.view(E4M3), s, block), want, "dequant_native (e4m3 dtype)")


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_dequant_bf16_is_rne_of_float32_product(shape):
    codes, s = random_fp8_source(shape, f8.BLOCK, seed=5)
    s = ((s.view(np.uint32) & 0xFFFF0000) | 0x8000).view(np.float32)  # power-of-two codes give exact ties
    want = f8.dequant_ref(codes, s).astype(ml_dtypes.bfloat16)
    got = f8.dequant_native(codes, s, out_dtype="bfloat16")
    assert got.dtype == ml_dtypes.bfloat16
    assert_bitwise_equal(got, want, "dequant bf16")


def test_dequant_ragged_block_mapping_576_rows():
    """kv_a_proj_with_mqa-like: 576 rows -> 5 scale rows; scale row 4 covers rows 512..575 only."""
    codes = np.full((576, 320), 0x38, np.uint8)  # 1.0
    s = np.ones((5, 3), np.float32)
    s[4, 2] = 8.0
    got = f8.dequant_native(codes, s)
    assert (got[512:, 256:] == 8.0).all() and (got[:512] == 1.0).all() and (got[:, :256] == 1.0).all()
    assert_bitwise_equal(got, f8.dequant_ref(codes, s), "ragged")


def test_planted_fault_wrong_block_scale_is_detected():
    codes, s = random_fp8_source((576, 320), f8.BLOCK, seed=6)
    want = f8.dequant_ref(codes, s)
    s_bad = s.copy()
    s_bad[[3, 4]] = s_bad[[4, 3]]  # scale applied to the wrong block rows
    with pytest.raises(AssertionError, match="mismatches"):
        assert_bitwise_equal(f8.dequant_native(codes, s_bad), want, "swapped scale rows")


@pytest.mark.parametrize("rows", [(0, 576), (0, 100), (100, 300), (512, 576), (575, 576), (200, 200)])
def test_dequant_chunks_equal_whole(rows):
    codes, s = random_fp8_source((576, 320), f8.BLOCK, seed=7)
    whole = f8.dequant_native(codes, s, out_dtype="bfloat16")
    part = f8.dequant_native(codes, s, out_dtype="bfloat16", rows=rows)
    assert_bitwise_equal(part, whole[rows[0] : rows[1]], f"dequant rows {rows}")


# ---------------------------------------------------------------- quantize


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_quantize_native_equals_reference(shape, dtype):
    w = with_outliers_and_zero_block(shape).astype(dtype)
    q_ref, s_ref = f8.quantize_ref(w)
    q, s = f8.quantize_native(w)
    assert q.shape == shape and s.shape == f8.scale_shape(shape)
    assert_bitwise_equal(q, q_ref, "quantize codes")
    assert_bitwise_equal(s, s_ref, "quantize scale_inv")


@pytest.mark.parametrize("shape", [(576, 320), (130, 257)])
def test_quantize_is_rne_of_x_over_scale_and_amax_over_448(shape):
    w = with_outliers_and_zero_block(shape)
    q, s = f8.quantize_native(w)
    x64 = np.abs(w.astype(np.float64))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = x64[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            want = np.float32(blk.max()) / np.float32(448)
            assert s[i, j] == (want if want > 0 else 1.0), (i, j)
    s_full = np.repeat(np.repeat(s, 128, 0)[: shape[0]], 128, 1)[:, : shape[1]]
    assert_bitwise_equal(q, rne_e4m3_f64(w / s_full), "codes vs float64 RNE of the float32 quotient")
    assert (np.abs(f8.decode_e4m3_ref(q)) <= 448).all()


def test_quantize_error_sizes_on_gaussian():
    w = gaussian((512, 1024), seed=8)
    q, s = f8.quantize_native(w)
    d = f8.dequant_native(q, s).astype(np.float64)
    sqnr = 10 * np.log10((w.astype(np.float64) ** 2).sum() / ((d - w) ** 2).sum())
    assert 29.0 < sqnr < 34.0, sqnr
    s_full = np.repeat(np.repeat(s, 128, 0), 128, 1).astype(np.float64)
    y = np.abs(w / s_full)
    half_ulp = 2.0 ** (np.maximum(np.floor(np.log2(np.maximum(y, 1e-30))), -6) - 4)
    assert (np.abs(d - w) <= half_ulp * s_full * (1 + 1e-6) + 1e-30).all()
    normal = y >= 2.0**-6
    rel = np.abs(d - w)[normal] / np.abs(w)[normal]
    assert rel.max() <= 1 / 17 + 1e-6  # half an ulp of a 3-bit mantissa, worst at 1 + 1/16


def test_quantize_zero_and_tiny_blocks():
    w = np.zeros((130, 257), np.float32)
    w[0, 0] = -0.0
    w[129, 256] = 1e-44  # amax / 448 underflows to 0
    w[0, 200] = 3.0
    q, s = f8.quantize_native(w)
    assert s[0, 0] == 1.0 and s[1, 2] == 1.0 and s[0, 1] == np.float32(3.0) / np.float32(448)
    assert q[0, 0] == 0x80 and q[129, 256] == 0x00 and q[0, 200] == 0x7E
    assert_bitwise_equal(q, f8.quantize_ref(w)[0], "zero blocks")
    assert not np.isnan(f8.dequant_native(q, s)).any()


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_quantize_rejects_non_finite(bad):
    w = gaussian((130, 257))
    w[129, 3] = bad
    with pytest.raises(DsxError, match="inf/NaN"):
        f8.quantize_native(w)
    with pytest.raises(DsxError, match="inf/NaN"):
        f8.quantize_ref(w)


@pytest.mark.parametrize("chunk", ROW_CHUNKS)
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_quantize_chunks_equal_whole(chunk, dtype):
    w = with_outliers_and_zero_block((576, 320)).astype(dtype)
    q, s = f8.quantize_native(w)
    parts = [f8.quantize_native(w, rows=(r, min(r + chunk, 576))) for r in range(0, 576, chunk)]
    assert_bitwise_equal(np.concatenate([p[0] for p in parts]), q, "chunked codes")
    assert_bitwise_equal(np.concatenate([p[1] for p in parts]), s, "chunked scales")


def test_quantize_rejects_unaligned_rows_and_bad_input():
    w = gaussian((576, 320))
    with pytest.raises(DsxError, match="block boundary"):
        f8.quantize_native(w, rows=(100, 300))
    with pytest.raises(DsxError, match="float32 or bfloat16"):
        f8.quantize_native(w.astype(np.float64))
    with pytest.raises(DsxError, match="block"):
        f8.quantize_native(w, block=(0, 128))
    codes, s = random_fp8_source((576, 320), f8.BLOCK)
    with pytest.raises(DsxError, match=r"expected \[5, 3\]"):
        f8.dequant_native(codes, s[:4])


# ---------------------------------------------------------------- requant and passthrough


@pytest.mark.parametrize("src_block", [(64, 64), (128, 64), (1, 128), (256, 256)])
def test_requant_native_equals_reference_and_chunks(src_block):
    codes, s = random_fp8_source((576, 320), src_block, seed=9)
    q_ref, s_ref = f8.requant_ref(codes, s, src_block)
    for chunk in (128, 1024):
        q, s2 = f8.requant_native(codes, s, src_block, chunk_rows=chunk)
        assert_bitwise_equal(q, q_ref, f"requant codes chunk {chunk}")
        assert_bitwise_equal(s2, s_ref, f"requant scales chunk {chunk}")
    q, s2 = f8.requant_native(codes, s, src_block, rows=(128, 384))
    assert_bitwise_equal(q, q_ref[128:384], "requant rows")
    assert_bitwise_equal(s2, s_ref[1:3], "requant rows scales")


def test_passthrough_rules():
    assert f8.is_passthrough((576, 7168), (5, 56), (128, 128))
    assert f8.is_passthrough((130, 257), (2, 3), [128, 128])
    assert not f8.is_passthrough((576, 7168), (9, 112), (64, 64))
    with pytest.raises(DsxError, match="does not match"):
        f8.is_passthrough((576, 7168), (4, 56), (128, 128))  # e.g. block derived as 576/4
    ps = f8.packed_shapes(576, 7168)
    assert ps["weight"] == {"shape": (576, 7168), "dtype": "float8_e4m3fn", "nbytes": 576 * 7168}
    assert ps["weight_scale_inv"] == {"shape": (5, 56), "dtype": "float32", "nbytes": 5 * 56 * 4}


def test_passthrough_copies_bits_and_requantizing_would_not():
    codes, s = random_fp8_source((576, 320), f8.BLOCK, seed=10)
    # Re-quantizing a checkpoint tensor is not an identity: this is why passthrough copies.
    q, s2 = f8.quantize_ref(f8.dequant_ref(codes, s))
    assert not (np.array_equal(q, codes) and np.array_equal(s2, s))
    for fn in (f8.requant_ref, f8.requant_native):
        q, s2 = fn(codes, s, (128, 128))
        assert_bitwise_equal(q, codes, "passthrough codes")
        assert_bitwise_equal(s2, s, "passthrough scales")
        assert q is not codes


# ---------------------------------------------------------------- activations


@pytest.mark.parametrize("shape", [(7, 300), (16, 256), (1, 1), (33, 129)])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_act_quant_native_equals_reference(shape, dtype):
    x = with_outliers_and_zero_block(shape).astype(dtype) * 30
    q_ref, s_ref = f8.act_quant_ref(x)
    q, s = f8.act_quant_native(x)
    assert s.shape == (shape[0], -(-shape[1] // 128))
    assert_bitwise_equal(q, q_ref, "act codes")
    assert_bitwise_equal(s, s_ref, "act scales")
    x64 = np.abs(x.astype(np.float64))
    for j in range(s.shape[1]):
        amax = x64[:, j * 128 : (j + 1) * 128].max(axis=1).astype(np.float32)
        want = amax / np.float32(448)
        assert_bitwise_equal(s[:, j], np.where(want == 0, np.float32(1), want), "per-token scale")
    parts = [f8.act_quant_native(x, rows=(r, min(r + 5, shape[0]))) for r in range(0, shape[0], 5)]
    assert_bitwise_equal(np.concatenate([p[0] for p in parts]), q, "act chunks")


def test_planted_fault_block_scale_instead_of_per_token_is_detected():
    x = gaussian((16, 256), seed=11) * np.linspace(0.1, 10, 16, dtype=np.float32)[:, None]
    q, _ = f8.act_quant_native(x)
    q_bad, _ = f8.quantize_native(x)  # one 128x128 scale shared by all tokens
    with pytest.raises(AssertionError, match="mismatches"):
        assert_bitwise_equal(q_bad, q, "block scale used for activations")


def test_native_fills_caller_buffers():
    codes, s = random_fp8_source((576, 320), f8.BLOCK, seed=12)
    buf = np.empty((128, 320), ml_dtypes.bfloat16)
    got = f8.dequant_native(codes, s, out_dtype="bfloat16", rows=(256, 384), out=buf)
    assert np.shares_memory(got, buf)
    assert_bitwise_equal(buf, f8.dequant_native(codes, s, out_dtype="bfloat16")[256:384], "dequant into out")
    w = gaussian((576, 320), seed=13)
    q_buf, s_buf = np.empty((192, 320), E4M3), np.empty((2, 3), np.float32)
    f8.quantize_native(w, rows=(384, 576), out=(q_buf, s_buf))
    q, sc = f8.quantize_native(w)
    assert_bitwise_equal(q_buf.view(np.uint8), q[384:], "quantize into out")
    assert_bitwise_equal(s_buf, sc[3:], "quantize scales into out")
    with pytest.raises(DsxError, match="out must be"):
        f8.quantize_native(w, out=(np.empty((576, 320), np.int8), np.empty((5, 3), np.float32)))
    with pytest.raises(DsxError, match="out must be"):
        f8.dequant_native(codes, s, out=np.empty((576, 320), np.float32)[:, ::1].T.copy().T)


def test_decode_lookup_is_ml_dtypes_cast_bit_for_bit():
    """decode_e4m3_ref looks the 256 codes up in ml_dtypes' own cast of them (NaN bit patterns included), and
    dequant_ref's in-place product over whole blocks is the expanded product's bits."""
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(f8.E4M3).astype(np.float32)
    assert np.array_equal(f8.decode_e4m3_ref(codes).view(np.uint32), want.view(np.uint32))
    rng = np.random.default_rng(7)
    for (n, k), block in [((256, 384), (128, 128)), ((200, 300), (128, 128)), ((5, 256), (1, 128)),
                          ((128, 128), (128, 128)), ((0, 128), (128, 128)), ((256, 300), (128, 128)),
                          ((200, 256), (128, 128)), ((576, 100), (128, 128)), ((7, 130), (1, 128))]:
        w = rng.integers(0, 256, (n, k), dtype=np.uint8)
        s = rng.random((-(-n // block[0]), -(-k // block[1]))).astype(np.float32) * 1e-3
        ref = f8.decode_e4m3_ref(w) * f8._expand(s, n, k, *block)
        got = f8.dequant_ref(w, s, block)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (n, k, block)
        buf = np.full(n * k + 3, np.nan, np.float32)  # into a given array (a view of a longer buffer)
        into = f8.dequant_ref(w, s, block, out=buf[: n * k].reshape(n, k))
        assert (np.shares_memory(into, buf) or not n) and np.array_equal(into.view(np.uint32), ref.view(np.uint32)), (n, k)
        assert np.isnan(buf[n * k:]).all()
    with pytest.raises(DsxError, match="out must be float32"):
        f8.dequant_ref(w, s, block, out=np.empty((7, 130), np.float64))


def test_nan_code_count_native_equals_the_reference():
    """count_nan_native (C++, one pass) gives count_nan_ref's (count, first index) on every code, random codes with
    NaNs planted at the ends and in the middle, odd lengths, unaligned views and nothing."""
    every = np.arange(256, dtype=np.uint8)
    assert f8.count_nan_native(every) == f8.count_nan_ref(every) == (2, 0x7F)
    rng = np.random.default_rng(5)
    base = rng.integers(0, 256, (1 << 17) + 77, dtype=np.uint8)
    base[(base & 0x7F) == 0x7F] = 3
    for where in ([], [0], [len(base) - 1], [70000, 70001, 131000], list(rng.integers(0, len(base), 50))):
        a = base.copy()
        a[where] = rng.choice([0x7F, 0xFF], len(where)) if where else a[where]
        for view in (a, a[1:], a[3:-5], a.reshape(-1)[: (1 << 16) + 1]):
            assert f8.count_nan_native(view) == f8.count_nan_ref(view)
    assert f8.count_nan_native(np.zeros(0, np.uint8)) == (0, -1)
    w = np.full((3, 256), 0x38, np.uint8)
    w[2, 17] = 0xFF
    assert f8.count_nan_native(w.view(ml_dtypes.float8_e4m3fn)) == (1, 2 * 256 + 17)


def test_the_nan_scan_bench_runs():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "bench" / "fp8_nan_scan.py"), "--mib", "4", "--rounds", "1"],
                         capture_output=True, text=True, check=True).stdout
    assert "scan (C++)" in out and "copy (anchor)" in out and "x the copy's speed" in out
