"""Weight-only GEMM front ends: bf16 x [M, K] @ dequant(W)^T with W in Paddle's layout.

W is what ``ds_export.formats.weight_only.quantize_ref`` / ``quantize_native`` return
(= Paddle's ``weight_quantize`` for arch 75..100; 80, 89 and 90 give the same bytes):
qweight int8 [N, K] (bits 8) or [N // 2, K] (bits 4), scale bfloat16 [N] (group -1) or
[ceil(K / group), N]. The result is bfloat16 [M, N]; the arithmetic and its
accumulation order are documented in csrc/include/dsx/gemm_weight_only.h.

- ``gemm_weight_only(x, qweight, scale, bits, group_size, arch)``: CPU (libdsx_cpu), numpy
  in and out;
- ``gemm_weight_only_cuda_device(...)``: CUDA, on ``ds_export.native.cuda.DeviceArray``s
  (device pointers), asynchronous on a stream, no allocation;
- ``gemm_weight_only_cuda(...)``: CUDA numpy convenience (upload, run, download);
- ``cuda_config(...)``: the launch configuration an ``algo`` word resolves to.

Every check raises DsxError naming the argument, what was expected and what to do.
"""

from __future__ import annotations

import ctypes
import functools

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError

BF16 = np.dtype(ml_dtypes.bfloat16)
ARCHS = (75, 80, 86, 89, 90, 100)  # the tiled layout; arch 70's bytes are not accepted


def check_args(m: int, n: int, k: int, bits: int, group_size: int, arch: int) -> None:
    """Raise DsxError unless the GEMM supports this (shape, bits, group, arch)."""
    if bits not in (4, 8):
        raise DsxError(f"bits: weight-only GEMM takes 4 or 8, got {bits}")
    if group_size not in (-1, 64, 128):
        raise DsxError(f"group_size: weight-only GEMM takes -1, 64 or 128, got {group_size}")
    if arch not in ARCHS:
        hint = " (arch 70 bytes are row-major; re-quantize with arch 80/89/90)" if arch == 70 else ""
        raise DsxError(f"arch: weight-only GEMM reads Paddle's arch {ARCHS} layout, got {arch}{hint}")
    if n <= 0 or k <= 0 or n % 64 or k % 64:
        raise DsxError(f"weight [N={n}, K={k}]: N and K must be positive multiples of 64 (Paddle's layout tiles by 64)")
    if m < 0:
        raise DsxError(f"x: M must be >= 0, got {m}")


def check_inputs(x, qweight, scale, bits: int, group_size: int = -1, arch: int = 90):
    """Validate numpy inputs; return (x as uint16 bits, qweight int8, scale as uint16 bits, M, N, K).

    x: bfloat16 [M, K]; scale: bfloat16 [N] or [ceil(K/g), N] (N is read from it);
    qweight: int8 (or uint8) [N, K] for bits 8, [N // 2, K] for bits 4.
    """
    for name, a in (("x", x), ("qweight", qweight), ("scale", scale)):
        if not isinstance(a, np.ndarray):
            raise DsxError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if x.dtype != BF16 or x.ndim != 2:
        raise DsxError(f"x: expected bfloat16 [M, K] activations, got {x.dtype} {x.shape}; "
                       "cast with .astype(ml_dtypes.bfloat16)")
    if scale.dtype != BF16 or scale.ndim not in (1, 2):
        raise DsxError(f"scale: expected bfloat16 [N] or [ceil(K/g), N], got {scale.dtype} {scale.shape}")
    m, k = x.shape
    n = scale.shape[-1]
    check_args(m, n, k, bits, group_size, arch)
    want_s = (n,) if group_size == -1 else (-(-k // group_size), n)
    if scale.shape != want_s:
        raise DsxError(f"scale: expected shape {want_s} for group_size {group_size} and K={k}, got {scale.shape}")
    want_q = (n, k) if bits == 8 else (n // 2, k)
    if qweight.dtype not in (np.int8, np.uint8) or qweight.shape != want_q:
        raise DsxError(
            f"qweight: expected int8 {want_q} (Paddle's int{bits} bytes for N={n}, K={k}), got {qweight.dtype} "
            f"{qweight.shape}; is K the last dim of x and N the last dim of scale?"
        )
    return (np.ascontiguousarray(x).view(np.uint16), np.ascontiguousarray(qweight).view(np.int8),
            np.ascontiguousarray(scale).view(np.uint16), m, n, k)


@functools.lru_cache(maxsize=1)
def _cpu_fn():
    from ds_export.native import I32, I64, P, bind

    return bind("dsx_wo_gemm_bf16_nt_cpu", P, P, P, P, I64, I64, I64, I32, I32, I32, I32)


def gemm_weight_only(x, qweight, scale, bits: int, group_size: int = -1, arch: int = 90, *,
                     threads: int = 0) -> np.ndarray:
    """CPU: bfloat16 [M, N] = x [M, K] @ dequant(qweight, scale)^T (fp32 accumulation).

    threads: OpenMP threads (0 = OpenMP's default); the result does not depend on it.
    """
    from ds_export.native import check, ptr

    xb, q, s, m, n, k = check_inputs(x, qweight, scale, bits, group_size, arch)
    out = np.empty((m, n), np.uint16)
    if m:
        rc = _cpu_fn()(ptr(xb), ptr(q), ptr(s), ptr(out), m, n, k, bits, group_size, arch, int(threads))
        check(rc, "dsx_wo_gemm_bf16_nt_cpu")
    return out.view(BF16)


# ---------------------------------------------------------------- CUDA


@functools.lru_cache(maxsize=1)
def _cuda_fns():
    from ds_export.native import cuda

    P, I64, I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    run = cuda._fn("dsx_wo_gemm_bf16_nt_cuda", P, P, P, P, I64, I64, I64, I32, I32, I32, I32, P)
    pi = ctypes.POINTER(I32)
    cfg = cuda._fn("dsx_wo_gemm_config_cuda", I64, I64, I64, I32, I32, I32, pi, pi, pi, pi, pi)
    path = cuda._fn("dsx_wo_gemm_path_cuda", I64, I64, I64, I32, I32, I32, pi, pi)
    launch = cuda._fn("dsx_wo_gemm_launch_cuda", I64, I64, I64, I32, I32, I32, pi, pi)
    return run, cfg, path, launch


def _warps_ok(warps: int, splits: int, tiles_bits: int) -> bool:
    """0 (automatic), 1, 2, 4 or 8; 3, 5, 6 or 7 only with several tiles a warp (bits 29..30) and a given split."""
    return warps in (0, 1, 2, 4, 8) or (warps in (3, 5, 6, 7) and tiles_bits > 0 and splits > 0)


def check_algo(algo: int) -> None:
    """Raise DsxError unless `algo` is 0 or a well-formed tuning word (see algo_word)."""
    warps, splits, box = algo & 15, (algo >> 4) & 15, (algo >> 20) & 15
    tiles = (algo >> 29) & 3  # (bits 29..30: 1 or 2, only with bit 28)
    if algo < 0 or algo >> 31 or tiles == 3 or (tiles and not (algo >> 28) & 1) or not _warps_ok(warps, splits, tiles) or not 0 <= splits <= 8 or box > 8:
        raise DsxError(f"algo: expected 0 (automatic) or a word from algo_word(), got {algo:#x}")


def _query(entry: int, name: str, outs: int, m, n, k, bits, group_size, algo) -> list[int]:
    """Call the query entry _cuda_fns()[entry] (`name`) for an m-row call: its `outs` int results."""
    from ds_export.native import check

    check_args(m, n, k, bits, group_size, 90)
    check_algo(algo)
    v = [ctypes.c_int() for _ in range(outs)]
    rc = _cuda_fns()[entry](m, n, k, bits, group_size, algo, *[ctypes.byref(i) for i in v])
    check(rc, f"{name} (algo {algo:#x})")
    return [i.value for i in v]


def cuda_config(m: int, n: int, k: int, bits: int, group_size: int = -1, algo: int = 0) -> dict:
    """{'warps', 'splits', 'chunk', 'stages', 'box'}: the launch configuration `algo` resolves to on this GPU."""
    v = _query(1, "dsx_wo_gemm_config_cuda", 5, m, n, k, bits, group_size, algo)
    return dict(zip(("warps", "splits", "chunk", "stages", "box"), v))


def cuda_path(m: int, n: int, k: int, bits: int, group_size: int = -1, algo: int = 0) -> dict:
    """{'ws': bool, 'tiles': int, 'xring': bool, 'fold': bool, 'wgmma': bool}: whether `algo` runs the
    warp-specialized kernel here (bit 28, or the automatic choice), with how many 16-channel tiles a consumer warp
    (1 on the other kernels), whether x comes through its ring (a given chunk equal to the ring's steps a slot,
    shorter than the slice), whether that launch folds the - 8 of int4 per channel out of the unpack (its bits then
    differ from the other paths' at the same split, within the same bound), and whether its consumers multiply
    through wgmma (17..64 rows, 4 or 8 warps, every layout: the same bits as the mma path; 33..64 rows in one
    launch of eight token tiles with bit 28 and bits 29..30 = 1, or automatically where x for them fits)."""
    ws, tiles = _query(2, "dsx_wo_gemm_path_cuda", 2, m, n, k, bits, group_size, algo)
    return {"ws": bool(ws), "tiles": tiles, "xring": ws in (2, 3), "fold": ws == 3, "wgmma": ws == 4}


def cuda_launch(m: int, n: int, k: int, bits: int, group_size: int = -1, algo: int = 0) -> dict:
    """{'rows': int, 'parts': int}: the rows of M the first launch takes and the grid parts it runs them in
    (2: automatic 33..64 rows as two launches' worth side by side, the rest with the first 32's configuration)."""
    rows, parts = _query(3, "dsx_wo_gemm_launch_cuda", 2, m, n, k, bits, group_size, algo)
    return {"rows": rows, "parts": parts}


def gemm_weight_only_cuda_device(x, qweight, scale, out, *, bits: int, group_size: int = -1, arch: int = 90,
                                 algo: int = 0, stream=None) -> None:
    """out[M, N] (uint16 bf16 bits) = x[M, K] (uint16 bf16 bits) @ dequant(W)^T, on device arrays.

    qweight: DeviceArray int8/uint8 in Paddle's shape; scale: uint16 (bf16 bits) [N] or
    [ceil(K/g), N]. Asynchronous on `stream` (a cuda.Stream, None = default stream).
    """
    from ds_export.native import check, cuda

    for name, a in (("x", x), ("qweight", qweight), ("scale", scale), ("out", out)):
        if not isinstance(a, cuda.DeviceArray):
            raise DsxError(f"{name}: expected a ds_export.native.cuda.DeviceArray, got {type(a).__name__}")
    if len(x.shape) != 2 or not scale.shape:
        raise DsxError(f"x: expected [M, K] and scale [N] or [G, N] device arrays, got {x.shape} and {scale.shape}")
    m, k = x.shape
    n = scale.shape[-1]
    check_args(m, n, k, bits, group_size, arch)
    want_s = (n,) if group_size == -1 else (-(-k // group_size), n)
    cuda._need(x, "x", (m, k), np.uint16)
    cuda._need(scale, "scale", want_s, np.uint16)
    cuda._need(out, "out", (m, n), np.uint16)
    want_q = (n, k) if bits == 8 else (n // 2, k)
    if qweight.shape != want_q or qweight.dtype not in (np.int8, np.uint8):
        raise DsxError(f"qweight: expected an int8 DeviceArray {want_q}, got {qweight.dtype} {qweight.shape}")
    check_algo(algo)
    rc = _cuda_fns()[0](x.ptr, qweight.ptr, scale.ptr, out.ptr, m, n, k, bits, group_size, arch, algo,
                        stream.handle if stream else None)
    check(rc, f"dsx_wo_gemm_bf16_nt_cuda (M={m}, N={n}, K={k}, int{bits}, group {group_size}, algo {algo:#x})")


def gemm_weight_only_cuda(x, qweight, scale, bits: int, group_size: int = -1, arch: int = 90, *,
                          algo: int = 0) -> np.ndarray:
    """CUDA numpy convenience: same contract and checks as gemm_weight_only (synchronous)."""
    from ds_export.native import cuda

    xb, q, s, m, n, k = check_inputs(x, qweight, scale, bits, group_size, arch)
    out = cuda.empty((m, n), np.uint16).fill_bytes(0xFF)  # NaN poison: every element must be written
    dev = [cuda.to_device(a) for a in (xb, q, s)]  # kept alive until the download syncs
    gemm_weight_only_cuda_device(*dev, out, bits=bits, group_size=group_size, arch=arch, algo=algo)
    return out.numpy().view(BF16)


def algo_word(warps: int = 0, splits: int = 0, chunk: int = 0, stages: int = 0, box: int = 0,
              pdl: bool = False, balanced: bool = False, warp_specialized: bool = False,
              tiles: int = 1) -> int:
    """Pack a tuning word for the CUDA kernel (0 fields stay automatic).

    warps: warps per block (16 output channels each); splits: K slices (cluster size, 1..8);
    chunk: steps of x staged in shared memory at once; stages: ring slots of weights per
    warp (1 only at M <= 8: one slot refilled as soon as its steps are in registers); box: steps per slot (one tensor copy each; stages * box steps are in flight per
    warp); pdl: programmatic dependent launch (bit 24: the start overlaps the previous kernel's
    end; include/dsx/gemm_weight_only.h says what that requires); balanced: the balanced
    persistent grid (bit 27: int4 per channel, M <= 8; clusters own runs of 16-channel tiles, a
    block's warps equal runs of K steps; its own accumulation order, see the header);
    warp_specialized: bit 28 (launches of up to 16 rows; one producer warp a block fills a ring
    shared by its warps, `stages` x `box` steps of all of them, x staged whole, or, with a chunk equal
    to `box` and shorter than the slice, int4 at 9..16 rows and 2 tiles a warp, x through a ring of its own; not with
    `balanced`); tiles: 16-channel tiles a consumer warp owns, 1, 2 or 4 (bits 29..30 = log2; with
    warp_specialized, up to 16 rows: one x fragment load feeds all of them; at 17..32 rows
    the same bits pick the consumers: tiles 2 = wgmma, 4 = mma.sync, 1 = wgmma where it pays; at 33..64 rows
    tiles 2 = one launch of eight token tiles through wgmma, else the existing path).
    Only `splits` changes the result's bits (and `balanced`, for tiles that a warp run boundary cuts).
    """
    tiles_bits = (tiles.bit_length() - 1) if warp_specialized and tiles in (2, 4) else 0
    if not _warps_ok(warps, splits, tiles_bits) or tiles not in (1, 2, 4) or not 0 <= splits <= 8 or \
            not 0 <= chunk < 256 or not 0 <= stages <= 15 or not 0 <= box <= 8:
        raise DsxError(f"algo: warps must be 0, 1, 2, 4 or 8 (3, 5, 6, 7 with warp_specialized, tiles 2 or 4 and a "
                       f"split), splits 0..8, chunk 0..255, stages 0..15, box 0..8 and tiles 1, 2 or 4, got {warps}, "
                       f"{splits}, {chunk}, {stages}, {box}, {tiles}")
    return warps | splits << 4 | chunk << 8 | stages << 16 | box << 20 | int(bool(pdl)) << 24 | int(bool(balanced)) << 27 | \
        int(bool(warp_specialized)) << 28 | (tiles.bit_length() - 1) << 29


__all__ = ["check_args", "check_inputs", "gemm_weight_only", "gemm_weight_only_cuda", "gemm_weight_only_cuda_device",
           "cuda_config", "cuda_path", "algo_word", "check_algo"]
