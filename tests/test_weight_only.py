"""Weight-only INT8/INT4: byte identity with Paddle's CPU weight_quantize, native == reference,
chunking, round-trip error, edge cases, refusals and planted faults.

Oracles: Paddle's own op (bytes), float64 numpy (error sizes, rounding), ml_dtypes (bf16).
Paddle is only ever called on shapes that our own check_args accepts (its CPU kernel
corrupts memory on in-dims that are not multiples of 64).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import weight_only as wo

BF16 = ml_dtypes.bfloat16

# ------------------------------------------------------------------ cases

PADDLE_SHAPES = [(192, 320), (576, 128), (64, 64), (128, 448)]  # HF [out, in]
ARCH70_SHAPES = [(48, 200), (16, 37), (64, 100)]  # arch 70 has no 64-tile rule
BITS_GROUPS = [(b, g) for b in (8, 4) for g in (-1, 64, 128)]
NATIVE_SHAPES = [(64, 64), (192, 320), (256, 1024), (576, 128), (1024, 192)]


# ------------------------------------------------------------------ inputs


def gaussian(n: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, k), dtype=np.float32).astype(BF16)


def with_edge_rows(w: np.ndarray) -> np.ndarray:
    """Rows that exercise the corners of Paddle's arithmetic (needs >= 12 rows, in >= 64)."""
    w = w.astype(np.float32)
    k = w.shape[1]
    w[0] = 0.0  # all-zero row: scale 0, 0/0 -> NaN -> int8 127, int4 -7
    w[1] = 0.0
    w[1, 0] = -0.0  # Paddle seeds the max with the signed first element: scale -0.0
    w[2] = -0.0
    w[3] = 0.0
    w[3, k // 2] = 1e30  # one huge outlier
    w[4, :64] = 0.0  # a zero group
    w[5] *= 1e-39  # subnormal weights
    w[6] = 0.0
    w[6, 7], w[6, k - 1] = 3e-41, -1e-41  # scale underflows to 0 in bf16 -> +-Inf quotients
    w[7] = 0.0
    w[7, 0] = 127.0  # int8 scale exactly 1: .5 boundaries below
    w[7, 1:40] = np.arange(39) - 19.5
    w[8] = 0.0
    w[8, 0] = 7.0  # int4 scale exactly 1
    w[8, 1:16] = np.arange(15) - 7.5
    w[9] = -w[9]
    w[10, 5] = -50.0  # negative outlier
    w[11] = 1e-3
    return w.astype(BF16)


# ------------------------------------------------------------------ oracle


def paddle_quantize(w: np.ndarray, bits: int, group_size: int, arch: int):
    """Paddle's op on the [in, out] transpose; returns (qweight int8, scale bf16)."""
    wo.check_args(w.shape[0], w.shape[1], bits, group_size, arch)  # never hand Paddle a bad shape
    paddle = pytest.importorskip("paddle")
    x = paddle.to_tensor(np.ascontiguousarray(w.T).view(np.uint16)).view(paddle.bfloat16)
    q, s = paddle.nn.quant.weight_quantize(x, algo=f"weight_only_int{bits}", arch=arch, group_size=group_size)
    return q.numpy(), s.view(paddle.uint16).numpy().view(BF16)


def assert_bitwise_equal(got, want, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g, w = got.view(np.uint8).reshape(-1), want.view(np.uint8).reshape(-1)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} bytes differ, first at byte {bad[0]}: {g[bad[0]]} != {w[bad[0]]}"


def assert_same_as(got: tuple, want: tuple, what: str) -> None:
    assert_bitwise_equal(got[0], want[0], f"{what} qweight")
    assert_bitwise_equal(got[1], want[1], f"{what} scale")


# ------------------------------------------------------------------ identity with Paddle


@pytest.mark.parametrize("arch", wo.ARCHS)
@pytest.mark.parametrize("bits,group", BITS_GROUPS)
def test_identical_to_paddle(bits, group, arch):
    shapes = PADDLE_SHAPES + (ARCH70_SHAPES if arch == 70 else [])
    for i, (n, k) in enumerate(shapes):
        w = gaussian(n, k, seed=i)
        want = paddle_quantize(w, bits, group, arch)
        assert_same_as(wo.quantize_ref(w, bits, group, arch), want, f"ref {n}x{k}")
        assert_same_as(wo.quantize_native(w, bits, group, arch), want, f"native {n}x{k}")
        shapes_d = wo.packed_shapes(n, k, bits, group, arch)
        assert want[0].shape == shapes_d["qweight"]["shape"] and want[1].shape == shapes_d["scale"]["shape"]


@pytest.mark.parametrize("arch", [70, 80, 90])
@pytest.mark.parametrize("bits,group", BITS_GROUPS)
def test_edge_rows_identical_to_paddle(bits, group, arch):
    w = with_edge_rows(gaussian(64, 256, seed=7))
    want = paddle_quantize(w, bits, group, arch)
    assert_same_as(wo.quantize_ref(w, bits, group, arch), want, "ref edge rows")
    assert_same_as(wo.quantize_native(w, bits, group, arch), want, "native edge rows")


def test_archs_75_to_100_share_bytes():
    w = gaussian(128, 192, seed=3)
    for bits in (8, 4):
        base = paddle_quantize(w, bits, -1, 80)
        for arch in (75, 86, 89, 90, 100):
            assert_same_as(paddle_quantize(w, bits, -1, arch), base, f"paddle arch {arch} vs 80")


def test_float32_input_is_rounded_to_bf16_first():
    w32 = np.random.default_rng(5).standard_normal((64, 128), dtype=np.float32)
    want = paddle_quantize(w32.astype(BF16), 8, -1, 90)
    assert_same_as(wo.quantize_ref(w32, 8, -1, 90), want, "ref float32")
    assert_same_as(wo.quantize_native(w32, 8, -1, 90), want, "native float32")


def closed_form_pack(q: np.ndarray, bits: int, arch: int) -> np.ndarray:
    """docs/format-weight-only.md section 4, element by element (an independent third derivation)."""
    n_out, k_in = q.shape
    e, g, il = 32 // bits, 128 // bits, 2 if bits == 8 else 4
    f_inv = {8 * ((t % e) // 2) + t % 2 + 2 * (t // e): t for t in range(g)}
    order_inv = {(2 * d if d < e // 2 else 2 * (d - e // 2) + 1): d for d in range(e)}
    out = np.zeros(n_out * k_in * bits // 8, np.uint8)
    for n in range(n_out):
        for k in range(k_in):
            if arch == 70:
                p = k * n_out + n
            else:
                kp = g * (k // g) + f_inv[k % g]
                p = (n // il) * il * k_in + (kp // 64) * 64 * il + (n % il) * 64 + kp % 64
            slot = (p // e) * e + order_inv[p % e]
            if bits == 8:
                out[slot] = int(q[n, k]) + 128
            else:
                out[slot // 2] |= (int(q[n, k]) + 8) << (4 * (slot % 2))
    return out.view(np.int8).reshape(-1, k_in)


@pytest.mark.parametrize("arch", [70, 90])
@pytest.mark.parametrize("bits", [8, 4])
def test_spec_closed_form(bits, arch):
    w = gaussian(64, 128, seed=9)
    q, _ = wo.quantize_signed_ref(w, bits, -1)
    want = closed_form_pack(q, bits, arch)
    assert_bitwise_equal(wo.quantize_ref(w, bits, -1, arch)[0], want, "reference vs spec")
    assert_bitwise_equal(wo.quantize_native(w, bits, -1, arch)[0], want, "native vs spec")


# ------------------------------------------------------------------ rounding against float64


@pytest.mark.parametrize("bits", [8, 4])
def test_half_boundaries_round_away_from_zero(bits):
    """Scale 1 exactly, inputs k + 0.5: q must be round-half-away-from-zero computed in float64."""
    bound = 127 if bits == 8 else 7
    w = np.zeros((64, 64), np.float32)
    w[:, 0] = bound
    vals = np.arange(-bound + 0.5, bound, 1.0)[: 63]
    w[:, 1 : 1 + vals.size] = vals
    wb = w.astype(BF16)
    expect = (np.sign(w) * np.floor(np.abs(w.astype(np.float64)) + 0.5)).astype(np.int8)
    for fn in (wo.quantize_ref, wo.quantize_native):
        q, s = fn(wb, bits, -1, 90)
        assert (s.astype(np.float32) == 1.0).all()
        np.testing.assert_array_equal(wo.unpack_ref(q, bits, 90, 64), expect)


# ------------------------------------------------------------------ native vs reference


@pytest.mark.parametrize("arch", [70, 75, 90])
@pytest.mark.parametrize("bits,group", BITS_GROUPS)
def test_native_equals_reference(bits, group, arch):
    for i, (n, k) in enumerate(NATIVE_SHAPES):
        w = gaussian(n, k, seed=10 + i) * BF16(np.float32(10.0 ** (i - 2)))
        if n >= 12:
            w = with_edge_rows(w)
        ref = wo.quantize_ref(w, bits, group, arch)
        assert_same_as(wo.quantize_native(w, bits, group, arch, threads=2), ref, f"native {n}x{k}")
        assert_bitwise_equal(wo.dequantize_native(*ref, bits, group, arch, k), wo.dequantize_ref(*ref, bits, group, arch, k), "dequant")


@pytest.mark.parametrize("arch", [70, 90])
@pytest.mark.parametrize("bits,group", [(8, -1), (4, 128), (4, -1), (8, 64)])
def test_chunked_equals_whole(bits, group, arch):
    n, k = 320, 192
    w = with_edge_rows(gaussian(n, k, seed=21))
    whole = wo.quantize_native(w, bits, group, arch)
    shapes = wo.packed_shapes(n, k, bits, group, arch)

    def fresh():
        return np.zeros(shapes["qweight"]["shape"], np.int8), np.zeros(shapes["scale"]["shape"], BF16)

    bounds = [0, 8, 64, 72, 200, 320]
    out = fresh()  # chunks given as row slices only, run concurrently into one buffer
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda r: wo.quantize_native(w[r[0] : r[1]], bits, group, arch, out=out, rows=r, threads=1),
                    zip(bounds[:-1], bounds[1:])))
    assert_same_as(out, whole, "chunks from row slices")
    out = fresh()  # chunks given with the full weight
    for r in zip(bounds[:-1], bounds[1:]):
        wo.quantize_native(w, bits, group, arch, out=out, rows=r)
    assert_same_as(out, whole, "chunks from full weight")
    out = fresh()  # one chunk writes only its own bytes
    wo.quantize_native(w, bits, group, arch, out=out, rows=(64, 72))
    mask = np.zeros(n, bool)
    mask[64:72] = True
    q_rows = wo.unpack_ref(out[0], bits, arch, k)
    np.testing.assert_array_equal(q_rows[~mask], 0 - (128 if bits == 8 else 8))  # zero bytes unpack to -bias
    np.testing.assert_array_equal(q_rows[mask], wo.unpack_ref(whole[0], bits, arch, k)[mask])


@pytest.mark.parametrize("bits,group", [(8, -1), (4, 128), (4, -1), (8, 64)])
def test_chunk_local_outputs_concatenate_to_whole(bits, group):
    """quantize_rows_native: each chunk's bytes and scales, concatenated, are the whole tensor's."""
    n, k = 320, 192
    w = with_edge_rows(gaussian(n, k, seed=22))
    q_whole, s_whole = wo.quantize_native(w, bits, group, 90)
    bounds = [0, 8, 64, 72, 200, 320]
    parts = [wo.quantize_rows_native(w[a:b], n, (a, b), bits, group, 90) for a, b in zip(bounds[:-1], bounds[1:])]
    assert np.concatenate([q for q, _ in parts]).tobytes() == q_whole.tobytes()
    assert np.concatenate([s for _, s in parts], axis=-1).tobytes() == s_whole.tobytes()
    with pytest.raises(DsxError, match="arch 70"):
        wo.quantize_rows_native(w[:8], n, (0, 8), bits, group, 70)


@pytest.mark.parametrize("bits,group", [(8, -1), (4, 128), (4, -1), (8, 64)])
@pytest.mark.parametrize("block", [(128, 128), (64, 64)])
def test_fused_fp8_source_equals_dequant_then_quantize(bits, group, block):
    """quantize_fp8_rows_native == fp8_block.dequant_native(bf16) followed by quantize_rows_native, bit for bit."""
    from ds_export.formats import fp8_block

    n, k = 320, 448  # ragged FP8 blocks both ways
    rng = np.random.default_rng(23)
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # no NaN codes
    codes[5] = 0  # an all-zero channel
    s = np.exp2(rng.uniform(-12, 2, (-(-n // block[0]), -(-k // block[1])))).astype(np.float32)
    for r0, r1 in [(0, n), (64, 200)]:
        bf = fp8_block.dequant_native(codes, s, block, "bfloat16", rows=(r0, r1))
        want = wo.quantize_rows_native(bf, n, (r0, r1), bits, group, 90)
        got = wo.quantize_fp8_rows_native(codes, s, block, (r0, r1), bits, group, 90, threads=2)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()


# ------------------------------------------------------------------ round trip error


def _sqnr_db(ref: np.ndarray, approx: np.ndarray) -> float:
    return float(10 * np.log10((ref**2).sum() / ((approx - ref) ** 2).sum()))


@pytest.mark.parametrize("bits,group,lo,hi", [
    (8, -1, 40.0, 45.0), (8, 128, 42.0, 46.0), (4, -1, 15.5, 19.0), (4, 128, 17.5, 20.5), (4, 64, 18.0, 21.0),
])
def test_dequantize_round_trip_error(bits, group, lo, hi):
    n, k = 256, 1024
    w = gaussian(n, k, seed=33)
    w64 = w.astype(np.float64)
    q, s = wo.quantize_native(w, bits, group, 90)
    deq = wo.dequantize_ref(q, s, bits, group, 90, k).astype(np.float64)
    overall = _sqnr_db(w64, deq)
    assert lo < overall < hi, f"SQNR {overall:.2f} dB outside [{lo}, {hi}]"
    # uniform-noise model from the scales alone (float64): step^2 / 12 per element
    step = s.astype(np.float64)
    step2 = np.repeat(step**2, k) if group == -1 else np.repeat(step.T**2, group, axis=1)[:, :k].reshape(-1)
    model = 10 * np.log10((w64**2).mean() / (step2.mean() / 12))
    assert abs(overall - model) < 1.0, f"SQNR {overall:.2f} dB vs model {model:.2f} dB"
    # every element within half a step (no clipping on Gaussian data), up to bf16 scale rounding
    per = step[:, None] if group == -1 else np.repeat(step.T, group, axis=1)[:, :k]
    assert (np.abs(deq - w64) <= per * 0.5 * (1 + 2**-7)).all()


def test_unpack_matches_signed_quantization():
    w = with_edge_rows(gaussian(128, 256, seed=2))
    for bits in (8, 4):
        q_signed, _ = wo.quantize_signed_ref(w, bits, 64)
        for arch in (70, 90):
            q, _ = wo.quantize_native(w, bits, 64, arch)
            np.testing.assert_array_equal(wo.unpack_ref(q, bits, arch, 256), q_signed)


@pytest.mark.parametrize("arch", [70, 75, 90])
@pytest.mark.parametrize("bits,group", BITS_GROUPS)
def test_decoder_equals_dequantize_ref(bits, group, arch):
    """weight_only.decoder (dsx verify's decode: tiles gathered, float64) gives dequantize_ref's numbers bit for bit,
    into a given buffer too, and bound_count is unpack_ref's count of |q| at the bound."""
    rng = np.random.default_rng(11)
    for i, (n, k) in enumerate(NATIVE_SHAPES):
        w = with_edge_rows(gaussian(n, k, seed=i))
        w[:, : k // 8] *= 40  # some scales far apart, so codes at the bound show up in every row
        qw, sc = wo.quantize_native(w, bits, group, arch)
        want = wo.dequantize_ref(qw, sc, bits, group, arch, k).astype(np.float64)
        decode = wo.decoder(n, k, bits, group, arch)
        got = decode(qw, sc)
        assert got.shape == (n, k) and np.array_equal(got.view(np.uint64), want.view(np.uint64)), (n, k)
        buf = np.full(n * k + 5, 7.0)
        into = decode(qw, sc, buf)
        assert np.shares_memory(into, buf) and np.array_equal(into, want) and (buf[n * k:] == 7.0).all()
        q = wo.unpack_ref(qw, bits, arch, k).astype(np.int16)
        bound = 127 if bits == 8 else 7
        assert wo.bound_count(qw, bits) == np.count_nonzero(np.abs(q) >= bound) > 0
        raw = rng.integers(0, 256, qw.shape, dtype=np.uint8).view(np.int8)  # every code, -128 / -8 included
        q = wo.unpack_ref(raw, bits, arch, k).astype(np.int16)
        assert wo.bound_count(raw, bits) == np.count_nonzero(np.abs(q) >= bound)
        assert np.array_equal(decode(raw, sc), wo.dequantize_ref(raw, sc, bits, group, arch, k).astype(np.float64))


@pytest.mark.parametrize("bits,group", [(8, -1), (4, 128)])
def test_decoder_keeps_float32s_overflow_and_non_finite_scales(bits, group):
    """Scales whose float32 product overflows (bf16 reaches 3.4e38), and NaN / Inf scales, decode as dequantize_ref's
    float32 does (in float64 the product would stay finite)."""
    n, k = 128, 256
    qw, sc = wo.quantize_native(gaussian(n, k, seed=5), bits, group, 90)
    for bad in (3.0e38, np.inf, np.nan, -2.0e37):
        s = sc.copy()
        s.reshape(-1)[3] = bad
        want = wo.dequantize_ref(qw, s, bits, group, 90, k).astype(np.float64)
        got = wo.decoder(n, k, bits, group, 90)(qw, s)
        assert np.array_equal(got, want, equal_nan=True), bad
        assert bad != 3.0e38 or np.isinf(want).any()  # (the overflow the float64 product alone would miss)


def test_decoder_refuses_wrong_parts():
    decode = wo.decoder(128, 256, 4, 128, 90)
    qw, sc = wo.quantize_native(gaussian(128, 256), 4, 128, 90)
    with pytest.raises(DsxError, match="qweight: expected int8"):
        decode(qw[:32], sc)
    with pytest.raises(DsxError, match="scale: expected shape"):
        decode(qw, sc[:1])


@pytest.mark.parametrize("bits", [8, 4])
def test_decoder_planted_gather_fault_is_detected(bits, monkeypatch):
    """Two elements of a tile swapped in the gather must change the decode (what the equality above would catch)."""
    qw, sc = wo.quantize_native(gaussian(64, 128, seed=9), bits, -1, 90)
    want = wo.dequantize_ref(qw, sc, bits, -1, 90, 128).astype(np.float64)
    where = wo._tile_gather(bits).copy()
    where[[1, 70]] = where[[70, 1]]
    monkeypatch.setattr(wo, "_tile_gather", lambda b: where)
    assert not np.array_equal(wo.decoder(64, 128, bits, -1, 90)(qw, sc), want)


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("n,k,arch", [(64, 100, 90), (100, 64, 80), (72, 128, 90), (64, 96, 75), (24, 64, 70)])
def test_bad_shapes_refused(n, k, arch):
    w = gaussian(n, k)
    for call in (lambda: wo.quantize_ref(w, 8, -1, arch), lambda: wo.quantize_native(w, 4, -1, arch),
                 lambda: wo.packed_shapes(n, k, 8, -1, arch), lambda: paddle_quantize(w, 8, -1, arch)):
        with pytest.raises(DsxError, match="multiple"):
            call()


def test_bad_arguments_refused():
    w = gaussian(64, 64)
    for kwargs in ({"bits": 2}, {"group_size": 32}, {"arch": 92}):
        args = {"bits": 8, "group_size": -1, "arch": 90} | kwargs
        with pytest.raises(DsxError):
            wo.quantize_ref(w, **args)
        with pytest.raises(DsxError):
            wo.quantize_native(w, **args)
    with pytest.raises(DsxError, match="bf16 or float32"):
        wo.quantize_native(w.astype(np.float16), 8)
    shapes = wo.packed_shapes(64, 64, 8, -1)
    out = (np.zeros(shapes["qweight"]["shape"], np.int8), np.zeros(shapes["scale"]["shape"], BF16))
    with pytest.raises(DsxError, match="multiples of 8"):
        wo.quantize_native(w, 8, out=out, rows=(4, 64))
    with pytest.raises(DsxError, match="expected C-contiguous"):
        wo.quantize_native(w, 8, out=(out[0].astype(np.uint8), out[1]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(bad):
    w = gaussian(64, 128).astype(np.float32)
    w[40, 77] = bad
    for fn in (wo.quantize_ref, wo.quantize_native):
        with pytest.raises(DsxError, match="NaN or Inf"):
            fn(w.astype(BF16), 4, 64, 90)


# ------------------------------------------------------------------ planted faults


@pytest.mark.parametrize("fault", ["word_order", "row_permutation", "interleave", "rounding"])
def test_planted_fault_is_detected(fault, monkeypatch):
    """A deliberately wrong layout or rounding step must make the Paddle identity check fail."""
    w = with_edge_rows(gaussian(128, 192, seed=4))
    for bits in (8, 4):
        want = paddle_quantize(w, bits, -1, 90)
        with monkeypatch.context() as m:
            if fault == "word_order":
                m.setattr(wo, "word_order", lambda b: np.arange(32 // b))
            elif fault == "row_permutation":
                m.setattr(wo, "row_permutation", lambda b: np.arange(128 // b))
            elif fault == "interleave":
                m.setattr(wo, "_interleave", lambda b: 1)
            else:
                m.setattr(wo, "_round_clip", lambda v, b: np.clip(np.nan_to_num(np.round(v)), -(2 ** (b - 1) - 1), 2 ** (b - 1) - 1).astype(np.int8))
            got = wo.quantize_ref(w, bits, -1, 90)
        assert not np.array_equal(got[0], want[0]), f"{fault} fault went undetected for int{bits}"
        assert_same_as(wo.quantize_ref(w, bits, -1, 90), want, "unpatched reference")
