"""Kernel numerics: run the compiled GEMM and MTP kernels on the stored weights and separate two errors.

For each sampled Linear:
- kernel error: the kernel's output against float64 on exactly the kernel's inputs (the
  quantized activations for block FP8, the stored weights decoded by the numpy references).
  It must sit at accumulation-rounding level (bf16 output rounding, fp32 sums): anything
  larger is a kernel or layout bug.
- quantization error: the kernel's output against float64 on the reference weights and the
  unquantized activations, as SQNR: what users care about.
Routed experts also go through the grouped (MoE) FP8 GEMM when they are FP8. The MTP
accept kernel is checked against a plain reference on random drafts.
Activations are realistic stand-ins: Gaussian tokens of varied scale with a few outlier
channels, rounded to bf16 (a fixed seed, so reports are reproducible).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from ds_export.formats import fp8_block, weight_only
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds
from ds_export.verify.weights import compare, reference_f64

KERNEL_GATE = 8e-3  # max |kernel - float64| / max |float64|: bf16 output rounding is 2^-9 relative
M_TOKENS = 16


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


def _fp8_linear(target: Checkpoint, name: str, x_bf16: np.ndarray):
    from ds_export.native.kernels import gemm_fp8_nt

    w, s = target.get(name), target.get(name + ds.SCALE_SUFFIX)
    xq, sx = fp8_block.act_quant_native(x_bf16)
    y = gemm_fp8_nt(xq, sx, w, s)
    x_deq = fp8_block.dequant_ref(xq, sx, (1, 128)).astype(np.float64)
    ref = x_deq @ fp8_block.dequant_ref(w, s).astype(np.float64).T
    return y, ref


def _wo_linear(target: Checkpoint, name: str, x_bf16: np.ndarray, n: int):
    from ds_export.native.gemm_weight_only import gemm_weight_only
    from ds_export.verify.weights import _wo_params

    k = x_bf16.shape[1]
    bits, group, arch = _wo_params(target, name, (n, k))
    q, s = target.get(name), target.get(name + ds.WO_SCALE_SUFFIX)
    y = gemm_weight_only(x_bf16, q, s, bits, group, arch)
    ref = x_bf16.astype(np.float64) @ weight_only.dequantize_ref(q, s, bits, group, arch, k).astype(np.float64).T
    return y, ref, f"weight_only_int{bits} gemm"


def _sample_layers(layers: list[int], samples: int) -> list[int]:
    if samples >= len(layers):
        return layers
    idx = np.linspace(0, len(layers) - 1, samples).round().astype(int)
    return sorted({layers[i] for i in idx})


def check_kernels(target: Checkpoint, reference: Checkpoint, cfg: ds.DeepseekV3Config, *, samples: int = 4,
                  seed: int = 0, gate: float = KERNEL_GATE) -> list[KernelStat]:
    roles = {n: ds.classify(n, cfg) for n in target.names()}
    layers = sorted({r.layer for r in roles.values() if r.layer is not None})
    chosen = set(_sample_layers(layers, samples))
    stats: list[KernelStat] = []
    for name, r in roles.items():
        if r.kind != "weight" or not r.quantizable or r.layer not in chosen or name not in reference:
            continue
        if r.expert is not None and r.expert > 0:
            continue  # one expert per layer here; the grouped check covers several
        info = target.info(name)
        ref_w = reference_f64(reference, name)
        n, k = ref_w.shape
        x = activations(M_TOKENS, k, seed + (r.layer or 0))
        if info.dtype == "F8_E4M3":
            y, ref, kern = *_fp8_linear(target, name, x), "block fp8 gemm"
        elif info.dtype == "I8":
            y, ref, kern = _wo_linear(target, name, x, n)
        else:
            continue
        _, sqnr, _, _ = compare(x.astype(np.float64) @ ref_w.T, y.astype(np.float64))
        err = _max_rel(y, ref)
        stats.append(KernelStat(kern, name, r.role, r.layer, err, sqnr, err <= gate))
    stats += _grouped(target, roles, chosen, seed, gate)
    stats.append(_mtp_accept(seed))
    return stats


def _grouped(target: Checkpoint, roles: dict, chosen: set, seed: int, gate: float) -> list[KernelStat]:
    """The MoE path: FP8 experts of one sampled layer through the contiguous grouped GEMM."""
    from ds_export.native.kernels import gemm_fp8_grouped_nt_contiguous

    out = []
    for layer in sorted(chosen):
        names = sorted((r.expert, n) for n, r in roles.items()
                       if r.layer == layer and r.role == "expert_up" and r.kind == "weight"
                       and target.info(n).dtype == "F8_E4M3")[:4]
        if len(names) < 2:
            continue
        ws = [target.get(n) for _, n in names]
        ss = [target.get(n + ds.SCALE_SUFFIX) for _, n in names]
        k = ws[0].shape[1]
        counts = [3, 0, 5, 8][: len(names)]  # an expert with no tokens included
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        x = activations(int(offsets[-1]), k, seed + 1000 + layer)
        xq, sx = fp8_block.act_quant_native(x)
        y = gemm_fp8_grouped_nt_contiguous(xq, sx, np.stack(ws), np.stack(ss), offsets)
        x_deq = fp8_block.dequant_ref(xq, sx, (1, 128)).astype(np.float64)
        ref = np.concatenate([x_deq[offsets[e]:offsets[e + 1]] @ fp8_block.dequant_ref(ws[e], ss[e]).astype(
            np.float64).T for e in range(len(names))])
        err = _max_rel(y, ref)
        out.append(KernelStat("grouped fp8 gemm (MoE)", f"model.layers.{layer}.mlp.experts.*.up_proj", "expert_up",
                              layer, err, math.inf, err <= gate))
    return out


def _mtp_accept(seed: int) -> KernelStat:
    from ds_export.native.kernels import mtp_accept_greedy

    rng = np.random.default_rng(seed)
    b, k = 64, 5
    target = rng.integers(0, 4, (b, k + 1))
    draft = np.where(rng.random((b, k)) < 0.7, target[:, :k], rng.integers(0, 4, (b, k)))
    nd = rng.integers(0, k + 1, b).astype(np.int32)
    acc, cnt = mtp_accept_greedy(draft, target, nd)
    bad = 0
    for i in range(b):
        j = 0
        while j < nd[i] and draft[i, j] == target[i, j]:
            j += 1
        want = list(draft[i, :j]) + [target[i, j]]
        bad += cnt[i] != len(want) or list(acc[i, : cnt[i]]) != want
    return KernelStat("mtp accept", f"random drafts B={b} K={k}", "-", None, float(bad), math.inf, bad == 0)
