"""numpy front ends of the CPU kernels in csrc/cpu/ (block FP8 GEMM, MTP accept).

Layouts (see csrc/include/dsx/gemm_fp8.h and mtp_accept.h for the exact arithmetic):

- ``gemm_fp8_nt``: a float8_e4m3fn [M, K] with sa float32 [M, ceil(K/128)] (per token,
  groups of 128 along K), b float8_e4m3fn [N, K] (HF Linear layout) with sb float32
  [ceil(N/128), ceil(K/128)]; returns bfloat16 [M, N] = (a*sa) @ (b*sb)^T.
- ``gemm_fp8_grouped_nt_contiguous``: rows of a grouped per expert by ``offsets`` [E+1];
  b [E, N, K], sb [E, ceil(N/128), ceil(K/128)].
- ``mtp_accept_greedy``: draft [B, K], target [B, K+1], num_draft [B] ->
  (accepted [B, K+1] padded with -1, count [B]).

fp8 arrays may be ml_dtypes.float8_e4m3fn or their raw uint8 bytes. Every check raises
DsxError naming the argument, the expected shape/dtype and what to do.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError
from ds_export.native import I32, I64, P, bind, check, process_switch, ptr, switched

BLOCK = 128
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fp8_bytes(x: np.ndarray, name: str, ndim: int) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise DsxError(f"{name}: expected a numpy array, got {type(x).__name__}")
    if x.dtype not in (FP8, np.uint8):
        raise DsxError(f"{name}: expected float8_e4m3fn (or its uint8 bytes), got {x.dtype}; quantize it first")
    if x.ndim != ndim:
        raise DsxError(f"{name}: expected {ndim} dims, got shape {x.shape}")
    return np.ascontiguousarray(x).view(np.uint8)


def _f32(x: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise DsxError(f"{name}: expected float32 scales, got {got}; pass scale_inv as float32")
    if tuple(x.shape) != tuple(shape):
        raise DsxError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)} (one scale per 128-block, ceil-divided)")
    return np.ascontiguousarray(x)


def check_gemm_nt(a, sa, b, sb):
    """Validate dense GEMM inputs; return (a_u8, sa, b_u8, sb, M, N, K)."""
    a = _fp8_bytes(a, "a (activations [M, K])", 2)
    b = _fp8_bytes(b, "b (weights [N, K])", 2)
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise DsxError(f"b: weights [N, K] must share K={k} with a, got shape {b.shape} (HF layout is [out, in])")
    if n == 0 or k == 0:
        raise DsxError(f"gemm_fp8_nt: N and K must be positive, got N={n}, K={k}")
    sa = _f32(sa, "sa (activation scales [M, ceil(K/128)])", (m, cdiv(k, BLOCK)))
    sb = _f32(sb, "sb (weight scales [ceil(N/128), ceil(K/128)])", (cdiv(n, BLOCK), cdiv(k, BLOCK)))
    return a, sa, b, sb, m, n, k


def check_offsets(offsets, num_experts: int, m: int) -> np.ndarray:
    off = np.asarray(offsets)
    if off.ndim != 1 or off.shape[0] != num_experts + 1 or not np.issubdtype(off.dtype, np.integer):
        raise DsxError(f"offsets: expected integers of shape [{num_experts + 1}] (E+1), got {off.dtype} {off.shape}")
    if off[0] != 0 or off[-1] != m or np.any(np.diff(off) < 0):
        raise DsxError(f"offsets: must start at 0, never decrease and end at M={m}; got {off.tolist()[:8]}...")
    return np.ascontiguousarray(off, dtype=np.int32)


def check_gemm_grouped(a, sa, b, sb, offsets):
    """Validate grouped GEMM inputs; return (a_u8, sa, b_u8, sb, offsets_i32, E, M, N, K)."""
    a = _fp8_bytes(a, "a (activations [M, K])", 2)
    b = _fp8_bytes(b, "b (stacked expert weights [E, N, K])", 3)
    m, k = a.shape
    e, n, kb_ = b.shape
    if kb_ != k or n == 0 or k == 0 or e == 0:
        raise DsxError(f"b: expected [E, N, K] with K={k} and E, N > 0, got {b.shape}")
    sa = _f32(sa, "sa (activation scales [M, ceil(K/128)])", (m, cdiv(k, BLOCK)))
    sb = _f32(sb, "sb (weight scales [E, ceil(N/128), ceil(K/128)])", (e, cdiv(n, BLOCK), cdiv(k, BLOCK)))
    return a, sa, b, sb, check_offsets(offsets, e, m), e, m, n, k


def check_mtp(draft, target, num_draft):
    """Validate MTP accept inputs; return (draft, target, num_draft_i32, B, K, dtype)."""
    draft, target = np.asarray(draft), np.asarray(target)
    if draft.dtype not in (np.int32, np.int64) or target.dtype != draft.dtype:
        raise DsxError(f"draft/target: expected the same int32 or int64 dtype, got {draft.dtype} / {target.dtype}")
    if draft.ndim != 2:
        raise DsxError(f"draft: expected [B, K], got shape {draft.shape}")
    bsz, k = draft.shape
    if target.shape != (bsz, k + 1):
        raise DsxError(f"target: expected [B, K+1] = {(bsz, k + 1)} (base model argmax at each verify position), got {target.shape}")
    nd = np.asarray(num_draft)
    if nd.shape != (bsz,) or not np.issubdtype(nd.dtype, np.integer):
        raise DsxError(f"num_draft: expected integers of shape ({bsz},), got {nd.dtype} {nd.shape}")
    if bsz and (nd.min() < 0 or nd.max() > k):
        raise DsxError(f"num_draft: every count must lie in [0, K={k}], got range [{nd.min()}, {nd.max()}]")
    return (np.ascontiguousarray(draft), np.ascontiguousarray(target),
            np.ascontiguousarray(nd, dtype=np.int32), bsz, k, draft.dtype)


def check_mtp_topp(draft, candidates, num_candidates, sampled, num_draft):
    """Validate top-p accept inputs; return (draft, cand, ncand_i32, sampled, num_draft_i32, B, K, C, dtype)."""
    draft, cand, sampled = np.asarray(draft), np.asarray(candidates), np.asarray(sampled)
    draft, sampled, nd, bsz, k, dt = check_mtp(draft, sampled, num_draft)
    if cand.dtype != dt or cand.ndim != 3 or cand.shape[:2] != (bsz, k + 1) or cand.shape[2] < 1:
        raise DsxError(f"candidates: expected {dt} [B, K+1, C] = [{bsz}, {k + 1}, C >= 1] (the base model's top-p "
                       f"set at each verify position), got {cand.dtype} {cand.shape}")
    c = cand.shape[2]
    nc = np.asarray(num_candidates)
    if nc.shape != (bsz, k + 1) or not np.issubdtype(nc.dtype, np.integer):
        raise DsxError(f"num_candidates: expected integers of shape ({bsz}, {k + 1}), got {nc.dtype} {nc.shape}")
    if nc.size and (nc.min() < 1 or nc.max() > c):
        raise DsxError(f"num_candidates: every count must lie in [1, C={c}], got range [{nc.min()}, {nc.max()}]")
    return (draft, np.ascontiguousarray(cand), np.ascontiguousarray(nc, dtype=np.int32), sampled, nd, bsz, k, c, dt)


def cpu_simd(on: bool | None = None) -> bool:
    """Whether the CPU kernels take their SIMD paths (AVX2) rather than their scalar ones, which give the same bits;
    with `on`, switch them for the process (DSX_CPU_SIMD=0 starts it at scalar). Returns the state before the call:
    dsx_cpu_simd."""
    return process_switch(bind("dsx_cpu_simd", I32), on, "cpu simd switch")


def scalar_paths():
    """The CPU kernels' scalar paths inside a with-block, the state before after it."""
    return switched(cpu_simd, False)


def gemm_fp8_nt(a, sa, b, sb) -> np.ndarray:
    """bf16 [M, N] = (a * sa) @ (b * sb)^T with DeepSeek block scales (CPU, OpenMP)."""
    a, sa, b, sb, m, n, k = check_gemm_nt(a, sa, b, sb)
    out = np.empty((m, n), dtype=np.uint16)
    fn = bind("dsx_gemm_fp8_nt_cpu", P, P, P, P, P, I64, I64, I64)
    check(fn(ptr(a), ptr(sa), ptr(b), ptr(sb), ptr(out), m, n, k), "gemm_fp8_nt_cpu")
    return out.view(BF16)


def gemm_fp8_grouped_nt_contiguous(a, sa, b, sb, offsets) -> np.ndarray:
    """Grouped (MoE) GEMM: rows offsets[e]:offsets[e+1] of a use expert e's weights b[e]."""
    a, sa, b, sb, off, e, m, n, k = check_gemm_grouped(a, sa, b, sb, offsets)
    out = np.empty((m, n), dtype=np.uint16)
    fn = bind("dsx_gemm_fp8_grouped_nt_contiguous_cpu", P, P, P, P, P, I64, P, I64, I64, I64)
    rc = fn(ptr(a), ptr(sa), ptr(b), ptr(sb), ptr(off), e, ptr(out), m, n, k)
    check(rc, "gemm_fp8_grouped_nt_contiguous_cpu")
    return out.view(BF16)


def mtp_accept_greedy(draft, target, num_draft) -> tuple[np.ndarray, np.ndarray]:
    """Greedy speculative acceptance: returns (accepted [B, K+1] padded with -1, count [B])."""
    draft, target, nd, bsz, k, dt = check_mtp(draft, target, num_draft)
    accepted = np.empty((bsz, k + 1), dtype=dt)
    count = np.empty((bsz,), dtype=np.int32)
    name = "dsx_mtp_accept_greedy_i32_cpu" if dt == np.int32 else "dsx_mtp_accept_greedy_i64_cpu"
    fn = bind(name, P, P, P, P, P, I64, I64)
    check(fn(ptr(draft), ptr(target), ptr(nd), ptr(accepted), ptr(count), bsz, k), name)
    return accepted, count


def mtp_accept_topp(draft, candidates, num_candidates, sampled, num_draft) -> tuple[np.ndarray, np.ndarray]:
    """Top-p speculative acceptance: a draft is kept while it lies in the base model's top-p candidate
    set at its position; the bonus token is the base model's sample. Returns (accepted, count)."""
    draft, cand, nc, sampled, nd, bsz, k, c, dt = check_mtp_topp(draft, candidates, num_candidates, sampled,
                                                                  num_draft)
    accepted = np.empty((bsz, k + 1), dtype=dt)
    count = np.empty((bsz,), dtype=np.int32)
    name = "dsx_mtp_accept_topp_i32_cpu" if dt == np.int32 else "dsx_mtp_accept_topp_i64_cpu"
    fn = bind(name, P, P, P, P, P, P, P, I64, I64, I64)
    check(fn(ptr(draft), ptr(cand), ptr(nc), ptr(sampled), ptr(nd), ptr(accepted), ptr(count), bsz, k, c), name)
    return accepted, count


__all__ = ["gemm_fp8_nt", "gemm_fp8_grouped_nt_contiguous", "mtp_accept_greedy", "mtp_accept_topp"]
