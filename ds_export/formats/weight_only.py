"""Weight-only INT8 / INT4, byte-identical with Paddle's CPU `weight_quantize`.

Contract: for an HF-layout weight ``w`` [out, in] (bfloat16),
``quantize_ref(w, bits, group_size, arch)`` returns exactly the bytes of
``paddle.nn.quant.weight_quantize(w.T, algo=f"weight_only_int{bits}", arch=arch,
group_size=group_size)`` (Paddle 3.3.1, CPU build): the int8 tensor and the
bfloat16 scale. The byte layout is specified in docs/format-weight-only.md;
this module is its executable reference, written step by step as the spec
reads (numpy, slow, clear). `quantize_native` is the compiled fast path
(csrc/cpu/quant_weight_only.cc), which derives the same layout independently
from a per-tile index table; tests hold the two and Paddle equal bit for bit.

Shapes (N = out_features, K = in_features):
  qweight int8 [N, K] (bits 8) or [N // 2, K] (bits 4, two nibbles a byte)
  scale   bfloat16 [N] (group_size -1) or [ceil(K / group_size), N]
Accepted: bits 4 | 8; group_size -1 | 64 | 128; arch 70 | 75 | 80 | 86 | 89 | 90 |
100 (75..100 give identical bytes). arch >= 75 needs K % 64 == 0 and N % 64 == 0
(Paddle's CPU op corrupts memory otherwise, so such shapes are refused, never
padded silently); arch 70 needs N % 16 == 0 (Paddle's own check). Non-finite weights are refused.

Chunkability: output channels (rows of ``w``) are independent. Any range
[r0, r1) with r0, r1 multiples of ROW_ALIGN (8) maps to its own bytes of
qweight (for arch >= 75 the contiguous byte range [r0*K*bits/8, r1*K*bits/8);
for arch 70 columns r0*bits/8 .. r1*bits/8 of every one of the K byte rows) and
to scale columns [r0, r1). `quantize_native(..., out=(q, s), rows=(r0, r1))`
fills exactly those bytes, so a tensor can be processed in row chunks with
bounded memory or in parallel, and the result equals the one-shot call.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError
from ds_export.formats._arrays import column_blocks

BF16 = ml_dtypes.bfloat16
ARCHS = (70, 75, 80, 86, 89, 90, 100)
BITS = (4, 8)
GROUP_SIZES = (-1, 64, 128)
ROW_ALIGN = 8  # chunk boundaries (output channels) must be multiples of this
TILE_K = 64  # arch >= 75: K is laid out in tiles of 64 elements
ENONFINITE = -10  # DSX_WO_ENONFINITE in csrc/include/dsx/quant_weight_only.h


def _interleave(bits: int) -> int:
    """Output channels sharing one column-major tile (ColumnMajorTileInterleave)."""
    return 2 if bits == 8 else 4


def _bound(bits: int) -> np.float32:
    return np.float32(127.0 if bits == 8 else 7.0)


# ---------------------------------------------------------------- validation


def check_args(
    out_features: int, in_features: int, bits: int, group_size: int, arch: int, name: str = "weight"
) -> None:
    """Raise DsxError unless (shape, bits, group_size, arch) is a supported combination."""
    if bits not in BITS:
        raise DsxError(f"{name}: weight-only bits must be 4 or 8, got {bits}")
    if group_size not in GROUP_SIZES:
        raise DsxError(f"{name}: weight-only group_size must be -1, 64 or 128, got {group_size}")
    if arch not in ARCHS:
        raise DsxError(f"{name}: weight-only arch must be one of {ARCHS}, got {arch} (use 90 for H100/H800/H200)")
    n, k = int(out_features), int(in_features)
    if n <= 0 or k <= 0:
        raise DsxError(f"{name}: empty weight [out={n}, in={k}] cannot be weight-only quantized")
    if arch == 70:
        if n % 16:
            raise DsxError(f"{name}: out_features {n} must be a multiple of 16 for weight-only arch 70 (Paddle's rule)")
    elif k % 64 or n % 64:
        raise DsxError(
            f"{name}: weight-only arch {arch} needs out and in features that are multiples of 64, "
            f"got [out={n}, in={k}] (Paddle's layout tiles by 64; keep this tensor in bf16 or pad it)"
        )


def packed_shapes(out_features: int, in_features: int, bits: int, group_size: int = -1, arch: int = 90) -> dict:
    """Shapes/dtypes/bytes of the outputs without computing anything (validates the arguments).

    Returns {"qweight": {"shape", "dtype", "nbytes"}, "scale": {...}}; dtypes are
    numpy-style names ("int8", "bfloat16").
    """
    check_args(out_features, in_features, bits, group_size, arch)
    n, k = int(out_features), int(in_features)
    qshape = (n, k) if bits == 8 else (n // 2, k)
    sshape = (n,) if group_size == -1 else (-(-k // group_size), n)
    return {
        "qweight": {"shape": qshape, "dtype": "int8", "nbytes": qshape[0] * k},
        "scale": {"shape": sshape, "dtype": "bfloat16", "nbytes": 2 * int(np.prod(sshape))},
    }


def _as_bf16(w: np.ndarray, name: str = "weight") -> np.ndarray:
    """bfloat16 [N, K] view of `w`; float32 input is rounded to bf16 (nearest-even) first."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise DsxError(f"{name}: weight-only quantization needs a 2-D [out, in] weight, got shape {w.shape}")
    if w.dtype == np.float32:
        w = w.astype(BF16)
    elif w.dtype != BF16:
        raise DsxError(f"{name}: weight-only quantization takes bfloat16 or float32, got {w.dtype}")
    if not np.isfinite(w.astype(np.float32)).all():
        raise DsxError(f"{name}: weight contains NaN or Inf; weight-only quantization refuses non-finite weights")
    return w


# ---------------------------------------------------------------- rounding


def scales_ref(w: np.ndarray, bits: int, group_size: int) -> np.ndarray:
    """bf16 scales, Paddle's shape: absmax / bound in float32, rounded to bf16 (nearest even).

    Per channel, Paddle seeds the running max with the signed first element,
    so an all-zero channel whose first element is -0.0 gets scale -0.0.
    """
    w32 = w.astype(np.float32)
    n, k = w32.shape
    if group_size == -1:
        amax = np.abs(w32).max(axis=1)
        amax = np.where(amax == 0, w32[:, 0], amax)  # keeps the sign of a -0.0 seed
        return (amax / _bound(bits)).astype(BF16)
    ng = -(-k // group_size)
    pad = np.zeros((n, ng * group_size), np.float32)
    pad[:, :k] = np.abs(w32)
    amax = pad.reshape(n, ng, group_size).max(axis=2)
    return np.ascontiguousarray((amax / _bound(bits)).T).astype(BF16)


def _round_clip(v: np.ndarray, bits: int) -> np.ndarray:
    """round(v) half away from zero, then Paddle's clip, with its NaN/Inf outcomes.

    int8: r = round(v); min(127, r) keeps 127 when r is NaN; then max(-127, .).
    int4: (int)round(v) first (x86: NaN/Inf/out of range -> INT_MIN), then clip to
    [-7, 7]; so NaN and +-Inf (only from a zero scale) become -7.
    """
    with np.errstate(invalid="ignore"):  # NaN / Inf quotients are handled below
        t = np.trunc(v)
        r = t + np.where(np.abs(v - t) >= 0.5, np.sign(v), 0).astype(np.float32)
    if bits == 8:
        c = np.where(r < 127, r, np.float32(127))
        c = np.where(np.float32(-127) < c, c, np.float32(-127))
        return c.astype(np.int8)
    in_range = (r >= -(2.0**31)) & (r < 2.0**31)
    c = np.where(in_range, np.clip(np.where(in_range, r, 0), -7, 7), -7)
    return c.astype(np.int8)


def quantize_signed_ref(w: np.ndarray, bits: int, group_size: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Signed integers q [N, K] (int8 holding -127..127 or -7..7) and bf16 scales."""
    w = _as_bf16(w)
    scale = scales_ref(w, bits, group_size)
    s32 = scale.astype(np.float32)
    per_col = s32[:, None] if group_size == -1 else np.repeat(s32.T, group_size, axis=1)[:, : w.shape[1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = w.astype(np.float32) / per_col
    return _round_clip(v, bits), scale


# ---------------------------------------------------------------- layout


def row_permutation(bits: int) -> np.ndarray:
    """f(t) for one MMA group of G = 128/bits rows: permuted row t reads source row f(t)."""
    e = 32 // bits
    t = np.arange(8 * 16 // bits)
    return 8 * ((t % e) // 2) + t % 2 + 2 * (t // e)


def word_order(bits: int) -> np.ndarray:
    """Within each 32-bit word, destination slot d holds source element order[d]."""
    return np.array([0, 2, 1, 3]) if bits == 8 else np.array([0, 2, 4, 6, 1, 3, 5, 7])


def _pack_elements(u: np.ndarray, bits: int) -> np.ndarray:
    """Flat unsigned elements (0..255 or 0..15) -> bytes after the in-word interleave."""
    e = 32 // bits
    u = u.reshape(-1, e)[:, word_order(bits)].reshape(-1)
    if bits == 4:
        u = u[0::2] | (u[1::2] << 4)  # low nibble = even element
    return u.astype(np.uint8)


def _unpack_elements(b: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of _pack_elements: bytes -> flat unsigned elements in pre-interleave order."""
    b = b.reshape(-1).astype(np.uint8)
    if bits == 4:
        u = np.empty(b.size * 2, np.uint8)
        u[0::2], u[1::2] = b & 0xF, b >> 4
    else:
        u = b.copy()
    e = 32 // bits
    out = np.empty_like(u.reshape(-1, e))
    out[:, word_order(bits)] = u.reshape(-1, e)
    return out.reshape(-1)


def _element_order(n: int, k: int, bits: int, arch: int) -> np.ndarray:
    """Signed q [N, K] -> flat element sequence before bias and word interleave.

    Returns the (n, k) source of each output element as a flat index n*K + k.
    arch 70: row-major [K, N]. arch >= 75: rows (K) permuted in groups of
    128/bits, transposed to column-major, then columns interleaved by I in
    tiles of 64 along K: order (n // I, k // 64, n % I, k % 64).
    """
    idx = np.arange(n * k).reshape(n, k)  # idx[n, k] = n*K + k
    if arch == 70:
        return idx.T.reshape(-1)
    g = 128 // bits
    f = row_permutation(bits)
    # permuted K position p = base + t holds source row base + f(t)
    perm = (np.arange(k).reshape(-1, g)[:, f]).reshape(-1)
    t = idx[:, perm]  # [N, K'] after row permutation and transpose
    i = _interleave(bits)
    return t.reshape(n // i, i, k // TILE_K, TILE_K).transpose(0, 2, 1, 3).reshape(-1)


def pack_ref(q: np.ndarray, bits: int, arch: int) -> np.ndarray:
    """Signed q [N, K] -> Paddle's int8 qweight ([N, K] or [N // 2, K])."""
    n, k = q.shape
    flat = q.reshape(-1)[_element_order(n, k, bits, arch)].astype(np.int16)
    u = (flat + (128 if bits == 8 else 8)) & (0xFF if bits == 8 else 0xF)
    rows = n if bits == 8 else n // 2
    return _pack_elements(u, bits).view(np.int8).reshape(rows, k)


def unpack_ref(qweight: np.ndarray, bits: int, arch: int, in_features: int) -> np.ndarray:
    """Paddle's qweight -> the signed integer matrix q [N, K] (int8) before scaling."""
    qweight = np.ascontiguousarray(qweight)
    k = int(in_features)
    return unpacker(qweight.size * 8 // bits // k, k, bits, arch)(qweight)


def unpacker(out_features: int, in_features: int, bits: int, arch: int):
    """unpack_ref for the qweights of one shape [N, K], the layout's element order built once (an index of the whole
    weight: `decoder` is the fast way to many parts' values)."""
    n, k = int(out_features), int(in_features)
    check_args(n, k, bits, -1, arch, "qweight")
    want = n * k * bits // 8
    order = _element_order(n, k, bits, arch)

    def unpack(qweight: np.ndarray) -> np.ndarray:
        qweight = np.ascontiguousarray(qweight)
        if qweight.dtype not in (np.int8, np.uint8) or qweight.size != want:
            raise DsxError(f"qweight: expected int8 with {want} bytes for in={k}, got {qweight.dtype} {qweight.shape}")
        u = _unpack_elements(qweight.view(np.uint8), bits).astype(np.int16) - (128 if bits == 8 else 8)
        q = np.empty(n * k, np.int8)
        q[order] = u
        return q.reshape(n, k)
    return unpack


@functools.lru_cache(maxsize=None)
def _tile_gather(bits: int) -> np.ndarray:
    """arch >= 75: where each element of one tile (I channels x TILE_K inputs, in (channel, input) order) is in the
    tile's bytes: a byte index (int8), or an index into [the tile's low nibbles, then its high nibbles] (int4). Read off
    the reference's own element order and in-word interleave for a weight of one tile."""
    i, e = _interleave(bits), 32 // bits
    seq = _element_order(i, TILE_K, bits, 90)  # sequence position -> element (channel * TILE_K + input)
    slot = np.arange(i * TILE_K)  # the tile's elements as stored (bytes, or nibbles low first), in memory order
    held = seq[slot // e * e + word_order(bits)[slot % e]]  # the element each stored slot holds
    where = np.empty_like(slot)
    where[held] = slot
    if bits == 4:
        where = where % 2 * (i * TILE_K // 2) + where // 2
    return where


_F32_MAX = float(np.finfo(np.float32).max)


def decoder(out_features: int, in_features: int, bits: int, group_size: int, arch: int):
    """dequantize_ref for qweights of one shape [N, K], in float64 and without its per-element index:
    decode(qweight, scale, out=None) -> [N, K] float64, written into `out` (float64, N * K elements at least) if
    given. `dsx verify` decodes every weight-only part with it.

    The same numbers as dequantize_ref's float32, widened: q has at most 8 significant bits and a bf16 scale 8, so
    q * scale is exact in float32 and in float64 alike. arch >= 75 gathers each tile's elements from its bytes (one
    small index, `_tile_gather`) and places the tiles by a transposed copy, where unpack_ref scatters every element
    through an index of the whole weight. arch 70, and scales large enough that the float32 product could overflow
    (or not finite), go through dequantize_ref itself."""
    n, k = int(out_features), int(in_features)
    check_args(n, k, bits, group_size, arch, "qweight")
    want_q, want_s = (tuple(v["shape"]) for v in packed_shapes(n, k, bits, group_size, arch).values())
    i = _interleave(bits)
    tile_bytes = i * TILE_K * bits // 8
    where = None if arch == 70 else _tile_gather(bits)
    bias, limit = (128.0, _F32_MAX / 256) if bits == 8 else (8.0, _F32_MAX / 16)

    def decode(qweight: np.ndarray, scale, out: np.ndarray | None = None) -> np.ndarray:
        qweight = np.ascontiguousarray(qweight)
        if qweight.dtype not in (np.int8, np.uint8) or qweight.shape != want_q:
            raise DsxError(f"qweight: expected int8 {list(want_q)} for [out={n}, in={k}], got {qweight.dtype} "
                           f"{list(qweight.shape)}")
        s = np.asarray(scale).astype(np.float64)
        if s.shape != want_s:
            raise DsxError(f"scale: expected shape {list(want_s)} for [out={n}, in={k}] group {group_size}, "
                           f"got {list(s.shape)}")
        res = (np.empty((n, k)) if out is None else out.reshape(-1)[: n * k]).reshape(n, k)
        if where is None or not np.all(np.abs(s) <= limit):  # (NaN scales too)
            np.copyto(res, dequantize_ref(qweight, scale, bits, group_size, arch, k))
            return res
        b = qweight.view(np.uint8).reshape(-1, tile_bytes)
        if bits == 4:
            codes = np.empty((b.shape[0], 2 * tile_bytes), np.uint8)
            np.bitwise_and(b, 0xF, out=codes[:, :tile_bytes])
            np.right_shift(b, 4, out=codes[:, tile_bytes:])
        else:
            codes = b
        tiles = np.take(codes, where, axis=1)  # [tiles, I * TILE_K]: each tile's elements, channel by channel
        np.copyto(res.reshape(n // i, i, k // TILE_K, TILE_K),
                  tiles.reshape(n // i, k // TILE_K, i, TILE_K).transpose(0, 2, 1, 3))
        res -= bias
        if group_size == -1:
            res *= s[:, None]
        else:
            whole = k // group_size
            if whole:
                column_blocks(res, group_size)[...] *= s[:whole].T[:, :, None]
            if k % group_size:
                res[:, whole * group_size:] *= s[whole][:, None]
        return res
    return decode


def bound_count(qweight: np.ndarray, bits: int) -> int:
    """How many elements of a qweight are at the format's bound, |q| >= 127 (int8) or 7 (int4), the codes -128 / -8
    included; read from the bytes, as the count does not depend on the layout's order. (Stored codes are q + 128 or
    q + 8: the bound is codes 0, 1 and 255 or 15.)"""
    b = np.ascontiguousarray(qweight).view(np.uint8).reshape(-1)
    top = 255 if bits == 8 else 15
    fields = (b,) if bits == 8 else (b & 0xF, b >> 4)
    return sum(int(np.count_nonzero(c <= 1)) + int(np.count_nonzero(c == top)) for c in fields)


def quantize_ref(w: np.ndarray, bits: int, group_size: int = -1, arch: int = 90) -> tuple[np.ndarray, np.ndarray]:
    """Reference quantizer: HF weight [N, K] (bf16, or float32 rounded to bf16) -> (qweight int8, scale bf16).

    Byte-identical with paddle.nn.quant.weight_quantize(w.T, ...) on CPU.
    """
    w = _as_bf16(w)
    check_args(w.shape[0], w.shape[1], bits, group_size, arch)
    q, scale = quantize_signed_ref(w, bits, group_size)
    return pack_ref(q, bits, arch), scale


def dequantize_ref(qweight, scale, bits: int, group_size: int, arch: int, in_features: int) -> np.ndarray:
    """Undo the layout and apply the scale: float32 [N, K] (what the GEMM sees)."""
    return scale_ref(unpack_ref(qweight, bits, arch, in_features), scale, bits, group_size, arch)


def scale_ref(q: np.ndarray, scale, bits: int, group_size: int, arch: int) -> np.ndarray:
    """dequantize_ref's second step: signed q [N, K] (unpack_ref's) times its scales -> float32 [N, K]."""
    n, k = q.shape
    s = np.asarray(scale).astype(np.float32)
    want = packed_shapes(n, k, bits, group_size, arch)["scale"]["shape"]
    if s.shape != want:
        raise DsxError(f"scale: expected shape {want} for [out={n}, in={k}] group {group_size}, got {s.shape}")
    per = s[:, None] if group_size == -1 else np.repeat(s.T, group_size, axis=1)[:, :k]
    return q.astype(np.float32) * per


def slice_plan(out_features: int, in_features: int, bits: int, group_size: int, arch: int,
               rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None) -> dict:
    """Validate a part rows=(n0, n1) x cols=(k0, k1) of a stored weight (see slice_ref) without data.

    Returns {"rows", "cols", "qweight": shape, "scale": shape, "scale_index": (row slice, col slice
    or None)} of the part; DsxError when the part is not a valid weight-only shape of its own.
    """
    n, k = int(out_features), int(in_features)
    n0, n1 = rows if rows is not None else (0, n)
    k0, k1 = cols if cols is not None else (0, k)
    if not (0 <= n0 < n1 <= n and 0 <= k0 < k1 <= k):
        raise DsxError(f"qweight: slice rows {n0}:{n1} cols {k0}:{k1} is outside [out={n}, in={k}]")
    shapes = packed_shapes(n1 - n0, k1 - k0, bits, group_size, arch)  # checks the part's shape
    if group_size == -1:
        index = (slice(n0, n1), None)
    else:
        if k0 % group_size:
            raise DsxError(f"qweight: an input slice starting at {k0} splits a scale group of {group_size}")
        index = (slice(k0 // group_size, -(-k1 // group_size)), slice(n0, n1))
    return {"rows": (n0, n1), "cols": (k0, k1), "qweight": shapes["qweight"]["shape"],
            "scale": shapes["scale"]["shape"], "scale_index": index}


def slice_scale(scale, plan: dict) -> np.ndarray:
    """The scale of the part described by `slice_plan`."""
    a, b = plan["scale_index"]
    s = np.asarray(scale)
    return np.ascontiguousarray(s[a] if b is None else s[a, b])


def slice_ref(qweight, scale, bits: int, group_size: int, arch: int, in_features: int,
              rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None):
    """Part of a stored weight, in Paddle's layout: output channels rows=(n0, n1), inputs cols=(k0, k1).

    Returns (qweight, scale) of the sub-matrix q[n0:n1, k0:k1] with its scales s[n0:n1] (or
    s[k0/g : ceil(k1/g), n0:n1]): the same integers and scales, re-laid out for the smaller shape,
    so dequantize_ref of the result is exactly the matching block of dequantize_ref of the input.
    This is a tensor-parallel rank's share of a quantized Linear (column split = rows, row split =
    cols). It is not what `weight_quantize` of the bf16 sub-matrix would give for a cols split with
    per-channel scales (that would take the absmax of the part only); keeping the full weight's
    scales makes N ranks compute exactly the tp = 1 model. The part must itself be a valid shape
    (multiples of 64 for arch >= 75) and a cols split of grouped scales must start on a group.
    """
    k = int(in_features)
    q = unpack_ref(qweight, bits, arch, k)
    plan = slice_plan(q.shape[0], k, bits, group_size, arch, rows, cols)
    (n0, n1), (k0, k1) = plan["rows"], plan["cols"]
    return pack_ref(np.ascontiguousarray(q[n0:n1, k0:k1]), bits, arch), slice_scale(scale, plan)

def slice_packed(qweight, bits: int, arch: int, in_features: int, plan: dict) -> np.ndarray:
    """The qweight of the part described by `slice_plan`, cut from the packed bytes directly.

    For arch >= 75 the bytes are tiles of I output channels x 64 inputs in the order (n // I,
    k // 64) (I = 2 for int8, 4 for int4), and the row permutation and the in-word interleave stay
    inside a tile, so a part on 64-aligned bounds is the sub-array of whole tiles, in the same
    order: a strided copy instead of unpacking and repacking (what slice_ref does, and what the
    tests compare this with bit for bit). arch 70 (row-major [K, N] bytes) goes through slice_ref.
    """
    if arch == 70:
        raise DsxError("slice_packed: arch 70 bytes are row-major; use slice_ref")
    k = int(in_features)
    q = np.ascontiguousarray(qweight).view(np.uint8)
    i = _interleave(bits)
    n = q.size * 8 // bits // k
    (n0, n1), (k0, k1) = plan["rows"], plan["cols"]
    if n0 % i or n1 % i or k0 % TILE_K or k1 % TILE_K:
        raise DsxError(f"slice_packed: rows {n0}:{n1} / cols {k0}:{k1} are not on whole {i}x{TILE_K} tiles")
    tile = i * TILE_K * bits // 8
    tiles = q.reshape(n // i, k // TILE_K, tile)[n0 // i: n1 // i, k0 // TILE_K: k1 // TILE_K]
    return np.ascontiguousarray(tiles).reshape(plan["qweight"]).view(np.int8)

# ---------------------------------------------------------------- native


@functools.lru_cache(maxsize=1)
def _native_fns():
    from ds_export.native import I32, I64, P, bind

    quant = bind("dsx_wo_quantize_bf16_rowmajor_nk", P, I64, I64, I64, I64, I32, I32, I32, P, P, I32)
    deq = bind("dsx_wo_dequantize_rowmajor_nk", P, P, I64, I64, I32, I32, I32, P, I32)
    return quant, deq


@functools.lru_cache(maxsize=1)
def _native_rows_fn():
    from ds_export.native import I32, I64, P, bind

    return bind("dsx_wo_quantize_bf16_rowmajor_nk_rows", P, I64, I64, I64, I64, I32, I32, I32, P, P, I32)


@functools.lru_cache(maxsize=1)
def _native_fp8_fn():
    from ds_export.native import I32, I64, P, bind

    return bind("dsx_wo_quantize_fp8_rowmajor_nk_rows", P, P, I64, I64, I64, I64, I64, I64, I32, I32, I32, P, P, I32)


def quantize_fp8_rows_native(w_fp8, scale_inv, block, rows, bits: int, group_size: int = -1, arch: int = 90, *,
                             threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fused block-FP8 -> weight-only for output channels rows=(r0, r1) (arch >= 75).

    w_fp8: the full [N, K] e4m3 weight (uint8 bits or ml_dtypes.float8_e4m3fn),
    scale_inv: its full float32 block scales for `block` (bn, bk). Same outputs as
    quantize_rows_native on the bf16 rows that fp8_block.dequant_native(...,
    'bfloat16') would give (Paddle's input), without materializing them.
    """
    w = np.asarray(w_fp8)
    if w.ndim != 2 or w.dtype.itemsize != 1:
        raise DsxError(f"weight: FP8 weight-only quantization takes a 2-D e4m3 array, got {w.dtype} {w.shape}")
    n, k = w.shape
    bn, bk = (int(b) for b in block)
    s = np.ascontiguousarray(scale_inv, dtype=np.float32)
    if s.shape != (-(-n // bn), -(-k // bk)):
        raise DsxError(f"scale_inv: expected [{-(-n // bn)}, {-(-k // bk)}] for [{n}, {k}] with block {block}, "
                       f"got {list(s.shape)}")
    check_args(n, k, bits, group_size, arch)
    if arch == 70:
        raise DsxError("arch 70 interleaves all channels of each K row: chunk-local output needs arch >= 75")
    r0, r1 = _check_rows(rows, n)
    src = np.ascontiguousarray(w[r0:r1]).view(np.uint8)
    q = np.empty((r1 - r0) * k * bits // 8, np.int8)
    sc = np.empty((r1 - r0,) if group_size == -1 else (-(-k // group_size), r1 - r0), BF16)
    rc = _native_fp8_fn()(src.ctypes.data, s.ctypes.data, bn, bk, n, k, r0, r1, bits, group_size, arch,
                          q.ctypes.data, sc.ctypes.data, int(threads))
    if rc == ENONFINITE:
        raise DsxError(f"weight rows {r0}..{r1}: NaN or Inf after the FP8 decode (a NaN code, or a block scale "
                       "that overflows it); weight-only quantization refuses non-finite weights")
    if rc != 0:
        from ds_export.native import check

        check(rc, "dsx_wo_quantize_fp8_rowmajor_nk_rows")
    return q, sc


def quantize_rows_native(w_rows, n_out: int, rows, bits: int, group_size: int = -1, arch: int = 90, *,
                         threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Quantize output channels rows=(r0, r1) into chunk-local outputs (arch >= 75).

    Returns (qbytes, scale): qbytes is int8, flat, the (r1 - r0) * K * bits / 8
    bytes these channels own in Paddle's layout, which start at byte
    r0 * K * bits / 8 of the full qweight; scale is bfloat16 [r1 - r0] (group -1)
    or [ceil(K / group), r1 - r0]. Consecutive chunks' qbytes concatenate to the
    full qweight, so a tensor can be streamed to disk chunk by chunk.
    """
    w = np.asarray(w_rows)
    if w.ndim == 2 and w.dtype == np.float32:
        w = w.astype(BF16)
    if w.ndim != 2 or w.dtype != BF16:
        raise DsxError(f"weight: weight-only quantization takes a 2-D bfloat16 or float32 array, got {w.dtype} {w.shape}")
    n, k = int(n_out), w.shape[1]
    check_args(n, k, bits, group_size, arch)
    if arch == 70:
        raise DsxError("arch 70 interleaves all channels of each K row: chunk-local output needs arch >= 75")
    r0, r1 = _check_rows(rows, n)
    if w.shape[0] != r1 - r0:
        raise DsxError(f"weight: {w.shape[0]} rows given for channels ({r0}, {r1})")
    w = np.ascontiguousarray(w)
    q = np.empty((r1 - r0) * k * bits // 8, np.int8)
    s = np.empty((r1 - r0,) if group_size == -1 else (-(-k // group_size), r1 - r0), BF16)
    rc = _native_rows_fn()(w.ctypes.data, n, k, r0, r1, bits, group_size, arch, q.ctypes.data, s.ctypes.data,
                           int(threads))
    if rc == ENONFINITE:
        raise DsxError(f"weight rows {r0}..{r1}: NaN or Inf found; weight-only quantization refuses non-finite weights")
    if rc != 0:
        from ds_export.native import check

        check(rc, "dsx_wo_quantize_bf16_rowmajor_nk_rows")
    return q, s


def _check_rows(rows, n: int) -> tuple[int, int]:
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    if not (0 <= r0 < r1 <= n) or r0 % ROW_ALIGN or r1 % ROW_ALIGN:
        raise DsxError(f"rows ({r0}, {r1}) must satisfy 0 <= r0 < r1 <= out={n}, both multiples of {ROW_ALIGN}")
    return r0, r1


def _out_buffers(out, n: int, k: int, bits: int, group_size: int, arch: int):
    shapes = packed_shapes(n, k, bits, group_size, arch)
    if out is None:
        return np.empty(shapes["qweight"]["shape"], np.int8), np.empty(shapes["scale"]["shape"], BF16)
    for arr, key, dt in ((out[0], "qweight", np.int8), (out[1], "scale", BF16)):
        want = shapes[key]["shape"]
        if arr.shape != want or arr.dtype != dt or not arr.flags.c_contiguous:
            raise DsxError(f"out {key}: expected C-contiguous {np.dtype(dt).name} {want}, got {arr.dtype} {arr.shape}")
    return out


def quantize_native(w, bits: int, group_size: int = -1, arch: int = 90, *, out=None, rows=None, threads: int = 0):
    """Compiled quantizer, same contract and bytes as quantize_ref.

    out=(qweight, scale): preallocated full-size outputs (int8 and bfloat16 in
    packed_shapes' shapes) to fill in place; rows=(r0, r1): only output
    channels r0..r1 (multiples of ROW_ALIGN) are computed, and ``w`` is then
    either the full [N, K] weight or just its rows [r1 - r0, K] (N is taken
    from ``out``; without ``out``, ``w`` must be the full weight). threads:
    OpenMP threads (0 = OpenMP's default). Returns (qweight, scale).
    """
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype not in (BF16, np.float32):
        raise DsxError(f"weight: weight-only quantization takes a 2-D bf16 or float32 array, got {w.dtype} {w.shape}")
    k = w.shape[1]
    n = w.shape[0] if out is None else out[1].shape[-1]
    qweight, scale = _out_buffers(out, n, k, bits, group_size, arch)
    r0, r1 = _check_rows(rows, n)
    if w.shape[0] == n:
        w = w[r0:r1]
    elif w.shape[0] != r1 - r0:
        raise DsxError(f"weight: {w.shape[0]} rows fit neither out={n} nor the chunk rows ({r0}, {r1})")
    w = np.ascontiguousarray(w.astype(BF16, copy=False))  # float32 -> bf16, nearest even
    quant, _ = _native_fns()
    rc = quant(w.ctypes.data, n, k, r0, r1, bits, group_size, arch, qweight.ctypes.data, scale.ctypes.data, threads)
    if rc == ENONFINITE:
        raise DsxError(f"weight rows {r0}..{r1}: NaN or Inf found; weight-only quantization refuses non-finite weights")
    if rc != 0:
        from ds_export.native import check

        check(rc, "dsx_wo_quantize_bf16_rowmajor_nk")
    return qweight, scale


def dequantize_native(qweight, scale, bits: int, group_size: int, arch: int, in_features: int, *, threads: int = 0):
    """Compiled dequantizer, equal to dequantize_ref: float32 [N, K]."""
    from ds_export.native import check

    qweight = np.ascontiguousarray(qweight)
    scale = np.ascontiguousarray(scale)
    k = int(in_features)
    n = scale.shape[-1]
    shapes = packed_shapes(n, k, bits, group_size, arch)
    if qweight.shape != shapes["qweight"]["shape"] or qweight.dtype not in (np.int8, np.uint8):
        raise DsxError(f"qweight: expected int8 {shapes['qweight']['shape']}, got {qweight.dtype} {qweight.shape}")
    if scale.shape != shapes["scale"]["shape"] or scale.dtype != BF16:
        raise DsxError(f"scale: expected bfloat16 {shapes['scale']['shape']}, got {scale.dtype} {scale.shape}")
    res = np.empty((n, k), np.float32)
    _, deq = _native_fns()
    rc = deq(qweight.ctypes.data, scale.ctypes.data, n, k, bits, group_size, arch, res.ctypes.data, threads)
    check(rc, "dsx_wo_dequantize_rowmajor_nk")
    return res


__all__ = [
    "ARCHS", "BITS", "GROUP_SIZES", "ROW_ALIGN", "check_args", "packed_shapes", "quantize_ref", "dequantize_ref",
    "unpack_ref", "pack_ref", "quantize_signed_ref", "scales_ref", "quantize_native", "dequantize_native",
]
