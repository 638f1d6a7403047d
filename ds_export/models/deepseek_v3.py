"""DeepSeek-V3 / R1: everything dsx knows about the architecture, in one place.

- `DeepseekV3Config`: config.json parsed and checked (only the keys we use).
- `classify(name, cfg)`: tensor name -> `TensorRole` (role, layer, expert, MTP?,
  weight/scale partner, quantizable?, tensor-parallel split). Unknown names are
  an error, never passed through silently.
- `expected_tensors(cfg, fp8=...)`: every tensor the model must have, with its
  shape and dtype, derived from the config alone (used by `dsx tiny`, planning,
  and integrity checks).

Layer indices of the MTP module(s) are derived from the config
(num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers - 1),
never hard-coded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from ds_export.errors import ModelMapError
from ds_export.io.dtypes import nbytes
from ds_export.values import is_int, is_number

ARCHITECTURE = "DeepseekV3ForCausalLM"
MODEL_TYPES = ("deepseek_v3",)
SCALE_SUFFIX = "_scale_inv"  # official FP8 companion: <name>.weight_scale_inv
WO_SCALE_SUFFIX = "_scale"  # Paddle weight-only companion (dsx quantize output): <name>.weight_scale
# The companions' dtypes as DeepSeek and dsx quantize write them (another is a damaged or foreign checkpoint: an I32
# block scale, the same 4 bytes a value, was read as integers)
SCALE_DTYPES = {SCALE_SUFFIX: "F32", WO_SCALE_SUFFIX: "BF16"}
FP8_BLOCK = (128, 128)

# ---------------------------------------------------------------- config ----

_REQUIRED = (
    "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size", "n_routed_experts",
    "num_experts_per_tok", "first_k_dense_replace",
)
_OPTIONAL_INTS = ("q_lora_rank", "n_shared_experts", "n_group", "topk_group", "moe_layer_freq",
                  "num_nextn_predict_layers")
_MAY_BE_ZERO = ("first_k_dense_replace", "n_shared_experts", "num_nextn_predict_layers")  # (the rest count from 1)


def _check_settings(cfg: dict, source: str) -> None:
    """The settings the math reads besides the sizes (rope, norm epsilon, router scaling), when present: numbers
    where numbers go, true/false where flags go, and a YaRN rope_scaling with its factor and original length. A
    string ("2.5") or a YaRN table without its factor went through to an internal error in export, or was read
    by dsx as a number while the serving stack reads the same config.json."""
    def bad(key, v, want):
        raise ModelMapError(f"{source}: {key} {v!r}: expected {want}",
                            hint="fix config.json, or take the model repository's own")
    for k in ("rope_theta", "routed_scaling_factor"):
        if cfg.get(k) is not None and not (is_number(cfg[k]) and cfg[k] > 0):
            bad(k, cfg[k], "a positive number")
    if cfg.get("rms_norm_eps") is not None and not (is_number(cfg["rms_norm_eps"]) and cfg["rms_norm_eps"] >= 0):
        bad("rms_norm_eps", cfg["rms_norm_eps"], "a non-negative number")
    for k in ("norm_topk_prob", "tie_word_embeddings"):
        if cfg.get(k) is not None and not isinstance(cfg[k], bool):
            bad(k, cfg[k], "true or false")
    mpe = cfg.get("max_position_embeddings")
    if mpe is not None and not (is_int(mpe) and mpe > 0):
        bad("max_position_embeddings", mpe, "a positive integer")
    # (the serving stack stops a sequence at eos_token_id and starts one with bos_token_id: an id past the vocabulary
    # is a token the model never emits, so generation would run to max length; a list of ids as transformers allows)
    for k in ("bos_token_id", "eos_token_id"):
        ids = cfg.get(k)
        if ids is not None and not all(is_int(i) and 0 <= i < cfg["vocab_size"] for i in (
                ids if isinstance(ids, list) and ids else [ids])):
            bad(k, ids, f"a token id in 0..{cfg['vocab_size'] - 1} (vocab_size {cfg['vocab_size']}), or a list of them")
    rs = cfg.get("rope_scaling")
    if rs is None:
        return
    if not isinstance(rs, dict):
        bad("rope_scaling", rs, "a mapping or null")
    if rs.get("type", rs.get("rope_type")) == "yarn":
        for k in ("factor", "original_max_position_embeddings"):
            if not (is_number(rs.get(k)) and rs[k] > 0):
                bad(f"rope_scaling.{k}", rs.get(k), "a positive number (YaRN needs it)")
        for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if rs.get(k) is not None and not is_number(rs[k]):
                bad(f"rope_scaling.{k}", rs[k], "a number")


@dataclass(frozen=True)
class DeepseekV3Config:
    raw: dict
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    moe_layer_freq: int
    num_nextn_predict_layers: int
    topk_method: str
    tie_word_embeddings: bool
    fp8_block: tuple[int, int] | None  # weight_block_size when the checkpoint is block FP8

    @classmethod
    def from_dict(cls, cfg: dict, *, source: str = "config.json") -> "DeepseekV3Config":
        mt = cfg.get("model_type")
        if mt not in MODEL_TYPES:
            raise ModelMapError(f"{source}: model_type is {mt!r}, dsx supports {', '.join(MODEL_TYPES)}")
        missing = [k for k in _REQUIRED if not is_int(cfg.get(k))]
        if missing:
            raise ModelMapError(f"{source}: missing or non-integer keys {', '.join(missing)}")
        # (a size of 0 or less: num_attention_heads -2 was an internal error in dsx tiny and export)
        small = [f"{k} {cfg[k]}" for k in _REQUIRED if cfg[k] < (0 if k in _MAY_BE_ZERO else 1)]
        if small:
            raise ModelMapError(f"{source}: {', '.join(small)}: sizes and counts are at least 1 ("
                                f"{', '.join(_MAY_BE_ZERO)}: at least 0)")
        # (optional keys: absent or null take their default; a string such as "1" is refused, not read as 1: the
        # serving stack reads the same config.json, where "1" times an int is a string; and 0 where counting starts
        # at 1 is refused, not read as the default: topk_group 0 was read as 1)
        odd = [f"{k} {cfg[k]!r}" for k in _OPTIONAL_INTS if cfg.get(k) is not None
               and not (is_int(cfg[k]) and cfg[k] >= (0 if k in _MAY_BE_ZERO else 1))]
        if odd:
            raise ModelMapError(f"{source}: {', '.join(odd)}: expected a non-negative integer or null "
                                f"({', '.join(k for k in _OPTIONAL_INTS if k not in _MAY_BE_ZERO)}: at least 1)")
        _check_settings(cfg, source)
        qc = cfg.get("quantization_config") or {}
        block = None
        if qc.get("quant_method") == "fp8":
            wbs = qc.get("weight_block_size")
            if not (isinstance(wbs, list) and len(wbs) == 2 and all(isinstance(b, int) and b > 0 for b in wbs)):
                raise ModelMapError(f"{source}: quantization_config.weight_block_size {wbs!r} is not [rows, cols]")
            block = (wbs[0], wbs[1])
        c = cls(
            raw=cfg,
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            moe_intermediate_size=cfg["moe_intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
            vocab_size=cfg["vocab_size"],
            n_routed_experts=cfg["n_routed_experts"],
            n_shared_experts=int(cfg.get("n_shared_experts") or 0),
            num_experts_per_tok=cfg["num_experts_per_tok"],
            n_group=int(cfg.get("n_group") or 1),
            topk_group=int(cfg.get("topk_group") or 1),
            first_k_dense_replace=cfg["first_k_dense_replace"],
            moe_layer_freq=int(cfg.get("moe_layer_freq") or 1),
            num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers") or 0),
            topk_method=str(cfg.get("topk_method") or "greedy"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            fp8_block=block,
        )
        c._check(source)
        return c

    def _check(self, source: str) -> None:
        if self.n_routed_experts % self.n_group:
            raise ModelMapError(f"{source}: n_routed_experts {self.n_routed_experts} not divisible by n_group {self.n_group}")
        if not 0 < self.topk_group <= self.n_group:
            raise ModelMapError(f"{source}: topk_group {self.topk_group} must be in 1..n_group ({self.n_group})")
        if not 0 < self.num_experts_per_tok <= self.n_routed_experts:
            raise ModelMapError(f"{source}: num_experts_per_tok {self.num_experts_per_tok} out of range")

    # -- derived ---------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def mtp_layers(self) -> range:
        n = self.num_hidden_layers
        return range(n, n + self.num_nextn_predict_layers)

    @property
    def all_layers(self) -> range:
        return range(self.num_hidden_layers + self.num_nextn_predict_layers)

    def is_mtp_layer(self, layer: int) -> bool:
        return layer in self.mtp_layers

    def is_moe_layer(self, layer: int) -> bool:
        return (self.n_routed_experts > 0 and layer >= self.first_k_dense_replace
                and layer % self.moe_layer_freq == 0)


# ----------------------------------------------------------------- roles ----

# role -> (tensor-parallel split, quantizable Linear?). Split names follow
# PaddleNLP: "col" splits the output dim (dim 0 of an HF weight), "row" splits
# the input dim (dim 1) and needs an all-reduce, "vocab" splits an embedding's
# rows; None = replicated.
ROLES: dict[str, tuple[str | None, bool]] = {
    "embed": ("vocab", False),
    "lm_head": ("col", False),
    "final_norm": (None, False),
    "input_norm": (None, False),
    "post_attn_norm": (None, False),
    "q_proj": ("col", True),  # only when q_lora_rank is null (V2-Lite style)
    "q_a": (None, True),
    "q_a_norm": (None, False),
    "q_b": ("col", True),
    "kv_a": (None, True),
    "kv_a_norm": (None, False),
    "kv_b": ("col", True),
    "o_proj": ("row", True),
    "dense_gate": ("col", True),
    "dense_up": ("col", True),
    "dense_down": ("row", True),
    "shared_gate": ("col", True),
    "shared_up": ("col", True),
    "shared_down": ("row", True),
    "expert_gate": ("col", True),
    "expert_up": ("col", True),
    "expert_down": ("row", True),
    "router": (None, False),
    "router_bias": (None, False),
    "mtp_embed": ("vocab", False),
    "mtp_enorm": (None, False),
    "mtp_hnorm": (None, False),
    "mtp_eh_proj": (None, True),
    "mtp_head_norm": (None, False),
    "mtp_head": ("col", False),
}
ROUTED_EXPERT_ROLES = frozenset({"expert_gate", "expert_up", "expert_down"})


@dataclass(frozen=True)
class TensorRole:
    name: str
    role: str
    layer: int | None = None
    expert: int | None = None
    mtp: bool = False
    kind: str = "weight"  # "weight" | "scale_inv" (FP8 block scale) | "scale" (weight-only scale) | "bias"

    @property
    def quantizable(self) -> bool:
        return self.kind == "weight" and ROLES[self.role][1]

    @property
    def tp_split(self) -> str | None:
        return ROLES[self.role][0] if self.kind != "bias" else None

    @property
    def weight_name(self) -> str:
        """For a scale_inv companion: the weight it scales."""
        if self.kind == "scale_inv":
            return self.name[: -len(SCALE_SUFFIX)]
        if self.kind == "scale":
            return self.name[: -len(WO_SCALE_SUFFIX)]
        return self.name

    @property
    def scale_name(self) -> str:
        return self.weight_name + SCALE_SUFFIX


# names inside a layer, relative to "model.layers.N."
_ATTN = {
    "self_attn.q_proj.weight": "q_proj",
    "self_attn.q_a_proj.weight": "q_a",
    "self_attn.q_a_layernorm.weight": "q_a_norm",
    "self_attn.q_b_proj.weight": "q_b",
    "self_attn.kv_a_proj_with_mqa.weight": "kv_a",
    "self_attn.kv_a_layernorm.weight": "kv_a_norm",
    "self_attn.kv_b_proj.weight": "kv_b",
    "self_attn.o_proj.weight": "o_proj",
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_attn_norm",
}
_DENSE = {f"mlp.{p}_proj.weight": f"dense_{p}" for p in ("gate", "up", "down")}
_MOE = {
    "mlp.gate.weight": "router",
    "mlp.gate.e_score_correction_bias": "router_bias",
    **{f"mlp.shared_experts.{p}_proj.weight": f"shared_{p}" for p in ("gate", "up", "down")},
}
_MTP = {
    "embed_tokens.weight": "mtp_embed",
    "enorm.weight": "mtp_enorm",
    "hnorm.weight": "mtp_hnorm",
    "eh_proj.weight": "mtp_eh_proj",
    "shared_head.norm.weight": "mtp_head_norm",
    "shared_head.head.weight": "mtp_head",
}
_TOP = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def classify(name: str, cfg: DeepseekV3Config) -> TensorRole:
    """Map a tensor name to its role. Raises ModelMapError for names that do not belong."""
    kind = "weight"
    base = name
    if name.endswith(SCALE_SUFFIX):
        kind, base = "scale_inv", name[: -len(SCALE_SUFFIX)]
    elif name.endswith(".weight" + WO_SCALE_SUFFIX):
        kind, base = "scale", name[: -len(WO_SCALE_SUFFIX)]
    if base in _TOP:
        role = TensorRole(name, _TOP[base], kind=kind)
    else:
        role = _classify_layer(name, base, kind, cfg)
    if kind in ("scale_inv", "scale") and not ROLES[role.role][1]:
        raise ModelMapError(f"tensor {name!r}: a {kind} companion of a tensor that is never quantized")
    return role


def _classify_layer(name: str, base: str, kind: str, cfg: DeepseekV3Config) -> TensorRole:
    m = _LAYER_RE.match(base)
    if not m:
        raise ModelMapError(f"tensor {name!r}: not a DeepSeek-V3 tensor name")
    layer, rest = int(m.group(1)), m.group(2)
    if layer not in cfg.all_layers:
        raise ModelMapError(f"tensor {name!r}: layer {layer} is beyond num_hidden_layers + num_nextn_predict_layers "
                            f"({cfg.num_hidden_layers} + {cfg.num_nextn_predict_layers})")
    mtp = cfg.is_mtp_layer(layer)
    if rest == "mlp.gate.e_score_correction_bias":
        kind = "bias"
    if rest in _ATTN:
        return TensorRole(name, _ATTN[rest], layer, None, mtp, kind)
    if mtp and rest in _MTP:
        return TensorRole(name, _MTP[rest], layer, None, True, kind)
    if cfg.is_moe_layer(layer):
        if rest in _MOE:
            return TensorRole(name, _MOE[rest], layer, None, mtp, kind)
        em = _EXPERT_RE.match(rest)
        if em:
            e = int(em.group(1))
            if e >= cfg.n_routed_experts:
                raise ModelMapError(f"tensor {name!r}: expert {e} >= n_routed_experts {cfg.n_routed_experts}")
            return TensorRole(name, f"expert_{em.group(2)}", layer, e, mtp, kind)
    elif rest in _DENSE:
        return TensorRole(name, _DENSE[rest], layer, None, mtp, kind)
    where = "an MoE" if cfg.is_moe_layer(layer) else "a dense"
    raise ModelMapError(f"tensor {name!r}: not a known tensor of {where} {'MTP ' if mtp else ''}layer")


# ------------------------------------------------------- expected tensors ----

@dataclass(frozen=True)
class ExpectedTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name
    role: TensorRole

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


def _linear_shapes(cfg: DeepseekV3Config, layer: int) -> Iterator[tuple[str, tuple[int, int]]]:
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    p = f"model.layers.{layer}."
    if cfg.q_lora_rank:
        yield p + "self_attn.q_a_proj.weight", (cfg.q_lora_rank, H)
        yield p + "self_attn.q_b_proj.weight", (nh * cfg.qk_head_dim, cfg.q_lora_rank)
    else:
        yield p + "self_attn.q_proj.weight", (nh * cfg.qk_head_dim, H)
    yield p + "self_attn.kv_a_proj_with_mqa.weight", (cfg.kv_lora_rank + cfg.qk_rope_head_dim, H)
    yield p + "self_attn.kv_b_proj.weight", (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    yield p + "self_attn.o_proj.weight", (H, nh * cfg.v_head_dim)
    if cfg.is_moe_layer(layer):
        si = cfg.moe_intermediate_size * cfg.n_shared_experts
        if si:
            yield p + "mlp.shared_experts.gate_proj.weight", (si, H)
            yield p + "mlp.shared_experts.up_proj.weight", (si, H)
            yield p + "mlp.shared_experts.down_proj.weight", (H, si)
        mi = cfg.moe_intermediate_size
        for e in range(cfg.n_routed_experts):
            yield p + f"mlp.experts.{e}.gate_proj.weight", (mi, H)
            yield p + f"mlp.experts.{e}.up_proj.weight", (mi, H)
            yield p + f"mlp.experts.{e}.down_proj.weight", (H, mi)
    else:
        I = cfg.intermediate_size
        yield p + "mlp.gate_proj.weight", (I, H)
        yield p + "mlp.up_proj.weight", (I, H)
        yield p + "mlp.down_proj.weight", (H, I)


def gemm_shapes(cfg: DeepseekV3Config, tp: int = 1) -> dict[tuple[int, int], tuple[str, ...]]:
    """{(N, K): names} of the weight GEMMs one of `tp` tensor-parallel ranks runs (ROLES' splits: "col"
    divides N, "row" divides K), for tuning and benchmarking kernels at the shapes a deployment meets.
    ModelMapError where tp does not divide a split dimension."""
    out: dict[tuple[int, int], tuple[str, ...]] = {}
    for name, role, n, k in _gemm_roles(cfg):
        split = ROLES[role][0]
        dim = n if split == "col" else k if split == "row" else None
        if dim is not None and dim % tp:
            raise ModelMapError(f"{name}: {'N' if split == 'col' else 'K'} = {dim} is not divisible by tp {tp}",
                                hint="choose a tensor-parallel degree that divides the heads and MLP widths")
        shape = (n // tp if split == "col" else n, k // tp if split == "row" else k)
        out[shape] = out.get(shape, ()) + (name,)
    return out


def _gemm_roles(cfg: DeepseekV3Config) -> Iterator[tuple[str, str, int, int]]:
    """(name, ROLES key whose split applies, N, K) of every distinct quantizable GEMM at tp = 1: the Linears
    of expected_tensors for one layer of each kind (dense, MoE, MTP), gate and up as one name ("dense_gate/up")
    and also fused ("dense_gate_up": one GEMM of both, as PaddleNLP's serving runs its ffn1)."""
    kinds: dict[tuple[bool, bool], int] = {}
    for layer in cfg.all_layers:
        kinds.setdefault((cfg.is_moe_layer(layer), cfg.is_mtp_layer(layer)), layer)
    seen = set()
    for layer in sorted(kinds.values()):
        for t in expected_tensors(cfg, fp8=False, fp8_eh_proj=True, layers=range(layer, layer + 1),
                                  include_top=False):
            role = t.role.role
            if not t.role.quantizable or role.endswith("_up") or role in seen:
                continue
            seen.add(role)
            n, k = t.shape
            if role.endswith("_gate"):
                kind = role[: -len("_gate")]
                yield f"{kind}_gate/up", role, n, k
                yield f"{kind}_gate_up", role, 2 * n, k
            else:
                yield role, role, n, k


def scale_shape(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    return (-(-shape[0] // block[0]), -(-shape[1] // block[1]))


def expected_tensors(cfg: DeepseekV3Config, *, fp8: bool | None = None, fp8_eh_proj: bool = False,
                     layers: range | None = None, include_top: bool = True) -> list[ExpectedTensor]:
    """Every tensor of the official layout, in a stable order (layer by layer).

    fp8: Linear weights stored as F8_E4M3 + F32 scale_inv (default: as the config says).
    """
    if fp8 is None:
        fp8 = cfg.fp8_block is not None
    block = cfg.fp8_block or FP8_BLOCK
    H, V = cfg.hidden_size, cfg.vocab_size
    out: list[tuple[str, tuple[int, ...], str]] = []

    def lin(name, shape):
        if fp8:
            out.append((name, shape, "F8_E4M3"))
            out.append((name + SCALE_SUFFIX, scale_shape(shape, block), "F32"))
        else:
            out.append((name, shape, "BF16"))

    if include_top:
        out.append(("model.embed_tokens.weight", (V, H), "BF16"))
    for L in layers if layers is not None else cfg.all_layers:
        p = f"model.layers.{L}."
        out.append((p + "input_layernorm.weight", (H,), "BF16"))
        if cfg.q_lora_rank:
            out.append((p + "self_attn.q_a_layernorm.weight", (cfg.q_lora_rank,), "BF16"))
        out.append((p + "self_attn.kv_a_layernorm.weight", (cfg.kv_lora_rank,), "BF16"))
        out.append((p + "post_attention_layernorm.weight", (H,), "BF16"))
        if cfg.is_moe_layer(L):
            out.append((p + "mlp.gate.weight", (cfg.n_routed_experts, H), "BF16"))
            if cfg.topk_method == "noaux_tc":
                out.append((p + "mlp.gate.e_score_correction_bias", (cfg.n_routed_experts,), "F32"))
        for name, shape in _linear_shapes(cfg, L):
            lin(name, shape)
        if cfg.is_mtp_layer(L):
            out.append((p + "embed_tokens.weight", (V, H), "BF16"))
            out.append((p + "enorm.weight", (H,), "BF16"))
            out.append((p + "hnorm.weight", (H,), "BF16"))
            if fp8 and fp8_eh_proj:
                lin(p + "eh_proj.weight", (H, 2 * H))
            else:
                out.append((p + "eh_proj.weight", (H, 2 * H), "BF16"))
            out.append((p + "shared_head.norm.weight", (H,), "BF16"))
            out.append((p + "shared_head.head.weight", (V, H), "BF16"))
    if include_top:
        out.append(("model.norm.weight", (H,), "BF16"))
        if not cfg.tie_word_embeddings:
            out.append(("lm_head.weight", (V, H), "BF16"))
    return [ExpectedTensor(n, s, d, classify(n, cfg)) for n, s, d in out]


def map_tensors(names: list[str], cfg: DeepseekV3Config, *, source: str = "checkpoint") -> dict[str, TensorRole]:
    """Classify every name and check FP8 partners: each scale_inv has its weight and vice versa."""
    roles = {n: classify(n, cfg) for n in names}
    for n, r in roles.items():
        if r.kind in ("scale_inv", "scale") and r.weight_name not in roles:
            raise ModelMapError(f"{source}: {n} has no weight {r.weight_name}")
    return roles


# role -> the config.json keys its shape comes from (besides hidden_size), named in a shape mismatch's message
_SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "embed": ("vocab_size",), "lm_head": ("vocab_size",), "mtp_embed": ("vocab_size",), "mtp_head": ("vocab_size",),
    "q_proj": ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim"),
    "q_a": ("q_lora_rank",), "q_a_norm": ("q_lora_rank",),
    "q_b": ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "q_lora_rank"),
    "kv_a": ("kv_lora_rank", "qk_rope_head_dim"), "kv_a_norm": ("kv_lora_rank",),
    "kv_b": ("num_attention_heads", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"),
    "o_proj": ("num_attention_heads", "v_head_dim"),
    "dense_gate": ("intermediate_size",), "dense_up": ("intermediate_size",), "dense_down": ("intermediate_size",),
    "shared_gate": ("moe_intermediate_size", "n_shared_experts"), "shared_up": ("moe_intermediate_size", "n_shared_experts"),
    "shared_down": ("moe_intermediate_size", "n_shared_experts"),
    "expert_gate": ("moe_intermediate_size",), "expert_up": ("moe_intermediate_size",),
    "expert_down": ("moe_intermediate_size",),
    "router": ("n_routed_experts",), "router_bias": ("n_routed_experts",),
}


def check_shapes(shapes: dict[str, tuple[int, ...]], cfg: DeepseekV3Config, *, source: str = "checkpoint") -> None:
    """Every weight and bias of `shapes` (name -> logical [out, in] shape, or a vector's) has the shape config.json
    implies. Names and dtypes alone let a config.json that does not describe the weights through (another model's,
    or an edited one: intermediate_size 3 over 320-row MLPs): quantize copied it into its output and export into the
    programs, which a server then loads against weights of other shapes."""
    def said(role: str) -> str:
        keys = (() if role in ("q_a_norm", "kv_a_norm", "kv_b", "q_b", "router_bias") else ("hidden_size",)) + \
            _SHAPE_KEYS.get(role, ())
        return ", ".join(f"{k} {cfg.raw.get(k)}" for k in keys if k in cfg.raw)

    want = {et.name: et for et in expected_tensors(cfg, fp8=False) if et.role.kind in ("weight", "bias")}
    bad = [et for name, et in want.items() if name in shapes and tuple(shapes[name]) != et.shape]
    if bad:
        et = bad[0]
        more = f"; {len(bad) - 1} more tensors disagree" if len(bad) > 1 else ""
        raise ModelMapError(f"{source}: {et.name} is {list(shapes[et.name])}, but config.json ({said(et.role.role)}) "
                            f"implies {list(et.shape)}{more}",
                            hint="config.json does not describe these weights: use the config.json that came with them")
    extra = [r for r in (classify(n, cfg) for n in shapes if n not in want) if r.kind in ("weight", "bias")]
    if extra:
        r = extra[0]
        more = f"; {len(extra) - 1} more" if len(extra) > 1 else ""
        raise ModelMapError(f"{source}: {r.name} is not a tensor of the model config.json describes "
                            f"({said(r.role)}){more}",
                            hint="config.json does not describe these weights: use the config.json that came with them")


# What a source checkpoint's tensors are (dsx quantize's input): FP8 e4m3 weights with F32 block scales (DeepSeek's), or
# floating-point values (a bf16 / f16 / f32 conversion). A weight-only output's I8 weights and BF16 scales are dsx's
# or Paddle's output, not a source: an FP8 weight declared I8 was converted from its bytes read as integers (-61 dB,
# exit 0), and a wint4 output given to quantize was refused as a shape that is not a multiple of 64.
SOURCE_DTYPES = ("F8_E4M3", "BF16", "F16", "F32")


def check_source(roles: dict[str, TensorRole], infos: dict[str, tuple[str, tuple[int, ...]]],
                 block: tuple[int, int], *, source: str = "checkpoint") -> None:
    """The present tensors of a source checkpoint (infos: name -> (dtype, shape)) are of a source's dtypes, and their
    block scales have the shapes their weights' blocks make (check_block_scales)."""
    for n, (dt, _) in infos.items():
        r = roles[n]
        if r.kind == "scale_inv":
            continue  # (F32: check_fp8_partners)
        if r.kind == "scale" or dt not in SOURCE_DTYPES or (dt == "F8_E4M3" and r.kind != "weight"):
            what = "a weight-only scale" if r.kind == "scale" else "a weight" if r.kind == "weight" else "a vector"
            raise ModelMapError(f"{source}: {n} ({what}) is {dt}; a source checkpoint holds F8_E4M3 block-scaled "
                                "weights or BF16 / F16 / F32 values",
                                hint="quantize from the original checkpoint (a quantized output is not converted "
                                     "again), or download it again if this is one")
    check_block_scales(roles, infos, block, source=source)


def check_block_scales(roles: dict[str, TensorRole], infos: dict[str, tuple[str, tuple[int, ...]]],
                       block: tuple[int, int], *, source: str = "checkpoint") -> None:
    """Each present FP8 weight's block scale, where present, has the shape its blocks make: a scale declared [2, 4]
    for a [512, 192] weight in blocks of 128 was copied by quantize under the [4, 2] the output needs, its values taken
    in the wrong order without a word (export stopped at it with an internal message)."""
    for n, r in roles.items():  # (roles: at least the present weights'; a partial checkpoint's absent ones skipped)
        if r.kind != "weight" or n not in infos or infos[n][0] != "F8_E4M3" or r.scale_name not in infos:
            continue
        shape = infos[n][1]
        want = [-(-shape[0] // block[0]), -(-shape[1] // block[1])] if len(shape) == 2 else None
        got = list(infos[r.scale_name][1])
        if got != want:
            raise ModelMapError(f"{source}: block scale {r.scale_name} is {got}; {n} {list(shape)} in blocks of "
                                f"{list(block)} has {want}",
                                hint="the checkpoint is damaged or not in DeepSeek's format: download it again")


def check_fp8_partners(roles: dict[str, TensorRole], dtypes: dict[str, str], *, source: str = "checkpoint") -> None:
    """Every FP8 weight of `dtypes` (the tensors present) has its block scale among `roles` (which may also hold the
    tensors of a partial checkpoint's absent shards)."""
    for n, dt in dtypes.items():
        r = roles[n]
        if r.kind == "weight" and dt in ("F8_E4M3", "F8_E5M2") and r.scale_name not in roles:
            raise ModelMapError(f"{source}: FP8 tensor {n} has no {r.scale_name}",
                                hint="the checkpoint is incomplete or not block-scaled FP8")
        if r.kind == "scale_inv" and dt != SCALE_DTYPES[SCALE_SUFFIX]:  # (I32 was converted as garbage: -243 dB)
            raise ModelMapError(f"{source}: block scale {n} is {dt}; DeepSeek's FP8 block scales are F32",
                                hint="the checkpoint is damaged or not in DeepSeek's format: download it again")
