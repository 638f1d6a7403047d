"""Weight numerics: dequantize each stored weight independently and compare it with the reference weight.

The stored side is decoded with the numpy references (`*_ref`: layout undone
step by step as the spec reads), never with the quantizer's compiled path; the
reference side is the source weight in float64 (FP8: value x block scale_inv).
Metrics per tensor: relative Frobenius error, SQNR (dB), max abs error, cosine,
and the share of saturated elements (codes at the format's limit). Each format
has an expected range (docs/numerics.md); a tensor outside it is flagged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ds_export.formats import fp8_block, weight_only
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds

# Minimum SQNR (dB) per stored format, on DeepSeek-like weights (docs/numerics.md gives the reasoning).
# "exact" formats must reproduce the reference bit for bit (copies).
MIN_SQNR = {
    "bf16": 45.0,
    "float32": 120.0,
    "a8w8_fp8": 25.0,
    "weight_only_int8": 33.0,
    "weight_only_int8/g": 35.0,
    "weight_only_int4": 13.0,
    "weight_only_int4/g": 15.0,
}


@dataclass
class WeightStat:
    name: str
    role: str
    layer: int | None
    mtp: bool
    format: str
    rel_fro: float
    sqnr_db: float
    max_abs: float
    cosine: float
    saturated: float  # share of elements at the format's largest code
    gate: float  # the minimum SQNR this format must reach
    ok: bool

    def to_json(self) -> dict:
        d = asdict(self)
        d["sqnr_db"] = None if math.isinf(self.sqnr_db) else self.sqnr_db
        return d


def reference_f64(ck: Checkpoint, name: str) -> np.ndarray:
    """The source weight in float64 (FP8 sources: decoded value x block scale_inv, exactly)."""
    info = ck.info(name)
    if info.dtype == "F8_E4M3":
        cfg_block = tuple((ck.config.get("quantization_config") or {}).get("weight_block_size") or fp8_block.BLOCK)
        return fp8_block.dequant_ref(ck.get(name), ck.get(name + ds.SCALE_SUFFIX), cfg_block).astype(np.float64)
    return ck.get(name).astype(np.float64)


def _wo_params(target: Checkpoint, name: str, ref_shape: tuple[int, int]) -> tuple[int, int, int]:
    n, k = ref_shape
    q = target.info(name)
    s = target.info(name + ds.WO_SCALE_SUFFIX)
    bits = 8 if q.shape[0] == n else 4
    group = -1 if len(s.shape) == 1 else (64 if s.shape[0] == -(-k // 64) else 128)
    arch = int((target.config.get("quantization_config") or {}).get("weightonly_arch", 90))
    return bits, group, arch


def stored_f64(target: Checkpoint, name: str, ref_shape) -> tuple[np.ndarray, str, float]:
    """(decoded weight, format label, saturated share)."""
    info = target.info(name)
    if info.dtype == "F8_E4M3":
        q = target.get(name)
        w = fp8_block.dequant_ref(q, target.get(name + ds.SCALE_SUFFIX)).astype(np.float64)
        sat = float(np.mean((q.view(np.uint8) & 0x7F) == 0x7E))  # |code| == 448
        return w, "a8w8_fp8", sat
    if info.dtype == "I8" and name + ds.WO_SCALE_SUFFIX in target:
        bits, group, arch = _wo_params(target, name, ref_shape)
        qw, sc = target.get(name), target.get(name + ds.WO_SCALE_SUFFIX)
        ints = weight_only.unpack_ref(qw, bits, arch, ref_shape[1])
        sat = float(np.mean(np.abs(ints) >= (127 if bits == 8 else 7)))
        w = weight_only.dequantize_ref(qw, sc, bits, group, arch, ref_shape[1]).astype(np.float64)
        return w, f"weight_only_int{bits}" + ("/g" if group != -1 else ""), sat
    label = {"BF16": "bf16", "F32": "float32"}.get(info.dtype, info.dtype)
    return target.get(name).astype(np.float64), label, 0.0


def compare(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float, float]:
    """(relative Frobenius error, SQNR dB, max abs error, cosine)."""
    err = got - ref
    e2, r2 = float((err * err).sum()), float((ref * ref).sum())
    rel = math.sqrt(e2 / r2) if r2 else (0.0 if e2 == 0 else math.inf)
    sqnr = math.inf if e2 == 0 else (10 * math.log10(r2 / e2) if r2 else -math.inf)
    denom = math.sqrt(r2 * float((got * got).sum()))
    cos = float((ref * got).sum()) / denom if denom else (1.0 if e2 == 0 else 0.0)
    return rel, sqnr, float(np.abs(err).max()) if err.size else 0.0, cos


def check_weights(target: Checkpoint, reference: Checkpoint, cfg: ds.DeepseekV3Config,
                  *, expert_sample: int | None = None, gates: dict | None = None) -> list[WeightStat]:
    """Compare every quantizable weight present in both (routed experts: the first `expert_sample` per layer)."""
    stats = []
    for name in target.names():
        r = ds.classify(name, cfg)
        if r.kind != "weight" or name not in reference:
            continue
        if expert_sample is not None and r.expert is not None and r.expert >= expert_sample:
            continue
        ref = reference_f64(reference, name)
        got, fmt, sat = stored_f64(target, name, ref.shape)
        if got.shape != ref.shape:
            stats.append(WeightStat(name, r.role, r.layer, r.mtp, fmt, math.inf, -math.inf, math.inf, 0.0, sat,
                                    0.0, False))
            continue
        rel, sqnr, mx, cos = compare(ref, got)
        gate = {**MIN_SQNR, **(gates or {})}.get(fmt, 0.0)
        # A stored tensor of the source's own format must be the source itself (passthrough copies).
        src_dtype = reference.info(name).dtype
        same = (fmt == "a8w8_fp8" and src_dtype == "F8_E4M3") or (fmt == "bf16" and src_dtype == "BF16")
        ok = math.isinf(sqnr) if same and _same_blocks(reference, target, name) else sqnr >= gate
        stats.append(WeightStat(name, r.role, r.layer, r.mtp, fmt, rel, sqnr, mx, cos, sat,
                                math.inf if same else gate, ok))
    return stats


def _same_blocks(reference: Checkpoint, target: Checkpoint, name: str) -> bool:
    sn = name + ds.SCALE_SUFFIX
    if sn in reference and sn in target:
        return reference.info(sn).shape == target.info(sn).shape
    return sn not in reference and sn not in target
