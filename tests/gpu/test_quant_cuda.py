"""GPU conversion kernels (csrc/cuda/quant_convert.cu) against the CPU native path, bit for bit.

GPU machine only (skipped where no CUDA device is visible). The converter poisons every
output buffer (0xA5 bytes) before its kernel, so an element the kernel does not write
differs from the CPU result. References are the CPU calls that `dsx quantize` makes
(ds_export/quant/transforms.py), themselves tested against Paddle, numpy and ml_dtypes;
the float32 dequant is also checked against ml_dtypes' decode times the scale.

DSX_QUANT_CUDA_LIB (test harness only): a path to a libdsx_cuda build to load instead of
ds_export.native.cuda.lib(), e.g. one compiled from quant_convert.cu alone.
"""

from __future__ import annotations

import ctypes
import itertools
import os

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import fp8_block, weight_only
from ds_export.native import cuda
from ds_export.native import cuda_quant as cq

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

BF16 = ml_dtypes.bfloat16

# (N, K, fp8 block): real DeepSeek-V3 rows, ragged blocks (576 = 4.5 x 128, K = 1.5 x 128),
# blocks whose K size is not a multiple of 32 (per-element scales inside a unit).
WO_SHAPES = [(576, 7168, (128, 128)), (256, 192, (128, 128)), (192, 320, (64, 96)), (128, 448, (32, 48))]
DEQ_SHAPES = [(130, 200, (128, 128)), (300, 256, (64, 96)), (576, 7168, (128, 128)), (100, 1000, (32, 48))]
FQ_SHAPES = [(300, 200, (128, 128)), (256, 7168, (128, 128)), (130, 264, (64, 96)), (9, 300, (1, 128))]


@pytest.fixture(scope="module")
def conv():
    path = os.environ.get("DSX_QUANT_CUDA_LIB")
    cuda.cudart()
    with cq.CudaConverter(lib=ctypes.CDLL(path) if path else None, poison=True) as c:
        yield c


def assert_same(got, ref, what: str) -> None:
    """Equal bytes, shape and dtype; else report the first mismatching element."""
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == ref.dtype, f"{what}: {got.dtype}{got.shape} vs {ref.dtype}{ref.shape}"
    g = got.reshape(-1).view(np.uint8 if got.dtype.itemsize == 1 else f"u{got.dtype.itemsize}")
    r = ref.reshape(-1).view(g.dtype)
    bad = np.flatnonzero(g != r)
    assert bad.size == 0, f"{what}: {bad.size} of {g.size} differ, first at {bad[0]}: {g[bad[0]]:#x} vs {r[bad[0]]:#x}"


# ---------------------------------------------------------------- inputs


def fp8_codes(rng, shape) -> np.ndarray:
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x7E  # no NaN codes
    return c


def fp8_weight(rng, n, k, block):
    """Random codes with special rows: all zero (-0.0 first), zero group, tiny and power-of-2 scales."""
    bn, bk = block
    w = fp8_codes(rng, (n, k))
    s = rng.uniform(1e-4, 5e-2, (-(-n // bn), -(-k // bk))).astype(np.float32)
    w[5] = 0
    w[5, 0] = 0x80
    w[6, 64:192] = 0x80
    w[9] = rng.choice([0x08, 0x88], k)  # +-2^-6 times 2^-126: bf16 subnormals, amax / B rounds to 0 ...
    s[9 // bn, :] = 2.0**-126  # ... and the other rows of this block row quantize subnormal values
    s[-1, 0] = 2.0**-4  # exact products: x / scale lands on .5 ties
    return w, s


def float_rows(rng, n, k) -> np.ndarray:
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 1e-30, 3e4], (n, 1))).astype(np.float32)
    x[3] = 0
    x[3, 0] = -0.0
    x[9, :64] = 0
    x[11] = np.round(rng.uniform(-14, 14, k)) * 0.0625  # ties of round-half-away
    x[11, 0] = 0.875
    return x


# ---------------------------------------------------------------- weight-only


def wo_ref(w, s, block, n, rows, bits, group):
    return weight_only.quantize_rows_native(fp8_block.dequant_native(w, s, block, "bfloat16", rows=rows), n, rows,
                                            bits, group, 90)


@pytest.mark.parametrize("shape", WO_SHAPES, ids=lambda c: f"{c[0]}x{c[1]}b{c[2][0]}x{c[2][1]}")
@pytest.mark.parametrize("bits,group", list(itertools.product([4, 8], [-1, 64, 128])))
def test_fp8_to_weight_only(conv, shape, bits, group):
    rng = np.random.default_rng(hash((shape, bits, group)) % 2**32)
    n, k, block = shape
    w, s = fp8_weight(rng, n, k, block)
    half = n // 16 * 8
    for rows in [(0, n), (64, n - 32), (8, 24), (half, n)]:
        ref = wo_ref(w, s, block, n, rows, bits, group)
        got = conv.fp8_to_weight_only_rows(w, s, block, n, rows, bits, group, 90)
        assert_same(got[0], ref[0], f"qbytes {rows}")
        assert_same(got[1], ref[1], f"scale {rows}")
    # chunk rows in, float8 dtype, and every arch of the tiled layout give the same bytes
    rows = (half, n)
    for arch in (75, 80, 86, 89, 100):
        got = conv.fp8_to_weight_only_rows(w[half:].view(fp8_block.E4M3), s, block, n, rows, bits, group, arch)
        assert_same(got[0], ref[0], f"qbytes arch {arch}")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("bits,group", list(itertools.product([4, 8], [-1, 64, 128])))
def test_rows_to_weight_only(conv, dtype, bits, group):
    rng = np.random.default_rng(7 + bits + group)
    n, k = 320, 2048 + 64
    x = float_rows(rng, n, k)
    src = x.astype(BF16) if dtype == "bf16" else x
    for rows in [(0, n), (64, 256)]:
        ref = weight_only.quantize_rows_native(src[rows[0]:rows[1]], n, rows, bits, group, 90)
        got = conv.rows_to_weight_only_rows(src, n, rows, bits, group)
        assert_same(got[0], ref[0], f"qbytes {rows}")
        assert_same(got[1], ref[1], f"scale {rows}")


@pytest.mark.parametrize("scale", [np.nan, np.inf, -np.inf, 3e38, 7.59e35, 1e30, -2.0**-4, 0.0])
@pytest.mark.parametrize("group", [-1, 128])
def test_fp8_to_weight_only_special_scales(conv, scale, group):
    """Per channel, the kernel's absmax pass uses |code| maxima: same outcome as the CPU's per-value absmax."""
    rng = np.random.default_rng(6)
    w, s = fp8_weight(rng, 128, 256, (128, 128))
    s[0, 1] = scale
    cpu = gpu = None
    try:
        cpu = wo_ref(w, s, (128, 128), 128, (0, 128), 4, group)
    except DsxError:
        pass
    try:
        gpu = conv.fp8_to_weight_only_rows(w, s, (128, 128), 128, (0, 128), 4, group)
    except DsxError:
        pass
    assert (cpu is None) == (gpu is None), f"CPU {'refused' if cpu is None else 'accepted'}, GPU did not"
    if cpu is not None:
        assert_same(gpu[0], cpu[0], "qbytes")
        assert_same(gpu[1], cpu[1], "scale")


def test_weight_only_refuses_nonfinite(conv):
    rng = np.random.default_rng(3)
    w, s = fp8_weight(rng, 128, 256, (128, 128))
    w[77, 100] = 0xFF  # NaN code
    for group in (-1, 128):
        with pytest.raises(DsxError, match="NaN or Inf"):
            wo_ref(w, s, (128, 128), 128, (0, 128), 4, group)
        with pytest.raises(DsxError, match="NaN or Inf"):
            conv.fp8_to_weight_only_rows(w, s, (128, 128), 128, (0, 128), 4, group)
    x = float_rows(rng, 64, 128).astype(BF16)
    x[10, 3] = np.inf
    with pytest.raises(DsxError, match="NaN or Inf"):
        conv.rows_to_weight_only_rows(x, 64, (0, 64), 8, 64)
    ok = conv.fp8_to_weight_only_rows(w, s, (128, 128), 128, (0, 72), 4)  # rows without the NaN are fine
    assert_same(ok[0], wo_ref(w, s, (128, 128), 128, (0, 72), 4, -1)[0], "qbytes after an error")


# ---------------------------------------------------------------- dequant


@pytest.mark.parametrize("shape", DEQ_SHAPES, ids=lambda c: f"{c[0]}x{c[1]}b{c[2][0]}x{c[2][1]}")
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_dequant(conv, shape, out_dtype):
    rng = np.random.default_rng(11)
    n, k, (bn, bk) = shape
    w = rng.integers(0, 256, (n, k), dtype=np.uint8)  # NaN codes included
    s = rng.uniform(1e-4, 5e-2, (-(-n // bn), -(-k // bk))).astype(np.float32)
    s[0, 0] = np.inf  # zero codes x inf = invalid: x86's default NaN
    s[-1, -1] = 2.0**-140  # subnormal products
    s[0, -1] = 3e36  # products past bf16's (and float32's) range
    w[: min(n, bn), :bk:3] = 0
    for rows in [(0, n), (3, n - 7), (n - 1, n)]:
        ref = fp8_block.dequant_native(w, s, (bn, bk), out_dtype, rows=rows)
        got = conv.fp8_dequant_rows(w, s, (bn, bk), rows, out_dtype)
        assert_same(got, ref, f"dequant {out_dtype} {rows}")
    if out_dtype == "float32":  # independent: ml_dtypes decode x scale in numpy float32, finite entries
        with np.errstate(invalid="ignore", over="ignore"):
            ind = fp8_block.decode_e4m3_ref(w) * np.repeat(np.repeat(s, bn, 0)[:n], bk, 1)[:, :k]
        fin = np.isfinite(ind)
        assert_same(conv.fp8_dequant_rows(w, s, (bn, bk), None, "float32")[fin], ind[fin], "vs ml_dtypes")


def test_dequant_nan_code_times_nan_scale(conv):
    """Both operands NaN: the scale's NaN wins (quieted), on the GPU and in the CPU kernel (dequant_product)."""
    w = np.array([[0x7F, 0xFF, 0x00, 0x38] * 16] * 2, np.uint8)
    s = np.array([[np.float32(np.nan)]], np.float32)
    s.view(np.uint32)[0, 0] = 0xFFC00001  # negative NaN with a payload
    for od in ("bfloat16", "float32"):
        assert_same(conv.fp8_dequant_rows(w, s, (128, 128), None, od),
                    fp8_block.dequant_native(w, s, (128, 128), od), od)


# ---------------------------------------------------------------- block FP8 quant and requant


@pytest.mark.parametrize("shape", FQ_SHAPES, ids=lambda c: f"{c[0]}x{c[1]}b{c[2][0]}x{c[2][1]}")
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_to_fp8(conv, shape, dtype):
    rng = np.random.default_rng(5)
    n, k, (bn, bk) = shape
    x = (rng.standard_normal((n, k)) * 3).astype(np.float32)
    x[:bn, :bk] = 0  # zero block -> scale 1
    if n > bn:
        x[bn:2 * bn, :bk] *= 1e-44  # amax / 448 underflows -> scale 1
    x[-1, -5:] = [448.0, -464.0, 2.0**-9, 2.0**-10 * 3, 0.0]  # saturation and e4m3 rounding ties
    src = x.astype(BF16) if dtype == "bf16" else x
    for rows in [(0, n), (bn, n), (0, bn)]:
        ref = fp8_block.quantize_native(src, (bn, bk), rows=rows)
        got = conv.to_fp8_rows(src, (bn, bk), rows)
        assert_same(got[0], ref[0], f"codes {rows}")
        assert_same(got[1], ref[1], f"scale_inv {rows}")


@pytest.mark.parametrize("src_block", [(64, 64), (128, 128), (32, 48)])
def test_fp8_requant(conv, src_block):
    rng = np.random.default_rng(9)
    n, k = 320, 7168 + 64
    w = fp8_codes(rng, (n, k))
    s = rng.uniform(1e-4, 1.0, (-(-n // src_block[0]), -(-k // src_block[1]))).astype(np.float32)
    for rows in [(0, n), (128, n), (128, 256)]:
        ref = fp8_block.quantize_native(fp8_block.dequant_native(w, s, src_block, "float32", rows=rows), (128, 128))
        got = conv.fp8_requant_rows(w, s, src_block, (128, 128), rows)
        assert_same(got[0], ref[0], f"codes {rows}")
        assert_same(got[1], ref[1], f"scale_inv {rows}")


def test_fp8_quant_refuses_nonfinite(conv):
    x = np.ones((256, 256), np.float32)
    x[200, 3] = np.nan
    with pytest.raises(DsxError, match="inf/NaN"):
        conv.to_fp8_rows(x)
    conv.to_fp8_rows(x, rows=(0, 128))  # the finite rows quantize


# ---------------------------------------------------------------- the pipeline


def _mixed_jobs(rng):
    """(job, CPU reference) pairs of every kind, sizes growing (the buffers regrow) and shrinking."""
    out = []
    for i, (n, k) in enumerate([(256, 512), (2048, 7168), (128, 256), (1024, 2048), (2048, 7168), (64, 64)]):
        w, s = fp8_weight(rng, n, k, (128, 128))
        bits, group = (4, 8)[i % 2], (-1, 64, 128)[i % 3]
        out.append((cq.fp8_to_weight_only_job(w, s, (128, 128), n, (0, n), bits, group),
                    wo_ref(w, s, (128, 128), n, (0, n), bits, group)))
        if i == 1:
            out.append((cq.fp8_dequant_job(w, s, rows=(5, 1000)), fp8_block.dequant_native(w, s, rows=(5, 1000),
                                                                                           out_dtype="bfloat16")))
            x = float_rows(rng, 512, 1024)
            out.append((cq.to_fp8_job(x), fp8_block.quantize_native(x)))
            out.append((cq.rows_to_weight_only_job(x.astype(BF16), 512, (64, 512), 4, 128),
                        weight_only.quantize_rows_native(x[64:].astype(BF16), 512, (64, 512), 4, 128)))
    return out


@pytest.mark.parametrize("copy", [True, False])
def test_convert_chunks_pipeline(conv, copy):
    pairs = _mixed_jobs(np.random.default_rng(21))
    n = 0
    for (job, ref), got in zip(pairs, conv.convert_chunks([j for j, _ in pairs], copy=copy)):
        got = got if isinstance(got, tuple) else (got,)
        ref = ref if isinstance(ref, tuple) else (ref,)
        for i, (g, r) in enumerate(zip(got, ref)):
            assert_same(g, r, f"{job.what} #{n} output {i}")
        n += 1
    assert n == len(pairs)


def test_pipeline_error_leaves_converter_usable(conv):
    rng = np.random.default_rng(2)
    w, s = fp8_weight(rng, 128, 256, (128, 128))
    bad = w.copy()
    bad[0, 0] = 0x7F
    jobs = [cq.fp8_to_weight_only_job(x, s, (128, 128), 128, (0, 128), 4) for x in (w, bad, w)]
    it = conv.convert_chunks(jobs)
    assert_same(next(it)[0], wo_ref(w, s, (128, 128), 128, (0, 128), 4, -1)[0], "first")
    with pytest.raises(DsxError, match="NaN or Inf"):
        next(it)
    assert_same(conv.run(jobs[0])[0], wo_ref(w, s, (128, 128), 128, (0, 128), 4, -1)[0], "after")


def test_new_pipeline_supersedes_an_abandoned_one(conv):
    rng = np.random.default_rng(8)
    w, s = fp8_weight(rng, 128, 256, (128, 128))
    job = cq.fp8_to_weight_only_job(w, s, (128, 128), 128, (0, 128), 4, 64)
    ref = wo_ref(w, s, (128, 128), 128, (0, 128), 4, 64)
    old = conv.convert_chunks([job] * 5)
    assert_same(next(old)[0], ref[0], "old pipeline")
    assert_same(conv.run(job)[1], ref[1], "new pipeline")  # abandons `old`
    with pytest.raises(DsxError, match="superseded"):
        next(old)
    assert_same(conv.run(job)[0], ref[0], "after")


def test_planted_fault_is_detected(conv):
    """The comparison catches a single changed nibble (and a swapped pair of bytes)."""
    rng = np.random.default_rng(4)
    w, s = fp8_weight(rng, 64, 128, (128, 128))
    q, _ = conv.fp8_to_weight_only_rows(w, s, (128, 128), 64, (0, 64), 4)
    for fault in (lambda a: a.__setitem__(1000, a[1000] ^ 0x10), lambda a: a.__setitem__(slice(0, 2), a[1::-1])):
        f = q.copy()
        fault(f)
        if np.array_equal(f, q):
            continue  # the swapped bytes happened to be equal
        with pytest.raises(AssertionError, match="differ"):
            assert_same(f, q, "planted")
