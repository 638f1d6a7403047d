"""Kernel numerics: run the compiled GEMM and MTP kernels on the stored weights and separate two errors.

For each sampled Linear:
- kernel error: the kernel's output against float64 on exactly the kernel's inputs (the
  quantized activations for block FP8, the stored weights decoded by the numpy references).
  It must sit at accumulation-rounding level (bf16 output rounding, fp32 sums): anything
  larger is a kernel or layout bug.
- quantization error: the kernel's output against float64 on the reference weights and the
  unquantized activations, as SQNR: what users care about.
Routed experts also go through the grouped (MoE) FP8 GEMM when they are FP8. MLA decode runs
with the absorbed weights of each sampled layer's kv_b (the target's stored weight): its kernel
error is against float64 attention on the kernel's own bf16 inputs, its quantization error against
the unabsorbed float64 attention (keys and values through the reference kv_b), so absorption and
kv_b's quantization are checked together. The MTP accept kernel is checked against a plain
reference on random drafts.

`device` picks the kernels: "cpu" (csrc/cpu, libdsx_cpu) or "cuda" (csrc/cuda, libdsx_cuda on
the current GPU); the references and inputs are the same, so a report from each can be compared.
Activations are realistic stand-ins: Gaussian tokens of varied scale with a few outlier
channels, rounded to bf16 (a fixed seed, so reports are reproducible).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from ds_export.formats import fp8_block
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds
from ds_export.verify import weights as W
from ds_export.progress import QUIET, Reporter
from ds_export.verify.weights import compare, reference_f64

KERNEL_GATE = 8e-3  # max |kernel - float64| / max |float64|: bf16 output rounding is 2^-9 relative
M_TOKENS = 16
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Backend:
    """One device's kernels, numpy in and out (device memory handled inside)."""

    device: str
    act_quant: object  # bf16 [M, K] -> (fp8 [M, K], float32 [M, ceil(K/128)])
    gemm_fp8: object  # (xq, sx, w, s) -> bf16 [M, N]
    grouped_fp8: object  # (xq, sx, ws, ss, offsets) -> bf16
    gemm_wo: object  # (x, q, s, bits, group, arch) -> bf16
    mla_decode: object  # (q, kv_cache, page_table, cache_lens, scale) -> (bf16 out, lse)
    mtp_accept: object  # (draft, target, num_draft) -> (accepted, count)
    mtp_accept_topp: object  # (draft, candidates, num_candidates, sampled, num_draft) -> (accepted, count)


def backend(device: str = "cpu") -> Backend:
    """The kernels of `device`; UsageError when it cannot run here (no GPU, no CUDA runtime), DsxError when its
    library does not build."""
    from ds_export.errors import UsageError

    if device == "cpu":
        from ds_export.native import kernels as k
        from ds_export.native.gemm_weight_only import gemm_weight_only
        from ds_export.native.mla_decode import mla_decode

        return Backend("cpu", fp8_block.act_quant_native, k.gemm_fp8_nt, k.gemm_fp8_grouped_nt_contiguous,
                       gemm_weight_only, mla_decode, k.mtp_accept_greedy, k.mtp_accept_topp)
    if device == "cuda":
        from ds_export.native import cuda
        from ds_export.native.gemm_weight_only import gemm_weight_only_cuda
        from ds_export.native.mla_decode import mla_decode_cuda

        if not cuda.available():
            raise UsageError("--device cuda: no CUDA GPU or CUDA runtime here",
                           hint="run verify on a GPU machine, or use --device cpu (same checks, CPU kernels)")
        cuda.lib()  # builds/loads libdsx_cuda now, so a build failure is reported before any check
        return Backend("cuda", cuda.act_quant_fp8, cuda.gemm_fp8_nt, cuda.gemm_fp8_grouped_nt_contiguous,
                       gemm_weight_only_cuda, mla_decode_cuda, cuda.mtp_accept_greedy, cuda.mtp_accept_topp)
    raise UsageError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")


@dataclass
class KernelStat:
    kernel: str
    tensor: str
    role: str
    layer: int | None
    kernel_err: float  # vs float64 on the kernel's own inputs
    quant_sqnr_db: float  # vs float64 on reference weights and unquantized activations
    ok: bool

    def to_json(self) -> dict:
        d = asdict(self)
        if math.isinf(self.quant_sqnr_db):
            d["quant_sqnr_db"] = None
        return d


def activations(m: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp(rng.uniform(-1, 1, (m, 1)))
    x[:, rng.choice(k, size=max(1, k // 256), replace=False)] *= 20.0  # outlier channels
    return x.astype(np.float32).astype(ml_dtypes.bfloat16)


def _max_rel(got: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max())
    return float(np.abs(got.astype(np.float64) - ref).max()) / scale if scale else float(np.abs(got).max())


def _fp8_linear(be: Backend, target: Checkpoint, name: str, x_bf16: np.ndarray):
    """(kernel output, the kernel's dequantized activations in float64)."""
    w, s = target.get(name), target.get(name + ds.SCALE_SUFFIX)
    xq, sx = be.act_quant(x_bf16)
    return be.gemm_fp8(xq, sx, w, s), fp8_block.dequant_ref(xq, sx, (1, 128)).astype(np.float64)


def _wo_linear(be: Backend, target: Checkpoint, name: str, x_bf16: np.ndarray, n: int):
    """(kernel output, its activations in float64, kernel label)."""
    from ds_export.verify.weights import _wo_params

    k = x_bf16.shape[1]
    bits, group, arch = _wo_params(target, name, (n, k))
    y = be.gemm_wo(x_bf16, target.get(name), target.get(name + ds.WO_SCALE_SUFFIX), bits, group, arch)
    return y, x_bf16.astype(np.float64), f"weight_only_int{bits} gemm"


def _products(pool, ref_rows, got_rows, parts, x_kernel: np.ndarray, x_ref: np.ndarray, copy=None):
    """(x_kernel @ stored.T, x_ref @ reference.T) in float64, the weights decoded in row parts on the pool's threads
    (a weight is never whole in float64: the dense MLPs of R1's first layers are 1 GB each there). copy: the weight
    check's byte comparison (verify.weights._copy_rows); rows it finds a finite copy are decoded once, for both."""
    n, m = parts[-1][1], x_kernel.shape[0]
    kern = np.empty((m, n))
    quant = np.empty((x_ref.shape[0], n))
    both = np.vstack([x_kernel, x_ref])  # (a copy's rows: both products in one pass over the weight)

    def part(r0, r1):
        size = (r1 - r0) * x_ref.shape[1]  # (into this thread's buffers, as the weight check does)
        w = ref_rows(r0, r1, W._scratch("ref", size, np.float64))
        if copy is not None and copy(r0, r1) is not None:  # equal, finite bytes: equal values
            y = both @ w.T
            kern[:, r0:r1], quant[:, r0:r1] = y[:m], y[m:]
            return
        kern[:, r0:r1] = x_kernel @ got_rows(r0, r1, W._scratch("got", size, np.float64))[0].T
        quant[:, r0:r1] = x_ref @ w.T
    for f in [pool.submit(part, r0, r1) for r0, r1 in parts]:
        f.result()
    return kern, quant


def _sample_layers(layers: list[int], samples: int) -> list[int]:
    if samples >= len(layers):
        return layers
    idx = np.linspace(0, len(layers) - 1, samples).round().astype(int)
    return sorted({layers[i] for i in idx})


def check_kernels(target: Checkpoint, reference: Checkpoint, cfg: ds.DeepseekV3Config, *, samples: int = 4,
                  seed: int = 0, gate: float = KERNEL_GATE, device: str = "cpu",
                  workers: int | None = None, progress: Reporter = QUIET) -> list[KernelStat]:
    """workers: threads decoding the float64 references' weights in row parts (default: one per core, at most 16).
    progress: counts the checks (each sampled Linear, then the grouped GEMM, MLA and the two MTP accept checks)."""
    be = backend(device)
    roles = {n: ds.classify(n, cfg) for n in target.names()}
    layers = sorted({r.layer for r in roles.values() if r.layer is not None})
    chosen = set(_sample_layers(layers, samples))
    linears = [(name, r) for name, r in roles.items()
               if r.kind == "weight" and r.quantizable and r.layer in chosen and name in reference
               and (r.expert is None or r.expert == 0)  # one expert per layer here; the grouped check covers several
               and target.info(name).dtype in ("F8_E4M3", "I8")]
    # (each check below gives one line of the report: the bar counts to the report's count)
    checks = ([partial(_grouped, be, target, layer, names, seed, gate)
               for layer, names in _grouped_work(target, roles, chosen)]
              + [partial(_mla, be, target, reference, cfg, name, r, seed, gate)
                 for name, r in _mla_work(reference, cfg, roles, chosen)]
              + [partial(_mtp_accept, be, seed), partial(_mtp_accept_topp, be, seed)])
    advance = progress.phase(f"kernels ({be.device})", len(linears) + len(checks), "checks")
    stats: list[KernelStat] = []
    pool = ThreadPoolExecutor(max_workers=workers or W.default_workers(), thread_name_prefix="dsx-verify")
    try:
        for name, r in linears:
            info = target.info(name)
            shape, ref_align, ref_rows = W._reference_rows(reference, name)
            try:
                _, got_align, got_rows = W._stored_rows(target, name, shape)
            except W._Shape:
                advance(1)
                continue  # the weight check fails this tensor, naming it
            n, k = shape
            x = activations(M_TOKENS, k, seed + (r.layer or 0))
            if info.dtype == "F8_E4M3":
                y, x_kernel = _fp8_linear(be, target, name, x)
                kern = "block fp8 gemm"
            else:
                y, x_kernel, kern = _wo_linear(be, target, name, x, n)
            parts = W._parts(n, k, math.lcm(ref_align, got_align))
            ref, quant_ref = _products(pool, ref_rows, got_rows, parts, x_kernel, x.astype(np.float64),
                                       W._copy_rows(reference, target, name))
            _, sqnr, _, _ = compare(quant_ref, y.astype(np.float64))
            err = _max_rel(y, ref)
            stats.append(KernelStat(f"{kern} ({be.device})", name, r.role, r.layer, err, sqnr, err <= gate))
            advance(1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for check in checks:
        stats.append(check())
        advance(1)
    return stats


def _grouped_work(target: Checkpoint, roles: dict, chosen: set) -> list[tuple[int, list[str]]]:
    """The grouped GEMM's checks: each sampled layer with two FP8 experts or more, its first four experts."""
    work = []
    for layer in sorted(chosen):
        names = sorted((r.expert, n) for n, r in roles.items()
                       if r.layer == layer and r.role == "expert_up" and r.kind == "weight"
                       and target.info(n).dtype == "F8_E4M3")[:4]
        if len(names) >= 2:
            work.append((layer, [n for _, n in names]))
    return work


def _grouped(be: Backend, target: Checkpoint, layer: int, names: list[str], seed: int, gate: float) -> KernelStat:
    """The MoE path: FP8 experts of one sampled layer through the contiguous grouped GEMM."""
    ws = [target.get(n) for n in names]
    ss = [target.get(n + ds.SCALE_SUFFIX) for n in names]
    k = ws[0].shape[1]
    counts = [3, 0, 5, 8][: len(names)]  # an expert with no tokens included
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    x = activations(int(offsets[-1]), k, seed + 1000 + layer)
    xq, sx = be.act_quant(x)
    y = be.grouped_fp8(xq, sx, np.stack(ws), np.stack(ss), offsets)
    x_deq = fp8_block.dequant_ref(xq, sx, (1, 128)).astype(np.float64)
    ref = np.concatenate([x_deq[offsets[e]:offsets[e + 1]] @ fp8_block.dequant_ref(ws[e], ss[e]).astype(
        np.float64).T for e in range(len(names))])
    err = _max_rel(y, ref)
    return KernelStat(f"grouped fp8 gemm (MoE, {be.device})", f"model.layers.{layer}.mlp.experts.*.up_proj",
                      "expert_up", layer, err, math.inf, err <= gate)


def _mtp_accept(be: Backend, seed: int) -> KernelStat:
    rng = np.random.default_rng(seed)
    b, k = 64, 5
    target = rng.integers(0, 4, (b, k + 1))
    draft = np.where(rng.random((b, k)) < 0.7, target[:, :k], rng.integers(0, 4, (b, k)))
    nd = rng.integers(0, k + 1, b).astype(np.int32)
    acc, cnt = be.mtp_accept(draft, target, nd)
    bad = 0
    for i in range(b):
        j = 0
        while j < nd[i] and draft[i, j] == target[i, j]:
            j += 1
        want = list(draft[i, :j]) + [target[i, j]]
        bad += cnt[i] != len(want) or list(acc[i, : cnt[i]]) != want
    return KernelStat(f"mtp accept ({be.device})", f"random drafts B={b} K={k}", "-", None, float(bad), math.inf, bad == 0)


def _mtp_accept_topp(be: Backend, seed: int) -> KernelStat:
    """Top-p acceptance: a draft stays while it is in its position's candidate set (plain reference)."""
    rng = np.random.default_rng(seed + 1)
    b, k, c = 64, 5, 4
    cand = np.stack([np.stack([rng.permutation(16)[:c] for _ in range(k + 1)]) for _ in range(b)]).astype(np.int64)
    ncand = rng.integers(1, c + 1, (b, k + 1)).astype(np.int32)
    sampled = cand[:, :, 0].copy()
    pick = np.take_along_axis(cand[:, :k], rng.integers(0, c, (b, k))[..., None], axis=2)[..., 0]
    draft = np.where(rng.random((b, k)) < 0.85, pick, rng.integers(0, 16, (b, k))).astype(np.int64)
    nd = rng.integers(0, k + 1, b).astype(np.int32)
    acc, cnt = be.mtp_accept_topp(draft, cand, ncand, sampled, nd)
    bad = 0
    for i in range(b):
        j = 0
        while j < nd[i] and draft[i, j] in set(cand[i, j, : ncand[i, j]].tolist()):
            j += 1
        want = list(draft[i, :j]) + [sampled[i, j]]
        bad += cnt[i] != len(want) or list(acc[i, : cnt[i]]) != want
    return KernelStat(f"mtp accept top-p ({be.device})", f"random drafts B={b} K={k} C={c}", "-", None, float(bad),
                      math.inf, bad == 0)


# ------------------------------------------------------------------ MLA ----

MLA_BATCH, MLA_SQ, MLA_LENS = 2, 2, (150, 77)  # 2 sequences, 2 new tokens each (a verify step), ragged


def _mla_work(reference: Checkpoint, cfg: ds.DeepseekV3Config, roles: dict,
              chosen: set) -> list[tuple[str, ds.TensorRole]]:
    """The MLA kernel's checks: each sampled layer's kv_b (none where the model's latent is not the kernel's)."""
    from ds_export.native.mla_decode import LATENT, ROPE

    if cfg.kv_lora_rank != LATENT or cfg.qk_rope_head_dim != ROPE:
        return []  # the kernel is DeepSeek-V3's 512 + 64 latent; other shapes have no MLA kernel to check
    return [(name, r) for name, r in sorted(roles.items())
            if r.role == "kv_b" and r.kind == "weight" and r.layer in chosen and name in reference]


def _mla(be: Backend, target: Checkpoint, reference: Checkpoint, cfg: ds.DeepseekV3Config, name: str,
         r: ds.TensorRole, seed: int, gate: float) -> KernelStat:
    """MLA decode with a sampled layer's absorbed kv_b over a paged latent cache (see the module doc)."""
    from ds_export.native.mla_decode import DIM, LATENT, PAGE, ROPE
    from ds_export.verify.weights import stored_f64

    h, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    heads = min(h, 16)  # a TP8 rank's worth of heads
    scale = cfg.qk_head_dim ** -0.5
    ref_w = reference_f64(reference, name).reshape(h, nope + v, LATENT)[:heads]
    got_w, _, _ = stored_f64(target, name, (h * (nope + v), LATENT))
    got_w = got_w.reshape(h, nope + v, LATENT)[:heads]
    rng = np.random.default_rng([seed, r.layer or 0, 7])
    lens = np.array(MLA_LENS, np.int32)
    t_max = int(lens.max())
    latent = rng.standard_normal((MLA_BATCH, t_max, LATENT)) * rng.uniform(0.5, 1.5, (1, 1, LATENT))
    k_pe = rng.standard_normal((MLA_BATCH, t_max, ROPE))
    q_nope = rng.standard_normal((MLA_BATCH, MLA_SQ, heads, nope))
    q_pe = rng.standard_normal((MLA_BATCH, MLA_SQ, heads, ROPE))
    rows = np.concatenate([latent, k_pe], -1).astype(np.float32).astype(ml_dtypes.bfloat16)  # the cache
    # Absorbed query, as the exported model forms it: q_nope @ W_UK per head, then bf16.
    q_lat = np.einsum("bshn,hnc->bshc", q_nope, got_w[:, :nope])
    q = np.concatenate([q_lat, q_pe], -1).astype(np.float32).astype(ml_dtypes.bfloat16)
    # Paged: pages shuffled, a spare page between, to catch a page-table bug.
    n_pages = -(-t_max // PAGE)
    perm = rng.permutation(MLA_BATCH * n_pages + 1)
    cache = np.zeros((MLA_BATCH * n_pages + 1, PAGE, DIM), ml_dtypes.bfloat16)
    table = np.zeros((MLA_BATCH, n_pages), np.int32)
    for b in range(MLA_BATCH):
        for p in range(n_pages):
            table[b, p] = perm[b * n_pages + p]
            chunk = rows[b, p * PAGE:(p + 1) * PAGE]
            cache[table[b, p], : len(chunk)] = chunk
    o_lat, _ = be.mla_decode(q, cache, table, lens, scale)
    o_lat = o_lat.astype(np.float64)
    # Kernel error: float64 attention on exactly the kernel's bf16 inputs.
    kv64, q64 = rows.astype(np.float64), q.astype(np.float64)
    want, ref_out, got_out = [], [], []
    for b in range(MLA_BATCH):
        for i in range(MLA_SQ):
            vis = int(lens[b]) - MLA_SQ + i + 1  # causal among the new tokens
            kv = kv64[b, :vis]
            p = _softmax(q64[b, i] @ kv.T * scale)  # [heads, vis]
            want.append(p @ kv[:, :LATENT])
            # Quantization error: unabsorbed attention with the reference kv_b (keys and values
            # through W_UK / W_UV of each head), vs the kernel's output taken through the stored W_UV.
            k_nope = np.einsum("tc,hnc->htn", latent[b, :vis], ref_w[:, :nope])
            vals = np.einsum("tc,hvc->htv", latent[b, :vis], ref_w[:, nope:])
            sc = (np.einsum("hn,htn->ht", q_nope[b, i], k_nope) + q_pe[b, i] @ k_pe[b, :vis].T) * scale
            ref_out.append(np.einsum("ht,htv->hv", _softmax(sc), vals))
            got_out.append(np.einsum("hc,hvc->hv", o_lat[b, i], got_w[:, nope:]))
    err = _max_rel(o_lat.reshape(-1, heads, LATENT), np.stack(want))
    _, sqnr, _, _ = compare(np.stack(ref_out), np.stack(got_out))
    return KernelStat(f"mla decode ({be.device}, {heads} heads, s_q {MLA_SQ})", name, "kv_b", r.layer, err, sqnr,
                      err <= gate)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
