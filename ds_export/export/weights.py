"""A DeepSeek-V3 checkpoint as exported-layout numpy arrays, layer by layer.

`load_weights(src, dtype)` reads an original checkpoint (block-FP8 or bf16) or a `dsx quantize`
output and returns `ModelWeights`: every tensor keyed by its role from
`ds_export.models.deepseek_v3` (no tensor names here), in the layout the Paddle model consumes.
A Linear becomes a `LinearWeights(fmt, tensors)`; the model builds one Layer per `fmt`:

- "dense": {"weight": [in, out]} in `dtype` (Paddle's Linear layout, the HF weight transposed).
  bf16/float32 weights; FP8 weights of an original checkpoint (dequantized exactly,
  `fp8_block.dequant_native`: fp8 value x scale_inv in float32, no bf16 rounding on the way,
  then cast to `dtype` by round-to-nearest-even); and any quantized weight when
  `dequantize=True` (float32 value from the numpy references in ds_export/formats).
- "weight_only": {"qweight": int8 [N, K] (bits 8) or [N/2, K] (bits 4) in Paddle's
  `weight_quantize` byte layout, "scale": bfloat16 [N] or [ceil(K/g), N], "bits", "group",
  "arch"} exactly as `dsx quantize` stored them (`<name>.weight`, `<name>.weight_scale`);
  bits / group_size from quantization_config.types_by_role (checked against the shapes), arch
  from weightonly_arch.
- "fp8": {"weight": float8_e4m3fn [N, K] (ml_dtypes), "scale_inv": float32 [ceil(N/128),
  ceil(K/128)]} (`<name>.weight`, `<name>.weight_scale_inv`), kept when `keep_fp8` (default: for
  dsx quantize outputs, not for original checkpoints, whose FP8 is dequantized as above).
- Norm weights [n] and embeddings [vocab, hidden] keep their shapes, in `dtype`.
- The router (`router` [hidden, n_experts], `router_bias` [n_experts]) is always float32.
- `kv_b` is replaced by the MLA absorption pair `w_uk`, `w_uv` (see `absorb_kv_b`), always dense:
  a quantized kv_b (FP8 or weight-only) is dequantized to float32 by the numpy references
  first (it feeds small batched per-head matmuls, not a Linear), then cast to `dtype`.

Absorbed layout, and why. kv_b_proj [H*(nope+v), kv_lora] holds, per head h, rows
W_UK[h] (nope rows: keys) then W_UV[h] (v rows: values). We export them batched per head,
FastDeploy / DeepSeek-reference style:

    w_uk [H, nope, kv_lora]   q_latent[t, h] = q_nope[t, h] @ w_uk[h]      (scores vs. the latent)
    w_uv [H, kv_lora, v]      out[t, h]      = o_latent[t, h] @ w_uv[h]    (latent -> value space)

and keep q_b_proj and o_proj as they are. PaddleNLP's alternative pre-multiplies them
(W_Q_UK = q_b nope part x W_UK -> [q_lora, H*kv_lora]; W_UV_O = W_UV x o_proj -> [H*kv_lora,
hidden]). We do not, because (1) the products are big: for the real model W_UV_O is
65536 x 7168 per layer, 4x o_proj (~28 G extra parameters over 61 layers); (2) q_b and o_proj
stay the checkpoint's own weights, so their FP8 blocks pass through bit-exactly and later
quantized formats apply to them unchanged, whereas a product of two quantized matrices
would need re-quantizing; (3) the batched matmuls are small (kv_b is 32 MB in bf16 per layer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from ds_export.errors import CheckpointError, DsxError
from ds_export.formats import fp8_block, weight_only
from ds_export.formats._arrays import count_non_finite, transposed
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.dtypes import ST_TO_NP
from ds_export.export.params import Lazy, derive, load
from ds_export.models import deepseek_v3 as ds

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
NORM_ROLES = frozenset({"input_norm", "post_attn_norm", "q_a_norm", "kv_a_norm", "final_norm",
                        "mtp_enorm", "mtp_hnorm", "mtp_head_norm"})
EMBED_ROLES = frozenset({"embed", "mtp_embed"})
FLOAT32_ROLES = frozenset({"router", "router_bias"})  # kept float32 whatever the model dtype
# Linear roles (HF weight [out, in]) exported as LinearWeights; kv_b is absorbed instead.
LINEAR_ROLES = frozenset(r for r, (_, quant) in ds.ROLES.items() if quant and r != "kv_b") | {"lm_head", "mtp_head"}
EXPERT_ROLE_KEYS = {"expert_gate": "gate", "expert_up": "up", "expert_down": "down"}


@dataclass
class LinearWeights:
    """One Linear in exported layout (fmt "dense" | "weight_only" | "fp8"; see the module docstring)."""

    fmt: str
    tensors: dict[str, object]

    @property
    def in_features(self) -> int:
        t = self.tensors
        return int(t["weight"].shape[0] if self.fmt == "dense" else (t["qweight"] if "qweight" in t else t["weight"]).shape[1])

    @property
    def out_features(self) -> int:
        t = self.tensors
        if self.fmt == "dense":
            return int(t["weight"].shape[1])
        if self.fmt == "weight_only":
            return int(t["qweight"].shape[0]) * (2 if t["bits"] == 4 else 1)
        return int(t["weight"].shape[0])


@dataclass
class LayerWeights:
    """One decoder layer (a main layer or an MTP layer): role -> array or LinearWeights.

    Keys: input_norm, post_attn_norm, q_a, q_a_norm, q_b (or q_proj), kv_a, kv_a_norm, w_uk,
    w_uv, o_proj; dense layers: dense_gate/up/down; MoE layers: router, router_bias,
    shared_gate/up/down and `experts[e]` = {"gate", "up", "down"}; MTP layers add mtp_embed,
    mtp_enorm, mtp_hnorm, mtp_eh_proj, mtp_head_norm, mtp_head.
    """

    index: int
    mtp: bool
    moe: bool
    tensors: dict[str, object] = field(default_factory=dict)
    experts: list[dict[str, LinearWeights]] = field(default_factory=list)

    def __getitem__(self, key: str):
        return self.tensors[key]


@dataclass
class ModelWeights:
    cfg: ds.DeepseekV3Config
    dtype: str
    top: dict[str, object]  # embed, final_norm, lm_head
    layers: list[LayerWeights]  # the main model's decoder layers, in order
    mtp: list[LayerWeights]  # MTP layers (empty when not loaded)
    tp: tuple[int, int] = (0, 1)  # (rank, world): a tensor-parallel rank's share (tp.shard_weights)

    def nbytes(self) -> int:
        """Bytes of every array once (a Lazy's by its declared shape and dtype, nothing read): a lower bound of what
        an export of these weights writes (programs, headers, MTP's own copies and tensor-parallel replicas come
        on top)."""
        seen: dict[int, int] = {}

        def walk(o):
            if hasattr(o, "shape") and hasattr(o, "dtype"):
                seen.setdefault(id(o), int(np.prod(o.shape, dtype=np.int64)) * np.dtype(o.dtype).itemsize)
            elif isinstance(o, dict):
                for v in o.values():
                    walk(v)
            elif isinstance(o, (list, tuple)):
                for v in o:
                    walk(v)
            elif isinstance(o, (LinearWeights, LayerWeights)):
                walk(o.tensors)
                walk(getattr(o, "experts", []))

        walk([self.top, self.layers, self.mtp])
        return sum(seen.values())


# ------------------------------------------------------------- absorption ----

def absorb_kv_b(kv_b: np.ndarray, num_heads: int, qk_nope_head_dim: int, v_head_dim: int):
    """kv_b_proj weight [H*(nope+v), kv_lora] (HF layout) -> (w_uk [H, nope, kv_lora], w_uv [H, kv_lora, v])."""
    rows = num_heads * (qk_nope_head_dim + v_head_dim)
    if kv_b.ndim != 2 or kv_b.shape[0] != rows:
        raise DsxError(f"kv_b_proj: shape {list(kv_b.shape)} is not [{rows}, kv_lora_rank] "
                       f"(heads {num_heads} x (qk_nope {qk_nope_head_dim} + v {v_head_dim}))")
    per_head = kv_b.reshape(num_heads, qk_nope_head_dim + v_head_dim, kv_b.shape[1])
    w_uk = np.ascontiguousarray(per_head[:, :qk_nope_head_dim, :])
    w_uv = np.ascontiguousarray(per_head[:, qk_nope_head_dim:, :].transpose(0, 2, 1))
    return w_uk, w_uv


# ----------------------------------------------------------------- reading ----

class _Reader:
    """Reads checkpoint tensors: float32 values (FP8 / weight-only dequantized exactly) or kept quantized.

    keep_fp8 / keep_wo: build "fp8" / "weight_only" LinearWeights instead of dequantizing.
    reference: dequantize FP8 with the numpy reference (`fp8_block.dequant_ref`, same values as
    the native one) so a dequantized model shares no compiled code with the quantized ops.
    """

    def __init__(self, ckpt: Checkpoint, cfg: ds.DeepseekV3Config, dtype: str, *, keep_fp8: bool, keep_wo: bool,
                 reference: bool = False, lazy: bool = False):
        self.ckpt, self.cfg, self.dt = ckpt, cfg, DTYPES[dtype]
        self.block = cfg.fp8_block or ds.FP8_BLOCK
        self.keep_fp8, self.keep_wo, self.reference, self.lazy = keep_fp8, keep_wo, reference, lazy
        self.qc = ckpt.config.get("quantization_config") or {}

    def defer(self, shape, dtype, fn):
        """fn() now, or a Lazy of it (lazy mode: nothing is read until the exporter writes it)."""
        return Lazy(shape, dtype, fn) if self.lazy else fn()

    def _companion_name(self, name: str, suffix: str, what: str) -> str:
        sname = name + suffix
        if sname not in self.ckpt:
            raise CheckpointError(f"{self.ckpt.root}: {what} tensor {name} has no {sname}",
                                  hint="the checkpoint is incomplete or was not written by dsx quantize / DeepSeek")
        dt, want = self.ckpt.info(sname).dtype, ds.SCALE_DTYPES[suffix]
        if dt != want:  # (an I32 one was read as integers, an F16 one as other numbers: an export of garbage, exit 0)
            raise CheckpointError(f"{self.ckpt.root}: {sname}, the scale of {what} tensor {name}, is {dt}; "
                                  f"{'DeepSeek' if want == 'F32' else 'dsx quantize'} writes {want}",
                                  hint="the checkpoint is damaged or was not written by dsx quantize / DeepSeek")
        return sname

    def _companion(self, name: str, suffix: str, what: str) -> np.ndarray:
        return self.ckpt.get(self._companion_name(name, suffix, what))

    def logical_shape(self, name: str) -> tuple[int, ...]:
        """[out, in] of a weight (a weight-only one is stored packed: out comes from its scale)."""
        info = self.ckpt.info(name)
        if info.dtype == "I8":
            s = self.ckpt.info(self._companion_name(name, ds.WO_SCALE_SUFFIX, "weight-only"))
            return int(s.shape[-1]), int(info.shape[1])
        return tuple(int(d) for d in info.shape)

    def weight_only_args(self, name: str, role: str, mtp: bool) -> dict:
        """{"qweight", "scale", "bits", "group", "arch"} of a stored weight-only Linear, checked."""
        sname = self._companion_name(name, ds.WO_SCALE_SUFFIX, "weight-only")
        q, s = self.ckpt.info(name), self.ckpt.info(sname)
        rule = (self.qc.get("types_by_role") or {}).get(("mtp." if mtp else "") + role) or {}
        kind = rule.get("type", "")
        bits = 4 if kind.endswith("int4") else 8 if kind.endswith("int8") else None
        n = int(s.shape[-1])
        if bits is None:  # no recipe entry: infer from the shapes
            bits = 8 if q.shape[0] == n else 4
        group = int(rule.get("group_size", self.qc.get("weightonly_group_size", -1)))
        arch = int(self.qc.get("weightonly_arch", 90))
        k = int(q.shape[1])
        try:
            want = weight_only.packed_shapes(n, k, bits, group, arch)
        except DsxError as e:
            raise DsxError(f"{self.ckpt.root}: {name}: {e}") from None
        if tuple(q.shape) != tuple(want["qweight"]["shape"]) or tuple(s.shape) != tuple(want["scale"]["shape"]):
            raise CheckpointError(f"{self.ckpt.root}: {name} {list(q.shape)} / scale {list(s.shape)} do not fit "
                                  f"int{bits} group {group} (expected {want['qweight']['shape']} / "
                                  f"{want['scale']['shape']})", hint="types_by_role disagrees with the tensors")
        ck = self.ckpt
        return {"qweight": self.defer(q.shape, np.int8, lambda: np.ascontiguousarray(ck.get(name).view(np.int8))),
                "scale": self.defer(s.shape, ml_dtypes.bfloat16, lambda: self.finite(sname, np.ascontiguousarray(
                    np.asarray(ck.get(sname)).astype(ml_dtypes.bfloat16)))),
                "bits": bits, "group": group, "arch": arch}

    def finite(self, name: str, a: np.ndarray) -> np.ndarray:
        """a, the values of tensor `name` (float, bf16 or e4m3 codes), when it holds no NaN / Inf: an export of one
        gave programs whose logits are NaN, exit 0 (dsx quantize refuses them in its sources)."""
        if a.dtype == ml_dtypes.float8_e4m3fn:
            bad, first = fp8_block.count_nan_native(a)
        else:
            bad, first = count_non_finite(a)
        if bad:
            raise CheckpointError(f"{self.ckpt.shard_of(name).path}: tensor {name!r}: {bad} NaN or Inf value(s) "
                                  f"(the first at flat index {first}); it cannot be exported",
                                  hint="the checkpoint is corrupt: download or quantize it again")
        return a

    def float32(self, name: str, role: str = "", mtp: bool = False) -> np.ndarray:
        return self.finite(name, self._float32(name, role, mtp))

    def _float32(self, name: str, role: str = "", mtp: bool = False) -> np.ndarray:
        info = self.ckpt.info(name)
        if info.dtype == "F8_E4M3":
            sinv = self._companion(name, ds.SCALE_SUFFIX, "FP8")
            if self.reference:
                return fp8_block.dequant_ref(self.ckpt.get(name), sinv, self.block).astype(np.float32)
            return fp8_block.dequant_native(self.ckpt.get(name), sinv, self.block, "float32")
        if info.dtype == "I8":
            a = self.weight_only_args(name, role, mtp)
            q, sc = load(a["qweight"]), load(a["scale"])
            return weight_only.dequantize_ref(q, sc, a["bits"], a["group"], a["arch"], int(q.shape[1]))
        if info.dtype in ("F32", "BF16", "F16"):
            return np.asarray(self.ckpt.get(name), dtype=np.float32)
        raise DsxError(f"{self.ckpt.root}: tensor {name} is {info.dtype}; export reads bf16/float32, block FP8 "
                       "and dsx weight-only (int8) tensors")

    def cast(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.astype(self.dt))

    def plain(self, name: str, role: str, mtp: bool, transpose: bool = False) -> np.ndarray:
        """A float tensor in the export dtype (transposed: a Linear's [out, in] as Paddle's [in, out]), NaN / Inf
        refused. Stored in that dtype already: its values as they are (no float32 round trip, exact either way);
        otherwise through float32, a narrowing cast checked for values beyond the export dtype's range."""
        stored = self.ckpt.info(name).dtype
        if ST_TO_NP.get(stored) == self.dt:
            a = self.finite(name, np.asarray(self.ckpt.get(name)))
        elif self.dt.itemsize < 4:
            a = self._narrowed(name, role, mtp)
            bad, first = count_non_finite(a)  # (one check of the narrowed values; which fault, only on a fault)
            if bad:
                wide = self.float32(name, role, mtp)  # (NaN / Inf stored: the corrupt tensor's error, here)
                raise DsxError(f"{self.ckpt.shard_of(name).path}: tensor {name!r}: {bad} value(s) beyond "
                               f"{self.dt.name}'s range (the first at flat index {first}, {wide.reshape(-1)[first]:g})",
                               hint="export with --dtype bfloat16 or float32")
        else:
            a = self.float32(name, role, mtp)
        return transposed(a) if transpose else np.ascontiguousarray(a)

    def _narrowed(self, name: str, role: str, mtp: bool) -> np.ndarray:
        """A tensor in the 16-bit export dtype, not checked: block FP8 straight to bfloat16 by the native dequant
        (its float32 products rounded to nearest even, as the cast of the float32 dequant rounds them: the same bits,
        without a float32 copy of the tensor), else through float32."""
        if self.ckpt.info(name).dtype == "F8_E4M3" and self.dt == ml_dtypes.bfloat16 and not self.reference:
            sinv = self._companion(name, ds.SCALE_SUFFIX, "FP8")
            return fp8_block.dequant_native(self.ckpt.get(name), sinv, self.block, "bfloat16")
        with np.errstate(over="ignore"):  # (counted by the caller)
            return self._float32(name, role, mtp).astype(self.dt, copy=False)

    def tensor(self, name: str, role: str, mtp: bool = False):
        ck, stored = self.ckpt, self.ckpt.info(name).dtype
        if role in LINEAR_ROLES and stored == "I8" and self.keep_wo:
            return LinearWeights("weight_only", self.weight_only_args(name, role, mtp))
        if role in LINEAR_ROLES and stored == "F8_E4M3" and self.keep_fp8:
            sname = self._companion_name(name, ds.SCALE_SUFFIX, "FP8")
            wi, si = ck.info(name), ck.info(sname)
            if tuple(self.block) != (128, 128):
                raise DsxError(f"{self.ckpt.root}: {name}: FP8 block {list(self.block)}; the FP8 op takes 128x128 "
                               "blocks", hint="requantize with dsx quantize --type a8w8_fp8, or export it dense")
            fp8_block.check_scale_shape(wi.shape, si.shape, (128, 128), name)
            w = self.defer(wi.shape, ml_dtypes.float8_e4m3fn, lambda: self.finite(name, np.ascontiguousarray(
                np.asarray(ck.get(name)).view(ml_dtypes.float8_e4m3fn))))
            sinv = self.defer(si.shape, np.float32, lambda: self.finite(sname, np.ascontiguousarray(
                np.asarray(ck.get(sname), np.float32))))
            return LinearWeights("fp8", {"weight": w, "scale_inv": sinv})
        shape = self.logical_shape(name)
        if role in FLOAT32_ROLES:
            t = role == "router"
            return self.defer(shape[::-1] if t else shape, np.float32, lambda: np.ascontiguousarray(
                self.float32(name, role, mtp).T if t else self.float32(name, role, mtp)))
        if role in LINEAR_ROLES:
            return LinearWeights("dense", {"weight": self.defer(shape[::-1], self.dt,
                                                                lambda: self.plain(name, role, mtp, transpose=True))})
        if role in NORM_ROLES or role in EMBED_ROLES:
            return self.defer(shape, self.dt, lambda: self.plain(name, role, mtp))
        raise DsxError(f"tensor {name}: role {role} has no export rule")


def _group_names(ckpt: Checkpoint, cfg: ds.DeepseekV3Config) -> tuple[dict, dict[int, dict]]:
    """Checkpoint names -> (top-level roles, {layer: {name: TensorRole}}), weights only."""
    roles = ds.map_tensors(ckpt.names(), cfg, source=str(ckpt.root))
    top, layers = {}, {}
    for name, r in roles.items():
        if r.kind in ("scale", "scale_inv"):  # read with their weights
            continue
        (top if r.layer is None else layers.setdefault(r.layer, {}))[name] = r
    return top, layers


def _check_complete(ckpt: Checkpoint, cfg: ds.DeepseekV3Config, layer: int | None, have: dict) -> None:
    want = ds.expected_tensors(cfg, layers=range(layer, layer + 1) if layer is not None else range(0),
                               include_top=layer is None)
    missing = [e.name for e in want if e.role.kind in ("weight", "bias") and e.name not in have]
    if missing:
        where = f"layer {layer}" if layer is not None else "top level"
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise CheckpointError(f"{ckpt.root}: {where} lacks {', '.join(missing[:3])}{more}",
                              hint="the checkpoint is partial: re-download or re-convert it")


def _load_layer(rd: _Reader, layer: int, names: dict) -> LayerWeights:
    cfg = rd.cfg
    lw = LayerWeights(layer, cfg.is_mtp_layer(layer), cfg.is_moe_layer(layer))
    if lw.moe:
        lw.experts = [{} for _ in range(cfg.n_routed_experts)]
    for name, r in names.items():
        if r.role == "kv_b":
            h, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
            if rd.lazy:  # each half reads and absorbs kv_b when it is written
                lora = rd.logical_shape(name)[1]

                def part(i: int, name=name, mtp=lw.mtp):
                    return rd.cast(absorb_kv_b(rd.float32(name, "kv_b", mtp), h, nope, v)[i])

                lw.tensors["w_uk"] = Lazy((h, nope, lora), rd.dt, lambda p=part: p(0))
                lw.tensors["w_uv"] = Lazy((h, lora, v), rd.dt, lambda p=part: p(1))
            else:
                lw.tensors["w_uk"], lw.tensors["w_uv"] = (rd.cast(a) for a in absorb_kv_b(
                    rd.float32(name, r.role, lw.mtp), h, nope, v))
        elif r.role in EXPERT_ROLE_KEYS:
            lw.experts[r.expert][EXPERT_ROLE_KEYS[r.role]] = rd.tensor(name, r.role, lw.mtp)
        else:
            lw.tensors[r.role] = rd.tensor(name, r.role, lw.mtp)
    return lw


def load_weights(src: Checkpoint | str | os.PathLike, dtype: str = "float32", *,
                 include_mtp: bool = True, keep_fp8: bool | None = None, dequantize: bool = False,
                 lazy: bool = False) -> ModelWeights:
    """Read a whole checkpoint into exported-layout arrays (see the module docstring).

    dtype: "float32" or "bfloat16" (norms, embeddings, dense Linears, w_uk/w_uv; router stays float32).
    include_mtp: also load the MTP layer(s) (cfg.mtp_layers).
    keep_fp8: FP8 Linears as "fp8" LinearWeights (run by the dsx_fp8_linear op) instead of dense;
        None = True for `dsx quantize` outputs (quant_method "dsx"), False for original checkpoints.
    dequantize: every quantized Linear (FP8 and weight-only) dense, dequantized by the numpy
        references `fp8_block.dequant_ref` / `weight_only.dequantize_ref` (the float reference of a
        quantized export, sharing no compiled code with the ops); overrides keep_fp8.
    lazy: every array is a `params.Lazy` (shape and dtype now, data read and converted when the
        exporter writes it), so a model far bigger than memory can be exported; the checkpoint
        must stay open until then.
    """
    if dtype not in DTYPES:
        raise DsxError(f"export dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    ckpt = src if isinstance(src, Checkpoint) else Checkpoint.open(src)
    cfg = ds.DeepseekV3Config.from_dict(ckpt.config, source=str(ckpt.root / "config.json"))
    if cfg.topk_method != "noaux_tc" or cfg.raw.get("scoring_func", "sigmoid") != "sigmoid":
        raise DsxError(f"{ckpt.root}: topk_method {cfg.topk_method!r} / scoring_func "
                       f"{cfg.raw.get('scoring_func')!r}: export supports DeepSeek-V3's noaux_tc + sigmoid router")
    if cfg.raw.get("hidden_act", "silu") != "silu":  # (the programs' MLPs are SwiGLU: silu(gate) * up)
        raise DsxError(f"{ckpt.root}: hidden_act {cfg.raw.get('hidden_act')!r}: export supports DeepSeek-V3's silu")
    top_names, layer_names = _group_names(ckpt, cfg)
    _check_complete(ckpt, cfg, None, top_names)
    if keep_fp8 is None:
        keep_fp8 = (ckpt.config.get("quantization_config") or {}).get("quant_method") == "dsx"
    rd = _Reader(ckpt, cfg, dtype, keep_fp8=bool(keep_fp8) and not dequantize, keep_wo=not dequantize,
                 reference=dequantize, lazy=lazy)
    ds.check_shapes({n: rd.logical_shape(n) for names in (top_names, *layer_names.values()) for n in names}, cfg,
                    source=str(ckpt.root))
    ds.check_block_scales({**top_names, **{n: r for names in layer_names.values() for n, r in names.items()}},
                          {t.name: (t.dtype, tuple(t.shape)) for t in ckpt.infos()}, rd.block, source=str(ckpt.root))
    top = {r.role: rd.tensor(n, r.role) for n, r in top_names.items()}
    if "lm_head" not in top:  # tie_word_embeddings
        e = top["embed"]
        top["lm_head"] = LinearWeights("dense", {"weight": derive(e, e.shape[::-1], lambda a: np.ascontiguousarray(a.T))})
    wanted = list(range(cfg.num_hidden_layers)) + (list(cfg.mtp_layers) if include_mtp else [])
    layers = []
    for L in wanted:
        names = layer_names.get(L, {})
        _check_complete(ckpt, cfg, L, names)
        layers.append(_load_layer(rd, L, names))
    main = [lw for lw in layers if not lw.mtp]
    return ModelWeights(cfg, dtype, top, main, [lw for lw in layers if lw.mtp])
