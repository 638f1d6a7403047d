"""DeepSeek-V3 inference in Paddle: one step function over a latent KV cache.

`DeepseekV3ForInference(weights, max_len)` (weights from `weights.load_weights`) has ONE
`forward(input_ids [B, S] int64, cache_lens [B] int64, cache [L, B, max_len, D])`
-> (logits [B, S, V] float32, hidden [B, S, H] float32 after the final norm, new cache).
Sequence b's S new tokens sit at positions cache_lens[b] .. cache_lens[b] + S - 1; their latent
rows are written there and each attends causally to positions 0 .. its own. Prefill (S = prompt,
cache_lens 0), decode (S = 1) and speculative verify (S = 1 + drafts) are the same call.
Ragged batches need no extra input: right-pad to S; a pad token writes cache rows past its
sequence's end that no real token reads, and the next step (cache_lens[b] + true length)
overwrites them. D = kv_lora_rank + qk_rope_head_dim; cache row = [kv_a_norm(c_kv), rope(k_pe)].

Precision: parameters and the cache are stored in the model dtype; arithmetic is float32
(Paddle's CPU build has no bf16 matmul/add kernels). For bfloat16 / float16, every Linear /
batched matmul output, norm output, residual sum and cache write is rounded to that dtype, which
emulates a 16-bit GEMM with float32 accumulation. Linears go through `make_linear` (one Layer class per
weight format, keyed by `LinearWeights.fmt`): "dense" (matmul), "weight_only" and "fp8" (the
dsx custom operators of ops.py, CPU kernels from csrc/; their outputs are bf16-exact values).

Written for `paddle.jit.save`: no Python-side reads of tensor values inside forward, shapes
through `paddle.shape`, forward's first parameter is `self`. Math: docs/export-model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.static import InputSpec

from ds_export.errors import DsxError
from ds_export.export.params import make_param
from ds_export.export.quant_layers import Fp8Linear, WeightOnlyLinear
from ds_export.export.tp import all_reduce, gather_last_dim
from ds_export.export.weights import LayerWeights, LinearWeights, ModelWeights
from ds_export.models.deepseek_v3 import DeepseekV3Config


# ------------------------------------------------------------------ spec ----

def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class ModelSpec:
    """The config values the math needs (sizes from DeepseekV3Config, the rest from its raw dict)."""

    hidden: int
    heads: int
    kv_lora: int
    nope: int
    rope: int
    v: int
    n_experts: int
    top_k: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    eps: float
    softmax_scale: float
    dtype: str
    tp_rank: int = 0  # tensor parallel: this program's rank of tp_world; heads is the rank's own count
    tp_world: int = 1

    @classmethod
    def from_config(cls, cfg: DeepseekV3Config, dtype: str, tp: tuple[int, int] = (0, 1)) -> "ModelSpec":
        raw = cfg.raw
        scale = cfg.qk_head_dim ** -0.5
        rs = raw.get("rope_scaling") or {}
        if rs and rs.get("mscale_all_dim"):
            m = yarn_get_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
            scale *= m * m
        return cls(cfg.hidden_size, cfg.num_attention_heads // tp[1], cfg.kv_lora_rank, cfg.qk_nope_head_dim,
                   cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.n_routed_experts, cfg.num_experts_per_tok,
                   cfg.n_group, cfg.topk_group, bool(raw.get("norm_topk_prob", True)),
                   float(raw.get("routed_scaling_factor", 1.0)), float(raw.get("rms_norm_eps", 1e-6)),
                   scale, dtype, tp[0], tp[1])


def rope_tables(cfg: DeepseekV3Config, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """YaRN (or plain) rope: cos, sin float32 [max_len, rope/2], one angle per interleaved pair.

    Computed in float64. inv_freq blends interpolated (1/(factor*base^(2i/d))) and extrapolated
    (1/base^(2i/d)) frequencies with a linear ramp between the correction dims of beta_fast and
    beta_slow; cos/sin carry mscale(factor, mscale) / mscale(factor, mscale_all_dim).
    """
    raw, dim = cfg.raw, cfg.qk_rope_head_dim
    theta = float(raw.get("rope_theta", 10000.0))
    base = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = raw.get("rope_scaling") or {}
    kind = rs.get("type", rs.get("rope_type")) if rs else None
    amp = 1.0
    if kind is None or kind == "default":
        inv_freq = 1.0 / base
    elif kind == "yarn":
        factor, orig = float(rs["factor"]), float(rs["original_max_position_embeddings"])
        beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))

        def corr_dim(rot: float) -> float:
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), dim - 1)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / ((high - low) or 0.001), 0.0, 1.0)
        extra = 1.0 - ramp  # weight of the extrapolated (unscaled) frequency
        inv_freq = (1.0 / (factor * base)) * (1.0 - extra) + (1.0 / base) * extra
        amp = yarn_get_mscale(factor, float(rs.get("mscale", 1.0))) / yarn_get_mscale(
            factor, float(rs.get("mscale_all_dim", 0.0)))
    else:
        raise DsxError(f"config.json: rope_scaling type {kind!r} is not supported by export (DeepSeek-V3 uses yarn)")
    ang = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    return (np.cos(ang) * amp).astype(np.float32), (np.sin(ang) * amp).astype(np.float32)


# ------------------------------------------------------------- building ----

def _param(layer: nn.Layer, arr) -> paddle.Tensor:
    """A weight of the model (an array, or a Lazy one under params.deferred()), exact in its dtype."""
    return make_param(layer, arr)


def _round(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """Round a float32 activation to the model dtype's precision (identity for float32)."""
    return x if dtype == "float32" else x.astype(dtype).astype("float32")


def _f32(t: paddle.Tensor, dtype: str) -> paddle.Tensor:
    return t if dtype == "float32" else t.astype("float32")


class DenseLinear(nn.Layer):
    """y = x @ weight, weight [in, out] (Paddle layout) in the model dtype; float32 arithmetic."""

    def __init__(self, lw: LinearWeights, dtype: str):
        super().__init__()
        self.dtype_name = dtype
        self.weight = _param(self, lw.tensors["weight"])

    def forward(self, x):
        return _round(paddle.matmul(x, _f32(self.weight, self.dtype_name)), self.dtype_name)


# LinearWeights.fmt -> Layer class
LINEAR_FORMATS = {"dense": DenseLinear, "weight_only": WeightOnlyLinear, "fp8": Fp8Linear}


def make_linear(lw: LinearWeights, dtype: str) -> nn.Layer:
    try:
        cls = LINEAR_FORMATS[lw.fmt]
    except KeyError:
        raise DsxError(f"Linear format {lw.fmt!r} has no Paddle layer yet "
                       f"(known: {', '.join(LINEAR_FORMATS)})") from None
    return cls(lw, dtype)


def embed_tokens(input_ids, weight, spec: "ModelSpec"):
    """Embedding rows of input_ids as float32 [B, S, H]; vocab-parallel when spec.tp_world > 1.

    A rank holds rows [tp_rank * V_r, (tp_rank + 1) * V_r) (V_r = its rows); other tokens embed to
    zero there, and the all-reduce adds the one rank's row to zeros (exact).
    """
    if spec.tp_world == 1:
        return _f32(F.embedding(input_ids, weight), spec.dtype)
    local = input_ids - spec.tp_rank * weight.shape[0]
    mine = paddle.logical_and(local >= 0, local < weight.shape[0])
    e = _f32(F.embedding(paddle.where(mine, local, paddle.zeros_like(local)), weight), spec.dtype)
    return all_reduce(e * mine.unsqueeze(-1).astype("float32"), spec.tp_world)


class RMSNorm(nn.Layer):
    def __init__(self, weight: np.ndarray, eps: float, dtype: str):
        super().__init__()
        self.eps, self.dtype_name = eps, dtype
        self.weight = _param(self, weight)

    def forward(self, x):
        y = x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + self.eps)
        return _round(y * _f32(self.weight, self.dtype_name), self.dtype_name)


# ------------------------------------------------------------ attention ----

def rotate_interleaved(x, cos, sin):
    """Rope on interleaved pairs (x[2i], x[2i+1]) by angle i, output in the same pair order.

    x [..., R], cos/sin broadcastable to [..., R/2]. (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin).
    """
    nd = len(x.shape)
    pairs = x.reshape([0] * (nd - 1) + [-1, 2])
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return paddle.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1).flatten(start_axis=nd - 1)


@dataclass
class StepTensors:
    """Per-step index tensors shared by all layers (built once by `step_tensors`)."""

    cos: paddle.Tensor  # [B, S, R/2] float32
    sin: paddle.Tensor
    write_b: paddle.Tensor  # [B*S] int64: batch row of each new token
    write_pos: paddle.Tensor  # [B*S] int64: its cache position (= rope position)
    attn_bias: paddle.Tensor  # [B, 1, S, kv_len] float32: 0 where key j <= query position, -inf elsewhere
    kv_len: paddle.Tensor  # 0-D int64: max(cache_lens) + S, the cache prefix attention reads


def step_tensors(input_ids, cache_lens, rope_cos, rope_sin) -> StepTensors:
    shp = paddle.shape(input_ids)
    b, s = shp[0], shp[1]
    pos = cache_lens.astype("int64").unsqueeze(1) + paddle.arange(s, dtype="int64").unsqueeze(0)  # [B, S]
    kv_len = paddle.max(cache_lens).astype("int64") + s
    allowed = paddle.arange(kv_len, dtype="int64").reshape([1, 1, -1]) <= pos.unsqueeze(-1)  # [B, S, kv_len]
    bias = paddle.where(allowed, paddle.zeros_like(allowed, dtype="float32"),
                        paddle.full_like(allowed, float("-inf"), dtype="float32"))
    rows = (paddle.arange(b, dtype="int64").unsqueeze(1) + paddle.zeros_like(pos)).flatten()
    return StepTensors(F.embedding(pos, rope_cos), F.embedding(pos, rope_sin), rows, pos.flatten(),
                       bias.unsqueeze(1), kv_len)


class MLAttention(nn.Layer):
    """Absorbed multi-head latent attention over the latent cache [B, max_len, kv_lora + rope]."""

    def __init__(self, spec: ModelSpec, lw: LayerWeights):
        super().__init__()
        dt, t = spec.dtype, lw.tensors
        self.spec, self.dtype_name = spec, dt
        self.softmax_scale = spec.softmax_scale
        self.q_a = make_linear(t["q_a"], dt) if "q_a" in t else None
        self.q_a_norm = RMSNorm(t["q_a_norm"], spec.eps, dt) if "q_a" in t else None
        self.q_b = make_linear(t["q_b"] if "q_a" in t else t["q_proj"], dt)
        self.kv_a = make_linear(t["kv_a"], dt)
        self.kv_a_norm = RMSNorm(t["kv_a_norm"], spec.eps, dt)
        self.w_uk = _param(self, t["w_uk"])  # [H, nope, kv_lora]
        self.w_uv = _param(self, t["w_uv"])  # [H, kv_lora, v]
        self.o_proj = make_linear(t["o_proj"], dt)

    def forward(self, x, st: StepTensors, cache):
        sp, dt = self.spec, self.dtype_name
        q = self.q_b(self.q_a_norm(self.q_a(x))) if self.q_a is not None else self.q_b(x)
        q = q.reshape([0, 0, sp.heads, sp.nope + sp.rope])
        q_nope, q_pe = paddle.split(q, [sp.nope, sp.rope], axis=-1)
        q_pe = rotate_interleaved(q_pe, st.cos.unsqueeze(2), st.sin.unsqueeze(2))
        c_kv, k_pe = paddle.split(self.kv_a(x), [sp.kv_lora, sp.rope], axis=-1)
        new = paddle.concat([self.kv_a_norm(c_kv), rotate_interleaved(k_pe, st.cos, st.sin)], axis=-1)
        cache = paddle.index_put(cache, (st.write_b, st.write_pos),
                                 new.reshape([-1, sp.kv_lora + sp.rope]).astype(cache.dtype))
        kv = _f32(cache[:, :st.kv_len], dt).unsqueeze(1)  # [B, 1, kv_len, D]
        q_lat = _round(paddle.matmul(q_nope.transpose([0, 2, 1, 3]), _f32(self.w_uk, dt)), dt)  # [B, H, S, kv_lora]
        q_all = paddle.concat([q_lat, q_pe.transpose([0, 2, 1, 3])], axis=-1)
        scores = paddle.matmul(q_all, kv, transpose_y=True) * self.softmax_scale + st.attn_bias
        probs = F.softmax(scores, axis=-1)
        o_lat = _round(paddle.matmul(probs, kv[:, :, :, :sp.kv_lora]), dt)  # [B, H, S, kv_lora]
        o = _round(paddle.matmul(o_lat, _f32(self.w_uv, dt)), dt)  # [B, H, S, v]
        o = o.transpose([0, 2, 1, 3]).reshape([0, 0, sp.heads * sp.v])
        if sp.tp_world == 1:
            return self.o_proj(o), cache
        return _round(all_reduce(self.o_proj(o), sp.tp_world), dt), cache  # o_proj is row-parallel


# ------------------------------------------------------------------ MLP ----

class MLP(nn.Layer):
    """down(silu(gate(x)) * up(x)); the dense MLP, a shared expert block or one routed expert.

    tp_world > 1 with reduce=True (the dense MLP): down is row-parallel, its partial sums are
    all-reduced here. Experts pass reduce=False: MoE reduces their sum once.
    """

    def __init__(self, gate: LinearWeights, up: LinearWeights, down: LinearWeights, dtype: str,
                 tp_world: int = 1, reduce: bool = False):
        super().__init__()
        self.dtype_name, self.tp_world, self.reduce = dtype, tp_world, reduce
        self.gate, self.up, self.down = make_linear(gate, dtype), make_linear(up, dtype), make_linear(down, dtype)

    def forward(self, x):
        y = self.down(_round(F.silu(self.gate(x)) * self.up(x), self.dtype_name))
        if self.reduce and self.tp_world > 1:
            y = _round(all_reduce(y, self.tp_world), self.dtype_name)
        return y


def noaux_tc_route(logits, bias, n_group: int, topk_group: int, top_k: int, norm_topk_prob: bool,
                   routed_scaling_factor: float):
    """DeepSeek-V3 router. logits [T, E] float32, bias [E] -> (topk_idx [T, K] int64, weights [T, K]).

    scores = sigmoid(logits); choice = scores + bias (selection only). Groups of E/n_group
    experts are ranked by the sum of their top-2 choice values; only the best topk_group groups
    stay eligible; the top_k eligible experts by choice are picked. Weights are their plain
    scores, divided by their sum (+1e-20) when norm_topk_prob, times routed_scaling_factor.
    """
    scores = F.sigmoid(logits)
    choice = scores + bias
    n_exp = logits.shape[-1]
    grouped = choice.reshape([-1, n_group, n_exp // n_group])
    group_scores = paddle.topk(grouped, 2, axis=-1)[0].sum(axis=-1)  # [T, G]
    group_idx = paddle.topk(group_scores, topk_group, axis=-1)[1]  # [T, topk_group]
    group_mask = F.one_hot(group_idx, n_group).sum(axis=1)  # [T, G]
    expert_mask = group_mask.unsqueeze(-1).expand([-1, n_group, n_exp // n_group]).reshape([-1, n_exp])
    masked = paddle.where(expert_mask > 0, choice, paddle.full_like(choice, float("-inf")))
    idx = paddle.topk(masked, top_k, axis=-1)[1]
    w = paddle.take_along_axis(scores, idx, axis=1)
    if norm_topk_prob:
        w = w / (w.sum(axis=-1, keepdim=True) + 1e-20)
    return idx, w * routed_scaling_factor


class MoE(nn.Layer):
    """Routed experts (noaux_tc) + shared experts: y = sum_k w_k expert_k(x) + shared(x)."""

    def __init__(self, spec: ModelSpec, lw: LayerWeights):
        super().__init__()
        dt, t = spec.dtype, lw.tensors
        self.spec, self.dtype_name = spec, dt
        self.router = _param(self, t["router"])  # [H, E] float32
        self.router_bias = _param(self, t["router_bias"])  # [E] float32
        self.experts = nn.LayerList([MLP(e["gate"], e["up"], e["down"], dt) for e in lw.experts])
        self.shared = MLP(t["shared_gate"], t["shared_up"], t["shared_down"], dt) if "shared_gate" in t else None

    @paddle.jit.not_to_static
    def experts_forward(self, x, idx, w):
        """x [T, H], idx/w [T, K] -> [T, H]: each expert runs on its tokens only (gather / index_add)."""
        k = self.spec.top_k
        flat_idx, flat_w = idx.flatten(), w.flatten()
        token = paddle.arange(paddle.shape(flat_idx)[0], dtype="int64") // k
        out = paddle.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = paddle.nonzero(flat_idx == e).flatten()
            rows = paddle.gather(token, sel)
            y = expert(paddle.gather(x, rows)) * paddle.gather(flat_w, sel).unsqueeze(1)
            out = paddle.index_add(out, rows, 0, y)
        return out

    def forward(self, x):
        sp = self.spec
        x2 = x.reshape([-1, sp.hidden])
        idx, w = noaux_tc_route(paddle.matmul(x2, self.router), self.router_bias, sp.n_group, sp.topk_group,
                                sp.top_k, sp.norm_topk_prob, sp.routed_scaling_factor)
        y = _round(self.experts_forward(x2, idx, w), self.dtype_name)
        if self.shared is not None:
            y = _round(y + self.shared(x2), self.dtype_name)
        if sp.tp_world > 1:  # every expert's down is row-parallel: y is this rank's partial sum
            y = _round(all_reduce(y, sp.tp_world), self.dtype_name)
        return y.reshape(paddle.shape(x))


class DecoderLayer(nn.Layer):
    def __init__(self, spec: ModelSpec, lw: LayerWeights):
        super().__init__()
        t, dt = lw.tensors, spec.dtype
        self.dtype_name = dt
        self.input_norm = RMSNorm(t["input_norm"], spec.eps, dt)
        self.attn = MLAttention(spec, lw)
        self.post_attn_norm = RMSNorm(t["post_attn_norm"], spec.eps, dt)
        self.mlp = MoE(spec, lw) if lw.moe else MLP(t["dense_gate"], t["dense_up"], t["dense_down"], dt,
                                                    spec.tp_world, reduce=True)

    def forward(self, h, st: StepTensors, cache):
        a, cache = self.attn(self.input_norm(h), st, cache)
        h = _round(h + a, self.dtype_name)
        h = _round(h + self.mlp(self.post_attn_norm(h)), self.dtype_name)
        return h, cache


# ---------------------------------------------------------------- model ----

def check_step(input_ids, cache_lens, cache, *, layers: int, max_len: int, width: int, what: str) -> None:
    """Dygraph-side checks of one step's inputs (raises DsxError)."""
    ids, lens = np.asarray(input_ids), np.asarray(cache_lens)
    if ids.ndim != 2 or lens.shape != (ids.shape[0],):
        raise DsxError(f"{what}: input_ids must be [B, S] and cache_lens [B], "
                       f"got {list(ids.shape)} and {list(lens.shape)}")
    want = [layers, ids.shape[0], max_len, width]
    if list(cache.shape) != want:
        raise DsxError(f"{what}: cache shape {list(cache.shape)}, expected {want} (use empty_cache(batch))")
    if lens.size and (lens.min() < 0 or lens.max() + ids.shape[1] > max_len):
        raise DsxError(f"{what}: cache_lens {lens.tolist()} + {ids.shape[1]} new tokens exceed max_len {max_len}")


class LatentCacheStep(nn.Layer):
    """What the base model and the MTP draft share: spec, dtype, rope tables and the latent cache shape."""

    num_cache_layers: int

    def __init__(self, weights: ModelWeights, max_len: int):
        super().__init__()
        self.spec = ModelSpec.from_config(weights.cfg, weights.dtype, weights.tp)
        self.max_len, self.dtype_name = int(max_len), weights.dtype
        cos, sin = rope_tables(weights.cfg, self.max_len)
        self.rope_cos = _param(self, cos)
        self.rope_sin = _param(self, sin)

    @property
    def cache_width(self) -> int:
        return self.spec.kv_lora + self.spec.rope

    def empty_cache(self, batch: int) -> paddle.Tensor:
        """A zero cache [cache layers, batch, max_len, kv_lora + rope] in the model dtype."""
        return paddle.zeros([self.num_cache_layers, batch, self.max_len, self.cache_width], dtype=self.dtype_name)


class DeepseekV3ForInference(LatentCacheStep):
    """The base model. forward(input_ids, cache_lens, cache) -> (logits, hidden, cache); see the module doc."""

    def __init__(self, weights: ModelWeights, max_len: int):
        super().__init__(weights, max_len)
        dt = weights.dtype
        self.embed = _param(self, weights.top["embed"])  # [V, H]
        self.layers = nn.LayerList([DecoderLayer(self.spec, lw) for lw in weights.layers])
        self.num_cache_layers = len(self.layers)
        self.norm = RMSNorm(weights.top["final_norm"], self.spec.eps, dt)
        self.lm_head = make_linear(weights.top["lm_head"], dt)

    def forward(self, input_ids, cache_lens, cache):
        st = step_tensors(input_ids, cache_lens, self.rope_cos, self.rope_sin)
        h = embed_tokens(input_ids, self.embed, self.spec)
        new = []
        for i, layer in enumerate(self.layers):
            h, c = layer(h, st, cache[i])
            new.append(c)
        h = self.norm(h)
        return gather_last_dim(self.lm_head(h), self.spec.tp_world), h, paddle.stack(new)

    def input_spec(self) -> list:
        """InputSpecs of forward for `paddle.jit.save` (batch and new-token count dynamic)."""
        return [InputSpec([None, None], "int64", "input_ids"), InputSpec([None], "int64", "cache_lens"),
                InputSpec([len(self.layers), None, self.max_len, self.cache_width], self.dtype_name, "cache")]

    def step(self, input_ids, cache_lens, cache):
        """Dygraph convenience: checks the inputs, runs forward without autograd."""
        check_step(input_ids, cache_lens, cache, layers=len(self.layers), max_len=self.max_len,
                   width=self.cache_width, what="base step")
        with paddle.no_grad():
            return self.forward(paddle.to_tensor(np.asarray(input_ids, dtype=np.int64)),
                                paddle.to_tensor(np.asarray(cache_lens, dtype=np.int64)), cache)
