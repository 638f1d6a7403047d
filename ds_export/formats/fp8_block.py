"""Block FP8 (a8w8_fp8): float8_e4m3fn weights with float32 128x128 block scales.

Byte-level spec: docs/format-fp8-block.md. In short, for a Linear weight [out, in]
(HF layout, row-major):
  weight            float8_e4m3fn [out, in]       (uint8 bits here)
  weight_scale_inv  float32 [ceil(out/bn), ceil(in/bk)], block (bn, bk) = (128, 128)
  dequant:  w[r, c] = float32(decode(weight[r, c])) * scale_inv[r // bn, c // bk]
            (a multiplier; product in float32; bf16 output = RNE of that product)
  quant:    scale_inv = float32(block amax) / 448 (float32 division);
            a block whose scale_inv is 0 (all zeros, or amax/448 underflows) gets 1.0;
            weight = e4m3(x / scale_inv) (float32 division), round to nearest even,
            finite values beyond +-448 saturate to +-448 (DeepSeek's recipe, whose
            GPU cast is saturating; ml_dtypes' cast would give NaN there).
  Edge blocks are ragged (576 rows -> 5 scale rows, the last covering 64 rows).
Activations use the same rule per token in 1 x 128 groups (act_quant_*).

Each operation has a numpy reference (`*_ref`, using ml_dtypes for the fp8 casts)
and a C++ fast path (`*_native`, csrc/cpu/quant_fp8.cc), bit-identical. Native
calls take `rows=(r0, r1)` to process a row chunk of a large tensor: inputs are
the full tensor, outputs hold only that chunk (for quantizers r0 must be a
multiple of the block rows and r1 a multiple or the row count), and an optional
`out=` buffer to fill (e.g. a slice of the output file's mmap). Threads: OpenMP
(OMP_NUM_THREADS); the kernels hold no state, so calls may run concurrently.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError
from ds_export.formats._arrays import column_blocks

BLOCK = (128, 128)
FP8_MAX = 448.0
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
WEIGHT_DTYPE = "float8_e4m3fn"
SCALE_DTYPE = "float32"
SCALE_SUFFIX = "_scale_inv"  # "<...>.weight" -> "<...>.weight_scale_inv"
_OUT_DTYPES = {"float32": 0, "bfloat16": 1}


# ---------------------------------------------------------------- shapes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block(block, what: str | None = None) -> tuple[int, int]:
    """(rows, cols) of a block size, or a DsxError (prefixed with `what`, the calling function)."""
    where = f"{what}: " if what else ""
    try:
        bn, bk = (int(b) for b in block)
    except (TypeError, ValueError):
        raise DsxError(f"{where}block must be two positive ints (rows, cols), got {block!r}") from None
    if bn <= 0 or bk <= 0:
        raise DsxError(f"{where}block must be two positive ints (rows, cols), got {block!r}")
    return bn, bk


def _group(group) -> int:
    if int(group) <= 0:
        raise DsxError(f"activation group size must be a positive int (128 for DeepSeek-V3), got {group!r}")
    return int(group)


def scale_shape(shape, block=BLOCK) -> tuple[int, int]:
    """Shape of weight_scale_inv for a weight of `shape` [out, in]: [ceil(out/bn), ceil(in/bk)]."""
    bn, bk = _block(block)
    out, in_ = (int(d) for d in shape)
    return _cdiv(out, bn), _cdiv(in_, bk)


def packed_shapes(out: int, in_: int, block=BLOCK) -> dict:
    """Output tensors of quantizing an [out, in_] weight, without computing anything.

    Returns {"weight": {"shape", "dtype", "nbytes"}, "weight_scale_inv": {...}}: the keys are
    the tensor-name suffixes written (P.weight, P.weight_scale_inv), dtypes numpy-style names.
    """
    if int(out) < 0 or int(in_) < 0:
        raise DsxError(f"weight shape must be non-negative, got [{out}, {in_}]")
    n, k = int(out), int(in_)
    sn, sk = scale_shape((n, k), block)
    return {
        "weight": {"shape": (n, k), "dtype": WEIGHT_DTYPE, "nbytes": n * k},
        "weight_scale_inv": {"shape": (sn, sk), "dtype": SCALE_DTYPE, "nbytes": 4 * sn * sk},
    }


def check_scale_shape(shape, scale_shape_, block=BLOCK, name: str = "weight") -> None:
    """Raise DsxError unless scale_shape_ == [ceil(out/bn), ceil(in/bk)] for `block`."""
    want = scale_shape(shape, block)
    got = tuple(int(d) for d in scale_shape_)
    if got != want:
        raise DsxError(
            f"{name}{SCALE_SUFFIX}: shape {list(got)} does not match weight {list(shape)} with "
            f"block {list(_block(block))} (expected {list(want)}); check the checkpoint's weight_block_size"
        )


def is_passthrough(shape, scale_shape_, block, target=BLOCK) -> bool:
    """True when an FP8 source can be copied bit-exactly (weight and scale_inv as they are).

    That is exactly when its block equals the target block (both 128x128 by
    default), after checking that scale_shape_ fits `block`; a mismatch raises.
    Re-quantizing instead is not an identity: quantize(dequant(src)) can differ
    from src (the recomputed amax/448 scale is not the source's scale).
    """
    check_scale_shape(shape, scale_shape_, block)
    return _block(block) == _block(target)


# ---------------------------------------------------------------- input checks


def _fp8_bits(w, what: str) -> np.ndarray:
    a = np.asarray(w)
    if a.dtype == E4M3:
        a = a.view(np.uint8)
    if a.dtype != np.uint8 or a.ndim != 2:
        raise DsxError(
            f"{what}: expected a 2-D float8_e4m3fn (or its uint8 bits) [out, in] array, got {a.dtype} {list(a.shape)}"
        )
    return a


def _scales(s, shape, block, what: str) -> np.ndarray:
    a = np.asarray(s)
    if a.dtype != np.float32 or a.ndim != 2:
        raise DsxError(
            f"{what}: scale_inv must be a 2-D float32 array, got {a.dtype} {list(a.shape)}; "
            "block-FP8 scales are float32 (convert other float dtypes with .astype(np.float32))"
        )
    check_scale_shape(shape, a.shape, block, name=what)
    return a


def _float_input(w, what: str) -> np.ndarray:
    """float32 or bfloat16 2-D array (float16 is widened to float32, exactly)."""
    a = np.asarray(w)
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    if a.dtype not in (np.dtype(np.float32), BF16) or a.ndim != 2:
        raise DsxError(
            f"{what}: expected a 2-D float32 or bfloat16 [rows, cols] array, got {a.dtype} {list(a.shape)}; "
            "reshape to 2-D and cast to float32"
        )
    return a


def _rows(rows, n: int, bn: int, aligned: bool, what: str) -> tuple[int, int]:
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= r0 <= r1 <= n:
        raise DsxError(f"{what}: row range {r0}..{r1} is outside 0..{n}")
    if aligned and (r0 % bn or (r1 % bn and r1 != n)):
        raise DsxError(f"{what}: row range {r0}..{r1} must start and end on a {bn}-row block boundary (or end at {n})")
    return r0, r1


# ---------------------------------------------------------------- references (numpy + ml_dtypes)


def encode_e4m3_ref(x) -> np.ndarray:
    """float32 -> e4m3fn bits (uint8): ml_dtypes' RNE cast after clipping to +-448 (saturation)."""
    a = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return np.clip(a, -FP8_MAX, FP8_MAX).astype(E4M3).view(np.uint8)


# All 256 codes cast once by ml_dtypes (the same cast, looked up: a gather instead of ml_dtypes' per-element loop).
_E4M3_TO_F32 = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)


def decode_e4m3_ref(codes, out: np.ndarray | None = None) -> np.ndarray:
    """e4m3fn bits (uint8) -> float32 via ml_dtypes (its cast of each of the 256 codes); into `out` when given."""
    codes = np.asarray(codes, dtype=np.uint8)
    if out is None:
        return _E4M3_TO_F32[codes]
    return np.take(_E4M3_TO_F32, codes, out=out)


def _expand(s: np.ndarray, n: int, k: int, bn: int, bk: int) -> np.ndarray:
    return np.repeat(np.repeat(s, bn, axis=0)[:n], bk, axis=1)[:, :k]


def dequant_ref(w_fp8, scale_inv, block=BLOCK, out: np.ndarray | None = None) -> np.ndarray:
    """[out, in] e4m3 (+ float32 scale_inv) -> float32 [out, in]: decode(w) * scale_inv of its block.

    out: a float32 array of the weight's shape to write into (`dsx verify` reuses one a thread), else a new one."""
    bn, bk = _block(block)
    w = _fp8_bits(w_fp8, "dequant_ref")
    s = _scales(scale_inv, w.shape, block, "dequant_ref")
    if out is not None and (out.dtype != np.float32 or out.shape != w.shape):
        raise DsxError(f"dequant_ref: out must be float32 {list(w.shape)}, got {out.dtype} {list(out.shape)}")
    v = decode_e4m3_ref(w, out)
    n, k = w.shape
    # each row's scales (n x kb, small); the whole column blocks scaled in place, then a last, narrower one if any
    rows = np.repeat(s, bn, axis=0)[:n]
    whole = k // bk
    with np.errstate(over="ignore", invalid="ignore"):  # (an overflowing product is Inf, as in C++: callers judge it)
        if whole:
            column_blocks(v, bk)[...] *= rows[:, :whole, None]
        if k % bk:
            v[:, whole * bk:] *= rows[:, whole:]
    return v


def _block_quant_ref(w, bn: int, bk: int, what: str):
    x = _float_input(w, what).astype(np.float32)
    n, k = x.shape
    if not np.isfinite(x).all():
        raise DsxError(f"{what}: input has inf/NaN values; FP8 block quantization needs finite weights")
    nb, kb = _cdiv(n, bn), _cdiv(k, bk)
    pad = np.zeros((nb * bn, kb * bk), np.float32)
    pad[:n, :k] = np.abs(x)
    amax = pad.reshape(nb, bn, kb, bk).max(axis=(1, 3))
    s = amax / np.float32(FP8_MAX)
    s[s == 0] = np.float32(1.0)
    q = encode_e4m3_ref(x / _expand(s, n, k, bn, bk))
    return q, s.astype(np.float32)


def quantize_ref(w, block=BLOCK):
    """float32/bfloat16 [out, in] -> (e4m3 bits uint8 [out, in], scale_inv float32 [ceil(out/bn), ceil(in/bk)])."""
    bn, bk = _block(block)
    return _block_quant_ref(w, bn, bk, "quantize_ref")


def requant_ref(w_fp8, scale_inv, src_block, block=BLOCK):
    """FP8 with blocks `src_block` -> float32 (dequant_ref) -> FP8 with blocks `block` (quantize_ref).

    When is_passthrough (same blocks) the source is returned as a copy, bit for bit.
    """
    w = _fp8_bits(w_fp8, "requant_ref")
    if is_passthrough(w.shape, np.shape(scale_inv), src_block, block):
        return w.copy(), _scales(scale_inv, w.shape, src_block, "requant_ref").copy()
    return quantize_ref(dequant_ref(w, scale_inv, src_block), block)


def act_quant_ref(x, group: int = 128):
    """Per-token activations [M, K] -> (e4m3 bits [M, K], scale float32 [M, ceil(K/group)]), scale = amax/448."""
    return _block_quant_ref(x, 1, _group(group), "act_quant_ref")


# ---------------------------------------------------------------- native (csrc/cpu/quant_fp8.cc)


def block_slice(shape, scale_shape_, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None,
                block=BLOCK, name: str = "weight") -> tuple[tuple[slice, slice], tuple[slice, slice]]:
    """Index of the part w[r0:r1, c0:c1] of a block-scaled FP8 weight and of its scales, validated.

    Each edge of the part must lie on a block boundary or at the end of the tensor, so that its
    blocks are whole blocks of the source (a tensor-parallel rank's share; DeepSeek-V3's splits over
    8 or 16 ranks all are). Otherwise a DsxError says which edge.
    """
    bn, bk = _block(block)
    check_scale_shape(shape, scale_shape_, (bn, bk), name)
    n, k = int(shape[0]), int(shape[1])
    r0, r1 = rows if rows is not None else (0, n)
    c0, c1 = cols if cols is not None else (0, k)
    if not (0 <= r0 < r1 <= n and 0 <= c0 < c1 <= k):
        raise DsxError(f"{name}: slice rows {r0}:{r1} cols {c0}:{c1} is outside {[n, k]}")
    for edge, size, b, what in ((r0, n, bn, "row"), (r1, n, bn, "row"), (c0, k, bk, "column"), (c1, k, bk, "column")):
        if edge % b and edge != size:
            raise DsxError(f"{name} {[n, k]}: a {what} split at {edge} cuts a {bn}x{bk} FP8 scale block",
                           hint="choose a tensor-parallel degree whose shares are multiples of the block, "
                                "or export from a bf16 checkpoint")
    return ((slice(r0, r1), slice(c0, c1)),
            (slice(r0 // bn, -(-r1 // bn)), slice(c0 // bk, -(-c1 // bk))))


def slice_blocks(w_fp8, scale_inv, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None,
                 block=BLOCK, name: str = "weight"):
    """(w[r0:r1, c0:c1], its scale_inv): whole blocks, bit-exact (no requantization); see block_slice."""
    wi, si = block_slice(w_fp8.shape, np.shape(scale_inv), rows, cols, block, name)
    return np.ascontiguousarray(w_fp8[wi]), np.ascontiguousarray(np.asarray(scale_inv)[si])

@functools.lru_cache(maxsize=None)
def _fn(name: str):
    from ds_export.native import I32, I64, P, bind

    sigs = {
        "dsx_f32_to_fp8_e4m3_sat": (P, I64, P),
        "dsx_fp8_e4m3_to_f32": (P, I64, P),
        "dsx_fp8_e4m3_count_nan": (P, I64, P, P),
        "dsx_fp8_block_dequant_rowmajor": (P, P, I64, I64, I64, I64, I64, I64, I32, P),
        "dsx_fp8_block_quant_f32_rowmajor": (P, I64, I64, I64, I64, I64, I64, P, P),
        "dsx_fp8_block_quant_bf16_rowmajor": (P, I64, I64, I64, I64, I64, I64, P, P),
    }
    return bind(name, *sigs[name])


def _call_rc(rc: int, name: str) -> None:
    from ds_export.native import check

    check(rc, name)


def _call(name: str, *args) -> None:
    _call_rc(_fn(name)(*args), name)


def _p(a: np.ndarray):
    from ds_export.native import ptr

    return ptr(a)


def encode_e4m3_native(x) -> np.ndarray:
    """float32 -> e4m3fn bits (uint8), C++ integer RNE with saturation; == encode_e4m3_ref."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(a.shape, np.uint8)
    _call("dsx_f32_to_fp8_e4m3_sat", _p(a), a.size, _p(out))
    return out


def decode_e4m3_native(codes) -> np.ndarray:
    """e4m3fn bits -> float32 through the C++ 256-entry table."""
    a = np.ascontiguousarray(codes, dtype=np.uint8)
    out = np.empty(a.shape, np.float32)
    _call("dsx_fp8_e4m3_to_f32", _p(a), a.size, _p(out))
    return out


def count_nan_ref(codes) -> tuple[int, int]:
    """(number of NaN codes, flat index of the first or -1) among e4m3fn bits: 0x7F and 0xFF are its only NaNs (it
    has no infinities)."""
    a = np.asarray(codes).view(np.uint8).reshape(-1)
    nan = (a & 0x7F) == 0x7F
    n = int(np.count_nonzero(nan))
    return n, int(np.argmax(nan)) if n else -1


def count_nan_native(codes) -> tuple[int, int]:
    """count_nan_ref in one pass in C++ (at memory speed): the same pair."""
    import ctypes

    a = np.ascontiguousarray(np.asarray(codes).view(np.uint8)).reshape(-1)
    n, first = ctypes.c_int64(), ctypes.c_int64()
    _call("dsx_fp8_e4m3_count_nan", _p(a), a.size, ctypes.addressof(n), ctypes.addressof(first))
    return n.value, first.value


def _out_array(out, shape, dtypes, what: str) -> np.ndarray:
    """A caller's output buffer (checked) or a new one; returned as the first of `dtypes`' bits."""
    if out is None:
        return np.empty(shape, dtypes[0])
    a = out
    if not isinstance(a, np.ndarray) or a.dtype not in [np.dtype(d) for d in dtypes] or a.shape != tuple(shape):
        got = f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
        raise DsxError(f"{what}: out must be a {np.dtype(dtypes[-1]).name} array of shape {list(shape)}, got {got}")
    if not (a.flags.c_contiguous and a.flags.writeable):
        raise DsxError(f"{what}: out must be C-contiguous and writable (pass a fresh np.empty or a writable mmap)")
    return a.view(dtypes[0])


def dequant_native(w_fp8, scale_inv, block=BLOCK, out_dtype: str = "float32", rows=None, *, out=None) -> np.ndarray:
    """C++ dequant of rows [r0, r1) (default all) -> float32 or bfloat16 [r1-r0, in].

    bfloat16 = RNE of the float32 product (bit-identical to to_bf16_ref(dequant_ref(...))).
    `out`: optional C-contiguous buffer of that shape (float32, or bfloat16/uint16) to fill.
    """
    if out_dtype not in _OUT_DTYPES:
        raise DsxError(f"dequant out_dtype must be one of {sorted(_OUT_DTYPES)}, got {out_dtype!r}")
    bn, bk = _block(block)
    w = np.ascontiguousarray(_fp8_bits(w_fp8, "dequant_native"))
    s = np.ascontiguousarray(_scales(scale_inv, w.shape, block, "dequant_native"))
    n, k = w.shape
    r0, r1 = _rows(rows, n, bn, False, "dequant_native")
    dts = (np.float32,) if out_dtype == "float32" else (np.uint16, BF16)
    buf = _out_array(out, (r1 - r0, k), dts, "dequant_native")
    _call("dsx_fp8_block_dequant_rowmajor", _p(w), _p(s), n, k, bn, bk, r0, r1, _OUT_DTYPES[out_dtype], _p(buf))
    return buf if out_dtype == "float32" else buf.view(BF16)


def _block_quant_native(w, bn: int, bk: int, rows, out, what: str):
    x = _float_input(w, what)
    kind = "f32" if x.dtype == np.float32 else "bf16"
    x = np.ascontiguousarray(x if kind == "f32" else x.view(np.uint16))
    n, k = x.shape
    r0, r1 = _rows(rows, n, bn, True, what)
    q_out, s_out = (None, None) if out is None else out
    q = _out_array(q_out, (r1 - r0, k), (np.uint8, E4M3), what + " codes")
    s = _out_array(s_out, (_cdiv(r1, bn) - r0 // bn, _cdiv(k, bk)), (np.float32,), what + " scales")
    name = f"dsx_fp8_block_quant_{kind}_rowmajor"
    rc = _fn(name)(_p(x), n, k, bn, bk, r0, r1, _p(q), _p(s))
    if rc == -1:  # shapes were checked above, so EINVAL here means non-finite input
        raise DsxError(
            f"{what}: input [{n}, {k}] has inf/NaN values in rows {r0}..{r1}; "
            "FP8 block quantization needs finite weights"
        )
    _call_rc(rc, name)
    return q, s


def quantize_native(w, block=BLOCK, rows=None, *, out=None):
    """C++ quantize of rows [r0, r1) (block aligned) -> (e4m3 bits uint8 [r1-r0, in], scale_inv float32).

    The scale holds scale rows r0/bn .. ceil(r1/bn). `out`: optional (codes, scales)
    buffers of those shapes (codes uint8 or float8_e4m3fn) to fill; returned as uint8.
    """
    bn, bk = _block(block)
    return _block_quant_native(w, bn, bk, rows, out, "quantize_native")


def act_quant_native(x, group: int = 128, rows=None, *, out=None):
    """C++ per-token activation quant of rows [r0, r1) -> (e4m3 bits [r1-r0, K], scale [r1-r0, ceil(K/group)])."""
    return _block_quant_native(x, 1, _group(group), rows, out, "act_quant_native")


def requant_native(w_fp8, scale_inv, src_block, block=BLOCK, rows=None, chunk_rows: int = 1024):
    """C++ requant: FP8 with `src_block` -> float32 -> FP8 with `block`, for rows [r0, r1) (aligned to block).

    Processed in chunks of `chunk_rows` (rounded up to the block rows), so the
    float32 scratch is at most chunk_rows x in floats. Bit-identical to requant_ref;
    when is_passthrough (same blocks) the source rows are returned as a copy.
    """
    bn, _ = _block(block)
    w = np.ascontiguousarray(_fp8_bits(w_fp8, "requant_native"))
    s_src = np.ascontiguousarray(_scales(scale_inv, w.shape, src_block, "requant_native"))
    n, k = w.shape
    r0, r1 = _rows(rows, n, bn, True, "requant_native")
    if is_passthrough(w.shape, s_src.shape, src_block, block):
        return w[r0:r1].copy(), s_src[r0 // bn : _cdiv(r1, bn)].copy()
    step = max(bn, _cdiv(int(chunk_rows), bn) * bn)
    qs, ss = [], []
    for c0 in range(r0, r1, step):
        c1 = min(c0 + step, r1)
        f = dequant_native(w, s_src, src_block, "float32", rows=(c0, c1))
        q, s = quantize_native(f, block)
        qs.append(q)
        ss.append(s)
    if not qs:
        return np.empty((0, k), np.uint8), np.empty((0, _cdiv(k, _block(block)[1])), np.float32)
    return np.concatenate(qs), np.concatenate(ss)
