"""Tensor parallelism for the export: one rank's share of the weights, and the collectives its program calls.

`shard_weights(weights, rank, world)` takes exported-layout `ModelWeights` (weights.py) and returns
the rank's `ModelWeights` (same keys, smaller arrays, `tp = (rank, world)`), split the way PaddleNLP
splits DeepSeek-V3 (`ds.ROLES`, the one place that says which role splits how):

- "col" (output features; q_b / q_proj, gate/up of the dense MLP, the shared and every routed
  expert, lm_head and the MTP head): rank r keeps outputs [r*N/w, (r+1)*N/w). For q_b that is
  whole heads, so the absorbed `w_uk` [H, nope, kv_lora] / `w_uv` [H, kv_lora, v] (kv_b, also
  "col") keep the same heads.
- "row" (input features; o_proj, down of the MLP and experts): rank r keeps inputs
  [r*K/w, (r+1)*K/w); its output is a partial sum that the program all-reduces.
- "vocab" (embed, MTP embed): rank r keeps rows [r*V/w, (r+1)*V/w); a token outside them embeds
  to zero and the program all-reduces.
- everything else (q_a, kv_a and their norms, layer norms, the router and its bias, eh_proj) is
  replicated, so every rank routes the same way and keeps the whole latent cache.

Quantized Linears are split in their stored form, bit for bit (`weight_only.slice_ref`,
`fp8_block.slice_blocks`), never requantized: the w rank programs compute the tp = 1 model, up to
the order of the sums. Shares that cut an FP8 block or break Paddle's weight-only tiling are
refused with the tensor named.

Collectives (`all_reduce`, `gather_last_dim`) are Paddle's own ops on communication ring 0
(`all_reduce_`, `all_gather`), which a Paddle Inference predictor runs when the process has joined
a `paddle.distributed` group (NCCL on GPUs, gloo on CPU). In the saved program they are plain
ops; in dygraph they call `paddle.distributed`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ds_export.errors import DsxError, UsageError
from ds_export.export.params import Lazy, derive, load
from ds_export.export.weights import LayerWeights, LinearWeights, ModelWeights
from ds_export.formats import fp8_block, weight_only
from ds_export.models import deepseek_v3 as ds

ABSORBED = {"w_uk": "kv_b", "w_uv": "kv_b"}  # exported keys that carry kv_b's split (by heads, axis 0)
EXPERT_ROLES = {"gate": "expert_gate", "up": "expert_up", "down": "expert_down"}


def check_tp(cfg: ds.DeepseekV3Config, world: int, source: str = "config.json") -> None:
    """UsageError unless `world` ranks can split this model: heads, MLP widths and the vocabulary."""
    if world < 1:
        raise UsageError(f"--tp {world}: must be at least 1")
    dims = [("num_attention_heads", cfg.num_attention_heads), ("vocab_size", cfg.vocab_size)]
    if cfg.first_k_dense_replace > 0:
        dims.append(("intermediate_size", cfg.intermediate_size))
    if cfg.n_routed_experts:
        dims.append(("moe_intermediate_size", cfg.moe_intermediate_size))
    for key, value in dims:
        if value % world:
            raise UsageError(f"--tp {world}: {source}: {key} {value} is not divisible by {world}",
                             hint="choose a tensor-parallel degree that divides the heads, MLP widths and vocabulary")


def _part(size: int, rank: int, world: int) -> tuple[int, int]:
    step = size // world
    return rank * step, (rank + 1) * step


def _take(x, index: tuple):
    """x[index] as its own array; deferred when x is a Lazy (validation has happened already)."""
    shape = tuple(len(range(*sl.indices(d))) for sl, d in zip(index, x.shape)) + tuple(x.shape[len(index):])
    return derive(x, shape, lambda a: np.ascontiguousarray(a[index]))


def split_linear(lw: LinearWeights, split: str, rank: int, world: int, what: str) -> LinearWeights:
    """Rank `rank`'s share of one Linear ("col": output features, "row": input features).

    Every check runs now; the data of Lazy weights is sliced when it is written.
    """
    n, k = lw.out_features, lw.in_features
    rows = _part(n, rank, world) if split == "col" else None
    cols = _part(k, rank, world) if split == "row" else None
    t = lw.tensors
    try:
        if lw.fmt == "dense":  # weight [in, out]
            index = (slice(None), slice(*rows)) if rows else (slice(*cols),)
            return LinearWeights("dense", {"weight": _take(t["weight"], index)})
        if lw.fmt == "fp8":
            wi, si = fp8_block.block_slice(t["weight"].shape, t["scale_inv"].shape, rows, cols)
            return LinearWeights("fp8", {"weight": _take(t["weight"], wi), "scale_inv": _take(t["scale_inv"], si)})
        if lw.fmt == "weight_only":
            plan = weight_only.slice_plan(n, k, t["bits"], t["group"], t["arch"], rows, cols)
            q0, s0 = t["qweight"], t["scale"]

            def qpart(q=q0, s=s0):
                if t["arch"] != 70:  # whole tiles of the packed bytes (tested equal to the reference)
                    return weight_only.slice_packed(load(q), t["bits"], t["arch"], k, plan)
                return weight_only.slice_ref(load(q), load(s), t["bits"], t["group"], t["arch"], k, rows, cols)[0]

            q = Lazy(plan["qweight"], np.int8, qpart) if isinstance(q0, Lazy) else qpart()
            s = derive(s0, plan["scale"], lambda a: weight_only.slice_scale(a, plan))
            return LinearWeights("weight_only", dict(t, qweight=q, scale=s))
    except DsxError as e:
        raise UsageError(f"--tp {world}: {what}: {e}", hint=e.hint or "choose another tensor-parallel degree") from None
    raise DsxError(f"{what}: Linear format {lw.fmt!r} has no tensor-parallel split")


def _split_value(value, split: str | None, rank: int, world: int, what: str):
    if split is None:
        return value
    if isinstance(value, LinearWeights):
        return split_linear(value, split, rank, world, what)
    if split in ("vocab", "col"):  # an embedding [V, H] by rows; w_uk / w_uv [H, ...] by heads
        return _take(value, (slice(*_part(value.shape[0], rank, world)),))
    raise DsxError(f"{what}: no rule to split a {type(value).__name__} by {split!r}")


def _shard_layer(lw: LayerWeights, rank: int, world: int) -> LayerWeights:
    out = LayerWeights(lw.index, lw.mtp, lw.moe)
    for key, value in lw.tensors.items():
        role = ABSORBED.get(key, key)
        out.tensors[key] = _split_value(value, ds.ROLES[role][0], rank, world, f"layer {lw.index} {key}")
    for e, expert in enumerate(lw.experts):
        out.experts.append({k: split_linear(v, ds.ROLES[EXPERT_ROLES[k]][0], rank, world,
                                            f"layer {lw.index} expert {e} {k}") for k, v in expert.items()})
    return out


def shard_weights(weights: ModelWeights, rank: int, world: int) -> ModelWeights:
    """Rank `rank` of `world`: the weights its program holds (see the module docstring)."""
    if weights.tp != (0, 1):
        raise DsxError(f"weights are already rank {weights.tp[0]} of {weights.tp[1]}")
    check_tp(weights.cfg, world)
    if not 0 <= rank < world:
        raise DsxError(f"rank {rank} is outside 0..{world - 1}")
    if world == 1:
        return weights
    top = {k: _split_value(v, ds.ROLES[k][0], rank, world, k) for k, v in weights.top.items()}
    return replace(weights, top=top, layers=[_shard_layer(lw, rank, world) for lw in weights.layers],
                   mtp=[_shard_layer(lw, rank, world) for lw in weights.mtp], tp=(rank, world))


# ------------------------------------------------------------- collectives ----

RING = 0  # the communication ring every dsx collective uses (the job's default group)
SUM = 0  # paddle.distributed.ReduceOp.SUM


def all_reduce(x, world: int):
    """Sum x over the ranks (identity for one rank)."""
    if world == 1:
        return x
    import paddle

    if paddle.in_dynamic_mode():
        import paddle.distributed as dist

        dist.all_reduce(x)
        return x
    return paddle._C_ops.all_reduce_(x, RING, SUM)


def gather_last_dim(x, world: int):
    """[B, S, n] on each rank -> [B, S, world * n], rank r's part at [r*n, (r+1)*n) (identity for one rank)."""
    if world == 1:
        return x
    import paddle

    if paddle.in_dynamic_mode():
        import paddle.distributed as dist

        parts: list = []
        dist.all_gather(parts, x)
        return paddle.concat(parts, axis=-1)
    shp = paddle.shape(x)
    n = x.shape[-1]
    g = paddle._C_ops.all_gather(x.reshape([-1, n]), RING, world)  # [world * B * S, n], rank-major
    g = g.reshape([world, -1, n]).transpose([1, 0, 2])
    return g.reshape([shp[0], shp[1], world * n])
