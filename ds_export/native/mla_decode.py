"""MLA decode attention with absorbed weights over a paged latent cache (DeepSeek-V3).

Layouts (csrc/include/dsx/mla_decode.h has the full contract):

- ``q``: bfloat16 [B, S_q, H, 576]: dims 0..511 = q_nope @ W_UK (latent), 512..575 = rotated q_pe;
  S_q in 1..6 new tokens per sequence, H in 1..128 heads;
- ``kv_cache``: bfloat16 [num_pages, 64, 576]: per token 512 latent dims c then 64 rope dims;
- ``page_table``: int32 [B, max_pages]; token t of sequence b is in page page_table[b, t // 64];
- ``cache_lens``: int32 [B], tokens in the cache including the S_q new ones (S_q <= len <= 64 * max_pages).

Returns ``(out, lse)``: bfloat16 [B, S_q, H, 512] = softmax(q . kv * scale) @ c, causal among the new
tokens (query i sees positions <= len - S_q + i), and float32 [B, S_q, H] natural log-sum-exp.

- ``mla_decode(q, kv_cache, page_table, cache_lens, softmax_scale)``: CPU (libdsx_cpu), numpy in/out;
- ``mla_decode_cuda_device(...)``: CUDA on ``ds_export.native.cuda.DeviceArray``s (bf16 as uint16),
  asynchronous on a stream, no allocation except what you pass as workspace;
- ``mla_decode_cuda(...)``: CUDA numpy convenience (upload, run, download);
- ``cuda_workspace(...)``: (split count, workspace bytes) a CUDA call with these sizes uses.
"""

from __future__ import annotations

import ctypes
import functools

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError

BF16 = np.dtype(ml_dtypes.bfloat16)
PAGE, LATENT, ROPE, DIM = 64, 512, 64, 576
MAX_SQ, MAX_HEADS = 6, 128


def check_sizes(b: int, s_q: int, h: int, max_pages: int) -> None:
    if not 1 <= s_q <= MAX_SQ:
        raise DsxError(f"q: S_q (new tokens per sequence) must be 1..{MAX_SQ}, got {s_q}")
    if not 1 <= h <= MAX_HEADS:
        raise DsxError(f"q: H (heads) must be 1..{MAX_HEADS}, got {h}; split heads over ranks")
    if max_pages < 1:
        raise DsxError(f"page_table: expected [B={b}, max_pages >= 1], got max_pages {max_pages}")


def check_inputs(q, kv_cache, page_table, cache_lens, softmax_scale):
    """Validate numpy inputs; return (q bits, kv bits, page_table, cache_lens, B, S_q, H, num_pages, max_pages)."""
    for name, a in (("q", q), ("kv_cache", kv_cache), ("page_table", page_table), ("cache_lens", cache_lens)):
        if not isinstance(a, np.ndarray):
            raise DsxError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if q.dtype != BF16 or q.ndim != 4 or q.shape[3] != DIM:
        raise DsxError(f"q: expected bfloat16 [B, S_q, H, {DIM}] (absorbed latent 512 + rope 64), got {q.dtype} {q.shape}")
    if kv_cache.dtype != BF16 or kv_cache.ndim != 3 or kv_cache.shape[1:] != (PAGE, DIM) or kv_cache.shape[0] < 1:
        raise DsxError(f"kv_cache: expected bfloat16 [num_pages >= 1, {PAGE}, {DIM}], got {kv_cache.dtype} {kv_cache.shape}")
    b, s_q, h, _ = q.shape
    if page_table.dtype != np.int32 or page_table.ndim != 2 or page_table.shape[0] != b:
        raise DsxError(f"page_table: expected int32 [B={b}, max_pages], got {page_table.dtype} {page_table.shape}")
    if cache_lens.dtype != np.int32 or cache_lens.shape != (b,):
        raise DsxError(f"cache_lens: expected int32 [B={b}], got {cache_lens.dtype} {cache_lens.shape}")
    num_pages, max_pages = kv_cache.shape[0], page_table.shape[1]
    check_sizes(b, s_q, h, max_pages)
    if not np.isfinite(softmax_scale):
        raise DsxError(f"softmax_scale: expected a finite float, got {softmax_scale}")
    bad = np.flatnonzero((cache_lens < s_q) | (cache_lens > PAGE * max_pages))
    if bad.size:
        i = bad[0]
        raise DsxError(f"cache_lens[{i}] = {cache_lens[i]}: must be in [S_q={s_q}, 64 * max_pages = {PAGE * max_pages}] "
                       "(the cache must already hold the new tokens)")
    used = np.arange(max_pages)[None, :] < (cache_lens[:, None] + PAGE - 1) // PAGE
    ids = page_table[used]
    if ids.size and (ids.min() < 0 or ids.max() >= num_pages):
        raise DsxError(f"page_table: used page ids must be in [0, num_pages={num_pages}), got {ids.min()}..{ids.max()}")
    return (np.ascontiguousarray(q).view(np.uint16), np.ascontiguousarray(kv_cache).view(np.uint16),
            np.ascontiguousarray(page_table), np.ascontiguousarray(cache_lens), b, s_q, h, num_pages, max_pages)


@functools.lru_cache(maxsize=1)
def _cpu_fn():
    from ds_export.native import F32, I32, I64, P, bind

    return bind("dsx_mla_decode_paged_bf16_cpu", P, P, P, P, P, P, I64, I64, I64, I64, I64, F32, I32)


def mla_decode(q, kv_cache, page_table, cache_lens, softmax_scale: float, *, threads: int = 0):
    """CPU reference: (out bfloat16 [B, S_q, H, 512], lse float32 [B, S_q, H]); see the module doc."""
    from ds_export.native import check, ptr

    qb, kv, pt, lens, b, s_q, h, num_pages, max_pages = check_inputs(q, kv_cache, page_table, cache_lens,
                                                                     softmax_scale)
    out = np.empty((b, s_q, h, LATENT), np.uint16)
    lse = np.empty((b, s_q, h), np.float32)
    if b:
        rc = _cpu_fn()(ptr(qb), ptr(kv), ptr(pt), ptr(lens), ptr(out), ptr(lse), b, s_q, h, num_pages, max_pages,
                       float(softmax_scale), int(threads))
        check(rc, "dsx_mla_decode_paged_bf16_cpu")
    return out.view(BF16), lse


# ---------------------------------------------------------------- CUDA


@functools.lru_cache(maxsize=1)
def _cuda_fns():
    from ds_export.native import cuda

    P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    run = cuda._fn("dsx_mla_decode_paged_bf16_cuda", P, P, P, P, P, P, I64, I64, I64, I64, I64, F32, I32, P, I64, P)
    ws = cuda._fn("dsx_mla_decode_workspace_cuda", I64, I64, I64, I64, I32, ctypes.POINTER(I32), ctypes.POINTER(I64))
    return run, ws


def cuda_workspace(b: int, s_q: int, h: int, max_pages: int, num_splits: int = 0) -> tuple[int, int]:
    """(splits, workspace bytes) a CUDA call with these sizes and `num_splits` (0 = auto) uses."""
    from ds_export.native import check

    check_sizes(b, s_q, h, max_pages)
    n, nbytes = ctypes.c_int(), ctypes.c_int64()
    check(_cuda_fns()[1](b, s_q, h, max_pages, int(num_splits), ctypes.byref(n), ctypes.byref(nbytes)),
          "dsx_mla_decode_workspace_cuda")
    return n.value, nbytes.value


def mla_decode_cuda_device(q, kv_cache, page_table, cache_lens, out, lse, softmax_scale: float, *,
                           num_splits: int = 0, workspace=None, stream=None) -> None:
    """CUDA on DeviceArrays: q uint16 [B, S_q, H, 576], kv_cache uint16 [P, 64, 576], page_table int32
    [B, max_pages], cache_lens int32 [B] -> out uint16 [B, S_q, H, 512], lse float32 [B, S_q, H].

    The kernel trusts lengths and page ids (it clamps lengths): validate them on the host.
    `workspace`: a DeviceArray of at least cuda_workspace(...)[1] bytes when that is > 0.
    """
    from ds_export.native import check, cuda

    for name, a in (("q", q), ("kv_cache", kv_cache), ("page_table", page_table), ("cache_lens", cache_lens),
                    ("out", out), ("lse", lse)):
        if not isinstance(a, cuda.DeviceArray):
            raise DsxError(f"{name}: expected a ds_export.native.cuda.DeviceArray, got {type(a).__name__}")
    if len(q.shape) != 4 or len(kv_cache.shape) != 3 or len(page_table.shape) != 2:
        raise DsxError(f"q [B, S_q, H, 576], kv_cache [P, 64, 576], page_table [B, max_pages] expected, got "
                       f"{q.shape}, {kv_cache.shape}, {page_table.shape}")
    b, s_q, h, _ = q.shape
    num_pages, max_pages = kv_cache.shape[0], page_table.shape[1]
    check_sizes(b, s_q, h, max_pages)
    cuda._need(q, "q", (b, s_q, h, DIM), np.uint16)
    cuda._need(kv_cache, "kv_cache", (num_pages, PAGE, DIM), np.uint16)
    cuda._need(page_table, "page_table", (b, max_pages), np.int32)
    cuda._need(cache_lens, "cache_lens", (b,), np.int32)
    cuda._need(out, "out", (b, s_q, h, LATENT), np.uint16)
    cuda._need(lse, "lse", (b, s_q, h), np.float32)
    _, need = cuda_workspace(b, s_q, h, max_pages, num_splits)
    if need and (workspace is None or workspace.nbytes < need):
        got = 0 if workspace is None else workspace.nbytes
        raise DsxError(f"workspace: this call needs {need} bytes of device workspace, got {got}; use cuda_workspace()")
    ws_ptr, ws_bytes = (workspace.ptr, workspace.nbytes) if workspace is not None else (None, 0)
    rc = _cuda_fns()[0](q.ptr, kv_cache.ptr, page_table.ptr, cache_lens.ptr, out.ptr, lse.ptr, b, s_q, h, num_pages,
                        max_pages, float(softmax_scale), int(num_splits), ws_ptr, ws_bytes, cuda._h(stream))
    check(rc, "dsx_mla_decode_paged_bf16_cuda")


def mla_decode_cuda(q, kv_cache, page_table, cache_lens, softmax_scale: float, *, num_splits: int = 0):
    """CUDA numpy convenience: same inputs, checks and outputs as mla_decode()."""
    from ds_export.native import cuda

    qb, kv, pt, lens, b, s_q, h, num_pages, max_pages = check_inputs(q, kv_cache, page_table, cache_lens,
                                                                     softmax_scale)
    out = cuda.empty((b, s_q, h, LATENT), np.uint16).fill_bytes(0xFF)  # poison: every element must be written
    lse = cuda.empty((b, s_q, h), np.float32).fill_bytes(0xFF)
    _, need = cuda_workspace(b, s_q, h, max_pages, num_splits)
    ws = cuda.empty((need,), np.uint8) if need else None
    dev = [cuda.to_device(x) for x in (qb, kv, pt, lens)]
    if b:
        mla_decode_cuda_device(*dev, out, lse, softmax_scale, num_splits=num_splits, workspace=ws)
    return out.numpy().view(BF16), lse.numpy()
